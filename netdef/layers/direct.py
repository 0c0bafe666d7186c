"""Direct 2-D convolution on the CPU: register-blocked microkernels over the padded input, no im2col.

A column matrix turns a convolution into one matrix product, but for the small images of LeNet and
CIFAR-10 (32-64 output channels) OpenBLAS runs those narrow products at half the rate of a square one,
and building the matrix costs another pass over memory per kernel tap. Here each kernel call
(jit/microkernels.py) keeps a block of outputs in vector registers (up to 12 pixels x 32 float channels
on AVX-512) and reads the input where it lies (jit/direct_conv.py):

- forward: y[n, o, h, w] = sum over the group's taps (ci, i, j) of w[o, ci, i, j] xpad[n, ci, h*sh + i*dh,
  w*sw + j*dw], then the bias;
- weight gradient: dw[o, t] += sum over images, rows and columns of dy[n, o, h, w] xpad[n, tap t at
  (h, w)];
- input gradient (stride 1, pad <= extent - 1): the forward of the top gradient padded by extent - 1 -
  pad with the flipped, transposed filters. Other strides take the column path's col2im (the layer).

Every element is one sum in a fixed order (see jit/microkernels.py): the same bits whatever the thread
count; they differ from the column path's products by rounding only. Used for float32 and float64
NumPy arrays when the compiled kernels are enabled (``usable``); ``ENABLED`` lets tests choose the
other paths.
"""
from __future__ import annotations

import functools
import logging

import numpy as np

from . import jit
from .im2col import Geometry

ENABLED = True
# Images per step of the weight gradient: their padded inputs and blocked gradients stay in cache
# while every tap span reads them.
WEIGHT_GRADIENT_IMAGES = 8


def usable(dtype, num_spatial: int, group: int, channels: int) -> bool:
    """Whether the direct path computes a convolution of these properties on NumPy arrays of
    ``dtype`` (depthwise convolutions keep their own kernels)."""
    return (ENABLED and jit.ENABLED and num_spatial == 2 and np.dtype(dtype) in (np.float32, np.float64)
            and not (group > 1 and group == channels) and _compiles(np.dtype(dtype)))


@functools.lru_cache(maxsize=None)
def _compiles(dtype) -> bool:
    """Whether this CPU's microkernels compile (llvmlite, which numba brings, generates them); where
    they do not, the column paths compute, and the log says why once."""
    from .jit import microkernels

    try:
        microkernels.kernels_for(dtype)
    except Exception as error:  # any failure of code generation leaves the other paths, which work
        logging.getLogger("netdef").warning(f"direct convolution kernels unavailable for {dtype} ({error}); using the column path")
        return False
    return True


def input_gradient_direct(geom: Geometry) -> bool:
    """Whether the input gradient is the direct forward of the padded top gradient (stride 1 and
    pad <= extent - 1; a larger pad only adds outputs that read padding)."""
    return geom.stride == (1, 1) and all(p <= e - 1 for p, e in zip(geom.pad, geom.extent))


def _tap_offsets(channels: int, padded_hw, geom: Geometry) -> np.ndarray:
    hp, wp = padded_hw
    kh, kw = geom.kernel
    dh, dw = geom.dilation
    c, i, j = np.meshgrid(np.arange(channels), np.arange(kh), np.arange(kw), indexing="ij")
    return (c * hp * wp + i * dh * wp + j * dw).reshape(-1).astype(np.int64)


