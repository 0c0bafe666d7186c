"""Depthwise 2-D convolution (group == input channels): each output channel filters one input channel.

A column matrix would hold kh*kw rows per channel for products of one row each (per group), so neither
im2col nor a per-group loop is used. The convolution is a sum over the kh*kw taps of shifted views of
the input, each times one weight per channel:

    y[n, o] = sum_{i, j} w[o, 0, i, j] * x_pad[n, o // m, i*dh : ... : sh, j*dw : ... : sw]

(m = num_output / C, the channel multiplier). On NumPy arrays the compiled kernels in jit/depthwise.py
compute it in one parallel pass: with m = 1, where the microkernels compile, over blocks of channels
laid out pixel-major (``blocked_taps``; also the input gradient at stride 1, as the forward of the
top gradient with the taps' offsets reversed; ``blocked_weights`` the weight gradient), otherwise
over each plane's stride phases; the ``*_reference`` functions here are their twins, written against
the array module (one array operation per tap, never a loop over channels or samples): what CuPy
arrays run and what the tests compare the kernels with.

Shapes: x, dx (N x C x H x W); w, dw (C*m x 1 x kh x kw); y, dy (N x C*m x H_out x W_out).
"""
from __future__ import annotations

import functools

import numpy as np

from .. import backend
from . import direct, jit
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
            offsets = _tap_offsets(geom.kernel, geom.dilation, x.shape[3] + 2 * geom.pad[1], _lanes(x.dtype), False)
            _blocked_taps(x, w, offsets, out, geom.stride, geom.pad, scratch)
            return out
        from .jit import depthwise as kernels

        kernels.forward(x, w, out, *_geometry_args(geom))
        return out
    return forward_reference(x, w, geom, out)


def backward_data(dy, w, geom: Geometry, out, scratch=None):
    """Writes the input gradient of the depthwise convolution into ``out`` (N x C x H x W)."""
    if jit.usable(dy, w, out):
        back_pad = tuple(e - 1 - p for p, e in zip(geom.pad, geom.extent))
        if _blocked(out.shape[1], w) and geom.stride == (1, 1) and min(back_pad) >= 0:
            # The forward of the top gradient padded by extent - 1 - pad, tap (i, j) reading where
            # the flipped filter's would: (kh-1-i, kw-1-j). In the taps' own order, so each input
            # gradient is the phase kernel's sum (every tap's share added in order, from zero).
            offsets = _tap_offsets(geom.kernel, geom.dilation, dy.shape[3] + 2 * back_pad[1], _lanes(dy.dtype), True)
            _blocked_taps(dy, w, offsets, out, (1, 1), back_pad, scratch)
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


@functools.lru_cache(maxsize=None)
def _tap_offsets(kernel, dilation, padded_width: int, lanes: int, flipped: bool) -> np.ndarray:
    """Where tap (i, j) reads, in elements of the blocked layout past an output's window origin:
    (i*dh*Wp + j*dw) * lanes, or with ``flipped`` the tap (kh-1-i, kw-1-j)'s place."""
    (kh, kw), (dh, dw) = kernel, dilation
    i, j = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    if flipped:
        i, j = kh - 1 - i, kw - 1 - j
    offsets = ((i * dh * padded_width + j * dw) * lanes).reshape(-1).astype(np.int64)
    offsets.flags.writeable = False
    return offsets


def _blocked_taps(x, w, offsets, out, stride, pad, scratch):
    """out = jit/depthwise.blocked_taps of x (padded by ``pad``) and w's taps per block of channels."""
    import numba

    from .jit import depthwise as kernels
    from .jit import microkernels
    from .scratch import Scratch

    compiled = microkernels.kernels_for(x.dtype)
    lanes = compiled.shape.lanes
    c, taps = w.shape[0], w.shape[2] * w.shape[3]
    blocks = -(-c // lanes)
    weights = np.zeros((blocks * lanes, taps), x.dtype)
    weights[:c] = w.reshape(c, taps)
    weights = np.ascontiguousarray(weights.reshape(blocks, lanes, taps).transpose(0, 2, 1))
    scratch = scratch if scratch is not None else Scratch()
    threads = numba.config.NUMBA_NUM_THREADS  # numba's pool: get_thread_id() is below it
    (h, wd), (ho, wo) = x.shape[2:], out.shape[2:]
    padded_cells = (h + 2 * pad[0]) * (wd + 2 * pad[1])
    planes = scratch.get("depthwise_planes", (threads, h * wd * lanes), x.dtype, np)
    padded_blocks = scratch.get("depthwise_padded", (threads, padded_cells * lanes), x.dtype, np)
    sums = scratch.get("depthwise_sums", (threads, ho * wo * lanes), x.dtype, np)
    kernels.blocked_taps(x, weights, offsets, out, *stride, *pad, compiled.depthwise, compiled.transpose[0],
                         compiled.shape.widest_depthwise, planes, padded_blocks, sums)


def _blocked_weights(x, dy, geom: Geometry, dw, scratch):
    """dw += the weight gradient by jit/depthwise.blocked_weights: each image's sums over its pixels
    in the element type (as the direct path's and Caffe's products), the images' added in order in
    float64 (the phase kernel sums everything in float64: the two differ by rounding)."""
    import numba

    from .jit import depthwise as kernels
    from .jit import microkernels
    from .scratch import Scratch

    compiled = microkernels.kernels_for(x.dtype)
    lanes = compiled.shape.lanes
    n, c = x.shape[:2]
    kh, kw = dw.shape[2:]
    blocks = -(-c // lanes)
    scratch = scratch if scratch is not None else Scratch()
    threads = numba.config.NUMBA_NUM_THREADS  # numba's pool: get_thread_id() is below it
    (h, wd), (ho, wo) = x.shape[2:], dy.shape[2:]
    (ph, pw) = geom.pad
    planes = scratch.get("depthwise_planes", (threads, max(h * wd, ho * wo) * lanes), x.dtype, np)
    padded_blocks = scratch.get("depthwise_padded", (threads, (h + 2 * ph) * (wd + 2 * pw) * lanes), x.dtype, np)
    gradients = scratch.get("depthwise_sums", (threads, ho * wo * lanes), x.dtype, np)
    parts = scratch.get("depthwise_weight_parts", (n, blocks, kh * kw, lanes), x.dtype, np)
    offsets = _tap_offsets(geom.kernel, geom.dilation, wd + 2 * pw, lanes, False)
    kernels.blocked_weights(x, dy, offsets, parts, *geom.stride, ph, pw, compiled.depthwise_weights,
                            compiled.transpose[0], compiled.shape.depthwise_taps, planes, padded_blocks, gradients)
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
