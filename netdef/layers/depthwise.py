"""Depthwise 2-D convolution (group == input channels): each output channel filters one input channel.

A column matrix would hold kh*kw rows per channel for products of one row each (per group), so neither
im2col nor a per-group loop is used. The convolution is a sum over the kh*kw taps of shifted views of
the input, each times one weight per channel:

    y[n, o] = sum_{i, j} w[o, 0, i, j] * x_pad[n, o // m, i*dh : ... : sh, j*dw : ... : sw]

(m = num_output / C, the channel multiplier). On NumPy arrays the compiled kernels in jit/depthwise.py
compute it in one parallel pass: with m = 1, where the microkernels compile, over blocks of channels
laid out pixel-major (``blocked_taps``: also the input gradient, as a convolution of the top
gradient per stride phase of the input; ``blocked_weights`` the weight gradient), otherwise over each
plane's stride phases; the ``*_reference`` functions here are their twins, written against
the array module (one array operation per tap, never a loop over channels or samples): what CuPy
arrays run and what the tests compare the kernels with.

Shapes: x, dx (N x C x H x W); w, dw (C*m x 1 x kh x kw); y, dy (N x C*m x H_out x W_out).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from .. import backend
from . import direct, jit
from .fusion import mapper_arguments
from .im2col import Geometry, offset_slices, padded


def _geometry_args(geom: Geometry) -> tuple:
    return geom.stride + geom.pad + geom.dilation


def _per_channel(w, c: int):
    """w (C*m x 1 x kh x kw) as (1 x C x m x 1 x 1) factors per tap: a list over taps in row-major order."""
    kh, kw = w.shape[2:]
    w5 = w.reshape(c, -1, kh, kw)
    return [w5[:, :, i, j][None, :, :, None, None] for i in range(kh) for j in range(kw)]


def forward(x, w, geom: Geometry, out, scratch=None):
    """Writes the depthwise convolution of ``x`` with ``w`` (no bias) into ``out``; ``scratch`` (a
    layer's Scratch, or None) keeps the blocked path's buffers between calls."""
    if jit.usable(x, w, out):
        if _blocked(x.shape[1], w):
            _blocked_taps(x, w, _forward_plan(geom, x.shape[3], _lanes(x.dtype)), out, scratch)
            return out
        from .jit import depthwise as kernels

        kernels.forward(x, w, out, *_geometry_args(geom))
        return out
    return forward_reference(x, w, geom, out)


def forward_mapped(x, w, geom: Geometry, out, channel_map, scratch=None) -> bool:
    """Writes ``channel_map`` (layers/fusion.ChannelMap) of the depthwise convolution into ``out``,
    each block of channels mapped as the blocked kernel writes it, while it is still in cache (one
    pass over the output fewer than the convolution and then the map; the same bits). False, with
    nothing written, where the blocked kernels do not compute it or the map's per-channel values
    are not over ``out``'s channels."""
    m = channel_map
    n, o = out.shape[:2]
    if m.dims is not None and tuple(m.dims) != (n, o, math.prod(out.shape[2:])):
        return False
    if not (jit.usable(x, w, out, m.shift, m.mean, m.std, m.scale, m.bias) and _blocked(x.shape[1], w)):
        return False
    _blocked_taps(x, w, _forward_plan(geom, x.shape[3], _lanes(x.dtype)), out, scratch, m)
    return True


def backward_data(dy, w, geom: Geometry, out, scratch=None):
    """Writes the input gradient of the depthwise convolution into ``out`` (N x C x H x W)."""
    if jit.usable(dy, w, out):
        if _blocked(out.shape[1], w):
            plan = _input_gradient_plan(geom, tuple(out.shape[2:]), tuple(dy.shape[2:]), _lanes(dy.dtype))
            _blocked_taps(dy, w, plan, out, scratch)
            return out
        from .jit import depthwise as kernels

        kernels.backward_data(dy, w, out, *_geometry_args(geom))
        return out
    return backward_data_reference(dy, w, geom, out)


def backward_weights(x, dy, geom: Geometry, dw, scratch=None):
    """Adds the weight gradient of the depthwise convolution to ``dw`` (C*m x 1 x kh x kw)."""
    if jit.usable(x, dy, dw) and _blocked(x.shape[1], dw):
        _blocked_weights(x, dy, geom, dw, scratch)
        return dw
    if jit.usable(x, dy, dw):
        from .jit import depthwise as kernels

        kernels.backward_weights(x, dy, dw, *_geometry_args(geom))
        return dw
    return backward_weights_reference(x, dy, geom, dw)


def _blocked(channels: int, w) -> bool:
    """Whether the channel-blocked kernels compute: one output channel per input channel (m = 1) and
    microkernels for the dtype on this CPU."""
    return w.shape[0] == channels and direct.compiles(w.dtype)


def _lanes(dtype) -> int:
    from .jit import microkernels

    return microkernels.shape_for(dtype).lanes


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What jit/depthwise.blocked_taps computes for one shape: the input's stride and zero padding,
    and per phase of the output (P x Q) its taps in order: which of the kernel's (``taps``, -1 past
    ``counts``) and where each reads (``offsets``, elements of the blocked layout past the window
    origin)."""

    stride: tuple
    pad: tuple
    taps: np.ndarray  # P x Q x T
    offsets: np.ndarray  # P x Q x T
    counts: np.ndarray  # P x Q


def _frozen(*arrays):
    for a in arrays:
        a.flags.writeable = False
    return arrays


@functools.lru_cache(maxsize=None)
def _forward_plan(geom: Geometry, width: int, lanes: int) -> _Plan:
    """The convolution: one phase, every tap (i, j) in order, reading (i*dh, j*dw) past (r*sh, q*sw)."""
    (kh, kw), (dh, dw), padded_width = geom.kernel, geom.dilation, width + 2 * geom.pad[1]
    i, j = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    offsets = ((i * dh * padded_width + j * dw) * lanes).reshape(1, 1, -1)
    taps, offsets, counts = _frozen(np.arange(kh * kw).reshape(1, 1, -1), offsets.astype(np.int64),
                                    np.array([[kh * kw]], np.int64))
    return _Plan(geom.stride, geom.pad, taps, offsets, counts)


def _phase_taps(phase: int, pad: int, stride: int, kernel: int, dilation: int) -> list:
    """[(i, d)]: the kernel rows i (or columns) whose reads land on input rows of ``phase`` (mod the
    stride), with d: input row phase + stride*u is read by top gradient row u + d."""
    return [(i, (phase + pad - i * dilation) // stride) for i in range(kernel)
            if (phase + pad - i * dilation) % stride == 0]


def _border(in_size: int, out_size: int, pad: int, stride: int, kernel: int, dilation: int) -> int:
    """The zeros the top gradient needs on each side so that every phase's reads stay inside it."""
    need = 0
    for phase in range(min(stride, in_size)):
        count = len(range(phase, in_size, stride))
        for _, d in _phase_taps(phase, pad, stride, kernel, dilation):
            need = max(need, -d, count - 1 + d - (out_size - 1))
    return need


