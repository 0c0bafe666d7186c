"""Which algorithm computes a Convolution layer, chosen once per input shape, dtype and array module
(``plan``), from the shapes alone, so that a resumed run takes the same path and gets the same bits.

On a GPU: cuDNN wherever it is installed and not refused (``engine: CAFFE``, or a plan it could not
make for this layer); the log says once per layer which path runs and why. Otherwise:

- "depthwise": group == channels (2-D): shifted multiply-adds over the taps (depthwise.py);
- "pointwise": 1x1 kernel, no padding, one group: matrix products on the input as it lies
  (pointwise.py);
- "direct": other 2-D convolutions of NumPy float arrays: register-blocked kernels over the padded
  input (direct.py), unless the row path's backward is the better one (below);
- "rows": the CPU's row products (rows.py), for stride-1 convolutions of one group with enough input
  channels, where the direct path does not apply or, in a TRAIN net, where it would be the slower
  backward: outputs narrower than direct.ROWS_BELOW_WIDTH, or an input gradient the direct path
  would compute by col2im. The direct kernels then still take its forward, and for outputs at least
  that wide its weight gradient;
- "columns": im2col and one product per group over chunks of the batch, anything else (columns.py).

A TEST net's layers run forward only (a backward still works, by either path), and the direct
forward is the faster one at every width: there the direct path is taken wherever it applies.
"""
from __future__ import annotations

import numpy as np

from ... import cudnn
from ...cudnn import convolution as cudnn_convolution
from ...proto import netdef_pb2 as pb
from .. import direct
from ..base import TRAIN
from .algorithm import ConvolutionAlgorithm
from .base import ConvolutionShape
from .columns import ColumnsAlgorithm
from .cudnn import CudnnAlgorithm
from .depthwise import DepthwiseAlgorithm
from .direct import DirectAlgorithm, planned_kernels
from .pointwise import PointwiseAlgorithm
from .rows import RowsAlgorithm, eligible, input_gradient_choice


def plan(layer, xp, dtype) -> ConvolutionAlgorithm:
    """The algorithm for ``layer`` (a ConvolutionLayer, its ``shape`` set for the input) on arrays of
    ``xp`` and ``dtype``."""
    shape = layer.shape
    if xp is np:
        return plan_netdef(shape, layer.phase, xp, dtype)
    reason = cudnn_refusal(layer, dtype)
    if reason is None:
        cudnn.log_path_once(layer.name, "cuDNN", "its fastest plan per shape, timed once")
        return CudnnAlgorithm(shape)
    fallback = plan_netdef(shape, layer.phase, xp, dtype)
    cudnn.log_path_once(layer.name, f"netdef's {fallback.name} path", reason)
    return fallback


def cudnn_refusal(layer, dtype) -> str | None:
    """None where ``layer``'s products run through cuDNN on the GPU; else why not."""
    if layer.layer_param.convolution_param.engine == pb.ConvolutionParameter.CAFFE:
        return "engine: CAFFE asks for Caffe's own path"
    refused = layer.refused.get(CudnnAlgorithm.name)
    if refused is not None:
        return refused
    if not cudnn.usable():
        return cudnn.why_not()
    return cudnn_convolution.usable_for(layer.shape.num_spatial, dtype)


def plan_netdef(shape: ConvolutionShape, phase, xp, dtype) -> ConvolutionAlgorithm:
    """netdef's own algorithm for ``shape`` (the module docstring's rules)."""
    g = shape.geom
    if shape.num_spatial == 2 and shape.group > 1 and shape.group == shape.channels:
        return DepthwiseAlgorithm(shape)
    if shape.group == 1 and all(k == 1 for k in g.kernel) and not any(g.pad):
        return PointwiseAlgorithm(shape)
    if xp is np and direct_usable(shape, dtype):
        training = phase == TRAIN
        slow_backward = training and direct.input_gradient(
            g, shape.channels, shape.group, shape.in_spatial, shape.out_spatial, dtype) != "direct"
        narrow = training and shape.out_spatial[1] < direct.ROWS_BELOW_WIDTH
        rows_better = eligible(shape, xp) and (narrow or slow_backward)
        if not rows_better and direct.compiles(np.dtype(dtype)):
            return DirectAlgorithm(shape, dtype)
    if eligible(shape, xp):
        return plan_rows(shape, dtype)
    return ColumnsAlgorithm(shape)


def plan_rows(shape: ConvolutionShape, dtype) -> RowsAlgorithm:
    """The row path, chosen for its backward. Where the direct kernels can compute the layer, its forward
    is theirs (faster at every width); where the row path was chosen for its input gradient alone
    (outputs at least direct.ROWS_BELOW_WIDTH wide), they compute the weight gradient too: no expanded
    rows, and their product runs at the rate the row path's kh narrow products do not. Narrow outputs
    keep the rows' weight gradient (benchmarks/README.md, "The figures behind the convolution paths")."""
    direct_forward = direct_usable(shape, np.dtype(dtype)) and direct.compiles(np.dtype(dtype))
    return RowsAlgorithm(shape, input_gradient_choice(shape),
                         direct_kernels=planned_kernels(shape, dtype) if direct_forward else None,
                         direct_weight_gradient=direct_forward and shape.out_spatial[1] >= direct.ROWS_BELOW_WIDTH)


def direct_usable(shape: ConvolutionShape, dtype) -> bool:
    return direct.usable(dtype, shape.num_spatial, shape.group, shape.channels, shape.geom.kernel, shape.out_spatial)
