"""The arithmetic of ReLU, Eltwise (sum, product, maximum), Split's gradient sum and Scale.

Every function writes into ``out`` arrays that the caller owns and that overlap none of the inputs
(see reused.py). NumPy did each as several passes over memory on one core, each pass into a fresh
temporary; on NumPy arrays (C-contiguous, one dtype) the compiled kernels in jit/elementwise.py
compute each in one parallel pass. The ``*_reference`` functions are their twins on the array module:
what CuPy arrays run, and what the tests compare the kernels with. The element-wise kernels give the
twins' bits exactly (same operations in the same order, in the arrays' dtype); Scale's parameter
gradients are summed in float64 (the twin: in the dtype).

Shapes: ``xs`` is a sequence of K arrays of one shape; ``x3``, ``dy3``, ``out3`` are (O x D x I) views
with the scale ``s`` and bias ``b`` (D) broadcast over O and I.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from . import gpu_batchnorm_chain, jit, kernels


def _flat(a):
    return a.reshape(-1)


def _kernels():
    from .jit import elementwise

    return elementwise


# ---------------------------------------------------------------------------------------------- ReLU
def relu_forward(x, negative_slope: float, out):
    """out = x where x > 0, else negative_slope * x (max(x, 0) when the slope is 0)."""
    if jit.usable(x, out):
        _kernels().relu_forward(_flat(x), x.dtype.type(negative_slope), _flat(out))
        return out
    if kernels.usable(x, out):
        kernels.launch("relu_forward", x.size, (x, x.dtype.type(negative_slope), out))
        return out
    return relu_forward_reference(x, negative_slope, out)


def relu_backward(x, dy, negative_slope: float, out):
    """out = dy where x > 0, else negative_slope * dy."""
    if jit.usable(x, dy, out):
        _kernels().relu_backward(_flat(x), _flat(dy), dy.dtype.type(negative_slope), _flat(out))
        return out
    if kernels.usable(x, dy, out):
        kernels.launch("relu_backward", x.size, (x, dy, dy.dtype.type(negative_slope), out))
        return out
    return relu_backward_reference(x, dy, negative_slope, out)


def relu_forward_reference(x, negative_slope: float, out):
    xp = get_array_module(x)
    if negative_slope == 0:
        return xp.maximum(x, 0, out=out)
    out[...] = xp.where(x > 0, x, x * negative_slope)
    return out


def relu_backward_reference(x, dy, negative_slope: float, out):
    xp = get_array_module(dy)
    out[...] = xp.where(x > 0, dy, dy * negative_slope)
    return out


# ---------------------------------------------------------------------------------------- channel sums
def add_channel_sums(x3, out):
    """out (C) += the sum of x3 (N x C x S) over samples and positions (a convolution's bias gradient)."""
    if jit.usable(x3, out) and x3.ndim == 3:
        _kernels().add_channel_sums(x3, out)
        return out
    if kernels.usable(x3, out) and x3.ndim == 3:
        gpu_batchnorm_chain.add_channel_sums(x3, out)
        return out
    return add_channel_sums_reference(x3, out)


def add_channel_sums_reference(x3, out):
    out += x3.sum(axis=(0, 2))
    return out


# ---------------------------------------------------------------------------------------------- sums
def weighted_sum(xs, coeffs, out):
    """out = sum_k coeffs[k] * xs[k], added in order (Eltwise SUM; Split's backward with coeffs 1)."""
    if jit.usable(*xs, out):
        _kernels().weighted_sum(tuple(_flat(x) for x in xs), np.asarray(coeffs, dtype=out.dtype), _flat(out))
        return out
    return weighted_sum_reference(xs, coeffs, out)


def weighted_sum_reference(xs, coeffs, out):
    xp = get_array_module(out)
    if len(xs) > 1 and coeffs[0] == 1 and coeffs[1] == 1:
        # The first two added in one pass (x * 1 is exact: the same values as the general form): on a
        # GPU, ResNet's Eltwise sums and Split gradients are a kernel each, not two.
        xp.add(xs[0], xs[1], out=out)
        first = 2
    else:
        xp.multiply(xs[0], coeffs[0], out=out)
        first = 1
    for c, x in zip(coeffs[first:], xs[first:]):
        out += c * x if c != 1 else x
    return out


# ---------------------------------------------------------------------------------------------- products
def product(xs, out):
    """out = prod_k xs[k], multiplied in order."""
    if jit.usable(*xs, out):
        _kernels().product(tuple(_flat(x) for x in xs), _flat(out))
        return out
    return product_reference(xs, out)


def product_gradients(xs, dy, stable: bool, outs: dict):
    """outs[k] = dy * the product of every input but xs[k], for each k in ``outs``. ``stable``: the
    inputs before k multiplied in order times those after k multiplied from the last one down
    (Caffe's stable_prod_grad); otherwise prod_j xs[j] / xs[k]."""
    wanted = sorted(outs)
    if jit.usable(*xs, dy, *outs.values()):
        _kernels().product_gradients(tuple(_flat(x) for x in xs), _flat(dy), np.asarray(wanted, dtype=np.int64),
                                     bool(stable), tuple(_flat(outs[k]) for k in wanted))
        return outs
    return product_gradients_reference(xs, dy, stable, outs)


def product_reference(xs, out):
    get_array_module(out).multiply(xs[0], xs[1], out=out)
    for x in xs[2:]:
        out *= x
    return out


def product_gradients_reference(xs, dy, stable: bool, outs: dict):
    xp = get_array_module(dy)
    n = len(xs)
    every = None if stable else product_reference(xs, xp.empty_like(dy))
    for k, out in outs.items():
        if not stable:
            out[...] = every / xs[k] * dy
            continue
        before = after = None
        for m in range(k):
            before = xs[m] if before is None else before * xs[m]
        for m in range(n - 1, k, -1):
            after = xs[m] if after is None else after * xs[m]
        others = before if after is None else (after if before is None else before * after)
        xp.multiply(others, dy, out=out)
    return outs


# ---------------------------------------------------------------------------------------------- maxima
def maximum(xs, out, mask):
    """out = max_k xs[k]; mask (int32) = the k each maximum came from: xs[0] only where strictly
    above xs[1], a later input only where strictly above the running maximum (Caffe's ties)."""
    if jit.usable(*xs, out):
        _kernels().maximum(tuple(_flat(x) for x in xs), _flat(out), _flat(mask))
        return out
    return maximum_reference(xs, out, mask)


def maximum_gradients(dy, mask, outs: dict):
    """outs[k] = dy where mask == k, else 0, for each k in ``outs``."""
    wanted = sorted(outs)
    if jit.usable(dy, *outs.values()) and mask.flags.c_contiguous:
        _kernels().maximum_gradients(_flat(dy), _flat(mask), np.asarray(wanted, dtype=np.int64),
                                     tuple(_flat(outs[k]) for k in wanted))
        return outs
    return maximum_gradients_reference(dy, mask, outs)


def maximum_reference(xs, out, mask):
    xp = get_array_module(out)
    first = xs[0] > xs[1]
    out[...] = xp.where(first, xs[0], xs[1])
    mask[...] = xp.where(first, 0, 1)
    for k, x in enumerate(xs[2:], 2):
        better = x > out
        out[better] = x[better]
        mask[better] = k
    return out


def maximum_gradients_reference(dy, mask, outs: dict):
    for k, out in outs.items():
        get_array_module(dy).multiply(dy, mask == k, out=out)
    return outs


# ---------------------------------------------------------------------------------------------- Scale
def scale_forward(x3, s, b, out3):
    """out3 = x3 * s (+ b unless b is None), s and b (D) broadcast over O and I."""
    if jit.usable(x3, s, b, out3):
        _kernels().scale_forward(x3, s, b, out3)
        return out3
    return scale_forward_reference(x3, s, b, out3)


def scale_backward(x3, dy3, s, dx3):
    """(sum of dy3 over O and I, sum of dy3 * x3 over O and I or None when x3 is None), both (D);
    also dx3 = dy3 * s unless dx3 is None."""
    if jit.usable(x3, dy3, s, dx3):
        sums = np.empty((2, dy3.shape[1]))
        _kernels().scale_backward(x3, dy3, s, dx3, sums)
        return sums[0], (None if x3 is None else sums[1])
    return scale_backward_reference(x3, dy3, s, dx3)


def scale_forward_reference(x3, s, b, out3):
    get_array_module(x3).multiply(x3, s.reshape(1, -1, 1), out=out3)
    if b is not None:
        out3 += b.reshape(1, -1, 1)
    return out3


def scale_backward_reference(x3, dy3, s, dx3):
    xp = get_array_module(dy3)
    sum_dy = dy3.sum(axis=(0, 2))
    sum_xdy = None if x3 is None else xp.einsum("odi,odi->d", dy3, x3)
    if dx3 is not None:
        xp.multiply(dy3, s.reshape(1, -1, 1), out=dx3)
    return sum_dy, sum_xdy
