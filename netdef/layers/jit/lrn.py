"""Local response normalization kernels (ACROSS_CHANNELS and WITHIN_CHANNEL), one parallel pass each.

Shapes: x, y, scale, power, dy, dx (N x C x M) across channels (M = H*W), (P x H x W) within a
channel (P = N*C planes); all C-contiguous, one dtype. Twins: ``vision.lrn_across_forward``,
``lrn_across_backward``, ``lrn_within_forward``, ``lrn_within_backward``.

    forward:  scale = k + alpha/n * (window sum of x^2), power = scale^-beta, y = x * power
    backward: dx = dy * power - (window sum of dy * y / scale) * x * 2 alpha beta / n

(the window: n channels centred on c across channels, n x n cells centred on (h, w) within a
channel with k = 1 and alpha/n^2; outside counts as zero). The sums run as the twins' do (the
window's terms in order from the first, the box's rows before its columns), so ``scale`` is the
twins' to the bit; the power is computed apart: for beta = 3/4 (AlexNet's, CaffeNet's, GoogLeNet's,
CIFAR-10 full's) as 1 / (r * sqrt(r)), r = sqrt(scale): two vector square roots and a division,
within 4 ulp of the correctly rounded power, where numba has no vector pow (it calls the C library's
for one value at a time, several times slower: benchmarks/README.md, "The figures behind the other
layers' choices").

Across channels, the work items are (sample, block of ``SPAN`` cells): each squares (or forms
dy * y / scale for) its block once into a scratch of C + n - 1 rows (zero rows at both ends), and
sums every channel's window from there, in cache. Within a channel, the items are planes: the
plane's squares go into a zero-bordered copy, and the box sum is n row-shifted adds then n
column-shifted adds, each one vector loop over the whole plane (rows Wp = W + n - 1 wide, the
last n - 1 cells of each computed and dropped). Every value is computed by one thread in a fixed
order: the same bits whatever the thread count.

One thread runs these in a third of the NumPy twins' time or less (benchmarks/README.md, "The figures
behind the other layers' choices").
"""
from __future__ import annotations

import numpy as np
from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from numba import njit, prange  # noqa: E402 (after the wait policy)

from .loops import ERRORS, add, block_range, blocks, copy, fill

SPAN = 512  # cells per work item across channels: C + n - 1 scratch rows of them stay in L2


@njit(inline="always", error_model=ERRORS)
def _finish_forward(box, x, alpha_over, k, beta, scale, power, y):
    """scale = box * alpha_over + k, power = scale^-beta, y = x * power over one run of cells (one
    loop: runs may be short)."""
    if beta == 0.75:
        one = scale.dtype.type(1.0)
        for m in range(box.shape[0]):
            s = box[m] * alpha_over + k
            root = np.sqrt(s)
            scale[m] = s
            power[m] = one / (root * np.sqrt(root))
            y[m] = x[m] * power[m]
    else:
        negative = -beta
        for m in range(box.shape[0]):
            s = box[m] * alpha_over + k
            scale[m] = s
            power[m] = s ** negative
            y[m] = x[m] * power[m]


@njit(inline="always")
def _finish_backward(box, x, dy, power, ratio, dx):
    """dx = dy * power - box * x * ratio over one run of cells."""
    for m in range(box.shape[0]):
        dx[m] = dy[m] * power[m] - box[m] * x[m] * ratio


@njit(inline="always")
def _square(dst, src):
    for m in range(dst.shape[0]):
        dst[m] = src[m] * src[m]


@njit(inline="always", error_model=ERRORS)
def _gradient_terms(dst, dy, y, scale):
    """dst = dy * y / scale, in the twins' order."""
    for m in range(dst.shape[0]):
        dst[m] = dy[m] * y[m] / scale[m]


@njit(inline="always")
def _window_sum(rows, c, size, out):
    """out = rows[c] + rows[c + 1] + ... + rows[c + size - 1] (the window of channel c in a
    scratch whose first (size - 1) / 2 rows are zero), summed in that order."""
    copy(out, rows[c])
    for o in range(1, size):
        add(out, rows[c + o])


@njit(inline="always")
def _items(n_, cells):
    """(items, spans per sample) of the work across channels."""
    spans = (cells + SPAN - 1) // SPAN
    return n_ * spans, spans


@njit(inline="always")
def _item_scratch(item, spans, c_, size, cells, dtype):
    """(sample, cells [m0, m1), C + size - 1 rows of m1 - m0 for the channels' terms (the first
    (size - 1) / 2 and the last size - 1 - (size - 1) / 2 zero), a row for a window sum) of work
    item ``item``."""
    m0 = (item % spans) * SPAN
    m1 = min(cells, m0 + SPAN)
    rows = np.empty((c_ + size - 1, m1 - m0), dtype)
    pre = (size - 1) // 2
    for c in range(pre):
        fill(rows[c], 0.0)
    for c in range(pre + c_, c_ + size - 1):
        fill(rows[c], 0.0)
    return item // spans, m0, m1, rows, np.empty(m1 - m0, dtype)


