"""Direct 2-D convolution on the CPU: register-blocked microkernels over the padded input, no im2col.

A column matrix turns a convolution into one matrix product, but for the small images of LeNet and
CIFAR-10 (32-64 output channels) OpenBLAS runs those narrow products at half the rate of a square one,
and building the matrix costs another pass over memory per kernel tap. Here each kernel call
(jit/microkernels.py) keeps a block of outputs in vector registers (up to 10 pixels x 32 float channels
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
import math

import numpy as np

from ..threads import partition_width
from . import jit
from .im2col import Geometry

ENABLED = True
# Fewer taps per group than this leave each kernel call too little work against the pass that
# copies blocked sums out (output planes of a multiple of 4 KiB, ``scatters_to_nchw``): such a layer
# (VGG's first) runs faster by the column path. Where the kernels scatter into the output itself
# they win with any number of taps (benchmarks/README.md, "The figures behind the convolution paths").
MIN_TAPS = 32
# The input gradient is the direct forward of the padded top gradient where that costs at most this
# many times the multiply-adds of col2im's product (the kernels compute whole channel blocks, and
# the input positions where col2im's product covers only the output ones): the kernels run about
# twice the rate of col2im's product and scatter.
DIRECT_INPUT_GRADIENT_ABOVE = 2.5
# Where the row-product path can compute a convolution, its backward is used instead of the direct
# path's when the output rows are narrower than this (each kernel call then gets a short row), and its
# input gradient alone when the direct path's would be col2im's in a TRAIN net (the row path's is the
# faster; the weight gradient stays direct, see layers/convolution/planner.py's plan_rows). Only in
# TRAIN nets, and only the backward: the direct forward is the faster at these widths too. With its
# weight packing and gradient steps the direct backward is the faster from 6 wide up, as fast at 5,
# and the slower below (benchmarks/README.md, "The figures behind the convolution paths").
ROWS_BELOW_WIDTH = 5
# The forward's taps go in chunks whose packed weights take about this many bytes: they and the input
# rows the chunk's taps read stay in L1 (48 KiB here) while a block of output rows is computed; 32 KiB
# left the rows to L2 (benchmarks/README.md, "The figures behind the convolution paths"). The chunks
# change no sum: each output's taps are added in order, the partial sums carried between chunks in the
# output's type. ...
TAP_CHUNK_BYTES = 16 << 10
# ... over blocks of up to this many output rows of one image (the chunk's weights and input rows are
# read again for each row of the block; 8 rows ran faster than 4 at every size, benchmarks/README.md,
# "The figures behind the convolution paths"). Blocks are halved until every thread has 4 work items
# (a batch of one on 7 x 7 planes would leave threads idle). No sum depends on them.
BLOCK_ROWS = 8
MIN_ITEMS_PER_THREAD = 4
# The threads split the work by channel blocks (each reads its share of the packed weights, every
# image) where the weights take more bytes than the padded input, else by images (each reads its
# share of the input, all the weights): what every thread reads whole is the smaller of the two. No
# sum depends on it.
# The weight gradient goes over the images in steps whose padded inputs and blocked gradients take
# about this many bytes (at least one image): they stay in L2 while every tap span reads them
# (benchmarks/README.md, "The figures behind the convolution paths").
WEIGHT_GRADIENT_STEP_BYTES = 1 << 20
# Addresses this many bytes apart fall in the same L1 set (x86's L1 caches: 64 sets of 64 bytes).
SCATTER_ALIASING_BYTES = 4096


def usable(dtype, num_spatial: int, group: int, channels: int, kernel, out_spatial) -> bool:
    """Whether the direct path computes a convolution of these properties on NumPy arrays of
    ``dtype``: 2-D, not depthwise (those keep their own kernels), not 1x1 (a matrix product as it
    stands: the column path's products ran ResNet's strided 1x1 layers faster), and with at
    least MIN_TAPS taps per group unless its output planes are written in place. Whether the kernels
    compile on this CPU is ``compiles``' question, asked last (a layer that takes another path never
    compiles them)."""
    return (ENABLED and jit.ENABLED and num_spatial == 2 and np.dtype(dtype) in (np.float32, np.float64)
            and not (group > 1 and group == channels) and math.prod(kernel) > 1
            and (channels // group * math.prod(kernel) >= MIN_TAPS or scatters_to_nchw(out_spatial, dtype)))


def scatters_to_nchw(out_spatial, dtype) -> bool:
    """Whether the forward kernels write the output's channel planes themselves: one vector lane per
    plane, so not where a plane is a multiple of 4 KiB, where every lane would fall in one L1 set
    (CIFAR-10's 32 x 32 planes, VGG's 224 x 224): those layers write blocked sums and copy them out."""
    return math.prod(out_spatial) * np.dtype(dtype).itemsize % SCATTER_ALIASING_BYTES != 0


@functools.lru_cache(maxsize=None)
def compiles(dtype) -> bool:
    """Whether this CPU's microkernels compile (llvmlite, which numba brings, generates them); where
    they do not, the other paths compute (the column paths; depthwise.py's phase kernels), and the
    log says why once."""
    from .jit import microkernels

    try:
        microkernels.kernels_for(dtype)
    except Exception as error:  # any failure of code generation leaves the other paths, which work
        logging.getLogger("netdef").warning(f"convolution microkernels unavailable for {dtype} ({error}); "
                                            "using the column and phase paths")
        return False
    return True


def input_gradient_direct(geom: Geometry) -> bool:
    """Whether the input gradient can be the direct forward of the padded top gradient (stride 1 and
    pad <= extent - 1; a larger pad only adds outputs that read padding)."""
    return geom.stride == (1, 1) and all(p <= e - 1 for p, e in zip(geom.pad, geom.extent))


def input_gradient(geom: Geometry, channels: int, group: int, in_hw, out_hw, dtype) -> str:
    """How the direct path computes the input gradient: "direct" (the forward of the padded top
    gradient) where it can and that costs at most DIRECT_INPUT_GRADIENT_ABOVE times col2im's product
    (the kernels compute whole blocks of input channels: a first layer's 3 channels cost 32), "col2im"
    (the column path's product and scatter) otherwise. From the shapes alone, so that a resumed run
    takes the same path."""
    from .jit import microkernels

    per_group = channels // group
    block = microkernels.shape_for(np.dtype(dtype)).channels
    direct_cost = math.prod(in_hw) * -(-per_group // block) * block
    col2im_cost = math.prod(out_hw) * per_group
    if input_gradient_direct(geom) and direct_cost <= DIRECT_INPUT_GRADIENT_ABOVE * col2im_cost:
        return "direct"
    return "col2im"


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


def block_rows(d: _Direction, threads: int | None = None) -> int:
    """The output rows per work item of the forward kernels for direction ``d``: BLOCK_ROWS, halved
    while that leaves fewer than MIN_ITEMS_PER_THREAD items per thread (by default for the threads the
    kernels' work is cut for, threads.partition_width, whatever count runs it)."""
    if threads is None:
        threads = partition_width()
    num, group, blocks, rows = d.blocked_shape[:4]
    per_row_block = num * group * blocks
    chosen = BLOCK_ROWS
    while chosen > 1 and per_row_block * -(-rows // chosen) < MIN_ITEMS_PER_THREAD * threads:
        chosen //= 2
    return chosen


class DirectConvolution:
    """The direct path of one Convolution layer for one input shape (N x C x H x W) and dtype."""

    def __init__(self, geom: Geometry, num: int, channels: int, num_output: int, group: int,
                 in_hw, out_hw, dtype):
        from .jit import microkernels

        self.geom = geom
        self.kernels = microkernels.kernels_for(np.dtype(dtype))
        block = self.kernels.shape.channels
        self.chunk_taps = max(1, TAP_CHUNK_BYTES // (block * np.dtype(dtype).itemsize))
        self.dtype = np.dtype(dtype)
        self.forward_dir = _Direction(num, group, channels, num_output, in_hw, out_hw, geom.pad, geom.stride,
                                      geom, block)
        #: How the input gradient is computed for these shapes ("direct" or "col2im"; see input_gradient).
        self.input_gradient_choice = input_gradient(geom, channels, group, in_hw, out_hw, dtype)
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

    def _packed(self, w, d: _Direction, scratch, key, flipped=False):
        """w (G*Og x Cg x kh x kw) packed per group and channel block for the direction ``d``; the
        input gradient's (``flipped``): for group g, wf[g*Cg + c, o, i, j] = w[g*Og + o, c, kh-1-i, kw-1-j]."""
        from .jit import direct_conv

        packed = scratch.get(key, d.packed_shape, self.dtype, np)
        w = np.ascontiguousarray(w)
        if flipped:
            direct_conv.pack_flipped(w, packed)
            return packed
        # The forward's packing is the layout change of to_blocks, the filters as one image of G*Og
        # channels over T cells: its square tiles move by vector transposes, where a loop over the
        # values (as pack_flipped) moves one at a time. At batch 1 the packing is a large part of a
        # layer with many weights (benchmarks/README.md, "The figures behind the convolution paths").
        g, b, t, block = d.packed_shape
        direct_conv.to_blocks(w.reshape(1, w.shape[0], t, 1), packed.reshape(1, g, b, t, 1, block),
                              self.kernels.transpose[0], self.kernels.shape.lanes)
        return packed

    # ---- the three computations
    def forward(self, x, w, bias, y, scratch):
        """y (N x O x Ho x Wo) = the convolution of x with w plus bias (None: no bias)."""
        d = self.forward_dir
        self._taps(d, self._padded(x, d, scratch, "direct_x"), self._packed(w, d, scratch, "direct_w"), bias, y,
                   scratch)

    def _taps(self, d: _Direction, xp, packed, bias, y, scratch):
        """y = the direct convolution ``d`` of the padded xp with the packed weights, plus bias (None:
        none)."""
        from .jit import direct_conv

        g, b, _, block = d.packed_shape
        padded_bias = scratch.get("direct_bias", (g, b * block), self.dtype, np, clear=True)
        if bias is not None:
            padded_bias[:, :d.out_per_group] = bias.reshape(g, d.out_per_group)
        to_nchw = scatters_to_nchw(d.blocked_shape[3:5], self.dtype)
        # Partial sums only where the taps take more than one chunk (or the copy needs them).
        part = (scratch.get("direct_part", d.blocked_shape, self.dtype, np)
                if d.taps > self.chunk_taps or not to_nchw else padded_bias)
        direct_conv.taps(xp, packed, d.offsets, part, y, padded_bias, self.kernels.taps, *d.stride,
                         self.kernels.shape.widest_pixels, self.chunk_taps, block_rows(d), to_nchw,
                         packed.nbytes > xp.nbytes)
        if not to_nchw:
            direct_conv.from_blocks(part, bias if bias is not None else np.empty(0, self.dtype), y,
                                     self.kernels.transpose[1], self.kernels.shape.lanes)

    def weight_gradient(self, x, dy, dw, scratch, overwrite=False):
        """dw (O x Cg x kh x kw) += the weight gradient of x (N x C x H x W) and dy (N x O x Ho x Wo);
        with ``overwrite`` (``Blob.diff_for_accumulation`` right after the solver's clear), dw = the
        gradient: what adding it to zeros gives, without reading dw."""
        from .jit import direct_conv

        d = self.forward_dir
        xp = self._padded(x, d, scratch, "direct_x")
        part = scratch.get("direct_dw", d.packed_shape, self.dtype, np)
        image_bytes = (math.prod(d.padded_shape[1:]) + math.prod(d.blocked_shape[1:])) * self.dtype.itemsize
        step = max(1, WEIGHT_GRADIENT_STEP_BYTES // image_bytes)
        num = x.shape[0]
        dyb = scratch.get("direct_dy", (min(step, num),) + d.blocked_shape[1:], self.dtype, np)
        # The gradient blocked one step of images at a time, right before the kernels read it: still
        # in cache, where blocking the whole batch first sent it through memory; a step's buffer
        # instead of the batch's.
        for start in range(0, num, step):
            stop = min(num, start + step)
            blocked = dyb[:stop - start]
            direct_conv.to_blocks(dy[start:stop], blocked, self.kernels.transpose[0], self.kernels.shape.lanes)
            direct_conv.pixels(xp[start:stop], blocked, d.offsets, part, self.kernels.pixels, *d.stride,
                               self.kernels.shape.widest_taps, stop - start, partition_width(), start == 0)
        if overwrite:
            # The packed sums moved into dw's layout by tile transposes (plus 0, as from_blocks adds
            # a missing bias: the values adding them to zeros gives), without the passes that add
            # them unpacked and zero dw before.
            g, b, t, block = d.packed_shape
            direct_conv.from_blocks(part.reshape(1, g, b, t, 1, block), np.empty(0, self.dtype),
                                    dw.reshape(1, dw.shape[0], t, 1), self.kernels.transpose[1],
                                    self.kernels.shape.lanes)
        else:
            direct_conv.add_unpacked(part, dw)

    def input_gradient(self, dy, w, dx, scratch):
        """dx (N x C x H x W) = the input gradient of dy (N x O x Ho x Wo); stride 1 only
        (``backward_dir`` is None otherwise)."""
        d = self.backward_dir
        packed = self._packed(w, d, scratch, "direct_wf", flipped=True)
        self._taps(d, self._padded(dy, d, scratch, "direct_dyp"), packed, None, dx, scratch)
