"""Per-channel element-wise maps that several layers compute in one pass (TEST-phase fusion).

In the TEST phase BatchNorm (global statistics), Scale (a learned per-channel operand) and ReLU are
each a map of one value to one value with per-channel constants: y = (x - mean) / std,
y = x * s (+ b), y = max(x, 0) (or x * slope below 0). Run one by one, each reads its whole input
and writes a fresh array; the zoo's nets run them in place, one after the other, on a convolution's
output, so ResNet-50 made three passes over every convolution output to produce values nobody can
read in between. A ``ChannelMap`` describes such a map as stages in a fixed order (normalize, scale
and bias, rectify), ``compose`` chains the maps of consecutive layers, and ``apply`` runs a chain in
one pass with the same float32 operations per element in the same order as the layers: the answer
is the same bits (the kernel computes each stage's expression as written in the layer's kernel;
BatchNorm is never folded into the convolution's weights, which would round differently).

The net decides where a chain may run fused (net.py: a layer followed by layers working in place on
its one top, none needing backward): the layers' contract has ``channel_map`` (what a layer's
forward is, as a ChannelMap, or None) and ``forward_mapped`` (a layer that can apply a map to the
output it has just written). ``apply`` on C-contiguous float NumPy arrays runs jit/fusion.py; on CuPy
arrays the BatchNorm chain's CUDA kernel (gpu_batchnorm_chain.apply_channel_map); on any other array
the layers' own reference functions in sequence, which is also the twin of the kernels.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_array_module
from . import batchnorm, elementwise, gpu_batchnorm_chain, jit, kernels

SHIFT, NORMALIZE, AFFINE, RECTIFY = range(4)  # the stages, in the order a map applies them
# Layers whose kernels can apply a map to each block of their output as they write it (the pointwise
# and depthwise convolutions) do so: one pass over the output fewer, the same bits. False: the map
# runs in a pass of its own after the layer (what benchmarks/fused_maps.py compares with).
MAPS_IN_KERNELS = True


class ChannelMap:
    """y = rectify(((((x + shift) - mean) / std) * scale) + bias) per element, each stage present or
    not (``shift``: a convolution's bias, added where the convolution adds it).

    ``dims`` (O, D, I): the input read as an O x D x I array, the per-channel arrays (D) broadcast
    over O and I; None when no stage has per-channel values (only rectify). ``negative_slope``:
    None without the rectify stage, else y = x where x > 0, else slope * x (+0 for slope 0).
    ``bias`` only comes with ``scale``. No stage at all: the identity (Dropout in the TEST phase).
    ``stages``: the stages present, in order. Never changed once made.

    A plain class with slots, not a frozen dataclass: the maps of every chain are made and composed
    at every forward (MobileNet v2 at batch 1: 52 chains, 150 maps), and a frozen dataclass's
    constructor and a cached ``stages`` cost several microseconds each of them.
    """

    __slots__ = ("dims", "shift", "mean", "std", "scale", "bias", "negative_slope", "stages")

    def __init__(self, dims=None, shift=None, mean=None, std=None, scale=None, bias=None,
                 negative_slope: float | None = None):
        self.dims = dims
        self.shift = shift
        self.mean = mean
        self.std = std
        self.scale = scale
        self.bias = bias
        self.negative_slope = negative_slope
        stages = ()
        if shift is not None:
            stages += (SHIFT,)
        if mean is not None:
            stages += (NORMALIZE,)
        if scale is not None:
            stages += (AFFINE,)
        if negative_slope is not None:
            stages += (RECTIFY,)
        self.stages = stages


def compose(first: ChannelMap, then: ChannelMap) -> ChannelMap | None:
    """The map ``then(first(x))``, or None when it is not one ChannelMap: a stage of ``then`` that
    does not come after every stage of ``first``, or per-channel values over different dims."""
    return compose_all((first, then))


def compose_all(maps) -> ChannelMap | None:
    """The maps applied in order as one ChannelMap; None when one of them is None or they do not
    compose (``compose``). One pass that takes each stage's values from the one map that has it
    (stages strictly increase across composable maps, and a map's values are set exactly where it
    has their stage): this runs at every forward of every chain (MobileNet v2 at batch 1: 52 chains)."""
    dims = None
    last_stage = -1
    shift = mean = std = scale = bias = slope = None
    for m in maps:
        if m is None:
            return None
        stages = m.stages
        if stages:
            if stages[0] <= last_stage:
                return None
            last_stage = stages[-1]
        if m.dims is not None:
            if dims is not None and tuple(dims) != tuple(m.dims):
                return None
            dims = m.dims
        for stage in stages:
            if stage == SHIFT:
                shift = m.shift
            elif stage == NORMALIZE:
                mean, std = m.mean, m.std
            elif stage == AFFINE:
                scale, bias = m.scale, m.bias
            else:
                slope = m.negative_slope
    return ChannelMap(dims, shift, mean, std, scale, bias, slope)


def apply(m: ChannelMap, x, out):
    """out = m(x); ``out`` may be ``x`` (in place). Returns out."""
    if not m.stages:
        if out is not x:
            out[...] = x
        return out
    dims = m.dims if m.dims is not None else (1, 1, x.size)
    x3, out3 = x.reshape(dims), out.reshape(dims)
    if jit.usable(x3, m.shift, m.mean, m.std, m.scale, m.bias, out3):
        slope = None if m.negative_slope is None else x.dtype.type(m.negative_slope)
        if out is x:
            _kernels().channel_map_in_place(out3, m.shift, m.mean, m.std, m.scale, m.bias, slope)
        else:
            _kernels().channel_map(x3, m.shift, m.mean, m.std, m.scale, m.bias, slope, out3)
        return out
    if (m.scale is not None or m.bias is None) and kernels.usable(x3, out3, m.shift, m.mean, m.std, m.scale, m.bias):
        slope = None if m.negative_slope is None else x.dtype.type(m.negative_slope)
        gpu_batchnorm_chain.apply_channel_map(x3, m.shift, m.mean, m.std, m.scale, m.bias, slope, out3)
        return out
    return apply_reference(m, x, out)


def apply_reference(m: ChannelMap, x, out):
    """``apply`` by the layers' reference functions, one stage after the other (the kernel's twin)."""
    dims = m.dims if m.dims is not None else (1, 1, x.size)
    x3, out3 = x.reshape(dims), out.reshape(dims)
    source = x3
    if m.shift is not None:
        get_array_module(out3).add(source, m.shift.reshape(1, -1, 1), out=out3)
        source = out3
    if m.mean is not None:
        batchnorm.forward_global_reference(source, m.mean, m.std, out3)
        source = out3
    if m.scale is not None:
        elementwise.scale_forward_reference(source, m.scale, m.bias, out3)
        source = out3
    if m.negative_slope is not None:
        elementwise.relu_forward_reference(source, m.negative_slope, out3)
        source = out3
    if source is not out3:
        out3[...] = source
    return out


def weighted_sum_mapped(xs, coeffs, m: ChannelMap, out):
    """out = m(sum_k coeffs[k] * xs[k]) (Eltwise SUM, then the map), the sum as ``weighted_sum``
    adds it; in one pass when the map is rectify alone and the kernels take the arrays."""
    if m.dims is None and m.negative_slope is not None and jit.usable(*xs, out):
        _kernels().weighted_sum_rectified(tuple(a.reshape(-1) for a in xs), np.asarray(coeffs, dtype=out.dtype),
                                          out.dtype.type(m.negative_slope), out.reshape(-1))
        return out
    elementwise.weighted_sum(xs, coeffs, out)
    return apply(m, out, out)


def mapper_arguments(m: ChannelMap | None, dtype) -> tuple:
    """What the kernels that map the blocks they write through a compiled mapper take (jit/fusion.py's
    ``rows_mapper``: jit/depthwise.blocked_taps, jit/blas.gemm_panels_mapped): the mapper's address (0
    for no map) and the map's shift, mean, std, scale and bias arrays and its negative slope as a
    one-value array, each stage that ``m`` lacks given as a placeholder array that nothing reads
    (the kernels' argument types then never change with the stages: one compiled kernel per dtype).
    ``m``'s arrays must be C-contiguous ``dtype`` arrays (``jit.usable``)."""
    dtype = np.dtype(dtype)
    unused = _placeholder(dtype)
    if m is None or not m.stages:
        return (0,) + (unused,) * 6
    address = _kernels().rows_mapper(dtype, m.shift is not None, m.mean is not None, m.scale is not None,
                                    m.bias is not None, m.negative_slope is not None)
    slope = unused if m.negative_slope is None else _one_value(dtype, float(m.negative_slope))
    shift, mean, std, scale, bias = m.shift, m.mean, m.std, m.scale, m.bias
    return (address, unused if shift is None else shift, unused if mean is None else mean,
            unused if std is None else std, unused if scale is None else scale, unused if bias is None else bias, slope)


@functools.lru_cache(maxsize=None)
def _placeholder(dtype: np.dtype) -> np.ndarray:
    return np.zeros(1, dtype=dtype)


@functools.lru_cache(maxsize=None)
def _one_value(dtype: np.dtype, value: float) -> np.ndarray:
    # Shared between calls and only read by the kernels; float(value) keys the cache, and the
    # value is rounded to the dtype as the kernels' own per-call scalar was (dtype.type(slope)).
    return np.array([dtype.type(value)], dtype=dtype)


def forward_then_map(layer, bottom, top, m: ChannelMap) -> bool:
    """``layer.forward`` and then ``m`` in place on top[0]'s values: for a layer whose forward leaves
    in its one top an array it has just written that views no other blob (a convolution's output,
    an inner product's), so writing into it once more changes nothing anyone else holds."""
    if len(top) != 1:
        return False
    layer.forward(bottom, top)
    apply(m, top[0].data, top[0].data)
    return True


def _kernels():
    """jit/fusion.py, imported on first use (it compiles numba kernels); kept, since this is asked at
    every mapped kernel call."""
    if not _JIT:
        from .jit import fusion

        _JIT.append(fusion)
    return _JIT[0]


_JIT: list = []


def plan_chains(layers, bottom_vecs, top_vecs, loss_weights) -> dict[int, int]:
    """{first layer: last layer} of the chains a net may run fused: a layer with one top T, followed
    by layers that each take T alone and work in place on it with a ``channel_map``. Only T's final
    value can be read (the chain's layers overwrite one blob), so fusing changes nothing a user
    sees; no layer of a chain has a loss weight (its loss would be summed from an intermediate
    value). Whether a chain is run fused is decided at each forward (net.py)."""
    chains = {}
    li = 0
    while li < len(layers):
        last = li
        tops = top_vecs[li]
        if len(tops) == 1 and not any(loss_weights[li]):
            while last + 1 < len(layers) and _maps_in_place(layers[last + 1], bottom_vecs[last + 1],
                                                            top_vecs[last + 1], loss_weights[last + 1], tops[0]):
                last += 1
        if last > li:
            chains[li] = last
        li = last + 1
    return chains


def _maps_in_place(layer, bottom, top, loss_weights, blob) -> bool:
    return (len(bottom) == 1 and len(top) == 1 and bottom[0] is blob and top[0] is blob and not any(loss_weights)
            and layer.channel_map(bottom, top) is not None)
