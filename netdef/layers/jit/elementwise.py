"""Element-wise kernels: ReLU, weighted sums (Eltwise SUM, Split's backward), products and maxima of
arrays of one shape (Eltwise PROD and MAX), and Scale's multiply-add broadcast over O x D x I.

Arrays are C-contiguous; the element-wise kernels take them flat (1-D), a tuple ``xs`` holding K
arrays of one size and dtype, and scalars of the arrays' dtype (so float32 arithmetic stays float32, as
in NumPy). A value of an output depends on values at its own position only, except in Scale's
parameter gradients: those are summed in float64 per work item (a fixed cut of the rows, whatever
the thread count) and the items' sums added in a fixed order, so every result is the same bits for
any thread count. Twins: ``elementwise.*_reference``.
"""
from __future__ import annotations

import numpy as np
from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from numba import njit, prange  # noqa: E402 (after the wait policy)

BLOCK = 16384  # elements per work item: 64 KiB of float32, many items per thread on ResNet's layers


@njit(inline="always")
def block_bounds(block, size):
    """[lo, hi) of work item ``block`` over ``size`` elements (shared with jit/fusion.py)."""
    lo = block * BLOCK
    return lo, min(lo + BLOCK, size)


@njit(inline="always")
def block_count(size):
    return (size + BLOCK - 1) // BLOCK


@njit(inline="always")
def channel_block(item, chunks, channels, size):
    """(o, d, chunk, lo, hi) of work item ``item`` over (O x D x I) arrays cut into ``chunks`` blocks
    of I per (o, d) row: row (o, d), its block ``chunk``, elements [lo, hi) (shared with jit/fusion.py)."""
    plane = item // chunks
    chunk = item % chunks
    lo, hi = block_bounds(chunk, size)
    return plane // channels, plane % channels, chunk, lo, hi


# ---------------------------------------------------------------------------------------------- ReLU
# One value in, one out: numba splits the loop over the threads as it likes, which changes no bits.
@njit(nogil=True, parallel=True, cache=True)
def relu_forward(x, negative_slope, y):
    """y = x where x > 0, else negative_slope * x (slope 0: +0 where x <= 0, as NumPy's max(x, 0))."""
    if negative_slope == 0:
        zero = x.dtype.type(0)
        for i in prange(x.shape[0]):
            v = x[i]
            y[i] = zero if v <= 0 else v
    else:
        for i in prange(x.shape[0]):
            v = x[i]
            y[i] = v if v > 0 else v * negative_slope


@njit(inline="always")
def rectified_gradient(g, sign, negative_slope):
    """ReLU's input gradient of one value: g where ``sign`` (its input, or its output for a slope >= 0)
    is > 0, else g * slope (the sum chain's kernel, jit/fusion.py, masks with it too)."""
    return g if sign > 0 else g * negative_slope


@njit(nogil=True, parallel=True, cache=True)
def relu_backward(x, dy, negative_slope, dx):
    for i in prange(x.shape[0]):
        dx[i] = rectified_gradient(dy[i], x[i], negative_slope)


# ---------------------------------------------------------------------------------------------- sums
# Several inputs: a block of each at a time (slices indexed from 0, which LLVM vectorizes; an index
# that numba cannot prove non-negative carries a wrap-around check that stops it).
@njit(inline="always")
def weighted_sum_block(xs, coeffs, lo, hi, out):
    """out = sum_k coeffs[k] * xs[k][lo:hi], added from k = 0 up (``weighted_sum``'s block; the fused
    Eltwise+ReLU of jit/fusion.py sums the same way)."""
    first = xs[0][lo:hi]
    c = coeffs[0]
    for i in range(hi - lo):
        out[i] = c * first[i]
    for k in range(1, len(xs)):
        term = xs[k][lo:hi]
        c = coeffs[k]
        for i in range(hi - lo):
            out[i] += c * term[i]


@njit(nogil=True, parallel=True, cache=True)
def weighted_sum(xs, coeffs, y):
    """y = sum_k coeffs[k] * xs[k], added from k = 0 up."""
    size = y.shape[0]
    for block in prange(block_count(size)):
        lo, hi = block_bounds(block, size)
        weighted_sum_block(xs, coeffs, lo, hi, y[lo:hi])


@njit(nogil=True, parallel=True, cache=True)
def product(xs, y):
    """y = prod_k xs[k], multiplied from k = 0 up."""
    size = y.shape[0]
    for block in prange(block_count(size)):
        lo, hi = block_bounds(block, size)
        out = y[lo:hi]
        first = xs[0][lo:hi]
        for i in range(hi - lo):
            out[i] = first[i]
        for k in range(1, len(xs)):
            term = xs[k][lo:hi]
            for i in range(hi - lo):
                out[i] *= term[i]


