"""One parameter blob's update, with Caffe's arithmetic (``SGDSolver::ApplyUpdate``'s steps).

For a blob whose gradient is in its diff, at the learning rate ``rate`` of iteration ``iteration``::

    diff /= divisor                    the average of a sum the exchange left to the update (else 1)
    diff *= 1 / iter_size              Normalize
    diff += local_decay * data         Regularize (L2; L1 adds local_decay * sign(data))
    diff = the rule's update value     ComputeUpdateValue (updates.py), at rate * lr_mult
    data -= diff

in the float32 operations Caffe uses, or all of it in one compiled pass where the update rule has
one (``UpdateRule.fused_step``: the same bits). ``clip_gradients`` scales every diff by one factor
when their global L2 norm exceeds ``clip_gradients``, so it needs every gradient first.

When a blob is updated is ``arrival.py``'s business, not this module's.
"""
from __future__ import annotations

import logging

import numpy as np

from .. import backend
from ..proto import netdef_pb2 as pb
from .updates import SolverConfigError, UpdateRule

logger = logging.getLogger("netdef")
f32 = np.float32


def fmt(value) -> str:
    """A number as C++'s ``ostream << float`` prints it (6 significant digits, %g)."""
    return "%g" % float(value)


class ParameterUpdate:
    """The updates of ``net``'s learnable blobs by ``rule`` under the solver settings ``param``."""

    def __init__(self, param: pb.SolverParameter, net, rule: UpdateRule):
        self.param = param
        self.net = net
        self.rule = rule

    @property
    def clips(self) -> bool:
        """Whether the gradients are clipped by their global norm (clip_gradients >= 0)."""
        return self.param.clip_gradients >= 0

    def apply(self, param_id: int, rate, iteration: int, divisor=1) -> None:
        """The whole update of blob ``param_id`` (see the module docstring)."""
        if not self._fused(param_id, rate, iteration, divisor):
            blob = self.net.learnable_params[param_id]
            self.divide(param_id, divisor)
            self.normalize(param_id)
            self.regularize(param_id)
            self.compute_update_value(param_id, rate, iteration)
            data = blob.data
            data -= blob.diff

    def apply_all(self, param_ids, rate, iteration: int, divisors) -> bool:
        """``apply`` of every blob of ``param_ids`` (each with its divisor) where the update rule can
        step them all in one launch per kind of regularization (on a GPU: ``UpdateRule.fused_steps``,
        the same bits); False, having touched nothing, where it cannot (the caller applies them one by
        one)."""
        p = self.param
        if p.regularization_type != "L2" or not param_ids:
            return False  # L1 steps (and the error for an unknown type) go one by one
        blobs = [self.net.learnable_params[param_id] for param_id in param_ids]
        arrays = self.rule.fused_steps_arrays(param_ids, blobs)
        if arrays is None:
            return False
        scale = self._normalization()
        groups = {False: ([], []), True: ([], [])}
        for param_id, blob_arrays, divisor in zip(param_ids, arrays, divisors):
            decay = self._local_decay(param_id)
            group_arrays, group_scalars = groups[bool(decay)]
            group_arrays.append(blob_arrays)
            group_scalars.append((f32(divisor), f32(self.net.params_lr[param_id]), decay))
        for l2, (group_arrays, group_scalars) in groups.items():
            if group_arrays:
                self.rule.fused_steps(group_arrays, l2, group_scalars, f32(rate), scale)
        return True

    def divide(self, param_id: int, divisor) -> None:
        """Average a gradient the exchange left as a sum (``divisor`` 1: nothing to do)."""
        if divisor != 1:
            diff = self.net.learnable_params[param_id].diff
            diff /= diff.dtype.type(divisor)  # what the exchange's own average computes: the same bits

    def clip_gradients(self) -> None:
        clip = f32(self.param.clip_gradients)
        if clip < 0:
            return
        sumsq = f32(0)
        for blob in self.net.learnable_params:
            diff = blob.diff
            # float() first: a CuPy scalar does not convert to NumPy implicitly.
            sumsq += f32(float(backend.get_array_module(diff).vdot(diff.ravel(), diff.ravel())))
        norm = f32(np.sqrt(sumsq))
        if norm > clip:
            scale = f32(clip / norm)
            logger.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by scale factor %s",
                        fmt(norm), fmt(clip), fmt(scale))
            for blob in self.net.learnable_params:
                diff = blob.diff
                diff *= scale

    def normalize(self, param_id: int) -> None:
        if self.param.iter_size == 1:
            return
        diff = self.net.learnable_params[param_id].diff
        diff *= self._normalization()

    def regularize(self, param_id: int) -> None:
        blob = self.net.learnable_params[param_id]
        local_decay = self._local_decay(param_id)
        if not local_decay:
            return
        diff = blob.diff
        if self.param.regularization_type == "L2":
            diff += local_decay * blob.data
        elif self.param.regularization_type == "L1":
            diff += local_decay * backend.get_array_module(blob.data).sign(blob.data)
        else:
            raise SolverConfigError(f"Unknown regularization type: {self.param.regularization_type!r}")

    def compute_update_value(self, param_id: int, rate, iteration: int) -> None:
        """The update rule's value for one blob at ``iteration``."""
        self.rule.compute_update_value(param_id, self.net.learnable_params[param_id],
                                       self._local_rate(param_id, rate), iteration)

    def _fused(self, param_id: int, rate, iteration: int, divisor) -> bool:
        """``apply`` in one compiled pass where the update rule has one (the same bits); False where
        it has not and nothing was done."""
        p = self.param
        if p.regularization_type not in ("L1", "L2"):
            return False  # regularize() names the bad value
        decay = self._local_decay(param_id)
        if decay and p.regularization_type != "L2":
            return False
        scale = self._normalization()
        return self.rule.fused_step(param_id, self.net.learnable_params[param_id], scale, decay if decay else None,
                                    self._local_rate(param_id, rate), iteration, divisor)

    def _normalization(self) -> np.float32:
        """``normalize``'s factor, 1 / iter_size in float32 (1 itself where iter_size is 1)."""
        iter_size = self.param.iter_size
        return f32(1) / f32(iter_size) if iter_size != 1 else f32(1)

    def _local_rate(self, param_id: int, rate) -> np.float32:
        """The solver's rate times the blob's lr_mult, in float32 as Caffe computes it."""
        return f32(rate) * f32(self.net.params_lr[param_id])

    def _local_decay(self, param_id: int) -> np.float32:
        """weight_decay times the blob's decay_mult, in float32 as Caffe computes it."""
        return f32(self.param.weight_decay) * f32(self.net.params_weight_decay[param_id])
