"""Local response normalization, Caffe's LRN layer, across channels or within each channel.

On C-contiguous float NumPy arrays the compiled kernels of jit/lrn.py run (when ``jit.ENABLED``); on a
GPU, across channels, the CUDA kernels of kernels/lrn.cu. The NumPy code here is the twin of both
(``lrn_across_forward`` ... ``lrn_within_backward``), and what any other array runs.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from ..proto import netdef_pb2 as pb
from . import im2col as _cols
from . import jit, kernels
from .base import Layer, register_layer

_LRN = pb.LRNParameter


def _channel_window_sum(a, size):
    """sum over channels [c - (size-1)/2, c + (size-1)/2] of a (N, C, ...), zero outside."""
    xp = backend.get_array_module(a)
    pre = (size - 1) // 2
    c = a.shape[1]
    padded_a = xp.zeros((a.shape[0], c + size - 1) + a.shape[2:], dtype=a.dtype)
    padded_a[:, pre:pre + c] = a
    total = padded_a[:, 0:c].copy()
    for o in range(1, size):
        total += padded_a[:, o:o + c]
    return total


def _box_sum(a, size):
    """sum over the size x size window centred on each cell of a (N, C, H, W), zero outside."""
    xp = backend.get_array_module(a)
    pad = (size - 1) // 2
    n, c, h, w = a.shape
    ap = xp.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=a.dtype)
    ap[:, :, pad:pad + h, pad:pad + w] = a
    rows = ap[:, :, 0:h].copy()
    for o in range(1, size):
        rows += ap[:, :, o:o + h]
    total = rows[:, :, :, 0:w].copy()
    for o in range(1, size):
        total += rows[:, :, :, o:o + w]
    return total


def lrn_across_forward(x, size, alpha, beta, k):
    """(y, scale, scale^-beta) of LRN ACROSS_CHANNELS. Twin of the CUDA kernels ``lrn_fill_scale``
    and ``lrn_compute_output``."""
    xp = backend.get_array_module(x)
    dtype = x.dtype.type
    if _cols.use_kernels(xp):
        x = xp.ascontiguousarray(x)
        n, c, h, w = x.shape
        scale = xp.empty_like(x)
        kernels.launch("lrn_fill_scale", n * h * w,
                       (x,) + kernels.int_args(c, h, w, size) + (dtype(alpha / size), dtype(k), scale))
        y = xp.empty_like(x)
        kernels.launch("lrn_compute_output", x.size, (x, scale, dtype(-beta), y))
        return y, scale, None
    if jit.usable(x):
        from .jit import lrn as compiled

        scale, power, y = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        compiled.across_forward(jit.cells(x), size, dtype(alpha / size), dtype(k), dtype(beta), jit.cells(scale),
                                jit.cells(power), jit.cells(y))
        return y, scale, power
    scale = _channel_window_sum(x * x, size)
    scale *= dtype(alpha / size)
    scale += dtype(k)
    power = scale ** dtype(-beta)
    return x * power, scale, power


def lrn_across_backward(x, y, scale, power, dy, size, alpha, beta):
    """Bottom gradient of LRN ACROSS_CHANNELS. Twin of the CUDA kernel ``lrn_compute_diff``."""
    xp = backend.get_array_module(x)
    dtype = x.dtype.type
    if _cols.use_kernels(xp):
        n, c, h, w = x.shape
        dx = xp.empty_like(x)
        kernels.launch("lrn_compute_diff", n * h * w,
                       tuple(xp.ascontiguousarray(a) for a in (x, y, scale, dy)) + kernels.int_args(c, h, w, size)
                       + (dtype(-beta), dtype(2.0 * alpha * beta / size), dx))
        return dx
    if power is None:
        power = scale ** dtype(-beta)
    if jit.usable(x, y, scale, power, dy):
        from .jit import lrn as compiled

        dx = np.empty_like(x)
        compiled.across_backward(jit.cells(x), jit.cells(y), jit.cells(scale), jit.cells(power), jit.cells(dy), size,
                                 dtype(2.0 * alpha * beta / size), jit.cells(dx))
        return dx
    ratio = _channel_window_sum(dy * y / scale, size)
    ratio *= x
    ratio *= dtype(2.0 * alpha * beta / size)
    return dy * power - ratio


def lrn_within_forward(x, size, alpha, beta):
    """(y, scale, scale^-beta) of LRN WITHIN_CHANNEL (no CUDA kernel: on a GPU the array-module code
    below runs)."""
    dtype = x.dtype.type
    if jit.usable(x):
        from .jit import lrn as compiled

        scale, power, y = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        compiled.within_forward(jit.planes(x), size, dtype(alpha / (size * size)), dtype(beta), jit.planes(scale),
                                jit.planes(power), jit.planes(y))
        return y, scale, power
    scale = _box_sum(x * x, size)
    scale *= dtype(alpha / (size * size))
    scale += dtype(1)
    power = scale ** dtype(-beta)
    return x * power, scale, power


def lrn_within_backward(x, y, scale, power, dy, size, alpha, beta):
    """Bottom gradient of LRN WITHIN_CHANNEL."""
    dtype = x.dtype.type
    if jit.usable(x, y, scale, power, dy):
        from .jit import lrn as compiled

        dx = np.empty_like(x)
        compiled.within_backward(jit.planes(x), jit.planes(y), jit.planes(scale), jit.planes(power), jit.planes(dy),
                                 size, dtype(2.0 * alpha * beta / (size * size)), jit.planes(dx))
        return dx
    ratio = _box_sum(dy * y / scale, size)
    ratio *= x
    ratio *= dtype(2.0 * alpha * beta / (size * size))
    return dy * power - ratio


@register_layer("LRN")
class LRNLayer(Layer):
    """Caffe's local response normalization.

    bottom: (N x C x H x W); top: (N x C x H x W).
    ACROSS_CHANNELS: y = x * (k + alpha/n * sum of x^2 over the n channels centred on c)^-beta.
    WITHIN_CHANNEL:  y = x * (1 + alpha/n^2 * sum of x^2 over the n x n window centred on (h, w))^-beta
                     (k is ignored, as in Caffe). Outside the input counts as zero; n = local_size (odd).
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def replayable(self) -> bool:
        return True

    def setup(self, bottom, top):
        lp = self.layer_param.lrn_param
        self.size = int(lp.local_size)
        if self.size % 2 != 1:
            raise self.error("LRN only supports odd values for local_size")
        self.alpha, self.beta, self.k = float(lp.alpha), float(lp.beta), float(lp.k)
        self.region = lp.norm_region
        self.state = None

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width); got {bottom[0].shape}")
        top[0].reshape(bottom[0].shape)
        # The window sums pad the input by local_size - 1 (channels across, rows and columns within).
        n, c, h, w = bottom[0].shape
        padded = ((n, c + self.size - 1, h, w) if self.region == _LRN.ACROSS_CHANNELS
                  else (n, c, h + self.size - 1, w + self.size - 1))
        self.check_temporary_fits(padded, bottom[0].dtype, f"the input padded by local_size {self.size}")

    def forward(self, bottom, top):
        x = bottom[0].data
        if self.region == _LRN.ACROSS_CHANNELS:
            y, scale, power = lrn_across_forward(x, self.size, self.alpha, self.beta, self.k)
        else:
            y, scale, power = lrn_within_forward(x, self.size, self.alpha, self.beta)
        self.state = (scale, power)
        top[0].data = y

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x, y, dy = bottom[0].data, top[0].data, top[0].diff
        scale, power = self.state
        if self.region == _LRN.ACROSS_CHANNELS:
            bottom[0].diff = lrn_across_backward(x, y, scale, power, dy, self.size, self.alpha, self.beta)
        else:
            bottom[0].diff = lrn_within_backward(x, y, scale, power, dy, self.size, self.alpha, self.beta)