@njit(nogil=True, parallel=True, cache=True, error_model=ERRORS)
def across_forward(x, size, alpha_over, k, beta, scale, power, y):
    """scale, power, y of LRN across channels; ``alpha_over`` = alpha / size (x's dtype)."""
    n_, c_, cells = x.shape
    pre = (size - 1) // 2
    items, spans = _items(n_, cells)
    for item in prange(items):
        n, m0, m1, squares, box = _item_scratch(item, spans, c_, size, cells, x.dtype)
        for c in range(c_):
            _square(squares[pre + c], x[n, c, m0:m1])
        for c in range(c_):
            _window_sum(squares, c, size, box)
            _finish_forward(box, x[n, c, m0:m1], alpha_over, k, beta, scale[n, c, m0:m1], power[n, c, m0:m1],
                            y[n, c, m0:m1])


@njit(nogil=True, parallel=True, cache=True, error_model=ERRORS)
def across_backward(x, y, scale, power, dy, size, ratio, dx):
    """dx of LRN across channels; ``ratio`` = 2 alpha beta / size (x's dtype)."""
    n_, c_, cells = x.shape
    pre = (size - 1) // 2
    items, spans = _items(n_, cells)
    for item in prange(items):
        n, m0, m1, terms, box = _item_scratch(item, spans, c_, size, cells, x.dtype)
        for c in range(c_):
            _gradient_terms(terms[pre + c], dy[n, c, m0:m1], y[n, c, m0:m1], scale[n, c, m0:m1])
        for c in range(c_):
            _window_sum(terms, c, size, box)
            _finish_backward(box, x[n, c, m0:m1], dy[n, c, m0:m1], power[n, c, m0:m1], ratio, dx[n, c, m0:m1])


@njit(inline="always")
def _box_sum(padded, size, width, rows, box):
    """box (H rows, ``width`` = W + size - 1 wide) = the size x size box sums of the zero-bordered
    plane ``padded`` (H + size - 1 rows of ``width``): first the rows (rows[h] = padded[h] + ... +
    padded[h + size - 1]), then the columns; as the twin, each from its first term."""
    length = box.shape[0]
    copy(rows[:length], padded[:length])
    for o in range(1, size):
        add(rows[:length], padded[o * width:o * width + length])
    copy(box, rows[:length])
    for o in range(1, size):
        add(box, rows[o:o + length])


@njit(inline="always")
def _within_scratch(h_, w_, size, dtype):
    """(zero-bordered plane, row sums, box sums) of one block of planes."""
    width = w_ + size - 1
    length = h_ * width
    return (np.zeros((h_ + size - 1) * width, dtype), np.zeros(length + size - 1, dtype),
            np.empty(length, dtype))


@njit(nogil=True, parallel=True, cache=True, error_model=ERRORS)
def within_forward(x, size, alpha_over, beta, scale, power, y):
    """scale, power, y of LRN within a channel; ``alpha_over`` = alpha / size^2 (x's dtype)."""
    planes, h_, w_ = x.shape
    pre = (size - 1) // 2
    width = w_ + size - 1
    one = x.dtype.type(1.0)
    count = blocks(planes)
    for block in prange(count):
        padded, rows, box = _within_scratch(h_, w_, size, x.dtype)
        for p in block_range(block, count, planes):
            for h in range(h_):
                start = (h + pre) * width + pre
                _square(padded[start:start + w_], x[p, h])
            _box_sum(padded, size, width, rows, box)
            for h in range(h_):
                _finish_forward(box[h * width:h * width + w_], x[p, h], alpha_over, one, beta, scale[p, h],
                                power[p, h], y[p, h])


@njit(nogil=True, parallel=True, cache=True, error_model=ERRORS)
def within_backward(x, y, scale, power, dy, size, ratio, dx):
    """dx of LRN within a channel; ``ratio`` = 2 alpha beta / size^2 (x's dtype)."""
    planes, h_, w_ = x.shape
    pre = (size - 1) // 2
    width = w_ + size - 1
    count = blocks(planes)
    for block in prange(count):
        padded, rows, box = _within_scratch(h_, w_, size, x.dtype)
        for p in block_range(block, count, planes):
            for h in range(h_):
                start = (h + pre) * width + pre
                _gradient_terms(padded[start:start + w_], dy[p, h], y[p, h], scale[p, h])
            _box_sum(padded, size, width, rows, box)
            for h in range(h_):
                _finish_backward(box[h * width:h * width + w_], x[p, h], dy[p, h], power[p, h], ratio, dx[p, h])
