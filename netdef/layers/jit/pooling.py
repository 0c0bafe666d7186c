"""2-D MAX and AVE pooling kernels: one parallel pass over the (sample, channel) planes.

Shapes: x, dx (P x H x W), y, dy, mask (P x H_out x W_out) (P = N*C planes); all C-contiguous, mask
int32. Semantics as Caffe's (and the twins ``vision.max_pool_forward`` ... ``ave_pool_backward``):
output (r, c) pools the input rows [r*sh - ph, + kh) and columns [c*sw - pw, + kw). MAX: from
-FLT_MAX, a cell wins by strict > in row-major window order (so NaN never wins, and a window of only
padding, -inf or NaN gives -FLT_MAX), the mask holding the winner's flat index h*W + w (-1: none).
AVE: the sum over the window's input cells over the window clipped to [-pad, size + pad).

The window is separable: the kernels pool each plane in two stages, each a few long vector loops.
The plane is first copied into a padded copy (the padding reads -inf, never > -FLT_MAX, or 0) whose
rows are grouped by row stride phase (rows u = a + sh*t of phase a together) and split by column
stride phase (columns sw*c + b of phase b together; stride 2: one pass over the whole copy, by
shuffles), each phase Wq columns wide. Then:

- across: offset j of every padded row's windows reads column phase j % sw from column j // sw on,
  one loop over all rows at once (the last Wq - W_out results of a row are computed and dropped);
- down: offset i of every output reads the across results of row phase i % sh from row i // sh on,
  one loop over all outputs in wide rows (Wq per output row).

MAX keeps the first maximum of each stage (strict >): that is the first maximum in row-major window
order. AVE's sums are associated by rows (the twins' sum in row-major order: rounding differs).
AVE's gradient runs the stages backwards (down, across, then the phases back into the plane); MAX's
adds each top diff to its mask's cell, outputs in row-major order, as Caffe's CPU loop. Windows too
large for the stages to pay (global pooling) loop over each output's clipped window as Caffe does.

Every plane is computed by one thread in a fixed order (overlapping windows, 3x3 at stride 2, need
no atomics): the results are the same bits whatever the thread count. The threads share blocks of
planes; a block allocates its scratch once and writes the padding once (its planes fill the same
interior cells). Where things start in the scratch is computed once per call: an integer division
costs as much as copying a row.

One thread runs these in a fraction of the NumPy twins' time, backward most of all (benchmarks/README.md,
"The figures behind the other layers' choices").
"""
from __future__ import annotations

import numpy as np
from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from numba import njit, prange  # noqa: E402 (after the wait policy)

from .loops import ERRORS, add, block_range, blocks, copy, fill

LOWEST = -float(np.finfo(np.float32).max)  # Caffe's start for every max (float and double)
SCALAR_COST = 4  # the per-window loop's cost per cell against the stages' vector loops


