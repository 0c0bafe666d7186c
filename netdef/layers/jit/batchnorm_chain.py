"""Training kernels of a BatchNorm chain (layers/batchnorm_chain.py): BatchNorm, then in place Scale
and/or ReLU, forward and backward in one parallel pass over the channels each.

Shapes: x, y, dy, dx (N x C x M); the per-channel arrays (C) have x's dtype; None stands for a layer
or operand the chain lacks (numba compiles a version without it). x is BatchNorm's input, y the
chain's output (ReLU's top), dy its gradient, dx BatchNorm's input gradient.

Every value is computed by the expressions of the layers' own kernels, in their order, and every sum
by their own row functions over the same rows in the same order (jit/batchnorm.py, jit/elementwise.py,
jit/fusion.py), so the chain gives the bits the layers give one by one (tests/layers/test_batchnorm_chain.py
compares them). What changes is the memory traffic: the normalized values, Scale's output and the
gradients between the layers are never written out. Backward computes a channel's normalized values
(from x) and its ReLU and Scale gradients (from y and dy) once, for the sums, into buffers of the
channel's size that its output pass then reads from L2 (with global statistics there is no second
pass: a row at a time).
"""
from __future__ import annotations

import numpy as np
from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from numba import njit, prange  # noqa: E402 (after the wait policy)

from .batchnorm import channel_statistics, gradient_sums, normalize_row  # noqa: E402
from .elementwise import block_bounds, block_count, row_sum, scale_gradient_sums  # noqa: E402
from .fusion import mapped_value  # noqa: E402

# Which of Scale's sums the chain's Scale layer wants (its parameters' propagate_down): none, the
# bias's alone (the sum of its top gradient, as Scale's kernel sums it without x), or both.
NO_SUMS, BIAS_SUM, BOTH_SUMS = 0, 1, 2


@njit(nogil=True, parallel=True, error_model="numpy", cache=True)
def forward_batch(x, eps, scale, bias, negative_slope, y, mean, var, std):
    """Batch statistics of each channel into mean, var, std (as jit/batchnorm.forward_batch); then
    y = rectify(((x - mean) / std) * scale + bias), each later stage skipped where its argument is None."""
    n_, c_, m_ = x.shape
    for c in prange(c_):
        channel_statistics(x, c, eps, mean, var, std)
        for n in range(n_):
            src = x[n, c]
            dst = y[n, c]
            for j in range(m_):
                dst[j] = mapped_value(src[j], c, None, mean, std, scale, bias, negative_slope)


@njit(inline="always", error_model="numpy")
def _row_gradients(x, y, dy, center, spread, scale, c, negative_slope, normalized, rectified, scaled):
    """One row of channel c: normalized = (x - center) / spread; rectified = ReLU's input gradient (dy
    where y > 0, else dy * slope; dy itself without ReLU); scaled = Scale's input gradient (rectified
    * scale[c]; rectified itself without Scale). Returns (rectified, scaled), the arrays that hold them."""
    normalize_row(x, center, spread, normalized)
    if negative_slope is None:
        rectified = dy
    else:
        for j in range(dy.shape[0]):
            g = dy[j]
            rectified[j] = g if y[j] > 0 else g * negative_slope
    if scale is None:
        scaled = rectified
    else:
        factor = scale[c]
        for j in range(dy.shape[0]):
            scaled[j] = rectified[j] * factor
    return rectified, scaled


@njit(nogil=True, parallel=True, error_model="numpy", cache=True)
def backward(x, y, dy, mean, std, inv_std, scale, negative_slope, scale_sums, dx, sums):
    """dx, BatchNorm's input gradient through the chain (``inv_std`` None: BatchNorm on batch
    statistics, as jit/batchnorm.backward_batch; else dx = g * inv_std, the statistics constants); sums
    (2 x C, float64): Scale's parameter sums (of its top gradient, and of it times Scale's input) as
    jit/elementwise.scale_backward sums them, per ``scale_sums``. With batch statistics a channel's
    normalized values and gradients stay in buffers of the channel's size (in L2: 0.4 MiB each for
    ResNet-50's largest at batch 8) between the sums and the output."""
    n_, c_, m_ = x.shape
    count = n_ * m_
    chunks = block_count(m_)
    kept = n_ if inv_std is None else 1
    for c in prange(c_):
        normalized = np.empty((kept, m_), x.dtype)
        scaled = np.empty((kept, m_), x.dtype)
        rectified = np.empty(m_, x.dtype)
        total = 0.0
        weighted = 0.0
        total_g = 0.0
        total_yg = 0.0
        for n in range(n_):
            row = n if inv_std is None else 0
            # Without Scale, ReLU's gradient is BatchNorm's: kept in ``scaled`` for the output pass.
            r, g = _row_gradients(x[n, c], y[n, c], dy[n, c], mean[c], std[c], scale, c, negative_slope,
                                  normalized[row], scaled[row] if scale is None else rectified, scaled[row])
            if scale_sums != NO_SUMS:
                for chunk in range(chunks):  # Scale's work items: blocks of a row
                    lo, hi = block_bounds(chunk, m_)
                    if scale_sums == BIAS_SUM:
                        total += row_sum(r[lo:hi])
                    else:
                        a, b = scale_gradient_sums(normalized[row, lo:hi], r[lo:hi])
                        total += a
                        weighted += b
            if inv_std is None:
                a, b = gradient_sums(normalized[row], g)
                total_g += a
                total_yg += b
            else:
                out = dx[n, c]
                for j in range(m_):
                    out[j] = g[j] * inv_std[c]
        sums[0, c] = total
        sums[1, c] = weighted
        if inv_std is None:
            mean_g = x.dtype.type(total_g / count)
            mean_yg = x.dtype.type(total_yg / count)
            inverse = x.dtype.type(1) / std[c]
            for n in range(n_):
                # g: Scale's or ReLU's input gradient as kept, or dy itself (no layer in between)
                g = dy[n, c] if scale is None and negative_slope is None else scaled[n]
                xn = normalized[n]
                out = dx[n, c]
                for j in range(m_):
                    out[j] = (g[j] - mean_g - xn[j] * mean_yg) * inverse
