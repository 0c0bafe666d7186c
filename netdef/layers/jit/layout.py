"""Layout changes of the CPU row-product convolution (im2col.py): NCHW blobs to and from its rows-first
layout (H, N, W, C), in parallel over the (h, n) rows.

NumPy copies a transposed array one element at a time on one core, with the innermost axis of one
side strided: for VGG-16's conv1_2 (batch 2, 64 channels of 224 x 224) the output's (H, N, W, O) to
NCHW copy took 60 ms and the input's copy into the padded rows 18 ms, against 113 ms for PyTorch's
whole convolution (one thread each); here they take 5-8 ms and 3-4 ms. Twins: the NumPy expressions
in ``im2col.rows_from_nchw`` / ``im2col.nchw_from_rows``.

Shapes: x (N x C x H x W) and the interior [ph : ph + H, :, pw : pw + W, :] of xb (Hp x N x Wp x C);
y (H x N x W x C) and out (N x C x H x W). All C-contiguous.
"""
from __future__ import annotations

from ...threads import let_idle_kernel_threads_sleep

let_idle_kernel_threads_sleep()  # before numba starts its thread pool

from numba import njit, prange  # noqa: E402 (after the wait policy)

COLUMN_BLOCK = 16


@njit(nogil=True, parallel=True, cache=True)
def rows_from_nchw(x, xb, ph, pw):
    """xb[h + ph, n, w + pw, c] = x[n, c, h, w] (xb's border is left as it is)."""
    n_, c_, h_, w_ = x.shape
    for task in prange(h_ * n_):
        h = task // n_
        n = task % n_
        dst = xb[h + ph, n, pw:pw + w_]  # (W x C)
        # In column blocks, so that the block's destination rows stay in cache while every channel
        # writes into them (one channel at a time over all W touched W cache lines per channel).
        for w0 in range(0, w_, COLUMN_BLOCK):
            w1 = min(w0 + COLUMN_BLOCK, w_)
            for c in range(c_):
                src = x[n, c, h]
                for w in range(w0, w1):
                    dst[w, c] = src[w]


@njit(nogil=True, parallel=True, cache=True)
def nchw_from_rows(y, out):
    """out[n, c, h, w] = y[h, n, w, c]."""
    h_, n_, w_, c_ = y.shape
    for task in prange(h_ * n_):
        h = task // n_
        n = task % n_
        src = y[h, n]  # (W x C)
        for c in range(c_):
            dst = out[n, c, h]
            for w in range(w_):
                dst[w] = src[w, c]


@njit(nogil=True, parallel=True, cache=True)
def nchw_from_rows_plus_bias(y, bias, out):
    """out[n, c, h, w] = y[h, n, w, c] + bias[c]."""
    h_, n_, w_, c_ = y.shape
    for task in prange(h_ * n_):
        h = task // n_
        n = task % n_
        src = y[h, n]
        for c in range(c_):
            dst = out[n, c, h]
            b = bias[c]
            for w in range(w_):
                dst[w] = src[w, c] + b


# ---- weights: (A x B x kh x kw) <-> (kh x kw x B x A), A (output channels) in blocks of COLUMN_BLOCK
# so that each block's writes (or reads) on the A side are one cache line while the other side runs
# contiguously. NumPy's transposed copies of VGG's 512 x 512 x 3 x 3 filters took 6 ms each, and the
# weight gradient's transposed accumulation 10 ms, per layer and iteration.
@njit(nogil=True, parallel=True, cache=True)
def weights_to_rows(w, out):
    """out[i, j, b, a] = w[a, b, i, j]; ``w`` may be any strided view (flipped, transposed)."""
    a_, b_, kh, kw = w.shape
    for block in prange((a_ + COLUMN_BLOCK - 1) // COLUMN_BLOCK):
        a0 = block * COLUMN_BLOCK
        a1 = min(a0 + COLUMN_BLOCK, a_)
        for b in range(b_):
            for i in range(kh):
                for j in range(kw):
                    dst = out[i, j, b]
                    for a in range(a0, a1):
                        dst[a] = w[a, b, i, j]


@njit(nogil=True, parallel=True, cache=True)
def add_weights_from_rows(rows, grad):
    """grad[a, b, i, j] += rows[i, j, b, a]."""
    kh, kw, b_, a_ = rows.shape
    for block in prange((a_ + COLUMN_BLOCK - 1) // COLUMN_BLOCK):
        a0 = block * COLUMN_BLOCK
        a1 = min(a0 + COLUMN_BLOCK, a_)
        for b in range(b_):
            for i in range(kh):
                for j in range(kw):
                    src = rows[i, j, b]
                    for a in range(a0, a1):
                        grad[a, b, i, j] += src[a]