# ---------------------------------------------------------------- geometry
@njit(inline="always")
def _layout(h_, w_, ho_, wo_, kh, kw, sh, sw, ph, pw):
    """(rows, Wq) of the padded copy: rows per row phase, columns per column phase. They hold every
    padded cell and every cell a window reads (ceil-rounded windows run past the padding)."""
    rows = max((h_ + 2 * ph + sh - 1) // sh, ho_ + (kh - 1) // sh)
    wq = max((w_ + 2 * pw + sw - 1) // sw, wo_ - 1 + (kw + sw - 1) // sw)
    return rows, wq


@njit(inline="always")
def _staged(ho_, wo_, kh, kw, sh, rows, wq):
    """Whether the two stages cost less than one loop per output window."""
    return sh * rows * wq * kw + ho_ * wq * kh <= SCALAR_COST * ho_ * wo_ * kh * kw


@njit(inline="always")
def _starts(h_, kh, kw, sh, sw, ph, pw, rows, wq):
    """(where each input row's first cell goes in the padded copy, where offset j's across reads
    start in the column phases, where offset i's down reads start in the across results)."""
    rows_at = np.empty(h_, np.int64)
    for h in range(h_):
        u = h + ph
        rows_at[h] = ((u % sh) * rows + u // sh) * wq * sw + pw
    across_at = np.empty(kw, np.int64)
    for j in range(kw):
        across_at[j] = (j % sw) * sh * rows * wq + j // sw
    down_at = np.empty(kh, np.int64)
    for i in range(kh):
        down_at[i] = ((i % sh) * rows + i // sh) * wq
    return rows_at, across_at, down_at


@njit(nogil=True, cache=True)  # not inlined: the parallel kernels' array analysis trips over its tuple of arrays
def _plan(h_, w_, ho_, wo_, kh, kw, sh, sw, ph, pw):
    """What one call needs: (Wq, whether the stages pay, _starts, cells per column phase, AVE's
    (row divisors, column divisors))."""
    rows, wq = _layout(h_, w_, ho_, wo_, kh, kw, sh, sw, ph, pw)
    sizes = (_divisors(ho_, kh, sh, ph, h_), _divisors(wo_, kw, sw, pw, w_))
    return (wq, _staged(ho_, wo_, kh, kw, sh, rows, wq), _starts(h_, kh, kw, sh, sw, ph, pw, rows, wq),
            sh * rows * wq, sizes)


@njit(inline="always")
def _window(start, k, pad, size):
    """(first, stop) of the window [start, start + k) clipped to the input [0, size), and its
    size clipped to the padded input [-pad, size + pad) (AVE's divisor)."""
    stop = min(start + k, size + pad)
    return max(start, 0), min(stop, size), stop - start


@njit(inline="always")
def _divisors(out, k, s, pad, size):
    """AVE's divisor along one axis: each window's size clipped to the padded input."""
    sizes = np.empty(out, np.float64)
    for o in range(out):
        sizes[o] = _window(o * s - pad, k, pad, size)[2]
    return sizes


# ---------------------------------------------------------------- the padded copy and its phases
@njit(inline="always")
def _gather(dst, src, step):
    """dst[k] = src[step*k] (unsigned indices: numba checks signed ones for wrap-around)."""
    s = np.uint64(step)
    for k in range(dst.shape[0]):
        dst[k] = src[s * np.uint64(k)]


@njit(inline="always")
def _spread(dst, src, step):
    """dst[step*k] = src[k]."""
    s = np.uint64(step)
    for k in range(src.shape[0]):
        dst[s * np.uint64(k)] = src[k]


@njit(inline="always")
def _deinterleave(even, odd, src):
    """even[k] = src[2k], odd[k] = src[2k + 1]: one pass, vectorized by shuffles."""
    two = np.uint64(2)
    for k in range(even.shape[0]):
        i = two * np.uint64(k)
        even[k] = src[i]
        odd[k] = src[i + np.uint64(1)]


@njit(inline="always")
def _interleave(dst, even, odd):
    two = np.uint64(2)
    for k in range(even.shape[0]):
        i = two * np.uint64(k)
        dst[i] = even[k]
        dst[i + np.uint64(1)] = odd[k]


@njit(inline="always")
def _scratch(sw, kw, block, value, dtype):
    """(padded copy, its column phases) of one block of planes, filled with ``value`` (the padding's);
    the phases are the copy itself for stride 1. Both hold (kw - 1) // sw cells of slack for the
    reads of the last wide row past its end."""
    slack = (kw - 1) // sw
    padded = np.full(sw * block + slack, value, dtype)
    phases = padded if sw == 1 else np.full(sw * block + slack, value, dtype)
    return padded, phases


@njit(inline="always")
def _split_plane(plane, rows_at, sw, block, padded, phases):
    """The plane into the padded copy (the padding cells are left as they are), and that into its
    column phases: phases[b*block + m] = padded[sw*m + b]."""
    w_ = plane.shape[1]
    for h in range(plane.shape[0]):
        copy(padded[rows_at[h]:rows_at[h] + w_], plane[h])
    if sw == 2:
        _deinterleave(phases[:block], phases[block:2 * block], padded)
    elif sw > 2:
        for b in range(sw):
            _gather(phases[b * block:(b + 1) * block], padded[b:], sw)


@njit(inline="always")
def _merge_plane(phases, rows_at, sw, block, padded, plane):
    """The inverse of _split_plane, dropping the padding."""
    if sw == 2:
        _interleave(padded, phases[:block], phases[block:2 * block])
    elif sw > 2:
        for b in range(sw):
            _spread(padded[b:], phases[b * block:(b + 1) * block], sw)
    w_ = plane.shape[1]
    for h in range(plane.shape[0]):
        copy(plane[h], padded[rows_at[h]:rows_at[h] + w_])


# ---------------------------------------------------------------- loops over one offset or row
@njit(inline="always")
def _keep_max(best, arg, src, tap):
    """Where src > best (strict: NaN never wins): best = src, arg = tap. Branch-free, so that it
    vectorizes."""
    for k in range(best.shape[0]):
        v = src[k]
        b = best[k]
        better = v > b
        best[k] = v if better else b
        arg[k] = tap if better else arg[k]


@njit(inline="always")
def _keep_max_down(best, arg, src, src_arg, tap):
    """_keep_max over across results: arg = tap + the row's own arg."""
    for k in range(best.shape[0]):
        v = src[k]
        b = best[k]
        better = v > b
        best[k] = v if better else b
        arg[k] = tap + src_arg[k] if better else arg[k]


@njit(inline="always")
def _emit_max(best, arg, first, sw, y, mask):
    """One output row from its wide row: arg holds the winner's flat offset from the window's first
    cell, the c-th window's first cell is ``first`` + c*sw."""
    for c in range(y.shape[0]):
        b = best[c]
        y[c] = b
        mask[c] = arg[c] + first + c * sw if b > LOWEST else -1


@njit(inline="always", error_model=ERRORS)
def _emit_quotients(total, rows_r, col_sizes, y):
    """One output row: its wide row over the divisors (a float64 quotient of float32 operands rounds
    to the float32 quotient)."""
    for c in range(y.shape[0]):
        y[c] = total[c] / (rows_r * col_sizes[c])


# ---------------------------------------------------------------- one plane
@njit(inline="always")
def _max_staged(plane, y, mask, kh, kw, sh, sw, ph, pw, wq, starts, padded, phases, across, across_arg, best,
                arg):
    h_, w_ = plane.shape
    ho_, wo_ = y.shape
    rows_at, across_at, down_at = starts
    block = across.shape[0]
    _split_plane(plane, rows_at, sw, block, padded, phases)
    fill(across, LOWEST)
    for j in range(kw):
        # across_arg: the winner's column offset from the window's first input column
        _keep_max(across, across_arg, phases[across_at[j]:across_at[j] + block], np.int32(j - pw))
    fill(best, LOWEST)
    length = best.shape[0]
    for i in range(kh):
        _keep_max_down(best, arg, across[down_at[i]:down_at[i] + length], across_arg[down_at[i]:down_at[i] + length],
                       np.int32((i - ph) * w_))
    for r in range(ho_):
        _emit_max(best[r * wq:r * wq + wo_], arg[r * wq:r * wq + wo_], r * sh * w_, sw, y[r], mask[r])


@njit(inline="always")
def _max_windows(plane, y, mask, kh, kw, sh, sw, ph, pw):
    """MAX over one plane, each output's clipped window in turn (Caffe's loop)."""
    h_, w_ = plane.shape
    ho_, wo_ = y.shape
    for r in range(ho_):
        h0, h1, _ = _window(r * sh - ph, kh, 0, h_)
        for c in range(wo_):
            w0, w1, _ = _window(c * sw - pw, kw, 0, w_)
            best = LOWEST  # float64: compares float32 cells exactly, and stores back exactly
            where = -1
            for h in range(h0, h1):
                for w in range(w0, w1):
                    if plane[h, w] > best:
                        best = plane[h, w]
                        where = h * w_ + w
            y[r, c] = best
            mask[r, c] = where


@njit(inline="always")
def _ave_staged(plane, y, kh, kw, sw, wq, starts, sizes, padded, phases, across, total):
    ho_, wo_ = y.shape
    rows_at, across_at, down_at = starts
    block = across.shape[0]
    _split_plane(plane, rows_at, sw, block, padded, phases)
    fill(across, 0.0)
    for j in range(kw):
        add(across, phases[across_at[j]:across_at[j] + block])
    fill(total, 0.0)
    length = total.shape[0]
    for i in range(kh):
        add(total, across[down_at[i]:down_at[i] + length])
    row_sizes, col_sizes = sizes
    for r in range(ho_):
        _emit_quotients(total[r * wq:r * wq + wo_], row_sizes[r], col_sizes, y[r])


@njit(inline="always", error_model=ERRORS)
def _ave_windows(plane, y, kh, kw, sh, sw, ph, pw):
    """AVE over one plane, each output's clipped window in turn (Caffe's loop)."""
    h_, w_ = plane.shape
    ho_, wo_ = y.shape
    for r in range(ho_):
        h0, h1, rows_r = _window(r * sh - ph, kh, ph, h_)
        for c in range(wo_):
            w0, w1, cols = _window(c * sw - pw, kw, pw, w_)
            total = plane.dtype.type(0.0)  # summed in the dtype, as Caffe does
            for h in range(h0, h1):
                for w in range(w0, w1):
                    total += plane[h, w]
            y[r, c] = total / (rows_r * cols)


@njit(inline="always")
def _ave_back_staged(dy, dx, kh, kw, sw, wq, starts, sizes, share, across, padded, phases):
    """The stages backwards: dy / divisor down into the across results' gradients, those across
    into the phases', those into the plane's. ``share`` keeps zeros past W_out (they land on cells
    that are dropped: padding, or read by no window)."""
    ho_, wo_ = dy.shape
    rows_at, across_at, down_at = starts
    row_sizes, col_sizes = sizes
    for r in range(ho_):
        _emit_quotients(dy[r], row_sizes[r], col_sizes, share[r * wq:r * wq + wo_])
    fill(across, 0.0)
    length = share.shape[0]
    for i in range(kh):
        add(across[down_at[i]:down_at[i] + length], share)
    fill(phases, 0.0)
    block = across.shape[0]
    for j in range(kw):
        add(phases[across_at[j]:across_at[j] + block], across)
    _merge_plane(phases, rows_at, sw, block, padded, dx)


@njit(inline="always", error_model=ERRORS)
def _ave_back_windows(dy, dx, kh, kw, sh, sw, ph, pw):
    """AVE's gradient over one plane, each output's dy / divisor added over its clipped window."""
    h_, w_ = dx.shape
    ho_, wo_ = dy.shape
    for h in range(h_):
        fill(dx[h], 0.0)
    for r in range(ho_):
        h0, h1, rows_r = _window(r * sh - ph, kh, ph, h_)
        for c in range(wo_):
            w0, w1, cols = _window(c * sw - pw, kw, pw, w_)
            share = dx.dtype.type(dy[r, c] / (rows_r * cols))
            for h in range(h0, h1):
                row = dx[h]
                for w in range(w0, w1):
                    row[w] += share


# ---------------------------------------------------------------- kernels
@njit(nogil=True, parallel=True, cache=True, error_model=ERRORS)
def max_forward(x, y, mask, kh, kw, sh, sw, ph, pw):
    """y = MAX pooling of x; mask = each output's winner as h*W + w (-1: none)."""
    planes, h_, w_ = x.shape
    ho_, wo_ = y.shape[1:]
    wq, staged, starts, block, _ = _plan(h_, w_, ho_, wo_, kh, kw, sh, sw, ph, pw)
    count = blocks(planes)
    for b in prange(count):
        if staged:
            padded, phases = _scratch(sw, kw, block, -np.inf, x.dtype)
            across = np.empty(block, x.dtype)
            across_arg = np.empty(block, np.int32)
            best = np.empty(ho_ * wq, x.dtype)
            arg = np.empty(ho_ * wq, np.int32)
            for p in block_range(b, count, planes):
                _max_staged(x[p], y[p], mask[p], kh, kw, sh, sw, ph, pw, wq, starts, padded, phases, across,
                            across_arg, best, arg)
        else:
            for p in block_range(b, count, planes):
                _max_windows(x[p], y[p], mask[p], kh, kw, sh, sw, ph, pw)


@njit(nogil=True, parallel=True, cache=True, error_model=ERRORS)
def max_backward(dy, mask, dx):
    """dx = each top diff added to its mask's cell (outputs in row-major order); dx (P x H*W),
    dy and mask (P x H_out*W_out)."""
    planes = dx.shape[0]
    outputs = dy.shape[1]
    for p in prange(planes):
        fill(dx[p], 0.0)
        for k in range(outputs):
            where = mask[p, k]
            if where >= 0:
                dx[p, where] += dy[p, k]


@njit(nogil=True, parallel=True, cache=True, error_model=ERRORS)
def ave_forward(x, y, kh, kw, sh, sw, ph, pw):
    """y = AVE pooling of x."""
    planes, h_, w_ = x.shape
    ho_, wo_ = y.shape[1:]
    wq, staged, starts, block, sizes = _plan(h_, w_, ho_, wo_, kh, kw, sh, sw, ph, pw)
    count = blocks(planes)
    for b in prange(count):
        if staged:
            padded, phases = _scratch(sw, kw, block, 0.0, x.dtype)
            across = np.empty(block, x.dtype)
            total = np.empty(ho_ * wq, x.dtype)
            for p in block_range(b, count, planes):
                _ave_staged(x[p], y[p], kh, kw, sw, wq, starts, sizes, padded, phases, across, total)
        else:
            for p in block_range(b, count, planes):
                _ave_windows(x[p], y[p], kh, kw, sh, sw, ph, pw)


@njit(nogil=True, parallel=True, cache=True, error_model=ERRORS)
def ave_backward(dy, dx, kh, kw, sh, sw, ph, pw):
    """dx = the gradient of AVE pooling: each top diff / divisor spread over its window's cells."""
    planes, h_, w_ = dx.shape
    ho_, wo_ = dy.shape[1:]
    wq, staged, starts, block, sizes = _plan(h_, w_, ho_, wo_, kh, kw, sh, sw, ph, pw)
    count = blocks(planes)
    for b in prange(count):
        if staged:
            share = np.zeros(ho_ * wq, dx.dtype)
            across = np.empty(block, dx.dtype)
            padded, phases = _scratch(sw, kw, block, 0.0, dx.dtype)
            for p in block_range(b, count, planes):
                _ave_back_staged(dy[p], dx[p], kh, kw, sw, wq, starts, sizes, share, across, padded, phases)
        else:
            for p in block_range(b, count, planes):
                _ave_back_windows(dy[p], dx[p], kh, kw, sh, sw, ph, pw)
