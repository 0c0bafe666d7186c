"""Fused element-wise kernels (layers/fusion.py): a chain of per-channel maps in one pass, and an
Eltwise sum rectified in the same pass.

Each value goes through the stages with the expressions of the layers' own kernels, in the arrays'
dtype, in the same order: x + b (a convolution's bias), (x - mean) / std (jit/batchnorm.py), v * s + b (jit/elementwise.py's
Scale), then ReLU's comparison, so a fused chain gives the bits the layers give one by one. A stage
that is absent is a None argument: numba compiles a version without it (dead branches pruned).
Work items as Scale's kernel: chunks of at most BLOCK values of one (o, d) row. Twins:
``fusion.apply_reference`` and ``elementwise.weighted_sum`` followed by ``relu_forward``.

The large kernels that apply a map to the blocks they write (jit/depthwise.py's blocked_taps,
jit/blas.py's mapped panels) call it through ``rows_mapper``'s address instead: given the stages as
None-or-array arguments, numba compiled one whole large kernel per combination of stages present
(14 of blocked_taps' in the test suite, 2 to 3 for a zoo net), each a long compilation
(benchmarks/README.md, "The figures behind the other layers' choices"); the mapper is a small
function per combination, and the kernel is compiled once per dtype.
"""
from __future__ import annotations

from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

import functools  # noqa: E402

import numpy as np  # noqa: E402
from numba import carray, cfunc, from_dtype, njit, prange, types  # noqa: E402 (after the wait policy)

from .elementwise import block_bounds, block_count, channel_block, rectified_gradient, weighted_sum_block  # noqa: E402


@njit(inline="always")
def _rectify(v, negative_slope):
    # ReLU's kernel: +0 where v <= 0 for slope 0 (NaN stays NaN), v * slope below 0 otherwise.
    if negative_slope == 0:
        return negative_slope - negative_slope if v <= 0 else v  # +0 of v's type, for slope -0 too
    return v if v > 0 else v * negative_slope


@njit(inline="always", error_model="numpy")
def mapped_value(v, d, shift, mean, std, scale, bias, negative_slope):
    """One value of channel d through the map's stages (jit/batchnorm_chain.py's forward too; its twin for
    constants already read: _map_by_constants)."""
    if shift is not None:
        v = v + shift[d]
    if mean is not None:
        v = (v - mean[d]) / std[d]
    if scale is not None:
        if bias is not None:
            v = v * scale[d] + bias[d]
        else:
            v = v * scale[d]
    if negative_slope is not None:
        v = _rectify(v, negative_slope)
    return v


@njit(inline="always", error_model="numpy")
def _map_by_constants(v, shift, mean, std, scale, bias, negative_slope):
    """``mapped_value`` with the channel's constants as scalars (None where a stage is absent): the
    same expressions in the same order, so a change to one is a change to both. Not one function:
    mapped_value's stages are pruned by its None arguments, which a call in between would hide from
    numba's branch pruning (tried: typing fails)."""
    if shift is not None:
        v = v + shift
    if mean is not None:
        v = (v - mean) / std
    if scale is not None:
        if bias is not None:
            v = v * scale + bias
        else:
            v = v * scale
    if negative_slope is not None:
        v = _rectify(v, negative_slope)
    return v


def _compile_rows_mapper(dtype: np.dtype, shift: bool, normalize: bool, scale: bool, bias: bool, rectify: bool):
    """The compiled ``map_rows`` for one dtype and one set of stages present (closure constants: numba
    prunes the absent stages' branches, and caches each set apart)."""
    pointer, i64 = types.CPointer(from_dtype(dtype)), types.int64

    @cfunc(types.void(pointer, i64, i64, i64, i64, pointer, pointer, pointer, pointer, pointer, pointer),
           cache=True, nogil=True, error_model="numpy")
    def map_rows(first, count, stride, rows, channel, shifts, means, stds, scales, biases, slope):
        # Per row, the stages' expressions per value, as mapped_value computes them everywhere else.
        # The block's view reaches past the last row's values (stride > count); only those values
        # are touched.
        block = carray(first, (rows * stride,))
        r = slope[0] if rectify else None
        for row in range(rows):
            # The row's constants as scalars: read inside the loop from arrays LLVM cannot prove
            # apart from the row, they kept it from vectorizing.
            c = channel + row
            s = shifts[c] if shift else None
            m = means[c] if normalize else None
            d = stds[c] if normalize else None
            k = scales[c] if scale else None
            b = biases[c] if bias else None
            values = block[row * stride:row * stride + count]
            for i in range(count):
                values[i] = _map_by_constants(values[i], s, m, d, k, b, r)

    return map_rows


