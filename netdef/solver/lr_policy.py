"""Learning-rate policies, computed exactly as Caffe's ``SGDSolver::GetLearningRate``.

``it`` is the iteration about to be applied (0 for the first update). Caffe computes in a mix of
float32 (``Dtype``) and double: ``std::pow(float, int)`` promotes to double (step, exp, multistep and
Adam's bias correction), ``std::pow(float, float)`` and ``std::exp(float)`` stay float (poly,
sigmoid); inv's recorded rates are those of a power taken in double and rounded once to float
(they depend on the C library Caffe was built against); the rate is stored as float. The functions here repeat those roundings, so the rates equal
Caffe's bit for bit (the oracle arrays hold Caffe's float32 rates).

    fixed      base_lr
    step       base_lr * gamma ^ floor(it / stepsize)        (current_step = floor(it / stepsize))
    exp        base_lr * gamma ^ it
    inv        base_lr * (1 + gamma * it) ^ (-power)
    multistep  base_lr * gamma ^ current_step, current_step advancing by at most one per call when
               it >= stepvalue[current_step] (so it lives in the solver state and the snapshots)
    poly       base_lr * (1 - it / max_iter) ^ power
    sigmoid    base_lr / (1 + exp(-gamma * (it - stepsize)))   (gamma >= 0, stepsize > 0)
"""
from __future__ import annotations

import numpy as np

from ..proto import netdef_pb2 as pb

f32 = np.float32

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


class LRPolicyError(ValueError):
    """A learning-rate policy that Caffe would reject (its CHECKs in GetLearningRate)."""


def validate(param: pb.SolverParameter) -> None:
    """Caffe's checks of GetLearningRate, made when the solver is built instead of at the first
    update, so that a bad solver file fails before any work is done."""
    policy = param.lr_policy
    if policy not in POLICIES:
        raise LRPolicyError(f"Unknown learning rate policy: {policy!r} (lr_policy must be one of "
                            f"{', '.join(POLICIES)})")
    if policy in ("step", "sigmoid") and param.stepsize <= 0:
        raise LRPolicyError(f"lr_policy {policy!r} needs stepsize > 0, got {param.stepsize}")
    if policy in ("step", "exp", "sigmoid") and param.gamma < 0:
        raise LRPolicyError(f"lr_policy {policy!r} needs gamma >= 0, got {param.gamma:g} "
                            f"(Caffe: Check failed: this->param_.gamma() >= 0)")
    if policy == "poly" and param.max_iter <= 0:
        # Caffe divides by max_iter and trains on with a NaN rate; say it instead.
        raise LRPolicyError(f"lr_policy 'poly' needs max_iter > 0, got {param.max_iter}")


def learning_rate(param: pb.SolverParameter, it: int, current_step: int = 0) -> tuple[np.float32, int]:
    """(rate, current_step after this call) for iteration ``it``.

    Only "step" and "multistep" change ``current_step``; the others return it unchanged.
    """
    policy = param.lr_policy
    base = f32(param.base_lr)
    gamma = f32(param.gamma)
    power = f32(param.power)
    if policy == "fixed":
        rate = base
    elif policy == "step":
        if param.stepsize <= 0:
            raise LRPolicyError(f"lr_policy 'step' needs stepsize > 0, got {param.stepsize}")
        current_step = it // param.stepsize
        rate = f32(float(base) * float(gamma) ** current_step)
    elif policy == "exp":
        rate = f32(float(base) * float(gamma) ** it)
    elif policy == "inv":
        # The power in double, rounded once to float: this reproduces Caffe's recorded rates on
        # every iteration of the oracle (a float32 power of a float32 base misses by an ulp at
        # it=2, and what NumPy's float32 power returns differs between NumPy releases).
        rate = base * f32((1.0 + float(gamma) * it) ** -float(power))
    elif policy == "multistep":
        if current_step < len(param.stepvalue) and it >= param.stepvalue[current_step]:
            current_step += 1
        rate = f32(float(base) * float(gamma) ** current_step)
    elif policy == "poly":
        if param.max_iter <= 0:
            raise LRPolicyError(f"lr_policy 'poly' needs max_iter > 0, got {param.max_iter}")
        rate = base * np.power(f32(1) - f32(it) / f32(param.max_iter), power, dtype=np.float32)
    elif policy == "sigmoid":
        validate(param)
        rate = base * (f32(1) / (f32(1) + np.exp(-gamma * (f32(it) - f32(param.stepsize)), dtype=np.float32)))
    else:
        raise LRPolicyError(f"Unknown learning rate policy: {policy!r}")
    return f32(rate), int(current_step)
