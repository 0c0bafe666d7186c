"""Depthwise 2-D convolution kernels: one parallel pass over the planes, the kh*kw taps in registers.

Shapes: x (N x C x H x W), w (C*m x 1 x kh x kw) (m: channel multiplier; output channel o reads input
channel o // m), y (N x C*m x H_out x W_out); all C-contiguous. Geometry as Caffe: input row
h = ho * stride_h - pad_h + i * dilation_h for tap row i (likewise columns); taps that fall in the
padding are skipped. Twins: ``depthwise.forward_reference``, ``backward_data_reference``,
``backward_weights_reference``.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(inline="always")
def _span(size_in, size_out, stride, pad, offset):
    """Output positions [lo, hi) whose input position o * stride - pad + offset lies in [0, size_in)."""
    lo = 0
    if pad - offset > 0:
        lo = (pad - offset + stride - 1) // stride
    hi = (size_in - 1 + pad - offset) // stride + 1
    if hi > size_out:
        hi = size_out
    if hi < lo:
        hi = lo
    return lo, hi


@njit(parallel=True, cache=True)
def forward(x, w, y, sh, sw, ph, pw, dh, dw):
    n_, c_, h_, w_ = x.shape
    o_, _, kh, kw = w.shape
    m = o_ // c_
    ho_, wo_ = y.shape[2], y.shape[3]
    for plane in prange(n_ * o_):
        n = plane // o_
        o = plane % o_
        c = o // m
        yp = y[n, o]
        xp = x[n, c]
        yp[:, :] = 0
        for i in range(kh):
            r0, r1 = _span(h_, ho_, sh, ph, i * dh)
            for j in range(kw):
                c0, c1 = _span(w_, wo_, sw, pw, j * dw)
                tap = w[o, 0, i, j]
                for r in range(r0, r1):
                    src = xp[r * sh - ph + i * dh]
                    dst = yp[r]
                    for col in range(c0, c1):
                        dst[col] += tap * src[col * sw - pw + j * dw]


@njit(parallel=True, cache=True)
def backward_data(dy, w, dx, sh, sw, ph, pw, dh, dw):
    n_, c_, h_, w_ = dx.shape
    o_, _, kh, kw = w.shape
    m = o_ // c_
    ho_, wo_ = dy.shape[2], dy.shape[3]
    for plane in prange(n_ * c_):
        n = plane // c_
        c = plane % c_
        dxp = dx[n, c]
        dxp[:, :] = 0
        for o in range(c * m, c * m + m):
            dyp = dy[n, o]
            for i in range(kh):
                r0, r1 = _span(h_, ho_, sh, ph, i * dh)
                for j in range(kw):
                    c0, c1 = _span(w_, wo_, sw, pw, j * dw)
                    tap = w[o, 0, i, j]
                    for r in range(r0, r1):
                        src = dyp[r]
                        dst = dxp[r * sh - ph + i * dh]
                        for col in range(c0, c1):
                            dst[col * sw - pw + j * dw] += tap * src[col]


@njit(parallel=True, cache=True)
def backward_weights(x, dy, dw_out, sh, sw, ph, pw, dh, dw):
    """dw_out (C*m x 1 x kh x kw) += the weight gradient (accumulated in float64 per output channel)."""
    n_, c_, h_, w_ = x.shape
    o_, _, kh, kw = dw_out.shape
    m = o_ // c_
    ho_, wo_ = dy.shape[2], dy.shape[3]
    for o in prange(o_):
        c = o // m
        total = np.zeros((kh, kw))
        for n in range(n_):
            xp = x[n, c]
            dyp = dy[n, o]
            for i in range(kh):
                r0, r1 = _span(h_, ho_, sh, ph, i * dh)
                for j in range(kw):
                    c0, c1 = _span(w_, wo_, sw, pw, j * dw)
                    for r in range(r0, r1):
                        src = xp[r * sh - ph + i * dh]
                        grad = dyp[r]
                        row = 0.0
                        for col in range(c0, c1):
                            row += grad[col] * src[col * sw - pw + j * dw]
                        total[i, j] += row
        for i in range(kh):
            for j in range(kw):
                dw_out[o, 0, i, j] += total[i, j]
