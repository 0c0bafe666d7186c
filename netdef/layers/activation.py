"""Element-wise (neuron) layers: Caffe's NeuronLayer family.

Every layer here takes one bottom and gives one top of the same shape, and works in place
(``top[0] is bottom[0]``). A layer whose backward needs the input ``x`` and cannot recover it from
the output keeps a copy of ``x`` when it runs in place, as Caffe's PReLU does; the others compute
their gradient from the output ``y`` (or from a mask) and need no copy. ReLU writes into arrays it
keeps from call to call and reads no copy either (see reused.py for why that is safe).
"""
from __future__ import annotations

import math

import numpy as np

from .. import backend
from ..blob import Blob
from ..fillers import fill
from ..proto import netdef_pb2 as pb
from . import elementwise
from .base import TRAIN, Layer, register_layer
from .fusion import ChannelMap
from .reused import ReusedArrays


class NeuronLayer(Layer):
    """Base of the element-wise layers: one bottom, one top of the bottom's shape."""

    exact_num_bottom = 1
    exact_num_top = 1

    _saved_input = None

    def reshape(self, bottom, top):
        top[0].reshape_like(bottom[0])

    def _keep_input(self, bottom, top, needed: bool = True):
        """The bottom's data; also remembered for backward when the layer runs in place, because
        the forward pass replaces bottom[0].data with the output."""
        x = bottom[0].data
        self._saved_input = x.copy() if (needed and top[0] is bottom[0]) else None
        return x

    def _input(self, bottom):
        return self._saved_input if self._saved_input is not None else bottom[0].data


# ---------------------------------------------------------------------------------------------- ReLU
@register_layer("ReLU")
class ReLULayer(NeuronLayer):
    """Rectified linear unit, optionally leaky.

    bottom[0]: (N x C x H x W ...) x.  top[0]: same shape,
        y = x if x > 0 else negative_slope * x.
    dy/dx = 1 if x > 0 else negative_slope (so exactly 0 takes negative_slope, as Caffe).
    """

    def setup(self, bottom, top):
        self.negative_slope = float(self.layer_param.relu_param.negative_slope)
        self._outputs = ReusedArrays()

    def replayable(self) -> bool:
        return True

    def forward(self, bottom, top):
        x = bottom[0].data
        out = self._outputs.get("top", like=x, avoid=(x,))
        elementwise.relu_forward(x, self.negative_slope, out)
        # With negative_slope >= 0, y > 0 exactly where x > 0, so backward reads the sign from this
        # layer's own output and keeps no other array alive; otherwise from x, which no later layer
        # writes into (in place, the top's new array replaces it in the blob).
        self._sign_of = out if self.negative_slope >= 0 else x
        top[0].data = out

    def channel_map(self, bottom, top):
        return ChannelMap(negative_slope=self.negative_slope)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff
        dx = self._outputs.get("bottom_diff", like=dy, avoid=(dy, self._sign_of))
        bottom[0].diff = elementwise.relu_backward(self._sign_of, dy, self.negative_slope, dx)


# ---------------------------------------------------------------------------------------------- PReLU
@register_layer("PReLU")
class PReLULayer(NeuronLayer):
    """Parametric ReLU (He et al. 2015) with a learned slope per channel (axis 1) or one shared.

    bottom[0]: (N x C x ...) x, at least 2 axes.  top[0]: same shape,
        y = x if x > 0 else a_c * x.
    blobs[0]: the slopes a, shape (C,), or () when channel_shared (Caffe's 0-d blob);
    filled by prelu_param.filler, constant 0.25 when none is given.
    dL/da_c = sum over x <= 0 in channel c of dL/dy * x;  dL/dx = dL/dy * (1 if x > 0 else a_c).
    """

    def setup(self, bottom, top):
        param = self.layer_param.prelu_param
        if bottom[0].num_axes < 2:
            raise self.error(f"needs a bottom with at least 2 axes, got shape {bottom[0].shape}")
        self.channel_shared = bool(param.channel_shared)
        channels = bottom[0].shape[1]
        shape = () if self.channel_shared else (channels,)
        if self.blobs:
            if self.blobs[0].count != (1 if self.channel_shared else channels):
                raise self.error(f"slope blob has shape {self.blobs[0].shape}, expected {shape}")
            return
        slopes = Blob(shape, dtype=bottom[0].dtype, name=f"{self.name}_slope")
        if param.HasField("filler"):
            fill(slopes, param.filler)
        else:
            default = pb.FillerParameter(type="constant", value=0.25)
            fill(slopes, default)
        self.blobs = [slopes]

    def reshape(self, bottom, top):
        if not self.channel_shared and bottom[0].shape[1] != self.blobs[0].count:
            raise self.error(f"bottom has {bottom[0].shape[1]} channels but the layer has {self.blobs[0].count} slopes")
        super().reshape(bottom, top)

    def _slopes(self, x):
        a = self.blobs[0].data
        if self.channel_shared:
            return a.reshape(())
        return a.reshape((1, -1) + (1,) * (x.ndim - 2))

    def forward(self, bottom, top):
        x = self._keep_input(bottom, top)
        xp = backend.get_array_module(x)
        top[0].data = xp.where(x > 0, x, x * self._slopes(x))

    def backward(self, top, propagate_down, bottom):
        x = self._input(bottom)
        dy = top[0].diff
        xp = backend.get_array_module(dy)
        negative = x <= 0
        if self.param_propagate_down and self.param_propagate_down[0]:
            contrib = dy * x * negative
            if self.channel_shared:
                self.blobs[0].diff += contrib.sum()
            else:
                axes = (0,) + tuple(range(2, x.ndim))
                self.blobs[0].diff += contrib.sum(axis=axes).reshape(self.blobs[0].shape)
        if propagate_down[0]:
            bottom[0].diff = xp.where(negative, dy * self._slopes(x), dy)