@functools.lru_cache(maxsize=None)
def _input_gradient_plan(geom: Geometry, in_hw: tuple, out_hw: tuple, lanes: int) -> _Plan:
    """The input gradient, a convolution of the top gradient per phase of the input (stride_h x
    stride_w of them): input (a + sh*u, b + sw*v) is the sum over the taps (i, j) whose reads land
    there, in order, of w[i, j] times dy[u + di, v + dj], di = (a + ph - i*dh) / sh. The phase
    kernels add the same terms in the same order: the same bits."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geom.kernel, geom.stride, geom.pad, geom.dilation
    border = (_border(in_hw[0], out_hw[0], ph, sh, kh, dh), _border(in_hw[1], out_hw[1], pw, sw, kw, dw))
    padded_width = out_hw[1] + 2 * border[1]
    taps = np.full((sh, sw, kh * kw), -1, np.int64)
    offsets = np.zeros((sh, sw, kh * kw), np.int64)
    counts = np.zeros((sh, sw), np.int64)
    for a in range(sh):
        for b in range(sw):
            pairs = [(i * kw + j, (di + border[0]) * padded_width + dj + border[1])
                     for i, di in _phase_taps(a, ph, sh, kh, dh) for j, dj in _phase_taps(b, pw, sw, kw, dw)]
            counts[a, b] = len(pairs)
            for t, (tap, offset) in enumerate(pairs):
                taps[a, b, t], offsets[a, b, t] = tap, offset * lanes
    return _Plan((1, 1), border, *_frozen(taps, offsets, counts))


def _thread_buffers(scratch, dtype, lanes: int, in_hw, pad, out_hw) -> tuple:
    """The blocked kernels' buffers, one row per thread of numba's pool (get_thread_id() is below its
    size): planes (the input's or the top gradient's cells), the padded input, the output's cells."""
    import numba

    from .scratch import Scratch

    scratch = scratch if scratch is not None else Scratch()
    threads = numba.config.NUMBA_NUM_THREADS
    cells, out_cells = math.prod(in_hw), math.prod(out_hw)
    padded_cells = (in_hw[0] + 2 * pad[0]) * (in_hw[1] + 2 * pad[1])
    return (scratch.get("depthwise_planes", (threads, max(cells, out_cells) * lanes), dtype, np),
            scratch.get("depthwise_padded", (threads, padded_cells * lanes), dtype, np),
            scratch.get("depthwise_sums", (threads, out_cells * lanes), dtype, np), scratch)


