"""The arithmetic of BatchNorm (the layer, with Caffe's semantics, is in normalization.py).

Shapes: x3, dy3, out3 are (N x C x M) views (M: the product of the spatial axes, 1 for N x C input);
mean, var, std are (C) in x's dtype. y = (x - mean) / std, std = sqrt(var + eps).

NumPy needed about ten passes over memory for the statistics and the normalization, each into a fresh
temporary, on one core; on NumPy arrays the compiled kernels in jit/batchnorm.py make one pass per
channel for each sum and one for the output, in parallel over the channels, with the sums in float64.
The ``*_reference`` functions are their twins on the array module: what CuPy arrays run, and what the
tests compare the kernels with. The backward recomputes y from x (one subtraction and one division per
value) instead of keeping it: a later in-place layer may then do what it likes with the top's array.
"""
from __future__ import annotations

from ..backend import get_array_module
from . import elementwise, jit


def _kernels():
    from .jit import batchnorm

    return batchnorm


def _channel(v):
    return v[None, :, None]


def forward_batch(x3, eps: float, out3):
    """Normalize x3 by its batch statistics into out3; returns (mean, biased var, std) per channel."""
    if jit.usable(x3, out3):
        xp = get_array_module(x3)
        mean, var, std = (xp.empty(x3.shape[1], x3.dtype) for _ in range(3))
        _kernels().forward_batch(x3, x3.dtype.type(eps), out3, mean, var, std)
        return mean, var, std
    return forward_batch_reference(x3, eps, out3)


def forward_global(x3, mean, std, out3):
    """out3 = (x3 - mean) / std with the given statistics."""
    if jit.usable(x3, mean, std, out3):
        _kernels().forward_global(x3, mean, std, out3)
        return out3
    return forward_global_reference(x3, mean, std, out3)


def backward_batch(y3, dy3, std, out3):
    """out3 = (dy - mean(dy) - y * mean(y * dy)) / std, the means per channel over N and M, y3 being
    forward_batch's output (Caffe's backward reads its top data too)."""
    if jit.usable(y3, dy3, std, out3):
        _kernels().backward_batch(y3, dy3, std, out3)
        return out3
    return backward_batch_reference(y3, dy3, std, out3)


def backward_global(dy3, std, out3):
    """out3 = dy3 / std (the statistics are constants)."""
    return elementwise.scale_forward(dy3, 1.0 / std, None, out3)


def forward_batch_reference(x3, eps: float, out3):
    xp = get_array_module(x3)
    mean = x3.mean(axis=(0, 2))
    var = ((x3 - _channel(mean)) ** 2).mean(axis=(0, 2))
    std = xp.sqrt(var + eps).astype(x3.dtype, copy=False)
    forward_global_reference(x3, mean, std, out3)
    return mean, var, std


def forward_global_reference(x3, mean, std, out3):
    get_array_module(x3).subtract(x3, _channel(mean), out=out3)
    out3 /= _channel(std)
    return out3


def backward_batch_reference(y, dy3, std, out3):
    mean_dy = dy3.mean(axis=(0, 2), keepdims=True)
    mean_ydy = (y * dy3).mean(axis=(0, 2), keepdims=True)
    out3[...] = (dy3 - mean_dy - y * mean_ydy) * (1.0 / _channel(std))
    return out3
