"""BatchNorm followed in place by Scale and/or ReLU, trained as one step (TRAIN-phase fusion).

The zoo's nets with BatchNorm (ResNet-50, the MobileNets) follow almost every convolution by
BatchNorm, Scale and ReLU, the last two working in place on BatchNorm's top. Run one by one, the
three read and write every value of the convolution's output six times between them forward and
seven backward, keep BatchNorm's normalized values for Scale and BatchNorm's backward, and hand
gradients from one to the next through memory: a large part of ResNet-50's iteration, with the three
layers' kernels already at memory speed. As one step (jit/batchnorm_chain.py), the
forward reads the input for the statistics and writes the chain's output once; the backward reads
the input, the output and its gradient, and writes the input's gradient, recomputing what the
layers kept or handed on in between (benchmarks/README.md, "BatchNorm chains").

The answer is the same bits: every value and every sum is computed by the layers' own expressions
and row functions in the layers' order. The layers stay the net's layers (their parameters, their
statistics, their names in hooks and logs); the chain only asks them for their operands and hands
them their gradients (``BatchNormLayer.record_batch_statistics``, ``ScaleLayer.add_parameter_gradients``).

Where a chain may run (``plan``): BatchNorm with one bottom and one top, then a Scale with a learned
per-channel scale, then ReLU with a slope >= 0 (its gradient's sign is read from its output), each
of the two optional but one present, each taking the top alone and working in place on it, no
loss weight on any. Only the chain's output and BatchNorm's input gradient can be read (the others
are one blob's values in between), so fusing changes nothing a user sees. The net runs a chain as
one step where its kernels take the arrays (float32 or float64; net.py), the layers one by one
otherwise. On CuPy arrays the chain runs the CUDA kernels of gpu_batchnorm_chain.py: the same
expressions, with sums in another order, so the layers' values to float rounding rather than to the bit
(tests/test_gpu_chains.py compares the two).
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from . import fusion, gpu_batchnorm_chain, jit, kernels
from .activation import ReLULayer
from .normalization import BatchNormLayer, ScaleLayer
from .trained_chain import TrainedChain


def _kernels():
    from .jit import batchnorm_chain

    return batchnorm_chain


class BatchNormChain(TrainedChain):
    """Layers ``first``..``last`` of a net: a BatchNorm layer, then a Scale layer and/or a ReLU
    layer in place on its top, run as one step (trained_chain.py)."""

    def __init__(self, first: int, batchnorm: BatchNormLayer, scale: ScaleLayer | None, scale_bottom,
                 relu: ReLULayer | None):
        super().__init__(first, first + (scale is not None) + (relu is not None))
        self.batchnorm, self.scale, self.relu = batchnorm, scale, relu
        self._scale_bottom = scale_bottom
        self._gpu_scratch = gpu_batchnorm_chain.Scratch()

    def forward(self, bottom, top) -> bool:
        """BatchNorm's ``bottom`` to the last layer's ``top`` (the layers reshaped already); False,
        with nothing computed, where the kernels do not take the arrays."""
        self._saved = None
        x = bottom[0].data
        scale, bias = self._scale_operands()
        on_gpu = kernels.usable(x, scale, bias)
        if not (on_gpu or jit.usable(x, scale, bias)):
            return False
        bn = self.batchnorm
        slope = None if self.relu is None else x.dtype.type(self.relu.negative_slope)
        out = self._outputs.get("top", like=x, avoid=(x,))
        x3, out3 = bn.view(x), bn.view(out)
        if bn.use_global_stats:
            mean, std = bn.global_statistics(x.dtype)
            if on_gpu:
                gpu_batchnorm_chain.forward_global(x3, mean, std, scale, bias, slope, out3)
            else:
                chain_map = fusion.ChannelMap(dims=x3.shape, mean=mean, std=std, scale=scale, bias=bias,
                                              negative_slope=None if slope is None else float(slope))
                fusion.apply(chain_map, x3, out3)
            inv_std = 1.0 / std  # as BatchNorm's backward divides with global statistics
        else:
            if on_gpu:  # the statistics live until the next forward, in the chain's scratch arrays
                xp = get_array_module(x)
                mean, var, std = (self._gpu_scratch.get(name, (bn.channels,), x.dtype, xp)
                                  for name in ("mean", "var", "std"))
                gpu_batchnorm_chain.forward_batch(x3, bn.eps, scale, bias, slope, out3, mean, var, std,
                                                  bn.moving_sums_update(x.size // bn.channels), self._gpu_scratch)
            else:
                mean, var, std = (np.empty(bn.channels, x.dtype) for _ in range(3))
                _kernels().forward_batch(x3, x.dtype.type(bn.eps), scale, bias, slope, out3, mean, var, std)
                bn.record_batch_statistics(mean, var, x.size // bn.channels)
            inv_std = None
        top[0].data = out
        self._saved = (x, out, mean, std, inv_std)
        return True

    def backward(self, top, bottom, propagate_down) -> None:
        """The gradient of the chain's output (``top``'s diff) to BatchNorm's input (``bottom``'s
        diff) and Scale's parameters, as the layers' backward passes would compute them (the net runs
        a chain as one step only where BatchNorm's input wants its gradient: ``propagate_down``)."""
        x, out, mean, std, inv_std = self._saved
        dy = top[0].diff
        dx = self._outputs.get("bottom_diff", like=dy, avoid=(dy, x, out))
        scale, _ = self._scale_operands()
        want_bias, want_scale = (False, False) if self.scale is None else self.scale.wanted_parameter_sums()
        slope = None if self.relu is None else x.dtype.type(self.relu.negative_slope)
        view = self.batchnorm.view
        if get_array_module(x) is np:
            cpu = _kernels()
            wanted = cpu.BOTH_SUMS if want_scale else cpu.BIAS_SUM if want_bias else cpu.NO_SUMS
            sums = np.zeros((2, self.batchnorm.channels))
            cpu.backward(view(x), view(out), view(dy), mean, std, inv_std, scale, slope, wanted, view(dx), sums)
        else:
            sums = gpu_batchnorm_chain.backward(view(x), view(out), view(dy), mean, std, inv_std, scale, slope,
                                                view(dx), self._gpu_scratch)
        if self.scale is not None:
            self.scale.add_parameter_gradients(sums[0] if want_bias else None, sums[1] if want_scale else None)
        bottom[0].diff = dx

    def _scale_operands(self):
        """(scale, bias) per channel of the Scale layer, each None where absent."""
        if self.scale is None:
            return None, None
        m = self.scale.channel_map(self._scale_bottom, None)
        return m.scale, m.bias


def plan(layers, bottom_vecs, top_vecs, loss_weights) -> dict[int, BatchNormChain]:
    """{first layer: chain} of the chains a net may run as one step (the module docstring's rule)."""
    chains = {}
    for li, layer in enumerate(layers):
        if not (isinstance(layer, BatchNormLayer) and len(bottom_vecs[li]) == 1 and len(top_vecs[li]) == 1
                and not any(loss_weights[li])):
            continue
        blob = top_vecs[li][0]
        channels = (blob.shape[0], layer.channels, blob.count // (blob.shape[0] * layer.channels)) if blob.shape else None
        following, scale_bottom = [], None
        for lj in range(li + 1, min(li + 3, len(layers))):
            if not _in_place_on(blob, bottom_vecs[lj], top_vecs[lj], loss_weights[lj]):
                break
            candidate = layers[lj]
            if (isinstance(candidate, ScaleLayer) and not following and len(bottom_vecs[lj]) == 1
                    and tuple(candidate.channel_map(bottom_vecs[lj], top_vecs[lj]).dims) == channels):
                following.append(candidate)
                scale_bottom = bottom_vecs[lj]
            elif isinstance(candidate, ReLULayer) and candidate.negative_slope >= 0:
                following.append(candidate)
                break
            else:
                break
        if following:
            scale = next((m for m in following if isinstance(m, ScaleLayer)), None)
            relu = next((m for m in following if isinstance(m, ReLULayer)), None)
            chains[li] = BatchNormChain(li, layer, scale, scale_bottom, relu)
    return chains


def _in_place_on(blob, bottom, top, loss_weights) -> bool:
    return len(bottom) == 1 and len(top) == 1 and bottom[0] is blob and top[0] is blob and not any(loss_weights)
