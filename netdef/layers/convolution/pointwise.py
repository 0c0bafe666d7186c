"""The pointwise path (1x1 kernel, no padding, one group): y[n] = W x[n] as (C x H*W) matrices, no column
matrix and, at stride 1, no copy of the input.

Per-sample products on (C x S) matrices, or, on small planes, one product for the batch on
channel-major copies (N x C x S -> C x N*S): OpenBLAS runs (O x 49) products badly. With strides, the
products read a copy of the pixels the strides pick (im2col.strided_pixels), made again for backward
(the bottom's values then, as Caffe reads them), and the input gradient is spread back over the map
with zeros between: the column path's im2col copied the picked pixels on one core, and its products
went through the column matrix's layout (benchmarks/README.md, "The figures behind the convolution
paths").
"""
from __future__ import annotations

import math

from ... import backend
from ..im2col import spread_strided, strided_pixels
from ..matmul import matmul, matmul_row_mapped
from .algorithm import BiasAfterProducts
from .base import ConvolutionShape

# A 1x1 convolution whose output planes hold fewer pixels than this runs one matrix product for the
# whole batch on channel-major copies instead of one per image; at 14 x 14 (196 pixels) the two ways
# measure alike, at 28 x 28 the copies cost more than they save.
POINTWISE_STACK_BELOW_PIXELS = 128


class PointwiseAlgorithm(BiasAfterProducts):
    """The products per sample, or stacked for the batch (``stacked``) on small planes; the bias in a
    pass of its own, or in the map the net asks for, which the products apply as each thread's panel
    is computed (the output channels are the products' rows)."""

    name = "pointwise"

    def __init__(self, shape: ConvolutionShape):
        super().__init__(shape)
        self.stacked = shape.num > 1 and math.prod(shape.out_spatial) < POINTWISE_STACK_BELOW_PIXELS
        self.strided = any(s != 1 for s in shape.geom.stride)

    def _channel_major(self, layer, a, key):
        """A (K x N x S) copy of the (N x K x S) array ``a``, in scratch ``key``."""
        xp = backend.get_array_module(a)
        out = layer.scratch.get(key, (a.shape[1], a.shape[0], a.shape[2]), a.dtype, xp)
        xp.copyto(out, a.transpose(1, 0, 2))
        return out

    def _input(self, layer, data):
        """The input as the products read it, (N x C x S_out): as it is, or the strides' pixels copied."""
        s = self.shape
        if not self.strided:
            return data.reshape(s.num, s.channels, -1)
        xp = backend.get_array_module(data)
        picked = layer.scratch.get("pointwise_picked", (s.num, s.channels) + s.out_spatial, data.dtype, xp)
        strided_pixels(data.reshape(s.x_shape), s.geom.stride, picked)
        return picked.reshape(s.num, s.channels, -1)

    def products(self, layer, bottom, top):
        self.mapped_products(layer, bottom, top, None)

    def mapped_products(self, layer, bottom, top, channel_map):
        """The products into the tops; with ``channel_map`` and one top, mapped as each panel is
        computed where matmul_row_mapped can. Whether the top was mapped (False: nothing is)."""
        s = self.shape
        xp = backend.get_array_module(bottom[0].data)
        w = layer.blobs[0].data.reshape(s.num_output, s.channels)
        mapped = channel_map is not None and len(top) == 1
        for b, t in zip(bottom, top):
            x = self._input(layer, b.data)
            y = t.data.reshape(s.num, s.num_output, -1)
            if not self.stacked:
                if not (mapped and matmul_row_mapped(w, x, y, channel_map)):
                    matmul(w, x, out=y)
                    mapped = False
                continue
            yt = layer.scratch.get("pointwise_yt", (s.num_output,) + x.shape[::2], x.dtype, xp)
            xt = self._channel_major(layer, x, "pointwise_xt").reshape(s.channels, -1)
            if not (mapped and matmul_row_mapped(w, xt, yt.reshape(s.num_output, -1), channel_map)):
                matmul(w, xt, out=yt.reshape(s.num_output, -1))
                mapped = False
            xp.copyto(y, yt.transpose(1, 0, 2))
        return mapped

    def backward(self, layer, top, propagate_down, bottom):
        s = self.shape
        xp = backend.get_array_module(top[0].diff)
        w = layer.blobs[0].data.reshape(s.num_output, s.channels)
        stacked = self.stacked
        for b, t, down in zip(bottom, top, propagate_down):
            dy = t.diff.reshape(s.num, s.num_output, -1)
            layer.add_bias_gradient(dy)
            x = self._input(layer, b.data)
            dyt = self._channel_major(layer, dy, "pointwise_dyt").reshape(s.num_output, -1) if stacked else None
            if layer.param_propagate_down[0]:
                # Right after the solver's clear the first product is written into the gradient itself
                # (what adding it to zeros gives), without the passes that zero it and read it back.
                diff, overwrite = layer.blobs[0].diff_for_accumulation()
                dw = diff.reshape(s.num_output, s.channels)
                part = layer.scratch.get("pointwise_dw", dw.shape, dw.dtype, xp)
                if stacked:
                    # One (O x N*S)(N*S x C) product: the sum over the batch's pixels in one pass.
                    matmul(dyt, self._channel_major(layer, x, "pointwise_xt").reshape(s.channels, -1).T,
                           out=dw if overwrite else part)
                    if not overwrite:
                        dw += part
                else:
                    for n in range(s.num):
                        # One product per sample: (O x S)(S x C) needs no copy of either operand.
                        first = overwrite and n == 0
                        matmul(dy[n], x[n].T, out=dw if first else part)
                        if not first:
                            dw += part
            if down:
                # With strides, into the buffer of the picked pixels (which the weight gradient has used)
                dx = x if self.strided else b.diff.reshape(x.shape)
                if stacked:  # into the buffer of x's channel-major copy, which the weight gradient has used
                    dxt = layer.scratch.get("pointwise_xt", (s.channels,) + x.shape[::2], x.dtype, xp)
                    matmul(w.T, dyt, out=dxt.reshape(s.channels, -1))
                    xp.copyto(dx, dxt.transpose(1, 0, 2))
                else:
                    matmul(w.T, dy, out=dx)
                if self.strided:
                    spread_strided(dx.reshape((s.num, s.channels) + s.out_spatial), s.geom.stride,
                                   b.diff.reshape(s.x_shape))
