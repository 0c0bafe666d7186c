"""Parallel drivers of the direct convolution's microkernels (jit/microkernels.py), and its layout passes.

Blocked layouts (``block`` = the kernels' channels per block, trailing channels of the last block zero):
- packed weights wb (G x B x T x block): wb[g, b, t, c] = w[g*Og + b*block + c, t], t = (ci, i, j) in
  row-major order over the group's input channels and the kernel;
- blocked outputs and top gradients (N x G x B x H x W x block): pixel-major, a block's channels
  contiguous, what the kernels read and write with one vector load per pixel.

The padded input xp (N x C x Hp x Wp) is read through a table of tap offsets (within one group's
channels): off[t] = ci*Hp*Wp + i*dh*Wp + j*dw. A row of output pixels is cut into near-equal spans of
at most ``widest``, a group's taps likewise for the weight gradient; work is split over output rows
(forward) or tap spans (weight gradient), never over a sum, so the threads never change a result.
"""
from __future__ import annotations

from ...threads import let_idle_kernel_threads_sleep

let_idle_kernel_threads_sleep()  # before numba starts its thread pool

import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit, prange, types  # noqa: E402 (after the wait policy)
from numba.extending import intrinsic  # noqa: E402

OPTIONS = dict(nogil=True, cache=True)
I64 = ir.IntType(64)


def _signature_and_call(arity: int):
    """The signature (address, then ``arity`` i64 arguments) and the code of a call to a kernel address."""

    def codegen(context, builder, signature, values):
        function = builder.inttoptr(values[0], ir.FunctionType(ir.VoidType(), [I64] * arity).as_pointer())
        builder.call(function, list(values[1:]))
        return context.get_dummy_value()

    return types.void(*([types.int64] * (arity + 1))), codegen


# numba's intrinsics take no *args: one per arity the kernels have.
@intrinsic
def _call6(typingctx, address, a, b, c, d, e, f):
    return _signature_and_call(6)


@intrinsic
def _call9(typingctx, address, a, b, c, d, e, f, g, h, i):
    return _signature_and_call(9)


@njit(inline="always")
def _span(k, count, total):
    """Start and stop of span ``k`` of ``count`` near-equal spans of ``total``."""
    return k * total // count, (k + 1) * total // count


@njit(inline="always")
def _addresses(a, b, c, d):
    """The data addresses of four arrays, as the kernels take them."""
    return np.int64(a.ctypes.data), np.int64(b.ctypes.data), np.int64(c.ctypes.data), np.int64(d.ctypes.data)


@njit(parallel=True, **OPTIONS)
def taps(xp, wb, off, out, kernels, stride_h, stride_w, widest):
    """out (N x G x B x Ho x Wo x block) = the convolution of the padded xp with the packed weights."""
    n_, c_, hp, wp = xp.shape
    g_, b_, t_, block = wb.shape
    ho, wo = out.shape[3], out.shape[4]
    group_channels = c_ // g_
    size = xp.itemsize
    spans = (wo + widest - 1) // widest
    x0, w0, y0, o0 = _addresses(xp, wb, out, off)
    for row in prange(n_ * ho):
        n = row // ho
        h = row % ho
        for g in range(g_):
            x_row = x0 + size * (((n * c_ + g * group_channels) * hp + h * stride_h) * wp)
            for b in range(b_):
                w_block = w0 + size * ((g * b_ + b) * t_ * block)
                y_row = y0 + size * ((((n * g_ + g) * b_ + b) * ho + h) * wo * block)
                for k in range(spans):
                    start, stop = _span(k, spans, wo)
                    _call6(kernels[stop - start - 1], x_row + size * start * stride_w, w_block,
                           y_row + size * start * block, o0, np.int64(t_), np.int64(stride_w))


@njit(parallel=True, **OPTIONS)
def pixels(xp, dyb, off, dwb, kernels, stride_h, stride_w, widest, chunk):
    """dwb (G x B x T x block) += the weight gradient from the padded xp and the blocked top gradient."""
    n_, c_, hp, wp = xp.shape
    g_, b_, t_, block = dwb.shape
    ho, wo = dyb.shape[3], dyb.shape[4]
    group_channels = c_ // g_
    size = xp.itemsize
    spans = (t_ + widest - 1) // widest
    x0, d0, w0, o0 = _addresses(xp, dyb, dwb, off)
    tasks = g_ * b_ * spans
    # Images in chunks: the chunk's inputs and gradients stay in cache while every task reads them.
    for n_start in range(0, n_, chunk):
        n_stop = min(n_, n_start + chunk)
        for task in prange(tasks):
            g = task // (b_ * spans)
            b = (task // spans) % b_
            start, stop = _span(task % spans, spans, t_)
            for n in range(n_start, n_stop):
                _call9(kernels[stop - start - 1],
                       x0 + size * ((n * c_ + g * group_channels) * hp * wp),
                       d0 + size * (((n * g_ + g) * b_ + b) * ho * wo * block),
                       w0 + size * (((g * b_ + b) * t_ + start) * block),
                       o0 + 8 * start, np.int64(ho), np.int64(wo), np.int64(stride_w),
                       np.int64(stride_h * wp), np.int64(wo * block))


@njit(parallel=True, **OPTIONS)
def pad(x, out, pad_h, pad_w):
    """out (N x C x Hp x Wp) = x (N x C x H x W) with a border of zeros, pad_h above, pad_w left."""
    n_, c_, h_, w_ = x.shape
    hp, wp = out.shape[2], out.shape[3]
    for plane in prange(n_ * c_):
        n = plane // c_
        c = plane % c_
        for r in range(hp):
            row = out[n, c, r]
            src = r - pad_h
            if src < 0 or src >= h_:
                for q in range(wp):
                    row[q] = 0
                continue
            line = x[n, c, src]
            for q in range(pad_w):
                row[q] = 0
            for q in range(w_):
                row[pad_w + q] = line[q]
            for q in range(pad_w + w_, wp):
                row[q] = 0


@njit(parallel=True, **OPTIONS)
def to_blocks(y, out):
    """out (N x G x B x H x W x block) from y (N x G*Og x H x W); channels past Og are zero."""
    n_, g_, b_, h_, w_, block = out.shape
    per_group = y.shape[1] // g_
    for item in prange(n_ * g_ * b_):
        n = item // (g_ * b_)
        g = (item // b_) % g_
        b = item % b_
        dst = out[n, g, b]
        for c in range(block):
            channel = b * block + c
            if channel < per_group:
                src = y[n, g * per_group + channel]
                for r in range(h_):
                    for q in range(w_):
                        dst[r, q, c] = src[r, q]
            else:
                for r in range(h_):
                    for q in range(w_):
                        dst[r, q, c] = 0


@njit(parallel=True, **OPTIONS)
def from_blocks(blocked, bias, y):
    """y (N x G*Og x H x W) = the blocked (N x G x B x H x W x block) plus bias[channel] (if bias.size)."""
    n_, g_, b_, h_, w_, block = blocked.shape
    per_group = y.shape[1] // g_
    with_bias = bias.shape[0] > 0
    for item in prange(n_ * g_ * b_):
        n = item // (g_ * b_)
        g = (item // b_) % g_
        b = item % b_
        src = blocked[n, g, b]
        for c in range(min(block, per_group - b * block)):
            channel = g * per_group + b * block + c
            dst = y[n, channel]
            shift = bias[channel] if with_bias else 0
            for r in range(h_):
                for q in range(w_):
                    dst[r, q] = src[r, q, c] + shift