@njit(nogil=True, parallel=True, error_model="numpy", cache=True)
def product_gradients(xs, dy, wanted, stable, outs):
    """outs[j] = dy * (the product of every xs[k] but k = wanted[j]). Stable: the inputs before k
    multiplied from the first up, times those after k multiplied from the last down; otherwise the
    product of all of them divided by xs[k] (NaN or inf where xs[k] is 0, as NumPy)."""
    n = len(xs)
    one = dy.dtype.type(1)
    for j in range(len(wanted)):
        k = wanted[j]
        out = outs[j]
        for i in prange(dy.shape[0]):
            if stable:
                before = one
                for m in range(k):
                    before *= xs[m][i]
                after = one
                for m in range(n - 1, k, -1):
                    after *= xs[m][i]
                out[i] = (before * after) * dy[i]
            else:
                every = one
                for m in range(n):
                    every *= xs[m][i]
                out[i] = (every / xs[k][i]) * dy[i]


# ---------------------------------------------------------------------------------------------- maxima
@njit(nogil=True, parallel=True, cache=True)
def maximum(xs, y, mask):
    """y = max_k xs[k], mask = the k it came from: xs[0] only where strictly above xs[1], a later
    input only where strictly above the running maximum (Caffe's ties)."""
    size = y.shape[0]
    for block in prange(block_count(size)):
        lo, hi = block_bounds(block, size)
        out = y[lo:hi]
        arg = mask[lo:hi]
        a = xs[0][lo:hi]
        b = xs[1][lo:hi]
        for i in range(hi - lo):
            first = a[i] > b[i]
            out[i] = a[i] if first else b[i]
            arg[i] = 0 if first else 1
        for k in range(2, len(xs)):
            term = xs[k][lo:hi]
            for i in range(hi - lo):
                if term[i] > out[i]:
                    out[i] = term[i]
                    arg[i] = k


@njit(nogil=True, parallel=True, cache=True)
def maximum_gradients(dy, mask, wanted, outs):
    """outs[j] = dy where mask == wanted[j], else 0 (as dy * 0: NaN stays NaN)."""
    zero = dy.dtype.type(0)
    for j in range(len(wanted)):
        k = wanted[j]
        out = outs[j]
        for i in prange(dy.shape[0]):
            g = dy[i]
            out[i] = g if mask[i] == k else g * zero


# ---------------------------------------------------------------------------------------------- Scale
# Work items: a chunk of at most BLOCK values of one (o, d) row, so that a single row (one scale for
# everything) still spreads over the threads.
@njit(nogil=True, parallel=True, cache=True)
def scale_forward(x, s, b, y):
    """y[o, d, i] = x[o, d, i] * s[d] (+ b[d] unless b is None); x, y (O x D x I)."""
    o_, d_, i_ = x.shape
    chunks = block_count(i_)
    for item in prange(o_ * d_ * chunks):
        o, d, _, lo, hi = channel_block(item, chunks, d_, i_)
        src = x[o, d, lo:hi]
        dst = y[o, d, lo:hi]
        factor = s[d]
        if b is None:
            for i in range(hi - lo):
                dst[i] = src[i] * factor
        else:
            shift = b[d]
            for i in range(hi - lo):
                dst[i] = src[i] * factor + shift


@njit(nogil=True, fastmath={"reassoc"}, cache=True)
def row_sum(row):
    """The sum of a 1-D array in float64 (``reassoc``: in vector lanes, in an order fixed by the
    compiled code, not by the data or the threads)."""
    total = 0.0
    for i in range(row.shape[0]):
        total += row[i]
    return total


@njit(nogil=True, parallel=True, cache=True)
def add_channel_sums(x, out):
    """out[c] += the sum of x[:, c, :] (N x C x S), in float64: the rows of a channel in order, each by
    ``row_sum``, one channel per work item (the same bits for any thread count)."""
    for c in prange(x.shape[1]):
        total = 0.0
        for n in range(x.shape[0]):
            total += row_sum(x[n, c])
        out[c] += total


@njit(nogil=True, fastmath={"reassoc"}, cache=True)
def scale_gradient_sums(x, dy):
    """(sum of dy, sum of dy * x) of one row."""
    total = 0.0
    weighted = 0.0
    for i in range(dy.shape[0]):
        g = np.float64(dy[i])
        total += g
        weighted += g * x[i]
    return total, weighted


@njit(nogil=True, parallel=True, cache=True)
def scale_backward(x, dy, s, dx, sums):
    """sums (2 x D, float64) = per d, the sum over O and I of dy and of dy * x (0 when x is None);
    dx = dy * s[d] unless dx is None. x, dy, dx (O x D x I)."""
    o_, d_, i_ = dy.shape
    chunks = block_count(i_)
    rows = o_ * chunks
    partial = np.zeros((2, rows, d_))
    for item in prange(o_ * d_ * chunks):
        o, d, chunk, lo, hi = channel_block(item, chunks, d_, i_)
        grad = dy[o, d, lo:hi]
        if x is None:
            partial[0, o * chunks + chunk, d] = row_sum(grad)
        else:
            total, weighted = scale_gradient_sums(x[o, d, lo:hi], grad)
            partial[0, o * chunks + chunk, d] = total
            partial[1, o * chunks + chunk, d] = weighted
        if dx is not None:
            out = dx[o, d, lo:hi]
            factor = s[d]
            for i in range(hi - lo):
                out[i] = grad[i] * factor
    for d in prange(d_):
        total = 0.0
        weighted = 0.0
        for r in range(rows):
            total += partial[0, r, d]
            weighted += partial[1, r, d]
        sums[0, d] = total
        sums[1, d] = weighted