class _Direction:
    """One convolution the kernels compute: input channels per group, outputs per group, geometry
    (pad and stride), and the shapes of the padded input and the blocked output."""

    def __init__(self, num, group, in_channels, out_channels, in_hw, out_hw, pad, stride, geom, block):
        self.group = group
        self.in_per_group = in_channels // group
        self.out_per_group = out_channels // group
        self.blocks = -(-self.out_per_group // block)
        self.pad = pad
        self.stride = stride
        self.padded_hw = (in_hw[0] + 2 * pad[0], in_hw[1] + 2 * pad[1])
        self.padded_shape = (num, in_channels) + self.padded_hw
        self.blocked_shape = (num, group, self.blocks) + tuple(out_hw) + (block,)
        self.offsets = _tap_offsets(self.in_per_group, self.padded_hw, geom)
        self.taps = self.offsets.size
        self.packed_shape = (group, self.blocks, self.taps, block)


class DirectConvolution:
    """The direct path of one Convolution layer for one input shape (N x C x H x W) and dtype."""

    def __init__(self, geom: Geometry, num: int, channels: int, num_output: int, group: int,
                 in_hw, out_hw, dtype):
        from .jit import microkernels

        self.geom = geom
        self.kernels = microkernels.kernels_for(np.dtype(dtype))
        block = self.kernels.shape.channels
        self.widest = self.kernels.shape.widest
        self.dtype = np.dtype(dtype)
        self.forward_dir = _Direction(num, group, channels, num_output, in_hw, out_hw, geom.pad, geom.stride,
                                      geom, block)
        self.backward_dir = None
        if input_gradient_direct(geom):
            back_pad = tuple(e - 1 - p for p, e in zip(geom.pad, geom.extent))
            self.backward_dir = _Direction(num, group, num_output, channels, out_hw, in_hw, back_pad, (1, 1),
                                           geom, block)

    # ---- layouts
    def _padded(self, x, d: _Direction, scratch, key):
        if not any(d.pad):
            return np.ascontiguousarray(x)
        out = scratch.get(key, d.padded_shape, self.dtype, np)
        from .jit import direct_conv

        direct_conv.pad(x, out, *d.pad)
        return out

    def _packed(self, w, d: _Direction, scratch, key):
        """w (G*Og x Cg x kh x kw, or the flipped, transposed filters) packed per group and channel block."""
        g, b, t, block = d.packed_shape
        packed = scratch.get(key, d.packed_shape, self.dtype, np)
        rows = w.reshape(g, d.out_per_group, t)
        for k in range(b):
            first, last = k * block, min(d.out_per_group, (k + 1) * block)
            packed[:, k, :, :last - first] = rows[:, first:last].transpose(0, 2, 1)
            packed[:, k, :, last - first:] = 0
        return packed

    def _flipped(self, w):
        """The input gradient's filters: for group g, wf[g*Cg + c, o, i, j] = w[g*Og + o, c, kh-1-i, kw-1-j]."""
        d = self.backward_dir
        g = d.group
        w5 = w.reshape((g, d.in_per_group, d.out_per_group) + w.shape[2:])
        return w5[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4)

    # ---- the three computations
    def forward(self, x, w, bias, y, scratch):
        """y (N x O x Ho x Wo) = the convolution of x with w plus bias (None: no bias)."""
        from .jit import direct_conv

        d = self.forward_dir
        xp = self._padded(x, d, scratch, "direct_x")
        packed = self._packed(w, d, scratch, "direct_w")
        blocked = scratch.get("direct_y", d.blocked_shape, self.dtype, np)
        direct_conv.taps(xp, packed, d.offsets, blocked, self.kernels.taps, *d.stride, self.widest)
        direct_conv.from_blocks(blocked, bias if bias is not None else np.empty(0, self.dtype), y)

    def weight_gradient(self, x, dy, dw, scratch):
        """dw (O x Cg x kh x kw) += the weight gradient of x (N x C x H x W) and dy (N x O x Ho x Wo)."""
        from .jit import direct_conv

        d = self.forward_dir
        xp = self._padded(x, d, scratch, "direct_x")
        dyb = scratch.get("direct_dy", d.blocked_shape, self.dtype, np)
        direct_conv.to_blocks(dy, dyb)
        part = scratch.get("direct_dw", d.packed_shape, self.dtype, np)
        part[...] = 0
        direct_conv.pixels(xp, dyb, d.offsets, part, self.kernels.pixels, *d.stride, self.widest,
                           WEIGHT_GRADIENT_IMAGES)
        g, b, t, block = d.packed_shape
        dw.reshape(g, d.out_per_group, t)[...] += part.transpose(0, 1, 3, 2).reshape(g, b * block, t)[:, :d.out_per_group]

    def input_gradient(self, dy, w, dx, scratch):
        """dx (N x C x H x W) = the input gradient of dy (N x O x Ho x Wo); stride 1 only
        (``backward_dir`` is None otherwise)."""
        from .jit import direct_conv

        d = self.backward_dir
        dyp = self._padded(dy, d, scratch, "direct_dyp")
        packed = self._packed(np.ascontiguousarray(self._flipped(w)), d, scratch, "direct_wf")
        blocked = scratch.get("direct_dx", d.blocked_shape, self.dtype, np)
        direct_conv.taps(dyp, packed, d.offsets, blocked, self.kernels.taps, 1, 1, self.widest)
        direct_conv.from_blocks(blocked, np.empty(0, self.dtype), dx)
