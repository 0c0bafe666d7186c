"""What Convolution and Deconvolution share, as Caffe's BaseConvolutionLayer: reading the geometry from
``convolution_param``, the weights and their fillers, the sizes that follow from an input shape, and
the bias."""
from __future__ import annotations

import math

from ...blob import Blob
from ...fillers import fill
from .. import elementwise
from ..base import Layer
from ..im2col import Geometry


def _spatial_param(layer: Layer, cp, name: str, h_name: str | None, w_name: str | None,
                   num_spatial: int, default: int | None) -> tuple:
    """One per-axis setting of a ConvolutionParameter, read as Caffe's BaseConvolutionLayer does:
    ``name_h``/``name_w`` (2-D only) or the repeated ``name`` with 1 or one-per-axis values."""
    values = list(getattr(cp, name))
    if h_name is not None and (cp.HasField(h_name) or cp.HasField(w_name)):
        if num_spatial != 2:
            raise layer.error(f"{h_name} & {w_name} can only be used for 2D convolution")
        if values:
            raise layer.error(f"either {name} or {h_name}/{w_name} should be specified; not both")
        return (int(getattr(cp, h_name)), int(getattr(cp, w_name)))
    allowed = (1, num_spatial) if default is None else (0, 1, num_spatial)
    if len(values) not in allowed:
        raise layer.error(f"{name} must be specified once, or once per spatial dimension "
                          f"({name} specified {len(values)} times; {num_spatial} spatial dims)")
    if not values:
        return (default,) * num_spatial
    return tuple(int(values[0 if len(values) == 1 else a]) for a in range(num_spatial))


def conv_geometry(layer: Layer, cp, num_spatial: int) -> Geometry:
    kernel = _spatial_param(layer, cp, "kernel_size", "kernel_h", "kernel_w", num_spatial, None)
    stride = _spatial_param(layer, cp, "stride", "stride_h", "stride_w", num_spatial, 1)
    pad = _spatial_param(layer, cp, "pad", "pad_h", "pad_w", num_spatial, 0)
    dilation = _spatial_param(layer, cp, "dilation", None, None, num_spatial, 1)
    if any(k <= 0 for k in kernel):
        raise layer.error(f"filter dimensions must be nonzero, got {kernel}")
    if any(s <= 0 for s in stride):
        raise layer.error(f"stride dimensions must be nonzero, got {stride}")
    if any(d <= 0 for d in dilation):
        raise layer.error(f"dilation dimensions must be nonzero, got {dilation}")
    return Geometry(kernel, stride, pad, dilation)


class ConvolutionShape:
    """The sizes of one layer's convolution for one input shape, which an algorithm is planned for:
    ``num`` samples (the axes before the channel axis, as one), ``channels`` in, ``num_output`` out,
    ``group``, the geometry, and the spatial sizes in and out. ``x_shape`` (num x channels x in) and
    ``y_shape`` (num x num_output x out) are the input's and output's arrays as the algorithms read
    them."""

    __slots__ = ("geom", "num", "channels", "num_output", "group", "in_spatial", "out_spatial", "num_spatial",
                 "x_shape", "y_shape")

    def __init__(self, geom: Geometry, num: int, channels: int, num_output: int, group: int, in_spatial: tuple,
                 out_spatial: tuple):
        self.geom, self.num, self.channels, self.num_output, self.group = geom, num, channels, num_output, group
        self.in_spatial, self.out_spatial = in_spatial, out_spatial
        self.num_spatial = len(in_spatial)
        self.x_shape = (num, channels) + in_spatial
        self.y_shape = (num, num_output) + out_spatial

    def __repr__(self) -> str:
        return (f"ConvolutionShape({self.x_shape} -> {self.y_shape}, group {self.group}, kernel {self.geom.kernel}, "
                f"stride {self.geom.stride}, pad {self.geom.pad}, dilation {self.geom.dilation})")