def _blocked_taps(x, w, plan: _Plan, out, scratch, channel_map=None):
    """out = jit/depthwise.blocked_taps of x and w by ``plan``, then ``channel_map`` (a
    layers/fusion.ChannelMap over out's channels, or None)."""
    from .jit import depthwise as kernels
    from .jit import microkernels

    compiled = microkernels.kernels_for(x.dtype)
    lanes = compiled.shape.lanes
    *buffers, scratch = _thread_buffers(scratch, x.dtype, lanes, x.shape[2:], plan.pad, out.shape[2:])
    weights = scratch.get("depthwise_weights", (buffers[0].shape[0], plan.taps.size * lanes), x.dtype, np)
    kernels.blocked_taps(x, w, plan.taps, plan.offsets, plan.counts, out, *plan.stride, *plan.pad, lanes,
                         compiled.depthwise, compiled.transpose[0], compiled.shape.widest_depthwise, *buffers,
                         weights, *mapper_arguments(channel_map, x.dtype))


def _blocked_weights(x, dy, geom: Geometry, dw, scratch):
    """dw += the weight gradient by jit/depthwise.blocked_weights: each image's sums over its pixels
    in the element type (as the direct path's and Caffe's products), the images' added in order in
    float64 (the phase kernel sums everything in float64: the two differ by rounding)."""
    from .jit import depthwise as kernels
    from .jit import microkernels

    compiled = microkernels.kernels_for(x.dtype)
    lanes = compiled.shape.lanes
    n, c = x.shape[:2]
    kh, kw = dw.shape[2:]
    blocks = -(-c // lanes)
    *buffers, scratch = _thread_buffers(scratch, x.dtype, lanes, x.shape[2:], geom.pad, dy.shape[2:])
    parts = scratch.get("depthwise_weight_parts", (n, blocks, kh * kw, lanes), x.dtype, np)
    offsets = _forward_plan(geom, x.shape[3], lanes).offsets.reshape(-1)
    kernels.blocked_weights(x, dy, offsets, parts, *geom.stride, *geom.pad, compiled.depthwise_weights,
                            compiled.transpose[0], compiled.shape.depthwise_taps, *buffers)
    total = parts.sum(axis=0, dtype=np.float64)  # blocks x T x lanes, the images in order
    dw.reshape(c, kh * kw)[...] += total.transpose(0, 2, 1).reshape(blocks * lanes, kh * kw)[:c]


def forward_reference(x, w, geom: Geometry, out):
    n, c = x.shape[:2]
    out_sizes = tuple(out.shape[2:])
    y = out.reshape((n, c, -1) + out_sizes)
    xpad = padded(x, geom.pad)
    for k, ((_, idx), tap) in enumerate(zip(offset_slices(geom, out_sizes), _per_channel(w, c))):
        term = xpad[idx][:, :, None] * tap
        if k == 0:
            y[...] = term
        else:
            y += term
    return out


def backward_data_reference(dy, w, geom: Geometry, out):
    xp = backend.get_array_module(dy)
    n, c = out.shape[:2]
    spatial = tuple(out.shape[2:])
    out_sizes = tuple(dy.shape[2:])
    dy5 = dy.reshape((n, c, -1) + out_sizes)
    acc = xp.zeros((n, c) + tuple(s + 2 * p for s, p in zip(spatial, geom.pad)), dy.dtype)
    for (_, idx), tap in zip(offset_slices(geom, out_sizes), _per_channel(w, c)):
        acc[idx] += (dy5 * tap).sum(axis=2)
    out[...] = acc[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(geom.pad, spatial))]
    return out


def backward_weights_reference(x, dy, geom: Geometry, dw):
    n, c = x.shape[:2]
    out_sizes = tuple(dy.shape[2:])
    kh, kw = dw.shape[2:]
    dy5 = dy.reshape((n, c, -1) + out_sizes)
    grad = dw.reshape(c, -1, kh, kw)
    xpad = padded(x, geom.pad)
    for (offs, idx) in offset_slices(geom, out_sizes):
        grad[(slice(None), slice(None)) + offs] += (dy5 * xpad[idx][:, :, None]).sum(axis=(0, 3, 4))
    return dw
