"""Caffe's Deconvolution layer (a transposed convolution), computed by the column path's pieces."""
from __future__ import annotations

from ... import backend
from ..base import register_layer
from ..im2col import Workspace, col2im, im2col
from .base import ConvolutionBase
from .columns import (ColumnChunks, add_weight_gradient, grouped_product, grouped_weights, product_into_chunk,
                      scattered_chunk)


@register_layer("Deconvolution")
class DeconvolutionLayer(ConvolutionBase):
    """Deconvolution (transposed convolution), Caffe's DeconvolutionLayer: the forward pass is a
    convolution's backward pass with respect to its input.

    bottom[i]: (N x C x H x W).
    top[i]:    (N x num_output x H_out x W_out), H_out = stride_h (H - 1) + dilation_h (kernel_h - 1) + 1
               - 2 pad_h (likewise W).
    blobs:     weight (C x num_output/group x kernel_h x kernel_w); bias (num_output) if bias_term.

    y = b + col2im(W^T x) per group, where x is read as (C x N*H*W).
    """

    reverse = True

    def setup(self, bottom, top):
        super().setup(bottom, top)
        self.workspace = Workspace()  # the input and the top gradient in columns
        # The columns live in the space of the output (this layer's output is a convolution's input).
        self.chunks = ColumnChunks(self.geom)

    def forward(self, bottom, top):
        xp = backend.get_array_module(bottom[0].data)
        c, g = self.channels, self.group
        w = grouped_weights(self.blobs[0].data, g)
        chunks = self.chunks(xp, self.num, self.num_output, self.out_spatial, bottom[0].dtype)
        for b, t in zip(bottom, top):
            x = b.data.reshape((self.num, c) + self.in_spatial)
            y_all = t.data.reshape((self.num, self.num_output) + self.out_spatial)
            for start, stop, lay in chunks:
                xt = scattered_chunk(lay, self.workspace, "xt", c, x[start:stop], xp)
                cols = self.scratch.get("deconv_cols", (lay.rows, lay.ncols), x.dtype, xp)
                grouped_product(g, w, xt.reshape(g, c // g, -1), cols.reshape(g, -1, lay.ncols), trans_a=True)
                col2im(cols, lay, y_all[start:stop], self.scratch)
            self.add_bias(y_all)

    def backward(self, top, propagate_down, bottom):
        xp = backend.get_array_module(top[0].diff)
        c, g = self.channels, self.group
        w = grouped_weights(self.blobs[0].data, g)
        want_w = self.param_propagate_down[0]
        want_b = self.bias_term and self.param_propagate_down[1]
        chunks = self.chunks(xp, self.num, self.num_output, self.out_spatial, top[0].diff.dtype)
        for b, t, down in zip(bottom, top, propagate_down):
            if not (want_w or want_b or down):
                continue
            dy_all = t.diff.reshape((self.num, self.num_output) + self.out_spatial)
            self.add_bias_gradient(dy_all.reshape(self.num, self.num_output, -1))
            if not (want_w or down):
                continue
            x = b.data.reshape((self.num, c) + self.in_spatial)
            dx_all = b.diff.reshape(x.shape) if down else None
            for start, stop, lay in chunks:
                dcols = im2col(dy_all[start:stop], lay, self.workspace, key=("dcols", lay.x_shape[0]))
                dcols_g = dcols.reshape(g, -1, lay.ncols)
                if want_w:
                    xt = scattered_chunk(lay, self.workspace, "xt", c, x[start:stop], xp)
                    add_weight_gradient(self.blobs[0], g, dcols_g, xt.reshape(g, c // g, -1))
                if dx_all is not None:
                    product_into_chunk(self.scratch, "deconv_dxt", w, dcols_g, lay, dx_all[start:stop], xp)