# ---------------------------------------------------------------------------------------------- ELU
@register_layer("ELU")
class ELULayer(NeuronLayer):
    """Exponential linear unit (Clevert et al. 2015).

    bottom[0]: (N x C x ...) x.  top[0]: same shape,
        y = x if x > 0 else alpha * (exp(x) - 1).
    dy/dx = 1 if x > 0 else y + alpha.
    """

    def setup(self, bottom, top):
        self.alpha = float(self.layer_param.elu_param.alpha)

    def forward(self, bottom, top):
        # alpha >= 0 keeps sign(y) == sign(x) for the x > 0 test, so in place needs no copy.
        x = self._keep_input(bottom, top, needed=self.alpha < 0)
        xp = backend.get_array_module(x)
        top[0].data = xp.where(x > 0, x, self.alpha * (xp.exp(xp.minimum(x, 0)) - 1))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data
        ref = self._input(bottom)  # x, or in place y (same sign pattern, see forward)
        dy = top[0].diff
        xp = backend.get_array_module(dy)
        bottom[0].diff = xp.where(ref > 0, dy, dy * (y + self.alpha))


# ---------------------------------------------------------------------------------------------- Sigmoid
@register_layer("Sigmoid")
class SigmoidLayer(NeuronLayer):
    """Logistic sigmoid.

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = 1 / (1 + exp(-x)) (computed as
    0.5 * tanh(0.5 x) + 0.5, Caffe's overflow-free form).  dy/dx = y (1 - y).
    """

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = backend.get_array_module(x)
        top[0].data = 0.5 * xp.tanh(0.5 * x) + 0.5

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            y = top[0].data
            bottom[0].diff = top[0].diff * y * (1 - y)


# ---------------------------------------------------------------------------------------------- TanH
@register_layer("TanH")
class TanHLayer(NeuronLayer):
    """Hyperbolic tangent.

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = tanh(x).  dy/dx = 1 - y^2.
    """

    def forward(self, bottom, top):
        x = bottom[0].data
        top[0].data = backend.get_array_module(x).tanh(x)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            y = top[0].data
            bottom[0].diff = top[0].diff * (1 - y * y)


# ---------------------------------------------------------------------------------------------- AbsVal
@register_layer("AbsVal")
class AbsValLayer(NeuronLayer):
    """Absolute value.

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = |x|.  dy/dx = sign(x), with sign(0) = 0.
    (Caffe refuses in-place AbsVal; netdef allows it by keeping a copy of x.)
    """

    def forward(self, bottom, top):
        x = self._keep_input(bottom, top)
        top[0].data = backend.get_array_module(x).abs(x)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            x = self._input(bottom)
            bottom[0].diff = top[0].diff * backend.get_array_module(x).sign(x)


