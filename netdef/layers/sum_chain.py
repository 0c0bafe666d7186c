"""An Eltwise sum, ReLU in place on it, and the Split that hands the result on, trained as one step.

ResNet's blocks end with a shortcut sum, a ReLU in place on it, and (inserted by the net, splits.py)
a Split feeding the next block's two branches. Run one by one in training, the ReLU reads and writes
the sum once more forward; backward, the Split adds its tops' gradients into a new array and the ReLU
reads that and writes its own, passes over memory that the chain does not make (benchmarks/README.md,
"The figures behind the other layers' choices"). As one step the sum is rectified while each block is
in cache (as the TEST phase's fused Eltwise+ReLU), and backward sums the Split's gradients and masks
them in the same pass (jit/fusion.py), the layers' expressions in their order: the same bits.

Where it applies (``plan``): Eltwise SUM with one top T and no loss weight, then a ReLU (slope >= 0:
its gradient's sign is read from its output) in place on T, then, if T's consumers are several, the
Split taking T alone. The net runs it as one step where the kernels take the arrays (net.py), the
layers one by one otherwise; what a user can read (T's final values and gradient, the Split's tops,
the Eltwise inputs' gradients) is what the layers would leave.
"""
from __future__ import annotations

import numpy as np

from ..proto import netdef_pb2 as pb
from . import elementwise, fusion, jit
from .activation import ReLULayer
from .trained_chain import TrainedChain, only, rectifies_in_place
from .shape import EltwiseLayer, SplitLayer


class SumChain(TrainedChain):
    """Layers ``first``..``last``: Eltwise SUM, ReLU in place on its top, and maybe a Split of it,
    run as one step (trained_chain.py)."""

    def __init__(self, first: int, eltwise: EltwiseLayer, relu: ReLULayer, split: SplitLayer | None, blob):
        super().__init__(first, first + 1 + (split is not None))
        self.eltwise, self.relu, self.split = eltwise, relu, split
        self._sum_blob = blob  # the Eltwise's top, which the ReLU rectifies in place

    def forward(self, bottom, top) -> bool:
        """The Eltwise's ``bottom`` to the last layer's ``top``; False, nothing computed, where the
        kernels do not take the arrays."""
        self._saved = None
        xs = [b.data for b in bottom]
        if not jit.usable(*xs):
            return False
        out = self._outputs.get("top", like=xs[0], avoid=xs)
        chain_map = fusion.ChannelMap(negative_slope=self.relu.negative_slope)
        self._sum_blob.data = fusion.weighted_sum_mapped(xs, self.eltwise.coeff, chain_map, out)
        if self.split is not None:
            self.split.forward([self._sum_blob], top)
        self._saved = out
        return True

    def backward(self, top, bottom, propagate_down) -> None:
        """The gradients of the last layer's tops to the Eltwise's inputs (those ``propagate_down``
        asks for), as the layers' backward passes would leave them."""
        out = self._saved
        dtype = out.dtype
        slope = dtype.type(self.relu.negative_slope)
        dys = [t.diff for t in top]
        dz = self._outputs.get("sum_diff", like=dys[0], avoid=[*dys, out])
        if len(dys) > 1 and jit.usable(*dys, out, dz):
            _kernels().summed_rectified_gradient(tuple(d.reshape(-1) for d in dys), np.ones(len(dys), dtype),
                                                 out.reshape(-1), slope, dz.reshape(-1))
        else:  # the layers' own functions, one after the other
            total = dys[0] if len(dys) == 1 else elementwise.weighted_sum(
                dys, [1.0] * len(dys), self._outputs.get("split_diff", like=dys[0], avoid=[*dys, out]))
            elementwise.relu_backward(out, total, self.relu.negative_slope, dz)
        self._sum_blob.diff = dz
        for k, (b, wanted) in enumerate(zip(bottom, propagate_down)):
            if wanted:
                c = self.eltwise.coeff[k]
                b.diff = dz if c == 1 else elementwise.weighted_sum(
                    [dz], [c], self._outputs.get(f"bottom_diff_{k}", like=dz, avoid=[dz, out]))


def _kernels():
    from .jit import fusion as kernels

    return kernels


def plan(layers, bottom_vecs, top_vecs, loss_weights) -> dict[int, SumChain]:
    """{first layer: chain} of the chains a net may run as one step (the module docstring's rule)."""
    chains = {}
    for li, layer in enumerate(layers[:-1]):
        if not (isinstance(layer, EltwiseLayer) and layer.op == pb.EltwiseParameter.SUM and len(top_vecs[li]) == 1
                and not any(loss_weights[li])):
            continue
        blob = top_vecs[li][0]
        relu = layers[li + 1]
        if not rectifies_in_place(relu, bottom_vecs[li + 1], top_vecs[li + 1], loss_weights[li + 1], blob):
            continue
        split = None
        if (li + 2 < len(layers) and isinstance(layers[li + 2], SplitLayer) and only(bottom_vecs[li + 2], blob)
                and not any(loss_weights[li + 2])):
            split = layers[li + 2]
        chains[li] = SumChain(li, layer, relu, split, blob)
    return chains
