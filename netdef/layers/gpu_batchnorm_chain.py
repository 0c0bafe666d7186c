"""A BatchNorm chain's forward and backward on CuPy arrays (and, with the same block reduction, the
sum of each channel of an array: a convolution's bias gradient): the kernels of kernels/batchnorm_chain.cu,
launched with the arguments of the CPU kernels in jit/batchnorm_chain.py (layers/batchnorm_chain.py
calls whichever takes its arrays).

Run layer by layer on a GPU, BatchNorm, Scale and ReLU are about twenty CuPy operations each way,
each a pass over the convolution's output into a fresh temporary, plus a reduction over two axes that
CuPy does slowly: ResNet-50's BatchNorm chains took longer than its convolutions. Here the forward
is three passes (two reads of x and one write of y), the backward two, and BatchNorm's moving sums
are updated in the kernel that makes the statistics (no launches per blob).

The sums are in float64, per (channel, slice) block and then the slices in order, the slices a
function of the shape alone: the same bits on every run. The values follow the CPU kernels'
expressions; sums in another order and the statistics from one pass (shifted by the channel's first
value) rather than two make them differ from the CPU's in the last bits.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_array_module
from . import kernels

BLOCK = 256
FINISH_BLOCK = 128
# Blocks of a reduction: enough slices per channel for about a thousand blocks (a large GPU's
# multiprocessors several times over), none with fewer than four values per thread.
TARGET_BLOCKS = 1024


class Scratch:
    """A chain's small device arrays (statistics, partial sums, means), kept from one iteration to the
    next: a ResNet-50 iteration would otherwise allocate about five hundred, some ten microseconds of
    Python each. An array handed out under a name is valid until that name is asked for again."""

    def __init__(self):
        self._arrays: dict = {}

    def get(self, name: str, shape: tuple, dtype, xp):
        found = self._arrays.get(name)
        if found is None or found.shape != shape or found.dtype != dtype:
            found = self._arrays[name] = xp.empty(shape, dtype=dtype)
        return found


def slices_for(channels: int, count: int) -> int:
    """Slices of each channel's ``count`` values in a reduction (see TARGET_BLOCKS)."""
    return max(1, min(-(-TARGET_BLOCKS // channels), -(-count // (BLOCK * 4))))


def _finish_grid(channels: int) -> tuple:
    return (-(-channels // FINISH_BLOCK),)


def _flag_and_array(array, like):
    """(1, array) or, for an absent operand, (0, a placeholder of like's type) for a kernel argument."""
    if array is None:
        return np.int32(0), like
    return np.int32(1), array


def forward_batch(x, eps, scale, bias, negative_slope, y, mean, var, std, moving, scratch: Scratch):
    """Batch statistics of each channel of x (N x C x M) into mean, var (biased), std; then
    y = rectify(((x - mean) / std) * scale + bias), each stage skipped where its argument is None.
    ``moving`` = (mean_sum, var_sum, factor, maf, correction): BatchNorm's blobs and its moving-average
    fraction and variance correction, updated as its record_batch_statistics does."""
    xp = get_array_module(x)
    num, channels, spatial = x.shape
    count = num * spatial
    slices = slices_for(channels, count)
    partial = scratch.get("partial", (channels, slices, 2), np.float64, xp)
    real = x.dtype.type
    kernels.launch_blocks("bn_statistics_partial", x.dtype, (channels, slices), BLOCK,
                          (x, np.int32(num), np.int32(channels), np.int32(spatial), partial))
    mean_sum, var_sum, factor, maf, correction = moving
    kernels.launch_blocks("bn_statistics_finish", x.dtype, _finish_grid(channels), FINISH_BLOCK,
                          (np.int32(channels), np.int32(slices), partial, x, np.int32(spatial), np.float64(count),
                           real(eps), real(maf), real(correction), mean, var, std, mean_sum, var_sum, factor))
    forward_global(x, mean, std, scale, bias, negative_slope, y)


def forward_global(x, mean, std, scale, bias, negative_slope, y, shift=None):
    """y = rectify((((x + shift) - mean) / std) * scale + bias) with the given statistics (``shift``
    None: none)."""
    _, channels, spatial = x.shape
    has_shift, shift = _flag_and_array(shift, mean)
    has_scale, scale = _flag_and_array(scale, mean)
    has_bias, bias = _flag_and_array(bias, mean)
    has_relu = np.int32(negative_slope is not None)
    slope = x.dtype.type(0 if negative_slope is None else negative_slope)
    kernels.launch("bn_chain_apply", x.size, (x, np.int32(channels), np.int32(spatial), has_shift, shift, mean, std,
                                              has_scale, scale, has_bias, bias, has_relu, slope, y))


def apply_channel_map(x, shift, mean, std, scale, bias, negative_slope, y) -> None:
    """y = rectify((((x + shift) - mean) / std) * scale + bias) on N x C x M arrays (y may be x), each
    stage left out where its arguments are None (``mean`` and ``std`` both, or ``bias`` alone after
    ``scale``), in one pass: ``fusion.apply`` on a GPU, the layers' expressions as their kernels
    compute them. Without a normalizing stage the kernel divides v - 0 by 1, which leaves every value
    as it was."""
    if mean is None:
        xp = get_array_module(x)
        # Keyed by the device's number: CuPy's Device objects cannot be hashed.
        device_id = None if xp is np else x.device.id
        mean, std = _identity_statistics(xp, x.shape[1], np.dtype(x.dtype), device_id)
    forward_global(x, mean, std, scale, bias, negative_slope, y, shift)


@functools.lru_cache(maxsize=None)
def _identity_statistics(xp, channels: int, dtype, device_id: int | None) -> tuple:
    """(zeros, ones) of ``channels`` values of ``dtype`` on GPU ``device_id``, the current one (where
    the map's input is; None: the host): kept, since the maps that need them recur every forward, and
    only ever read."""
    return xp.zeros(channels, dtype=dtype), xp.ones(channels, dtype=dtype)


def backward(x, y, dy, mean, std, inv_std, scale, negative_slope, dx, scratch: Scratch):
    """dx, BatchNorm's input gradient through the chain (``inv_std`` None: batch statistics; else
    dx = g * inv_std, the statistics constants); returns Scale's parameter sums (2 x C, x's dtype, valid
    until the next backward): of its top gradient, and of that times its input."""
    xp = get_array_module(x)
    num, channels, spatial = x.shape
    count = num * spatial
    slices = slices_for(channels, count)
    real = x.dtype.type
    has_relu = np.int32(negative_slope is not None)
    slope = real(0 if negative_slope is None else negative_slope)
    partial = scratch.get("partial", (channels, slices, 2), np.float64, xp)
    kernels.launch_blocks("bn_gradient_partial", x.dtype, (channels, slices), BLOCK,
                          (x, y, dy, np.int32(num), np.int32(channels), np.int32(spatial), mean, std, has_relu, slope,
                           partial))
    has_scale, scale = _flag_and_array(scale, mean)
    batch = np.int32(inv_std is None)
    sums = scratch.get("sums", (2, channels), x.dtype, xp)
    mean_g, mean_yg = (scratch.get(name, (channels,), x.dtype, xp) for name in ("mean_g", "mean_yg"))
    inverse = scratch.get("inverse", (channels,), x.dtype, xp) if inv_std is None else inv_std
    kernels.launch_blocks("bn_gradient_finish", x.dtype, _finish_grid(channels), FINISH_BLOCK,
                          (np.int32(channels), np.int32(slices), partial, np.float64(count), has_scale, scale, batch,
                           std, sums, mean_g, mean_yg, inverse))
    kernels.launch("bn_gradient_apply", x.size, (x, y, dy, np.int32(channels), np.int32(spatial), mean, std, has_scale,
                                                 scale, has_relu, slope, batch, mean_g, mean_yg, inverse, dx))
    return sums


def add_channel_sums(x, out) -> None:
    """out (C) += the sum of x (N x C x M) over samples and positions, in float64 blocks as the
    chain's sums (CuPy's sum over two axes runs one block per channel: slow for few channels)."""
    xp = get_array_module(x)
    num, channels, spatial = x.shape
    slices = slices_for(channels, num * spatial)
    partial = xp.empty((channels, slices), dtype=np.float64)
    kernels.launch_blocks("channel_sum_partial", x.dtype, (channels, slices), BLOCK,
                          (x, np.int32(num), np.int32(channels), np.int32(spatial), partial))
    kernels.launch_blocks("channel_sum_add", x.dtype, _finish_grid(channels), FINISH_BLOCK,
                          (np.int32(channels), np.int32(slices), partial, out))
