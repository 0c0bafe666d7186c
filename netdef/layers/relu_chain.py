"""A convolution or inner product and the ReLU in place on its output, trained as one step.

Run one by one in training, the ReLU reads the product's output and writes its own array: a second
pass over every activation, into memory that is not in cache (benchmarks/README.md, "The figures
behind the convolution paths"). The product's output is an array it has
just written that nothing else holds (the TEST phase's fusion rests on the same fact, fusion.py), so
the ReLU can rectify it in place, and the pointwise and depthwise convolutions add their bias in that
same pass (``forward_mapped``). Backward is the layers' own: the ReLU's gradient (its sign read from
the rectified output, as the layer reads it) and then the product's backward. The same bits as the
layers one by one: the map computes the ReLU's and the bias's expressions as their kernels do.

Where it applies (``plan``): a Convolution or InnerProduct with one top T and no loss weight, then
a ReLU with slope >= 0 (its sign is then the output's) in place on T and without a loss weight.
"""
from __future__ import annotations

from . import elementwise, fusion
from .activation import ReLULayer
from .dense import InnerProductLayer
from .trained_chain import TrainedChain, rectifies_in_place
from .convolution import ConvolutionLayer


class RectifiedProductChain(TrainedChain):
    """Layers ``first`` (the product) and ``first + 1`` (the ReLU in place on its top), run as one
    step (trained_chain.py)."""

    def __init__(self, first: int, product, relu: ReLULayer, blob):
        super().__init__(first, first + 1)
        self.product, self.relu = product, relu
        self._blob = blob  # the product's top, which the ReLU rectifies in place

    def forward(self, bottom, top) -> bool:
        self._saved = None
        rectify = fusion.ChannelMap(negative_slope=self.relu.negative_slope)
        if not self.product.forward_mapped(bottom, [self._blob], rectify):
            return False
        self._saved = self._blob.data
        return True

    def backward(self, top, bottom, propagate_down) -> None:
        rectified = self._saved
        dy = self._blob.diff
        dx = self._outputs.get("relu_diff", like=dy, avoid=(dy, rectified))
        self._blob.diff = elementwise.relu_backward(rectified, dy, self.relu.negative_slope, dx)
        self.product.backward([self._blob], propagate_down, bottom)


def plan(layers, bottom_vecs, top_vecs, loss_weights) -> dict[int, RectifiedProductChain]:
    """{first layer: chain} of the chains a net may run as one step (the module docstring's rule)."""
    chains = {}
    for li, layer in enumerate(layers[:-1]):
        if not (isinstance(layer, (ConvolutionLayer, InnerProductLayer)) and len(top_vecs[li]) == 1
                and not any(loss_weights[li])):
            continue
        blob = top_vecs[li][0]
        if rectifies_in_place(layers[li + 1], bottom_vecs[li + 1], top_vecs[li + 1], loss_weights[li + 1], blob):
            chains[li] = RectifiedProductChain(li, layer, layers[li + 1], blob)
    return chains