# ---------------------------------------------------------------------------------------------- Power
@register_layer("Power")
class PowerLayer(NeuronLayer):
    """Power of an affine map of the input.

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = (shift + scale * x) ^ power.
    dy/dx = power * scale * (shift + scale * x) ^ (power - 1)  (0 when power * scale == 0).
    The defaults (power 1, scale 1, shift 0) make it the identity.
    """

    def setup(self, bottom, top):
        param = self.layer_param.power_param
        self.power = float(param.power)
        self.scale = float(param.scale)
        self.shift = float(param.shift)
        self.diff_scale = self.power * self.scale

    def _base(self, x):
        z = x
        if self.scale != 1:
            z = z * self.scale
        if self.shift != 0:
            z = z + self.shift
        return z

    def forward(self, bottom, top):
        x = self._keep_input(bottom, top, needed=self.diff_scale != 0 and self.power != 1)
        xp = backend.get_array_module(x)
        if self.diff_scale == 0:
            # Caffe's special case: y does not depend on x (and 0 * inf never turns into NaN).
            value = 1.0 if self.power == 0 else self.shift ** self.power
            top[0].data = xp.full(x.shape, value, dtype=x.dtype)
            return
        z = self._base(x)
        top[0].data = z if self.power == 1 else (z * z if self.power == 2 else z ** self.power)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff
        xp = backend.get_array_module(dy)
        if self.diff_scale == 0:
            bottom[0].diff = xp.zeros_like(dy)
        elif self.power == 1:
            bottom[0].diff = dy * self.diff_scale
        else:
            z = self._base(self._input(bottom))
            grad = z if self.power == 2 else z ** (self.power - 1)
            bottom[0].diff = dy * (self.diff_scale * grad)


# ---------------------------------------------------------------------------------------------- Exp
@register_layer("Exp")
class ExpLayer(NeuronLayer):
    """Exponential of an affine map.

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = base ^ (shift + scale * x), where
    base -1 (the default) means e; base must otherwise be positive.
    dy/dx = y * scale * ln(base).
    """

    def setup(self, bottom, top):
        param = self.layer_param.exp_param
        base, scale, shift = float(param.base), float(param.scale), float(param.shift)
        if base != -1 and base <= 0:
            raise self.error(f"exp_param.base must be -1 (for e) or positive, got {base}")
        log_base = 1.0 if base == -1 else math.log(base)
        self.inner_scale = log_base * scale
        self.outer_scale = 1.0 if shift == 0 else (math.exp(shift) if base == -1 else base ** shift)

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = backend.get_array_module(x)
        y = xp.exp(x * self.inner_scale if self.inner_scale != 1 else x)
        top[0].data = y * self.outer_scale if self.outer_scale != 1 else y

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            scale = self.inner_scale
            grad = top[0].diff * top[0].data
            bottom[0].diff = grad * scale if scale != 1 else grad


# ---------------------------------------------------------------------------------------------- Log
@register_layer("Log")
class LogLayer(NeuronLayer):
    """Logarithm of an affine map.

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = log_base(shift + scale * x), where
    base -1 (the default) means e; base must otherwise be positive.
    dy/dx = scale / (ln(base) * (shift + scale * x)).
    """

    def setup(self, bottom, top):
        param = self.layer_param.log_param
        base = float(param.base)
        if base != -1 and base <= 0:
            raise self.error(f"log_param.base must be -1 (for e) or positive, got {base}")
        self.base_scale = 1.0 if base == -1 else 1.0 / math.log(base)
        self.scale = float(param.scale)
        self.shift = float(param.shift)

    def _inner(self, x):
        z = x * self.scale if self.scale != 1 else x
        return z + self.shift if self.shift != 0 else z

    def forward(self, bottom, top):
        x = self._keep_input(bottom, top)
        y = backend.get_array_module(x).log(self._inner(x))
        top[0].data = y * self.base_scale if self.base_scale != 1 else y

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            z = self._inner(self._input(bottom))
            bottom[0].diff = top[0].diff * (self.scale * self.base_scale) / z


# ---------------------------------------------------------------------------------------------- BNLL
@register_layer("BNLL")
class BNLLLayer(NeuronLayer):
    """Binomial normal log-likelihood (softplus).

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = log(1 + exp(x)).
    dy/dx = exp(x) / (1 + exp(x)), with exp's argument capped at 50 as Caffe does.
    """

    _THRESHOLD = 50.0

    def forward(self, bottom, top):
        x = self._keep_input(bottom, top)
        xp = backend.get_array_module(x)
        # x + log(1 + exp(-x)) for x > 0 avoids overflow; both branches agree with log1p(exp(x)).
        top[0].data = xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            x = self._input(bottom)
            xp = backend.get_array_module(x)
            e = xp.exp(xp.minimum(x, self._THRESHOLD))
            bottom[0].diff = top[0].diff * e / (e + 1)