@njit(inline="always")
def stage_addresses(shift, mean, std, scale, bias, slope):
    """The addresses of a map's arrays, as ``rows_mapper``'s function takes them after its first five
    arguments (the kernels that call it compute them once per call)."""
    return (np.int64(shift.ctypes.data), np.int64(mean.ctypes.data), np.int64(std.ctypes.data),
            np.int64(scale.ctypes.data), np.int64(bias.ctypes.data), np.int64(slope.ctypes.data))


@functools.lru_cache(maxsize=None)
def rows_mapper(dtype: np.dtype, shift: bool, normalize: bool, scale: bool, bias: bool, rectify: bool) -> int:
    """The address of a compiled ``map_rows(first, count, stride, rows, channel, shift, mean, std,
    scale, bias, slope)``: ``rows`` rows of ``count`` values, ``stride`` elements apart from address
    ``first`` on, row j all of channel ``channel + j``, through the map's stages in place; the stage
    arguments are the addresses of the stages' per-channel arrays (``slope``: of one value), of which
    only the present stages' are read. One call per block of rows, not per row: a call per 7 x 7
    plane made the depthwise kernel measurably slower (same section of benchmarks/README.md as the
    module docstring's). Called with jit/kernel_calls.call11
    (every argument an i64)."""
    return _compile_rows_mapper(np.dtype(dtype), shift, normalize, scale, bias, rectify).address


@njit(nogil=True, parallel=True, error_model="numpy", cache=True)
def channel_map(x, shift, mean, std, scale, bias, negative_slope, y):
    """y[o, d, i] = rectify((((x + shift[d]) - mean[d]) / std[d]) * scale[d] + bias[d]), each stage skipped
    where its argument is None; x, y (O x D x I), not overlapping (``channel_map_in_place`` else)."""
    o_, d_, i_ = x.shape
    chunks = block_count(i_)
    for item in prange(o_ * d_ * chunks):
        o, d, _, lo, hi = channel_block(item, chunks, d_, i_)
        src = x[o, d, lo:hi]
        dst = y[o, d, lo:hi]
        for i in range(hi - lo):
            dst[i] = mapped_value(src[i], d, shift, mean, std, scale, bias, negative_slope)


@njit(nogil=True, parallel=True, error_model="numpy", cache=True)
def channel_map_in_place(y, shift, mean, std, scale, bias, negative_slope):
    """``channel_map`` from y into y. A kernel of its own: given the same array twice, LLVM's
    vectorized loop saw its operands overlap and ran the scalar loop, several times slower."""
    o_, d_, i_ = y.shape
    chunks = block_count(i_)
    for item in prange(o_ * d_ * chunks):
        o, d, _, lo, hi = channel_block(item, chunks, d_, i_)
        row = y[o, d, lo:hi]
        for i in range(hi - lo):
            row[i] = mapped_value(row[i], d, shift, mean, std, scale, bias, negative_slope)


@njit(nogil=True, parallel=True, cache=True)
def weighted_sum_rectified(xs, coeffs, negative_slope, y):
    """y = rectify(sum_k coeffs[k] * xs[k]), added from k = 0 up as ``weighted_sum``; each block is
    rectified while it is still in cache."""
    size = y.shape[0]
    for block in prange(block_count(size)):
        lo, hi = block_bounds(block, size)
        out = y[lo:hi]
        weighted_sum_block(xs, coeffs, lo, hi, out)
        for i in range(hi - lo):
            out[i] = _rectify(out[i], negative_slope)


@njit(nogil=True, parallel=True, cache=True)
def summed_rectified_gradient(dys, coeffs, y, negative_slope, dx):
    """dx = ReLU's input gradient (y its output) of sum_k coeffs[k] * dys[k], summed as
    ``weighted_sum`` adds (Split's backward), each block masked while it is still in cache (the
    backward of Eltwise SUM + ReLU + Split in layers/sum_chain.py); as relu_backward: g where y > 0,
    else g * slope."""
    size = dx.shape[0]
    for block in prange(block_count(size)):
        lo, hi = block_bounds(block, size)
        out = dx[lo:hi]
        weighted_sum_block(dys, coeffs, lo, hi, out)
        sign = y[lo:hi]
        for i in range(hi - lo):
            out[i] = rectified_gradient(out[i], sign[i], negative_slope)
