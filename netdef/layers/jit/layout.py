"""Layout changes of the CPU row-product convolution (im2col.py): NCHW blobs to and from its rows-first
layout (H, N, W, C), in parallel over the (h, n) rows.

NumPy copies a transposed array one element at a time on one core, with the innermost axis of one
side strided: for a large layer the output's copy alone took half as long as PyTorch's whole
convolution; compiled here, a small part of that (benchmarks/README.md, "The figures behind the
convolution paths"). Twins: the NumPy expressions
in ``im2col.rows_from_nchw`` / ``im2col.nchw_from_rows``. Also here, with their twins in im2col.py:
the row path's expansion straight from NCHW (``rows_expanded``), its col2im (``row_col2im``), the
sum of its partial products, and the column path's copies between its matrix and NCHW
(``ColumnLayout.gather_into`` / ``scatter``).

Shapes: x (N x C x H x W) and the interior [ph : ph + H, :, pw : pw + W, :] of xb (Hp x N x Wp x C);
y (H x N x W x C) and out (N x C x H x W). All C-contiguous.
"""
from __future__ import annotations

from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402 (after the wait policy)

from .loops import add, copy, fill  # noqa: E402

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
# contiguously: NumPy's transposed copies of large filters, and the weight gradient's transposed
# accumulation, ran one element at a time on one core (benchmarks/README.md, "The figures behind the
# convolution paths").
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


@njit(nogil=True, parallel=True, cache=True)
def expand_rows_from_nchw(x, ph, pw, dh, dw, q):
    """q[h, n, wo, f, j, c] = x[n, c, h + f*dh - ph, wo + j*dw - pw], zero outside x: the row path's
    expanded input (im2col.RowPlan) straight from an NCHW array, q being (Hq x N x W_out x fold x kw x C).
    In one parallel pass: NumPy needed two (NCHW into the padded rows, then the expansion, a strided copy
    on one core)."""
    n_, c_, h_, w_ = x.shape
    hq, _, wo_, fold, kw, _ = q.shape
    for task in prange(hq * n_):
        h = task // n_
        n = task % n_
        # One input row, channel-last inside its zero border: each (wo, j) of q copies C contiguous cells.
        row = np.zeros((w_ + 2 * pw, c_), x.dtype)
        for f in range(fold):
            hh = h + f * dh - ph
            if hh < 0 or hh >= h_:
                for wo in range(wo_):
                    for j in range(kw):
                        fill(q[h, n, wo, f, j], 0)
                continue
            for c in range(c_):
                src = x[n, c, hh]
                for w in range(w_):
                    row[pw + w, c] = src[w]
            for wo in range(wo_):
                for j in range(kw):
                    copy(q[h, n, wo, f, j], row[wo + j * dw])


ADD_BLOCK = 1 << 14


@njit(nogil=True, parallel=True, cache=True)
def accumulate(dst, src):
    """dst += src (1-D, equal sizes), in parallel blocks: the row products' partial sums, which NumPy
    adds on one core (4 x 3.3 MB per forward of CIFAR-10 quick's conv2) while BLAS uses every core."""
    for block in prange((dst.shape[0] + ADD_BLOCK - 1) // ADD_BLOCK):
        start = block * ADD_BLOCK
        stop = min(start + ADD_BLOCK, dst.shape[0])
        add(dst[start:stop], src[start:stop])


# ---- the column path's matrices (im2col.ColumnLayout, 2-D): (R x N x H x width) <-> NCHW planes. NumPy's
# copy of the transposed view (with the bias added) ran one element at a time on one core
# (benchmarks/README.md, "The figures behind the convolution paths"); each plane here is H runs of W
# contiguous cells.
@njit(inline="always")
def _copy_plus(dst, src, value):
    for k in range(dst.shape[0]):
        dst[k] = src[k] + value


@njit(nogil=True, parallel=True, cache=True)
def nchw_from_columns(mat, bias, out):
    """out[n, r, h, w] = mat[r, n, h, w] + bias[r] for w < out's W (``mat``'s other columns are not
    outputs). Without a bias term the caller passes zeros: the add costs nothing beside the copy."""
    n_, r_, h_, w_ = out.shape
    for task in prange(n_ * r_):
        for h in range(h_):
            _copy_plus(out[task // r_, task % r_, h], mat[task % r_, task // r_, h, :w_], bias[task % r_])


@njit(nogil=True, parallel=True, cache=True)
def columns_from_nchw(values, mat):
    """mat[r, n, h, w] = values[n, r, h, w] for w < values' W (``mat``'s other columns are left as they are)."""
    n_, r_, h_, w_ = values.shape
    for task in prange(n_ * r_):
        for h in range(h_):
            copy(mat[task % r_, task // r_, h, :w_], values[task // r_, task % r_, h])


# ---- col2im from the rows-first layout: the input gradient of a convolution that shrinks its map
# (LeNet's conv2: 12 x 12 -> 8 x 8), where the full convolution of the padded top gradient would cost
# prod(input) / prod(output) = 2.25 times the multiply-adds of dcols = dY W and this sum.
@njit(nogil=True, parallel=True, cache=True)
def col2im_rows(dcols, ph, pw, dh, dw, out):
    """out[n, c, h, w] = sum over (i, j), in row-major order, of dcols[ho, n, wo, i, j, c] with
    h = ho + i*dh - ph and w = wo + j*dw - pw; dcols is (Ho x N x Wo x kh x kw x C), out (N x C x H x W)."""
    ho_, n_, wo_, kh, kw, c_ = dcols.shape
    h_, w_ = out.shape[2], out.shape[3]
    for task in prange(h_ * n_):
        h = task // n_
        n = task % n_
        acc = np.zeros((w_, c_), dcols.dtype)
        for i in range(kh):
            ho = h + ph - i * dh
            if ho < 0 or ho >= ho_:
                continue
            for j in range(kw):
                for wo in range(wo_):
                    w = wo + j * dw - pw
                    if w < 0 or w >= w_:
                        continue
                    dst = acc[w]
                    src = dcols[ho, n, wo, i, j]
                    for c in range(c_):
                        dst[c] += src[c]
        for c in range(c_):
            dst_row = out[n, c, h]
            for w in range(w_):
                dst_row[w] = acc[w, c]


# ---- strided 1x1 convolutions (layers/convolution/pointwise.py): the pixels a stride picks, and the
# input gradient spread back over the whole map. NumPy's copy of x[:, :, ::2, ::2] ran on one core
# (benchmarks/README.md, "The figures behind the convolution paths"). Twins: ``im2col.strided_pixels``
# and ``im2col.spread_strided``.
@njit(nogil=True, parallel=True, cache=True)
def pick_strided(x, out, stride_h, stride_w):
    """out[n, c, i, j] = x[n, c, i * stride_h, j * stride_w]; x (N x C x H x W), out (N x C x Ho x Wo)."""
    n_, c_, ho, wo = out.shape
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        for i in range(ho):
            src = x[n, c, i * stride_h]
            dst = out[n, c, i]
            for j in range(wo):
                dst[j] = src[j * stride_w]


@njit(nogil=True, parallel=True, cache=True)
def spread_strided(small, out, stride_h, stride_w):
    """out[n, c, i * stride_h, j * stride_w] = small[n, c, i, j], every other element of out 0."""
    n_, c_, h_, w_ = out.shape
    ho, wo = small.shape[2], small.shape[3]
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        for h in range(h_):
            row = out[n, c, h]
            fill(row, 0)
            if h % stride_h == 0 and h // stride_h < ho:
                src = small[n, c, h // stride_h]
                for j in range(wo):
                    row[j * stride_w] = src[j]