class ConvolutionBase(Layer):
    """Shared set-up of Convolution and Deconvolution (Caffe's BaseConvolutionLayer): bottoms and
    tops come in pairs that share the weights."""

    min_bottom = 1
    min_top = 1
    reverse = False  # Deconvolution swaps the roles of input and output channels

    def setup(self, bottom, top):
        if len(bottom) != len(top):
            raise self.error(f"takes as many tops as bottoms, got {len(bottom)} bottoms and {len(top)} tops")
        cp = self.layer_param.convolution_param
        self.channel_axis = bottom[0].canonical_axis(cp.axis)
        self.num_spatial = bottom[0].num_axes - self.channel_axis - 1
        if self.num_spatial < 1:
            raise self.error(f"needs at least one spatial axis after the channel axis {self.channel_axis}; "
                             f"bottom shape {bottom[0].shape}")
        self.geom = conv_geometry(self, cp, self.num_spatial)
        self.channels = bottom[0].shape[self.channel_axis]
        self.num_output = int(cp.num_output)
        self.group = int(cp.group)
        if self.num_output <= 0:
            raise self.error("num_output must be positive")
        if self.group <= 0 or self.channels % self.group or self.num_output % self.group:
            raise self.error(f"group {self.group} must divide both the input channels ({self.channels}) "
                             f"and num_output ({self.num_output})")
        if self.reverse:
            weight_shape = (self.channels, self.num_output // self.group) + self.geom.kernel
        else:
            weight_shape = (self.num_output, self.channels // self.group) + self.geom.kernel
        self.bias_term = bool(cp.bias_term)
        shapes = [weight_shape] + ([(self.num_output,)] if self.bias_term else [])
        if self.blobs:
            # Weights already loaded: Caffe skips the fillers and only checks the shapes.
            if len(self.blobs) != len(shapes):
                raise self.error(f"incorrect number of weight blobs: {len(self.blobs)}, expected {len(shapes)}")
            for j, (blob, shape) in enumerate(zip(self.blobs, shapes)):
                if tuple(blob.shape) != shape:
                    raise self.error(f"blob {j} has shape {blob.shape}; expected {shape}")
        else:
            dtype = bottom[0].dtype
            self.blobs = [Blob(shape, dtype=dtype) for shape in shapes]
            fill(self.blobs[0], cp.weight_filler)
            if self.bias_term:
                fill(self.blobs[1], cp.bias_filler)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if shape != self._sized_for:
            self._size(shape)
        for b in bottom[1:]:
            if b.shape != shape:
                raise self.error(f"all bottoms must have the same shape; {b.shape} != {shape}")
        for t in top:
            t.reshape(self._top_shape)

    # The sizes below follow from the input's shape alone (and the layer's fixed parameters), and every
    # forward asks for them again: worked out once per shape, as the Python around the kernels of a
    # small net's forward counts.
    _sized_for = None
    #: The sizes for the current input shape (``ConvolutionShape``), set by ``reshape``.
    shape: ConvolutionShape | None = None

    def _size(self, shape: tuple) -> None:
        ca = self.channel_axis
        if len(shape) != ca + 1 + self.num_spatial:
            raise self.error(f"bottom num_axes may not change (now {shape})")
        if shape[ca] != self.channels:
            raise self.error(f"input has {shape[ca]} channels; the layer was set up for {self.channels}")
        in_spatial = tuple(shape[ca + 1:])
        out_spatial = self.geom.deconv_out(in_spatial) if self.reverse else self.geom.conv_out(in_spatial)
        if any(o <= 0 for o in out_spatial):
            raise self.error(f"output size {out_spatial} is not positive for input {in_spatial}")
        self.num = math.prod(shape[:ca])
        self.in_spatial, self.out_spatial = in_spatial, out_spatial
        self.shape = ConvolutionShape(self.geom, self.num, self.channels, self.num_output, self.group, in_spatial,
                                      out_spatial)
        self._top_shape = shape[:ca] + (self.num_output,) + out_spatial
        self._sized_for = shape

    def add_bias(self, y) -> None:
        """y (num x num_output x spatial...) += the bias, where the layer has one."""
        if self.bias_term:
            y += self.blobs[1].data.reshape((1, -1) + (1,) * self.num_spatial)

    def add_bias_gradient(self, dy) -> None:
        """Adds the sum over samples and positions of ``dy`` (num x num_output x positions) to the bias
        gradient, where the layer has a bias that learns."""
        if self.bias_term and self.param_propagate_down[1]:
            # One compiled parallel pass: NumPy's sum runs on one core.
            elementwise.add_channel_sums(dy, self.blobs[1].diff)
