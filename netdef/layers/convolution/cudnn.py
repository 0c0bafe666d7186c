"""The GPU's path where cuDNN is there and not refused: its three products (netdef/cudnn/convolution.py),
each planned once per shape with its fastest plan timed; the bias is the layer's own, added with CuPy
or by the channel map the net applies in place after the layer."""
from __future__ import annotations

from ... import backend
from ...cudnn import convolution as cudnn_convolution
from ...cudnn import plans as cudnn_plans
from .algorithm import AlgorithmRefused, BiasAfterProducts
from .base import ConvolutionShape


class CudnnAlgorithm(BiasAfterProducts):
    """Forward (fprop), input gradient (dgrad) and weight gradient (wgrad) through cuDNN. Where cuDNN has
    no plan for the shapes it raises ``AlgorithmRefused`` before any gradient is added to: the layer
    then runs netdef's own path from then on, and the log says why. The bias is added in a pass of
    its own, or, where the net maps the output in place (a ReLU, TEST-phase BatchNorm and Scale), by
    that map's one pass (``fusion.apply``)."""

    name = "cudnn"

    def __init__(self, shape: ConvolutionShape):
        super().__init__(shape)
        self.plans = cudnn_convolution.CudnnConvolution(shape.geom)

    def products(self, layer, bottom, top):
        s = self.shape
        w = layer.blobs[0].data
        for b, t in zip(bottom, top):
            try:
                self.plans.forward(b.data.reshape(s.x_shape), w, t.data.reshape(s.y_shape))
            except cudnn_plans.Unsupported as exc:
                raise AlgorithmRefused(self.name, f"cuDNN has no plan: {exc}") from exc

    def mapped_products(self, layer, bottom, top, channel_map):
        self.products(layer, bottom, top)
        return False  # cuDNN's graph writes the products as they are: the map is a pass of its own

    def backward(self, layer, top, propagate_down, bottom):
        s = self.shape
        try:
            # Every pair has the same shapes: planned once here, before any gradient is added to.
            self.plans.plan_backward(bottom[0].data.reshape(s.x_shape), top[0].diff.reshape(s.y_shape),
                                        layer.blobs[0].data)
        except cudnn_plans.Unsupported as exc:
            raise AlgorithmRefused(self.name, f"cuDNN has no plan: {exc}") from exc
        w = layer.blobs[0].data
        want_w = layer.param_propagate_down[0]
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.diff.reshape(s.y_shape)
            layer.add_bias_gradient(dy.reshape(s.num, s.num_output, -1))
            if want_w:
                x = b.data.reshape(s.x_shape)
                dw, overwrite = layer.blobs[0].diff_for_accumulation()
                if overwrite:
                    self.plans.weight_gradient(x, dy, dw)
                else:
                    # cuDNN's graphs write their output: a second pair of blobs (or a gradient
                    # already there) adds through a temporary.
                    part = layer.scratch.get("cudnn_dw", dw.shape, dw.dtype, backend.get_array_module(dw))
                    self.plans.weight_gradient(x, dy, part)
                    dw += part
            if propagate_down[i]:
                self.plans.input_gradient(dy, w, b.diff_to_overwrite().reshape(s.x_shape))
