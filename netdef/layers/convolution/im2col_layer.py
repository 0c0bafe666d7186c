"""Caffe's Im2col layer: the column matrix of im2col.py, as a top."""
from __future__ import annotations

import math

from ... import backend
from ..base import Layer, register_layer
from ..im2col import Workspace, col2im, column_layout, im2col
from .base import conv_geometry


@register_layer("Im2col")
class Im2colLayer(Layer):
    """Caffe's Im2colLayer: the column matrix of each sample as an image.

    bottom: (N x C x H x W) (or any leading axes before ``axis``, any number of spatial axes).
    top:    (N x C*kernel_h*kernel_w x H_out x W_out), output sizes as Convolution's;
            top[n, (c*kh + i)*kw + j, ho, wo] = x_pad[n, c, ho*stride_h + i*dilation_h, wo*stride_w + j*dilation_w].
    Uses convolution_param's kernel/stride/pad/dilation (num_output is ignored).
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        cp = self.layer_param.convolution_param
        self.channel_axis = bottom[0].canonical_axis(cp.axis)
        self.num_spatial = bottom[0].num_axes - self.channel_axis - 1
        if self.num_spatial < 1:
            raise self.error(f"needs at least one spatial axis after the channel axis; bottom {bottom[0].shape}")
        self.geom = conv_geometry(self, cp, self.num_spatial)
        self.ws = Workspace()
        self._layout_key = None  # (array module, num, channels, input size) of _layout_value
        self._layout_value = None

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        ca = self.channel_axis
        if len(shape) != ca + 1 + self.num_spatial:
            raise self.error(f"bottom num_axes may not change (now {shape})")
        self.num = math.prod(shape[:ca])
        self.channels = shape[ca]
        self.in_spatial = tuple(shape[ca + 1:])
        self.out_spatial = self.geom.conv_out(self.in_spatial)
        if any(o <= 0 for o in self.out_spatial):
            raise self.error(f"output size {self.out_spatial} is not positive for input {self.in_spatial}")
        top[0].reshape(shape[:ca] + (self.channels * self.geom.kernel_count,) + self.out_spatial)

    def _layout(self, xp):
        key = (xp, self.num, self.channels, self.in_spatial)
        if self._layout_key != key:
            self._layout_key = key
            self._layout_value = column_layout((self.num, self.channels) + self.in_spatial, self.geom, xp)
        return self._layout_value

    def forward(self, bottom, top):
        lay = self._layout(backend.get_array_module(bottom[0].data))
        cols = im2col(bottom[0].data.reshape(lay.x_shape), lay, self.ws)
        top[0].data.reshape((self.num, lay.rows) + self.out_spatial)[...] = lay.gather(cols)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = backend.get_array_module(top[0].diff)
        lay = self._layout(xp)
        dcols = lay.buffer(self.ws, "dcols", lay.rows, top[0].diff.dtype, xp)
        lay.scatter(dcols, top[0].diff.reshape((self.num, lay.rows) + self.out_spatial))
        col2im(dcols, lay, bottom[0].diff.reshape(lay.x_shape), self.ws)
