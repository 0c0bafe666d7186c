"""A solver file's settings checked when it is read, before any net is built or any work is done.

A rate that is NaN, infinite or out of its range (``base_lr: nan``, ``momentum: 1.5``) would
otherwise train one iteration and then stop on non-finite parameters, far from its cause; a solver
without a net would be reported by whichever later check happened to run first. Each error names
the solver (its file, or what it was given as) and the field.

Only what is wrong for every update rule is refused here; what one rule cannot use (momentum with
AdaGrad, RMSProp's ``rms_decay``) is each rule's own ``validate``, and the learning-rate policies'
own conditions are ``lr_policy.validate``.
"""
from __future__ import annotations

import math

from ..backend import PRECISIONS
from ..proto import netdef_pb2 as pb
from .updates import SolverConfigError

#: The fields that can name the net to train; exactly one must be given.
TRAIN_NET_FIELDS = ("net", "net_param", "train_net", "train_net_param")

# (field, whether a finite value is in range, the range in words; None: any finite value).
_RANGES = (
    ("base_lr", lambda value: value >= 0, ">= 0"),
    ("weight_decay", lambda value: value >= 0, ">= 0"),
    ("momentum", lambda value: 0 <= value <= 1, "between 0 and 1"),
    # Adam divides by 1 - momentum2 ** t: 1 itself would divide by zero.
    ("momentum2", lambda value: 0 <= value < 1, "in [0, 1)"),
    ("rms_decay", lambda value: 0 <= value <= 1, "between 0 and 1"),
    # AdaGrad, RMSProp, AdaDelta and Adam divide by a root plus delta: 0 would divide zero by zero.
    ("delta", lambda value: value > 0, "> 0"),
    ("gamma", None, None),
    ("power", None, None),
    # Negative turns clipping off, as in Caffe.
    ("clip_gradients", None, None),
)


def train_net_field(param: pb.SolverParameter, name: str) -> str:
    """The one field of ``param`` that names the net to train; SolverConfigError when there is none
    or more than one."""
    given = [field for field in TRAIN_NET_FIELDS if param.HasField(field)]
    if not given:
        raise SolverConfigError(f"{name}: no net to train: the solver must give one of "
                                f"{', '.join(TRAIN_NET_FIELDS)}")
    if len(given) > 1:
        raise SolverConfigError(f"{name}: more than one net to train: the solver gives {', '.join(given)}; "
                                f"give exactly one of {', '.join(TRAIN_NET_FIELDS)}")
    return given[0]


def check_solver_values(param: pb.SolverParameter, name: str) -> None:
    """Raise SolverConfigError, naming ``name`` and the field, when the solver has no net to train,
    one of its rates is not finite or outside its range, or its GPU precision is not one netdef has."""
    train_net_field(param, name)
    for field, in_range, words in _RANGES:
        value = getattr(param, field)
        if math.isfinite(value) and (in_range is None or in_range(value)):
            continue
        rule = "a finite number" if words is None else f"a finite number {words}"
        raise SolverConfigError(f"{name}: {field} is {value:g}; it must be {rule}")
    if param.precision not in PRECISIONS:
        raise SolverConfigError(f"{name}: precision must be one of {', '.join(PRECISIONS)}, got {param.precision!r}")
