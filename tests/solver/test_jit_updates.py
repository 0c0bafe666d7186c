"""The compiled per-blob update steps give the same bits as normalize, regularize, the rule's value and
``data -= diff`` done one NumPy operation at a time (netdef/solver/jit_updates.py)."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.blob import Blob
from netdef.layers import jit
from netdef.proto import netdef_pb2 as pb
from netdef.solver.updates import update_rule_class

f32 = np.float32


def _blob(rng, shape, scale):
    blob = Blob(shape, dtype=np.float32)
    blob.data[...] = rng.standard_normal(shape).astype(np.float32) * scale
    blob.diff[...] = rng.standard_normal(shape).astype(np.float32) * scale
    return blob


def _stepwise(rule, param_id, blob, scale, decay, local_rate, iteration):
    """What the solver does without a fused step (Solver.normalize, regularize, compute_update_value)."""
    if scale != 1:
        blob.diff[...] *= scale
    if decay is not None:
        blob.diff[...] += decay * blob.data
    rule.compute_update_value(param_id, blob, local_rate, iteration)
    blob.data[...] -= blob.diff


@pytest.mark.parametrize("rule_name", ["SGD", "Nesterov"])
@pytest.mark.parametrize("iter_size", [1, 3])
@pytest.mark.parametrize("decay", [None, 0.0005])
@pytest.mark.parametrize("divisor", [1, 3])
def test_fused_step_is_bit_identical(rule_name, iter_size, decay, divisor):
    rng = np.random.default_rng(5)
    param = pb.SolverParameter(type=rule_name, base_lr=0.01, momentum=0.9)
    shapes = [(300, 257), (7,)]
    rules = [update_rule_class(rule_name)(param) for _ in range(2)]
    blobs = [[_blob(np.random.default_rng(1), s, 3.0) for s in shapes] for _ in range(2)]
    for rule, params in zip(rules, blobs):
        rule.setup(params)
    scale = f32(1) / f32(iter_size) if iter_size != 1 else f32(1)
    decay = None if decay is None else f32(decay)
    for iteration in range(4):  # the history carries over: momentum terms are exercised
        local_rate = f32(0.01) * f32(1 + iteration % 2)
        for param_id in range(len(shapes)):
            gradient = rng.standard_normal(shapes[param_id]).astype(np.float32)
            blobs[0][param_id].diff[...] = gradient
            blobs[1][param_id].diff[...] = gradient
            assert rules[0].fused_step(param_id, blobs[0][param_id], scale, decay, local_rate, iteration, divisor)
            # Without the fused step the solver averages a sum the exchange left first (_divide_now).
            blobs[1][param_id].diff /= f32(divisor)
            _stepwise(rules[1], param_id, blobs[1][param_id], scale, decay, local_rate, iteration)
        for fused, stepwise in zip(blobs[0], blobs[1]):
            for a, b in ((fused.data, stepwise.data), (fused.diff, stepwise.diff)):
                assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
        for fused, stepwise in zip(rules[0].history, rules[1].history):
            assert np.array_equal(fused.data.view(np.uint32), stepwise.data.view(np.uint32))


def test_no_fused_step_for_what_the_kernels_do_not_take(monkeypatch):
    param = pb.SolverParameter(type="SGD", base_lr=0.01, momentum=0.9)
    rule = update_rule_class("SGD")(param)
    blob = Blob((4, 3), dtype=np.float64)
    rule.setup([blob])
    before = blob.data.copy()
    assert not rule.fused_step(0, blob, 1.0, None, 0.1, 0)  # float64: the one-by-one steps
    monkeypatch.setattr(jit, "ENABLED", False)
    blob32 = Blob((4, 3), dtype=np.float32)
    rule.setup([blob32])
    assert not rule.fused_step(0, blob32, 1.0, None, 0.1, 0)
    assert np.array_equal(blob.data, before)
    adam = update_rule_class("Adam")(pb.SolverParameter(type="Adam", base_lr=0.01))
    adam.setup([blob32])
    assert not adam.fused_step(0, blob32, 1.0, None, 0.1, 0)  # no kernel for Adam
