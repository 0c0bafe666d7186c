"""Normalization layers: BatchNorm, Scale, Bias, MVN (Caffe semantics)."""
from __future__ import annotations

import math

import numpy as np

from ..backend import get_array_module
from ..blob import Blob
from ..fillers import fill
from ..proto import netdef_pb2 as pb
from . import batchnorm, elementwise
from .base import TEST, Layer, register_layer
from .fusion import ChannelMap
from .reused import ReusedArrays


def _keep_or_create(layer: Layer, shapes: list[tuple], dtype) -> bool:
    """Create ``layer.blobs`` of ``shapes`` unless they already exist (loaded or shared weights,
    Caffe's "Skipping parameter initialization"), in which case their shapes are checked.
    Returns True when fresh blobs were created (and so need filling)."""
    if layer.blobs:
        if len(layer.blobs) != len(shapes):
            raise layer.error(f"expects {len(shapes)} blob(s), {len(layer.blobs)} are present")
        for j, (blob, shape) in enumerate(zip(layer.blobs, shapes)):
            if tuple(blob.shape) != tuple(shape):
                raise layer.error(f"blob {j} has shape {blob.shape}, expected {tuple(shape)}")
        return False
    layer.blobs = [Blob(shape, dtype=dtype) for shape in shapes]
    return True