# ---------------------------------------------------------------------------------------------- Dropout
@register_layer("Dropout")
class DropoutLayer(NeuronLayer):
    """Dropout (Hinton et al. 2012), inverted: kept units are scaled at training time.

    bottom[0]: (N x C x ...) x.  top[0]: same shape.
    TRAIN: y = x * m / (1 - p), m ~ Bernoulli(1 - p) drawn per element every forward pass
    (p = dropout_ratio); backward uses the same m: dx = dy * m / (1 - p).
    TEST: y = x, dx = dy.
    """

    def setup(self, bottom, top):
        p = float(self.layer_param.dropout_param.dropout_ratio)
        if not 0.0 <= p < 1.0:
            raise self.error(f"dropout_ratio must be in [0, 1), got {p}")
        self.ratio = p
        self.scale = 1.0 / (1.0 - p)
        self.mask = None

    def _draw_mask(self, x):
        xp = backend.get_array_module(x)
        if xp is np:
            u = backend.rng().random(x.shape)
        else:
            # Drawn on the device: moving a host draw of every activation each step would cost
            # more than the layer itself.
            u = xp.random.random(x.shape, dtype=x.dtype)
        return u >= self.ratio

    def forward(self, bottom, top):
        x = bottom[0].data
        if self.phase == TRAIN:
            self.mask = self._draw_mask(x)
            top[0].data = x * self.mask * self.scale
        else:
            self.mask = None
            if top[0] is not bottom[0]:
                top[0].data = x.copy()

    def channel_map(self, bottom, top):
        # The identity in the TEST phase (an in-place Dropout after a ReLU joins its chain).
        return None if self.phase == TRAIN else ChannelMap()

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff
        if self.phase == TRAIN:
            if self.mask is None or self.mask.shape != dy.shape:
                raise self.error("backward in TRAIN phase needs a forward pass first (no dropout mask)")
            bottom[0].diff = dy * self.mask * self.scale
        elif top[0] is not bottom[0]:
            bottom[0].diff = dy.copy()


# ---------------------------------------------------------------------------------------------- Threshold
@register_layer("Threshold")
class ThresholdLayer(NeuronLayer):
    """Binary step.

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = 1 if x > threshold else 0 (strict).
    Forward only: Caffe has no gradient for it, so asking for one is an error.
    """

    def setup(self, bottom, top):
        self.threshold = float(self.layer_param.threshold_param.threshold)

    def forward(self, bottom, top):
        x = bottom[0].data
        top[0].data = (x > self.threshold).astype(x.dtype)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("Threshold has no backward pass (Caffe's is not implemented either)")


# ---------------------------------------------------------------------------------------------- Swish
@register_layer("Swish")
class SwishLayer(NeuronLayer):
    """Swish (Ramachandran et al. 2017).

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = x * sigmoid(beta * x).
    dy/dx = beta * y + s * (1 - beta * y), s = sigmoid(beta * x) kept from forward.
    """

    def setup(self, bottom, top):
        self.beta = float(self.layer_param.swish_param.beta)
        self.sigmoid = None

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = backend.get_array_module(x)
        self.sigmoid = 0.5 * xp.tanh((0.5 * self.beta) * x) + 0.5
        top[0].data = x * self.sigmoid

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            by = self.beta * top[0].data
            s = self.sigmoid
            bottom[0].diff = top[0].diff * (by + s * (1 - by))


# ---------------------------------------------------------------------------------------------- Clip
@register_layer("Clip")
class ClipLayer(NeuronLayer):
    """Clamp to [min, max].

    bottom[0]: (N x C x ...) x.  top[0]: same shape, y = min(max(x, min), max).
    dy/dx = 1 if min <= x <= max else 0 (the gradient passes at the bounds, as Caffe).
    """

    def setup(self, bottom, top):
        param = self.layer_param.clip_param
        if not (param.HasField("min") and param.HasField("max")):
            raise self.error("clip_param needs both min and max")
        self.lo, self.hi = float(param.min), float(param.max)
        if self.lo > self.hi:
            raise self.error(f"clip_param.min ({self.lo}) is greater than max ({self.hi})")

    def forward(self, bottom, top):
        x = self._keep_input(bottom, top)
        top[0].data = backend.get_array_module(x).clip(x, self.lo, self.hi)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            x = self._input(bottom)
            bottom[0].diff = top[0].diff * ((x >= self.lo) & (x <= self.hi))
