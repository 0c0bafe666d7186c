"""The depthwise path (group == channels, 2-D): shifted multiply-adds over the taps, by the kernels of
layers/depthwise.py; no matrix product."""
from __future__ import annotations

from .. import depthwise
from .algorithm import BiasAfterProducts


class DepthwiseAlgorithm(BiasAfterProducts):
    """Each channel convolved with its own filters; the bias in a pass of its own, or in the map the
    net asks for, which the blocked kernels apply as they write each block of channels."""

    name = "depthwise"

    def products(self, layer, bottom, top):
        s = self.shape
        w = layer.blobs[0].data
        for b, t in zip(bottom, top):
            depthwise.forward(b.data.reshape(s.x_shape), w, s.geom, t.data.reshape(s.y_shape), layer.scratch)

    def mapped_products(self, layer, bottom, top, channel_map):
        s = self.shape
        if channel_map is not None and depthwise.forward_mapped(
                bottom[0].data.reshape(s.x_shape), layer.blobs[0].data, s.geom, top[0].data.reshape(s.y_shape),
                channel_map, layer.scratch):
            return True
        self.products(layer, bottom, top)
        return False

    def backward(self, layer, top, propagate_down, bottom):
        s = self.shape
        w = layer.blobs[0].data
        for b, t, down in zip(bottom, top, propagate_down):
            dy = t.diff.reshape(s.y_shape)
            layer.add_bias_gradient(dy.reshape(s.num, s.num_output, -1))
            if layer.param_propagate_down[0]:
                depthwise.backward_weights(b.data.reshape(s.x_shape), dy, s.geom, layer.blobs[0].diff, layer.scratch)
            if down:
                depthwise.backward_data(dy, w, s.geom, b.diff.reshape(s.x_shape), layer.scratch)
