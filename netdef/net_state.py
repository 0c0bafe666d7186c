"""Which layers a net's state includes (Caffe's FilterNet and StateMeetsRule), and the phase a
caller names."""
from __future__ import annotations

from .layers.base import TEST, TRAIN
from .net_errors import NetError
from .proto import netdef_pb2 as pb


def state_matches_rule(state: pb.NetState, rule: pb.NetStateRule) -> bool:
    """Caffe's StateMeetsRule: every condition the rule sets must hold."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(s not in stages for s in rule.stage):
        return False
    if any(s in stages for s in rule.not_stage):
        return False
    return True


def layer_included(layer: pb.LayerParameter, state: pb.NetState) -> bool:
    """Caffe's FilterNet for one layer: include rules need one match, exclude rules none."""
    if layer.include and layer.exclude:
        raise NetError(f"layer {layer.name!r} specifies both include and exclude rules; use one of them")
    if layer.include:
        return any(state_matches_rule(state, r) for r in layer.include)
    return not any(state_matches_rule(state, r) for r in layer.exclude)


def parse_phase(phase) -> int:
    if phase is None:
        return TEST
    if isinstance(phase, str):
        upper = phase.upper()
        if upper not in ("TRAIN", "TEST"):
            raise ValueError(f"phase must be TRAIN or TEST, not {phase!r}")
        return TRAIN if upper == "TRAIN" else TEST
    if phase not in (TRAIN, TEST):
        raise ValueError(f"phase must be netdef.TRAIN (0) or netdef.TEST (1), not {phase!r}")
    return int(phase)
