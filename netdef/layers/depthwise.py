"""Depthwise 2-D convolution (group == input channels): each output channel filters one input channel.

A column matrix would hold kh*kw rows per channel for products of one row each (per group), so neither
im2col nor a per-group loop is used. The convolution is a sum over the kh*kw taps of shifted views of
the input, each times one weight per channel:

    y[n, o] = sum_{i, j} w[o, 0, i, j] * x_pad[n, o // m, i*dh : ... : sh, j*dw : ... : sw]

(m = num_output / C, the channel multiplier). On NumPy arrays the compiled kernels in jit/depthwise.py
compute it in one parallel pass; the ``*_reference`` functions here are their twins, written against
the array module (one array operation per tap, never a loop over channels or samples): what CuPy
arrays run and what the tests compare the kernels with.

Shapes: x, dx (N x C x H x W); w, dw (C*m x 1 x kh x kw); y, dy (N x C*m x H_out x W_out).
"""
from __future__ import annotations

from .. import backend
from . import jit
from .im2col import Geometry, offset_slices, padded


def _geometry_args(geom: Geometry) -> tuple:
    return geom.stride + geom.pad + geom.dilation


def _per_channel(w, c: int):
    """w (C*m x 1 x kh x kw) as (1 x C x m x 1 x 1) factors per tap: a list over taps in row-major order."""
    kh, kw = w.shape[2:]
    w5 = w.reshape(c, -1, kh, kw)
    return [w5[:, :, i, j][None, :, :, None, None] for i in range(kh) for j in range(kw)]


def forward(x, w, geom: Geometry, out):
    """Writes the depthwise convolution of ``x`` with ``w`` (no bias) into ``out``."""
    if jit.usable(x, w, out):
        from .jit import depthwise as kernels

        kernels.forward(x, w, out, *_geometry_args(geom))
        return out
    return forward_reference(x, w, geom, out)


def backward_data(dy, w, geom: Geometry, out):
    """Writes the input gradient of the depthwise convolution into ``out`` (N x C x H x W)."""
    if jit.usable(dy, w, out):
        from .jit import depthwise as kernels

        kernels.backward_data(dy, w, out, *_geometry_args(geom))
        return out
    return backward_data_reference(dy, w, geom, out)


def backward_weights(x, dy, geom: Geometry, dw):
    """Adds the weight gradient of the depthwise convolution to ``dw`` (C*m x 1 x kh x kw)."""
    if jit.usable(x, dy, dw):
        from .jit import depthwise as kernels

        kernels.backward_weights(x, dy, dw, *_geometry_args(geom))
        return dw
    return backward_weights_reference(x, dy, geom, dw)


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
