"""The direct path: the register-blocked kernels of layers/direct.py over the padded input, no column
matrix; the CPU's path for 2-D convolutions of float arrays that are neither 1x1 nor depthwise. The
input gradient is the kernels' forward of the padded top gradient where that is cheap enough
(``direct.input_gradient``), the column path's col2im otherwise."""
from __future__ import annotations

import numpy as np

from .. import direct
from ..im2col import Workspace
from .algorithm import ConvolutionAlgorithm
from .base import ConvolutionShape
from .columns import ColumnChunks, col2im_input_gradient, grouped_weights


def planned_kernels(shape: ConvolutionShape, dtype) -> direct.DirectConvolution:
    """The direct kernels planned for ``shape`` and ``dtype``."""
    return direct.DirectConvolution(shape.geom, shape.num, shape.channels, shape.num_output, shape.group,
                                    shape.in_spatial, shape.out_spatial, dtype)


def add_weight_gradient(kernels: direct.DirectConvolution, layer, x, dy) -> None:
    """The direct kernels' weight gradient of x and dy into the weights' diff: written right after the
    solver's deferred clear (what adding it to zeros gives), added otherwise."""
    dw, overwrite = layer.blobs[0].diff_for_accumulation()
    kernels.weight_gradient(x, dy, dw, layer.scratch, overwrite=overwrite)


class DirectAlgorithm(ConvolutionAlgorithm):
    """Forward and weight gradient by the direct kernels; the input gradient as ``input_gradient``
    says ("direct" or "col2im")."""

    name = "direct"

    def __init__(self, shape: ConvolutionShape, dtype):
        super().__init__(shape)
        self.kernels = planned_kernels(shape, dtype)
        self.input_gradient = self.kernels.input_gradient_choice
        self.workspace = Workspace()  # col2im's top gradient in columns
        self.chunks = ColumnChunks(shape.geom)

    def kept_bytes(self) -> int:
        return self.workspace.nbytes

    def forward(self, layer, bottom, top):
        s = self.shape
        bias = layer.blobs[1].data if layer.bias_term else None
        for b, t in zip(bottom, top):
            self.kernels.forward(b.data.reshape(s.x_shape), layer.blobs[0].data, bias, t.data.reshape(s.y_shape),
                                 layer.scratch)

    def backward(self, layer, top, propagate_down, bottom):
        s = self.shape
        w = layer.blobs[0].data
        for b, t, down in zip(bottom, top, propagate_down):
            x = b.data.reshape(s.x_shape)
            dy = t.diff.reshape(s.y_shape)
            layer.add_bias_gradient(dy.reshape(s.num, s.num_output, -1))
            if layer.param_propagate_down[0]:
                add_weight_gradient(self.kernels, layer, x, dy)
            if not down:
                continue
            dx = b.diff.reshape(x.shape)
            if self.input_gradient == "direct":
                self.kernels.input_gradient(dy, w, dx, layer.scratch)
            else:
                self._col2im_input_gradient(layer, dy, dx)

    def _col2im_input_gradient(self, layer, dy, dx):
        s = self.shape
        weights = grouped_weights(layer.blobs[0].data, s.group)
        for start, stop, lay in self.chunks(np, s.num, s.channels, s.in_spatial, dy.dtype):
            dy_cols = lay.buffer(self.workspace, ("dy", lay.x_shape[0]), s.num_output, dy.dtype, np)
            lay.scatter(dy_cols, dy[start:stop])
            col2im_input_gradient(layer.scratch, np, weights, dy_cols.reshape(s.group, s.num_output // s.group, -1),
                                  lay, dx[start:stop])
