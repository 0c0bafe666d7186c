"""Batch normalization kernels: one thread per channel, the channel's N rows of M values each.

Shapes: x, y, dy, dx (N x C x M) (M: the spatial size, 1 for N x C inputs); the per-channel arrays
(C) have x's dtype. Sums run in float64, each over one channel in a fixed order by one thread, so the
result is the same bits for any thread count (``reassoc`` lets LLVM keep several partial sums in
vector lanes: their order is fixed by the compiled code, not by the data or the threads). A channel's
rows are read once from memory and again from cache (about 0.4 MiB per channel for ResNet-50's first
layer at batch 8, against 2 MiB of L2 per core). Divisions follow NumPy (``error_model="numpy"``: a zero
std gives inf or NaN, as the twins, where numba would raise). Twins: ``batchnorm.*_reference``.
"""
from __future__ import annotations

import numpy as np
from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from numba import njit, prange  # noqa: E402 (after the wait policy)

from .elementwise import row_sum


@njit(nogil=True, fastmath={"reassoc"}, cache=True)
def _squared_deviation(row, center):
    total = 0.0
    for j in range(row.shape[0]):
        d = row[j] - center
        total += d * d
    return total


@njit(nogil=True, fastmath={"reassoc"}, cache=True)
def gradient_sums(y, dy):
    """(sum of dy, sum of y * dy) over one row."""
    total_dy = 0.0
    total_ydy = 0.0
    for j in range(y.shape[0]):
        g = np.float64(dy[j])
        total_dy += g
        total_ydy += y[j] * g
    return total_dy, total_ydy


@njit(nogil=True, error_model="numpy", cache=True)
def normalize_row(x, mean, std, y):
    for j in range(x.shape[0]):
        y[j] = (x[j] - mean) / std


@njit(nogil=True, parallel=True, error_model="numpy", cache=True)
def forward_batch(x, eps, y, mean, var, std):
    """Batch mean and biased variance of each channel into ``mean``, ``var``; ``std`` =
    sqrt(var + eps) (``eps`` of x's dtype); y = (x - mean) / std."""
    n_, c_, m_ = x.shape
    for c in prange(c_):
        channel_statistics(x, c, eps, mean, var, std)
        for n in range(n_):
            normalize_row(x[n, c], mean[c], std[c], y[n, c])


@njit(inline="always")
def channel_statistics(x, c, eps, mean, var, std):
    """mean[c], var[c] (biased) and std[c] = sqrt(var[c] + eps) of channel c of x (N x C x M): its
    rows summed one after the other, then their squared deviations (jit/batchnorm_chain.py too)."""
    n_, _, m_ = x.shape
    count = n_ * m_
    total = 0.0
    for n in range(n_):
        total += row_sum(x[n, c])
    center = total / count
    spread = 0.0
    for n in range(n_):
        spread += _squared_deviation(x[n, c], center)
    mean[c] = center
    var[c] = spread / count
    std[c] = np.sqrt(var[c] + eps)


@njit(nogil=True, parallel=True, error_model="numpy", cache=True)
def forward_global(x, mean, std, y):
    """y = (x - mean) / std with the given per-channel statistics."""
    n_, c_, m_ = x.shape
    for plane in prange(n_ * c_):
        n = plane // c_
        c = plane % c_
        normalize_row(x[n, c], mean[c], std[c], y[n, c])


@njit(nogil=True, parallel=True, error_model="numpy", cache=True)
def backward_batch(y, dy, std, dx):
    """dx = (dy - mean(dy) - y * mean(y * dy)) / std per channel, y being forward's output."""
    n_, c_, m_ = y.shape
    count = n_ * m_
    for c in prange(c_):
        total_dy = 0.0
        total_ydy = 0.0
        for n in range(n_):
            a, b = gradient_sums(y[n, c], dy[n, c])
            total_dy += a
            total_ydy += b
        mean_dy = y.dtype.type(total_dy / count)
        mean_ydy = y.dtype.type(total_ydy / count)
        inv_std = y.dtype.type(1) / std[c]
        for n in range(n_):
            normalized = y[n, c]
            grad = dy[n, c]
            out = dx[n, c]
            for j in range(m_):
                out[j] = (grad[j] - mean_dy - normalized[j] * mean_ydy) * inv_std