# ---------------------------------------------------------------------------------------------
@register_layer("BatchNorm")
class BatchNormLayer(Layer):
    """Normalizes each channel by its mean and variance (no affine part; follow with Scale).

    bottom[0]: N x C x ... (or N x C, or N) input x
    top[0]:    same shape, y = (x - mu_c) / sqrt(var_c + eps)

    Stored blobs: [mean_sum (C), var_sum (C), scale_factor (1)], statistics = blob / scale_factor
    (0 when the factor is 0). Without global stats, mu and var are the batch mean and biased
    variance over N and the spatial axes, and the stored blobs are updated as
    f = maf*f + 1, mean_sum = maf*mean_sum + mu, var_sum = maf*var_sum + m/(m-1)*var (m = N*H*W).
    use_global_stats defaults to (phase == TEST). The stored blobs never receive gradients.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        p = self.layer_param.batch_norm_param
        self.use_global_stats = p.use_global_stats if p.HasField("use_global_stats") else self.phase == TEST
        self.maf = float(p.moving_average_fraction)
        self.eps = float(p.eps)
        shape = bottom[0].shape
        self.channels = 1 if len(shape) == 1 else shape[1]
        if _keep_or_create(self, [(self.channels,), (self.channels,), (1,)], bottom[0].dtype):
            for b in self.blobs:
                b.data[...] = 0
        # Statistics are not learned: Caffe forces lr_mult 0 and never writes their diff.
        self.param_propagate_down = [False] * 3
        self._outputs = ReusedArrays()

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        c = 1 if len(shape) == 1 else shape[1]
        if c != self.channels:
            raise self.error(f"input has {c} channels, the layer was set up for {self.channels}")
        if top[0] is not bottom[0]:
            top[0].reshape(shape)

    def view(self, a):
        """``a`` (this layer's input or output shape) as N x C x M, M the spatial size (1 for N x C)."""
        return a.reshape(a.shape[0], self.channels, -1)

    def replayable(self) -> bool:
        return True

    def forward(self, bottom, top):
        x = bottom[0].data
        out = self._outputs.get("top", like=x, avoid=(x,))
        if self.use_global_stats:
            mean, std = self.global_statistics(x.dtype)
            batchnorm.forward_global(self.view(x), mean, std, self.view(out))
        else:
            mean, var, std = batchnorm.forward_batch(self.view(x), self.eps, self.view(out))
            self.record_batch_statistics(mean, var, x.size // self.channels)
        # Backward reads the output (batch statistics) or nothing but std (global ones), never the
        # input: the input's array can go as soon as a later layer stops reading it (ResNet-50, batch
        # 8: 323 MiB of convolution outputs). The output stays as it is until the next forward (a
        # later in-place layer replaces the blob's array instead of writing into it: reused.py), and
        # an in-place Scale after it keeps the same array, not a copy.
        self._y = None if self.use_global_stats else out
        self._std = std
        top[0].data = out

    def record_batch_statistics(self, mean, var, values_per_channel: int) -> None:
        """Fold a batch's mean and biased variance (over ``values_per_channel`` values each) into the
        stored moving sums (the class docstring's rule; layers/batchnorm_chain.py calls it too)."""
        correction = _variance_correction(values_per_channel)
        self.blobs[2].data *= self.maf
        self.blobs[2].data += 1
        self.blobs[0].data *= self.maf
        self.blobs[0].data += mean
        self.blobs[1].data *= self.maf
        self.blobs[1].data += correction * var

    def moving_sums_update(self, values_per_channel: int) -> tuple:
        """(mean_sum, var_sum, factor, maf, correction): what a kernel that folds a batch's statistics
        into the moving sums itself needs (layers/gpu_batchnorm_chain.py), by the rule of
        ``record_batch_statistics``."""
        return (self.blobs[0].data, self.blobs[1].data, self.blobs[2].data, self.maf,
                _variance_correction(values_per_channel))

    def global_statistics(self, dtype):
        """(mean, std) per channel from the stored blobs, in ``dtype``."""
        stored = self.blobs[2].data
        xp = get_array_module(stored)
        factor = inverse_factor(stored) if xp is np else inverse_factor_as_array(stored)
        mean = self.blobs[0].data * factor
        var = self.blobs[1].data * factor
        std = xp.sqrt(var + self.eps).astype(dtype, copy=False)
        return mean, std

    def channel_map(self, bottom, top):
        if not self.use_global_stats:
            return None
        shape = bottom[0].shape
        mean, std = self.global_statistics(bottom[0].dtype)
        return ChannelMap(dims=(shape[0], self.channels, bottom[0].count // (shape[0] * self.channels)),
                          mean=mean, std=std)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff
        dx = self._outputs.get("bottom_diff", like=dy, avoid=(dy, self._y))
        if self.use_global_stats:
            batchnorm.backward_global(self.view(dy), self._std, self.view(dx))
        else:
            batchnorm.backward_batch(self.view(self._y), self.view(dy), self._std, self.view(dx))
        bottom[0].diff = dx


# ---------------------------------------------------------------------------------------------
def inverse_factor(stored) -> float:
    """1 / the stored moving-average factor (0 for a factor of 0), as a Python float: multiplied into
    float32 blobs it is rounded to float32 first."""
    f = float(stored.reshape(-1)[0])
    return 0.0 if f == 0 else 1.0 / f


def inverse_factor_as_array(stored):
    """``inverse_factor`` where the factor lies, as a one-value array of its type: on a GPU nothing is
    read back to the host (a pass can then be recorded as a CUDA graph). The same bits: the inverse
    in float64, rounded to the blobs' type."""
    xp = get_array_module(stored)
    f = stored.reshape(-1)[:1].astype(np.float64)
    zero = f == 0
    return xp.where(zero, 0.0, 1.0 / xp.where(zero, 1.0, f)).astype(stored.dtype)


def _variance_correction(m: int) -> float:
    """m / (m - 1): what turns the biased variance of m values into the unbiased one (1 for one value)."""
    return m / (m - 1) if m > 1 else 1.0


def _operand_shape(layer: Layer, shape: tuple, axis: int, num_axes: int) -> tuple:
    """Shape of a learned scale/bias covering ``num_axes`` axes of ``shape`` from ``axis``."""
    axis = _canonical(layer, axis, len(shape))
    if num_axes < -1:
        raise layer.error(f"num_axes must be -1 or non-negative, got {num_axes}")
    if num_axes == -1:
        return tuple(shape[axis:])
    if axis + num_axes > len(shape):
        raise layer.error(f"axis {axis} + num_axes {num_axes} exceeds the {len(shape)} input axes")
    return tuple(shape[axis:axis + num_axes])


def _canonical(layer: Layer, axis: int, n: int) -> int:
    if not -n <= axis < max(n, 1):
        raise layer.error(f"axis {axis} out of range for an input of {n} axes")
    return axis + n if axis < 0 else axis


def _broadcast_dims(layer: Layer, x_shape: tuple, operand_shape: tuple, axis_param: int):
    """(outer, operand count, inner) for broadcasting an operand of ``operand_shape`` against
    ``x_shape`` from ``axis_param``; a scalar operand ignores the axis (Caffe uses axis 0)."""
    k = len(operand_shape)
    axis = 0 if k == 0 else _canonical(layer, axis_param, len(x_shape))
    if axis + k > len(x_shape) or tuple(x_shape[axis:axis + k]) != tuple(operand_shape):
        raise layer.error(f"operand of shape {tuple(operand_shape)} does not match input shape "
                          f"{tuple(x_shape)} from axis {axis}")
    return math.prod(x_shape[:axis]), math.prod(operand_shape), math.prod(x_shape[axis + k:])


@register_layer("Scale")
class ScaleLayer(Layer):
    """Multiplies the input by a scale broadcast over the other axes, optionally adding a bias.

    bottom[0]: x, any shape
    bottom[1]: (optional) the scale s, of shape x.shape[axis : axis + s.ndim]; without it, s is a
               learned blob covering num_axes axes from axis (-1: all remaining, 0: a scalar),
               filled by ``filler`` (constant 1 by default)
    top[0]:    y = x * s (+ b), same shape as x; b is a learned blob (after s) when bias_term
    """

    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def replayable(self) -> bool:
        return True

    def setup(self, bottom, top):
        p = self.layer_param.scale_param
        shapes = []
        if len(bottom) == 1:
            shapes.append(_operand_shape(self, bottom[0].shape, p.axis, p.num_axes))
        self.bias_index = None
        if p.bias_term:
            # Caffe builds an inner Bias layer with num_axes = the scale's number of axes.
            bias_axes = bottom[1].num_axes if len(bottom) > 1 else p.num_axes
            shapes.append(_operand_shape(self, bottom[0].shape, p.axis, bias_axes))
            self.bias_index = len(shapes) - 1
        if _keep_or_create(self, shapes, bottom[0].dtype):
            if len(bottom) == 1:
                filler = pb.FillerParameter()
                if p.HasField("filler"):
                    filler.CopyFrom(p.filler)
                else:
                    filler.type = "constant"
                    filler.value = 1.0
                fill(self.blobs[0], filler)
            if self.bias_index is not None:
                fill(self.blobs[self.bias_index], p.bias_filler)
        self._outputs = ReusedArrays()

    def _scale_blob(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        s = self._scale_blob(bottom)
        bias_shape = None if self.bias_index is None else self.blobs[self.bias_index].shape
        shapes = (bottom[0].shape, s.shape, bias_shape)
        if shapes != self._checked_shapes:  # the checks and dims follow from these shapes alone
            self._dims = _broadcast_dims(self, bottom[0].shape, s.shape, self.layer_param.scale_param.axis)
            if bias_shape is not None and tuple(bias_shape) != tuple(s.shape):
                raise self.error(f"bias of shape {bias_shape} does not match the scale's shape {s.shape}")
            self._checked_shapes = shapes
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    _checked_shapes = None

    def forward(self, bottom, top):
        x = bottom[0].data
        s = self._scale_blob(bottom).data
        out = self._outputs.get("top", like=x, avoid=(x, s))
        bias = None if self.bias_index is None else self.blobs[self.bias_index].data.reshape(-1)
        elementwise.scale_forward(x.reshape(self._dims), s.reshape(-1), bias, out.reshape(self._dims))
        # The input is kept for the scale's gradient: in place, the top's new array replaces it in
        # the shared blob, and nothing writes into it.
        self._x = x
        top[0].data = out

    def channel_map(self, bottom, top):
        if len(bottom) > 1:  # the scale is an input: its values are no constant of the layer
            return None
        bias = None if self.bias_index is None else self.blobs[self.bias_index].data.reshape(-1)
        return ChannelMap(dims=self._dims, scale=self.blobs[0].data.reshape(-1), bias=bias)

    def wanted_parameter_sums(self) -> tuple[bool, bool]:
        """(the bias's gradient, the learned scale's gradient): whether backward computes each."""
        return (self.bias_index is not None and self.param_propagate_down[self.bias_index],
                self.param_propagate_down[0])

    def add_parameter_gradients(self, sum_dy, sum_xdy) -> None:
        """Add a backward pass's sums (over all but the operand's axes, None where not wanted) to
        the bias's and the learned scale's gradients (layers/batchnorm_chain.py calls it too)."""
        if sum_dy is not None:
            b = self.blobs[self.bias_index]
            b.diff += sum_dy.reshape(b.shape)
        if sum_xdy is not None:
            s = self.blobs[0]
            s.diff += sum_xdy.reshape(s.shape)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff
        s_blob = self._scale_blob(bottom)
        want_bias = self.bias_index is not None and self.param_propagate_down[self.bias_index]
        want_scale = propagate_down[1] if len(bottom) > 1 else self.param_propagate_down[0]
        if not (want_bias or want_scale or propagate_down[0]):
            return
        dx = self._outputs.get("bottom_diff", like=dy, avoid=(dy, self._x)) if propagate_down[0] else None
        sum_dy, sum_xdy = elementwise.scale_backward(self._x.reshape(self._dims) if want_scale else None,
                                                     dy.reshape(self._dims), s_blob.data.reshape(-1),
                                                     None if dx is None else dx.reshape(self._dims))
        if len(bottom) > 1:
            self.add_parameter_gradients(sum_dy if want_bias else None, None)
            if want_scale:
                bottom[1].diff = sum_xdy.reshape(s_blob.shape)
        else:
            self.add_parameter_gradients(sum_dy if want_bias else None, sum_xdy if want_scale else None)
        # Last: in place, bottom[0].diff is top[0].diff, read above.
        if dx is not None:
            bottom[0].diff = dx


@register_layer("Bias")
class BiasLayer(Layer):
    """Adds a bias broadcast over the other axes.

    bottom[0]: x, any shape
    bottom[1]: (optional) the bias b, of shape x.shape[axis : axis + b.ndim]; without it, b is a
               learned blob covering num_axes axes from axis (-1: all remaining, 0: a scalar),
               filled by ``filler`` (constant 0 by default)
    top[0]:    y = x + b, same shape as x
    """

    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def replayable(self) -> bool:
        return True

    def setup(self, bottom, top):
        p = self.layer_param.bias_param
        if len(bottom) == 1:
            shape = _operand_shape(self, bottom[0].shape, p.axis, p.num_axes)
            if _keep_or_create(self, [shape], bottom[0].dtype):
                fill(self.blobs[0], p.filler)

    def _bias_blob(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        b = self._bias_blob(bottom)
        self._dims = _broadcast_dims(self, bottom[0].shape, b.shape, self.layer_param.bias_param.axis)
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        x = bottom[0].data
        o, d, i = self._dims
        y = x.reshape(o, d, i) + self._bias_blob(bottom).data.reshape(1, d, 1)
        top[0].data = y.reshape(x.shape)

    def backward(self, top, propagate_down, bottom):
        o, d, i = self._dims
        dy = top[0].diff
        want_bias = propagate_down[1] if len(bottom) > 1 else self.param_propagate_down[0]
        if want_bias:
            db = dy.reshape(o, d, i).sum(axis=(0, 2)).reshape(self._bias_blob(bottom).shape)
            if len(bottom) > 1:
                bottom[1].diff = db
            else:
                self.blobs[0].diff += db
        if propagate_down[0] and top[0] is not bottom[0]:
            bottom[0].diff = dy.copy()


# ---------------------------------------------------------------------------------------------
@register_layer("MVN")
class MVNLayer(Layer):
    """Mean-variance normalization of each sample (per channel, or across channels).

    bottom[0]: N x C x H x W input x (legacy num/channels: at most 4 axes)
    top[0]:    same shape; y = x - mean, or with normalize_variance y = (x - mean) / (std + eps)
               (eps is added to the standard deviation, as in Caffe), where mean and the biased
               std run over H x W per (n, c), or over C x H x W per n when across_channels.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        p = self.layer_param.mvn_param
        self.normalize_variance = p.normalize_variance
        self.across_channels = p.across_channels
        self.eps = float(p.eps)

    def reshape(self, bottom, top):
        b = bottom[0]
        rows = b.num if self.across_channels else b.num * b.channels
        self._rows = rows
        if top[0] is not bottom[0]:
            top[0].reshape(b.shape)

    def forward(self, bottom, top):
        x = bottom[0].data
        x2 = x.reshape(self._rows, -1)
        centered = x2 - x2.mean(axis=1, keepdims=True)
        if self.normalize_variance:
            xp = get_array_module(x)
            std = xp.sqrt((centered ** 2).mean(axis=1, keepdims=True)) + self.eps
            y = centered / std
            self._std = std
            # Private copy for backward: a later in-place layer may overwrite the top's array.
            self._y = y.copy()
        else:
            y = centered
        top[0].data = y.reshape(x.shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff.reshape(self._rows, -1)
        if self.normalize_variance:
            # Caffe's formula, which treats (std + eps) like the standard deviation.
            y = self._y
            dx = dy - dy.mean(axis=1, keepdims=True) - y * (y * dy).mean(axis=1, keepdims=True)
            dx = dx / self._std
        else:
            dx = dy - dy.mean(axis=1, keepdims=True)
        bottom[0].diff = dx.reshape(bottom[0].shape)
