"""Update rules: how a regularized gradient becomes the step subtracted from a parameter.

One class per rule, registered under Caffe's solver type name (``type: "Adam"``), each holding its
history blobs in Caffe's order (the order of ``SolverState.history``): one blob per learnable
parameter, and for AdaDelta and Adam a second set after all of the first (Adam: every first moment,
then every second moment).

``compute_update_value(param_id, blob, local_rate, iteration)`` turns ``blob.diff`` (the gradient
after normalization and regularization) into the update value, in place, as Caffe's
``ComputeUpdateValue``; the solver then does ``data -= diff``. The float32 operations follow Caffe's
order (``axpby`` as ``alpha * x + beta * y``...). With ``g`` the gradient, ``r`` the local rate:

    SGD       v = momentum * v + r * g;                      step v
    Nesterov  v' = momentum * v + r * g;                     step (1 + momentum) * v' - momentum * v
    AdaGrad   h += g^2;                                      step r * g / (sqrt(h) + delta)
    RMSProp   h = rms_decay * h + (1 - rms_decay) * g^2;     step r * g / (sqrt(h) + delta)
    AdaDelta  h = m * h + (1 - m) * g^2;  u = g * sqrt((hu + delta) / (h + delta));
              hu = m * hu + (1 - m) * u^2;                   step r * u
    Adam      m1 = b1 * m1 + (1 - b1) * g;  m2 = b2 * m2 + (1 - b2) * g^2;  t = iteration + 1
                                                             step r * sqrt(1 - b2^t) / (1 - b1^t) * m1 / (sqrt(m2) + delta)

A new rule: subclass ``UpdateRule``, decorate it with ``@register_update_rule("Name")``, and
``type: "Name"`` in a solver file uses it.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import get_array_module
from ..blob import Blob
from ..proto import netdef_pb2 as pb
from ..registry import Registry, UnknownNameError
from . import gpu_updates

f32 = np.float32

#: Solver type names (``type: "Adam"``) -> UpdateRule classes; every built-in rule is in this module.
UPDATE_RULES: Registry[type] = Registry("solver type")


class SolverConfigError(ValueError):
    """A solver definition Caffe would reject (its CHECKs); the message says which field."""


def register_update_rule(type_name: str):
    """Class decorator: ``type: "<type_name>"`` in a SolverParameter uses the decorated rule."""

    def decorate(cls):
        UPDATE_RULES.add(type_name, cls)
        cls.type_name = type_name
        return cls

    return decorate


def update_rule_class(type_name: str) -> type:
    try:
        return UPDATE_RULES.get(type_name)
    except UnknownNameError as error:
        raise SolverConfigError(f"Unknown solver type: {type_name!r} (known types: {', '.join(error.known)})") from None


def registered_update_rules() -> list[str]:
    return UPDATE_RULES.names()


def _flat_float32(*arrays):
    """The arrays as flat views, where the compiled steps take them (float32 NumPy arrays,
    C-contiguous, one size); else None."""
    from ..layers import jit

    if not (jit.usable(*arrays) and arrays[0].dtype == np.float32 and len({a.size for a in arrays}) == 1):
        return None
    return tuple(a.reshape(-1) for a in arrays)


class UpdateRule:
    """Base class. ``history_sets`` blobs per learnable parameter, allocated by ``setup``."""

    type_name = ""
    history_sets = 1

    def __init__(self, param: pb.SolverParameter):
        self.param = param
        self.validate(param)
        self.history: list[Blob] = []
        self.num_params = 0
        # The many-blob kernel's device tables, for the blobs with L2 decay and for those without.
        self._blob_tables = {False: gpu_updates.BlobTables(), True: gpu_updates.BlobTables()}

    @classmethod
    def validate(cls, param: pb.SolverParameter) -> None:
        """Raise SolverConfigError for settings this rule cannot use (Caffe's constructor CHECKs)."""

    def setup(self, params: list[Blob]) -> None:
        """Zero history shaped like each parameter (Caffe's PreSolve)."""
        self.num_params = len(params)
        self.history = []
        for _ in range(self.history_sets):
            for p in params:
                h = Blob(p.shape, dtype=p.dtype, name=f"history[{len(self.history)}]")
                h.data[...] = 0
                self.history.append(h)

    def compute_update_value(self, param_id: int, blob: Blob, local_rate, iteration: int) -> None:
        raise NotImplementedError

    def fused_step(self, param_id: int, blob: Blob, scale, decay, local_rate, iteration: int,
                   divisor=1) -> bool:
        """The whole step of one blob in one pass, where this rule has a compiled kernel for its
        arrays (on the CPU in ``jit_updates``, on a GPU in ``gpu_updates``): ``diff /= divisor``
        (the average of a sum over the ranks that the exchange left to the update), ``diff *= scale``
        (normalization), ``diff += decay * data`` (L2 regularization; ``decay`` None for none),
        the update value into ``diff`` and ``data -= diff``, the same bits as those steps one by one.
        Returns False (having touched nothing) where it has none; the solver then runs the steps one
        by one."""
        return False

    def multi_blob_constants(self) -> tuple | None:
        """The float32 constants of this rule's many-blob GPU kernel (``gpu_updates.MULTI_BLOB_RULES``),
        in the kernel's order and as its one-blob step passes them; None where the rule has none."""
        return None

    def fused_steps_arrays(self, param_ids, blobs) -> list | None:
        """Per blob (data, diff, each history set's array) for ``fused_steps``, where the many-blob
        kernel takes them all (a rule that has one, CuPy float32 arrays); else None."""
        if self.multi_blob_constants() is None or not blobs or blobs[0].array_module is np:
            return None
        arrays = [(blob.data, blob.diff) + tuple(self.history[s * self.num_params + param_id].data
                                                for s in range(self.history_sets))
                  for param_id, blob in zip(param_ids, blobs)]
        return arrays if gpu_updates.usable_many(arrays) else None

    def fused_steps(self, arrays, l2: bool, scalars, rate, scale) -> None:
        """``fused_step`` of several blobs in one launch on a GPU, the same bits: ``arrays`` from
        ``fused_steps_arrays``, ``scalars`` per blob (divisor, lr_mult, decay; the decays all zero
        unless ``l2``), the iteration's ``rate`` (each blob's local rate is rate * lr_mult, in float32
        as ``ParameterUpdate`` computes it)."""
        gpu_updates.multi_step(self.type_name, l2, self._blob_tables[l2], arrays, scalars, rate, scale,
                               self.multi_blob_constants())

    # The second history set of AdaDelta / Adam.
    def _second(self, param_id: int) -> Blob:
        return self.history[self.num_params + param_id]


class MomentumUpdate(UpdateRule):
    """What SGD and Nesterov share: one history set (the momentum buffer) and a compiled fused step on
    both devices, whose kernels take the same arguments but for the momentum's terms. A subclass
    names its kernels (``_gpu_step``, ``_cpu_steps``) and those terms (``_cpu_momentum_terms``)."""

    @staticmethod
    def _gpu_step(data, diff, history, divisor, scale, decay, local_rate, momentum) -> None:
        raise NotImplementedError

    @staticmethod
    def _cpu_steps(jit_updates) -> tuple:
        """(the parallel kernel, the serial one) of ``jit_updates``, imported only when a CPU step runs."""
        raise NotImplementedError

    def _cpu_momentum_terms(self) -> tuple:
        return (f32(self.param.momentum),)

    def multi_blob_constants(self):
        return self._cpu_momentum_terms()  # SGD's momentum; Nesterov's momentum and 1 + momentum

    def fused_step(self, param_id, blob, scale, decay, local_rate, iteration, divisor=1):
        history = self.history[param_id].data
        if gpu_updates.usable(blob.data, blob.diff, history):
            self._gpu_step(blob.data, blob.diff, history, divisor, scale, decay, local_rate, self.param.momentum)
            return True
        arrays = _flat_float32(blob.data, blob.diff, history)
        if arrays is None:
            return False
        from . import jit_updates

        parallel, serial = self._cpu_steps(jit_updates)
        step = parallel if arrays[0].size >= jit_updates.PARALLEL_MIN_ELEMENTS else serial
        step(*arrays, f32(divisor), f32(scale), f32(decay or 0), decay is not None, f32(local_rate),
             *self._cpu_momentum_terms())
        return True


@register_update_rule("SGD")
class SGDUpdate(MomentumUpdate):
    """Stochastic gradient descent with momentum (the rate sits inside the momentum buffer)."""

    _gpu_step = staticmethod(gpu_updates.sgd_step)

    @staticmethod
    def _cpu_steps(jit_updates):
        return jit_updates.sgd_step, jit_updates.sgd_step_serial

    def compute_update_value(self, param_id, blob, local_rate, iteration):
        momentum = f32(self.param.momentum)
        v = self.history[param_id].data
        v[...] = local_rate * blob.diff + momentum * v
        blob.diff[...] = v


@register_update_rule("Nesterov")
class NesterovUpdate(MomentumUpdate):
    """Nesterov's accelerated gradient (Sutskever et al. 2013 form)."""

    _gpu_step = staticmethod(gpu_updates.nesterov_step)

    @staticmethod
    def _cpu_steps(jit_updates):
        return jit_updates.nesterov_step, jit_updates.nesterov_step_serial

    def _cpu_momentum_terms(self):
        momentum = f32(self.param.momentum)
        return momentum, f32(1) + momentum

    def compute_update_value(self, param_id, blob, local_rate, iteration):
        momentum = f32(self.param.momentum)
        v = self.history[param_id].data
        previous = v.copy()
        v[...] = local_rate * blob.diff + momentum * v
        blob.diff[...] = (f32(1) + momentum) * v + (-momentum) * previous


@register_update_rule("AdaGrad")
class AdaGradUpdate(UpdateRule):
    """AdaGrad (Duchi et al. 2011): the rate divided by the root of the summed squared gradients."""

    @classmethod
    def validate(cls, param):
        if param.momentum != 0:
            raise SolverConfigError(f"Momentum cannot be used with AdaGrad (momentum is {param.momentum:g}; "
                                    f"remove it or set it to 0)")

    def compute_update_value(self, param_id, blob, local_rate, iteration):
        xp = get_array_module(blob.diff)
        g = blob.diff
        h = self.history[param_id].data
        h[...] = g * g + h
        blob.diff[...] = local_rate * (g / (xp.sqrt(h) + f32(self.param.delta)))

    def fused_step(self, param_id, blob, scale, decay, local_rate, iteration, divisor=1):
        history = self.history[param_id].data
        if not gpu_updates.usable(blob.data, blob.diff, history):
            return False
        gpu_updates.adagrad_step(blob.data, blob.diff, history, divisor, scale, decay, local_rate, self.param.delta)
        return True

    def multi_blob_constants(self):
        return (f32(self.param.delta),)


@register_update_rule("RMSProp")
class RMSPropUpdate(UpdateRule):
    """RMSProp (Tieleman and Hinton 2012): a running mean of squared gradients scales the step."""

    @classmethod
    def validate(cls, param):
        if param.momentum != 0:
            raise SolverConfigError(f"Momentum cannot be used with RMSProp (momentum is {param.momentum:g}; "
                                    f"remove it or set it to 0)")
        if not 0 <= param.rms_decay < 1:
            raise SolverConfigError(f"rms_decay should lie between 0 and 1 (0 <= rms_decay < 1), "
                                    f"got {param.rms_decay:g}")

    def compute_update_value(self, param_id, blob, local_rate, iteration):
        xp = get_array_module(blob.diff)
        decay = f32(self.param.rms_decay)
        g = blob.diff
        h = self.history[param_id].data
        h[...] = (f32(1) - decay) * (g * g) + decay * h
        blob.diff[...] = local_rate * (g / (xp.sqrt(h) + f32(self.param.delta)))

    def fused_step(self, param_id, blob, scale, decay, local_rate, iteration, divisor=1):
        history = self.history[param_id].data
        if not gpu_updates.usable(blob.data, blob.diff, history):
            return False
        gpu_updates.rmsprop_step(blob.data, blob.diff, history, divisor, scale, decay, local_rate,
                                 self.param.rms_decay, self.param.delta)
        return True

    def multi_blob_constants(self):
        rms_decay = f32(self.param.rms_decay)
        return rms_decay, f32(1) - rms_decay, f32(self.param.delta)


@register_update_rule("AdaDelta")
class AdaDeltaUpdate(UpdateRule):
    """AdaDelta (Zeiler 2012). History: all squared-gradient averages, then all squared-update
    averages (the update before the learning rate is applied)."""

    history_sets = 2

    def compute_update_value(self, param_id, blob, local_rate, iteration):
        xp = get_array_module(blob.diff)
        momentum = f32(self.param.momentum)
        rest = f32(1) - momentum
        delta = f32(self.param.delta)
        g = blob.diff
        h = self.history[param_id].data
        hu = self._second(param_id).data
        h[...] = rest * (g * g) + momentum * h
        u = g * xp.sqrt((delta + hu) / (delta + h))
        hu[...] = rest * (u * u) + momentum * hu
        blob.diff[...] = local_rate * u

    def fused_step(self, param_id, blob, scale, decay, local_rate, iteration, divisor=1):
        history, update_history = self.history[param_id].data, self._second(param_id).data
        if not gpu_updates.usable(blob.data, blob.diff, history, update_history):
            return False
        gpu_updates.adadelta_step(blob.data, blob.diff, history, update_history, divisor, scale, decay, local_rate,
                                  self.param.momentum, self.param.delta)
        return True

    def multi_blob_constants(self):
        momentum = f32(self.param.momentum)
        return momentum, f32(1) - momentum, f32(self.param.delta)


@register_update_rule("Adam")
class AdamUpdate(UpdateRule):
    """Adam (Kingma and Ba 2014); delta is added after the square root and is not bias-corrected.
    History: all first moments, then all second moments."""

    history_sets = 2

    def compute_update_value(self, param_id, blob, local_rate, iteration):
        xp = get_array_module(blob.diff)
        beta1 = f32(self.param.momentum)
        beta2 = f32(self.param.momentum2)
        correction = self._correction(iteration)
        g = blob.diff
        m = self.history[param_id].data
        v = self._second(param_id).data
        m[...] = (f32(1) - beta1) * g + beta1 * m
        v[...] = (f32(1) - beta2) * (g * g) + beta2 * v
        blob.diff[...] = (local_rate * correction) * (m / (xp.sqrt(v) + f32(self.param.delta)))

    def fused_step(self, param_id, blob, scale, decay, local_rate, iteration, divisor=1):
        m, v = self.history[param_id].data, self._second(param_id).data
        if not gpu_updates.usable(blob.data, blob.diff, m, v):
            return False
        gpu_updates.adam_step(blob.data, blob.diff, m, v, divisor, scale, decay, local_rate, self.param.momentum,
                              self.param.momentum2, self._correction(iteration), self.param.delta)
        return True

    def _correction(self, iteration: int) -> np.float32:
        """The bias correction sqrt(1 - beta2^t) / (1 - beta1^t) at ``iteration`` (t = iteration + 1).
        Caffe: std::pow(float, int) is double, the quotient is stored as float."""
        beta1 = f32(self.param.momentum)
        beta2 = f32(self.param.momentum2)
        t = iteration + 1
        return f32(math.sqrt(1.0 - float(beta2) ** t) / (1.0 - float(beta1) ** t))
