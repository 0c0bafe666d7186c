"""The solver's parallel seam (``netdef.solver.parallel``) and the exchange its updates talk to
(``netdef.solver.arrival``): the calls they get at fixed points, and updates applied as gradients
arrive giving the same weights, bit for bit, as updating at once."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.solver import get_solver
from netdef.solver.arrival import GradientExchange
from netdef.solver.parallel import Parallel
from tests.comm.fixtures import write_case


class RecordingExchange(GradientExchange):
    """One process's exchange, recording the updates' calls in ``calls``."""

    def __init__(self, calls):
        self.calls = calls

    def gradients_ready(self, param_ids):
        self.calls.append("gradients_ready")

    def backward_done(self):
        self.calls.append("backward_done")

    def arrived(self, param_ids):
        self.calls.append("arrived")
        return list(param_ids)

    def mixes_after_update(self, iteration):
        self.calls.append("mixes_after_update")
        return False

    def after_update(self, iteration):
        self.calls.append("after_update")


class Recording(Parallel):
    """The single-process seam, recording the calls of the loop (and of the exchange it connects)."""

    def __init__(self):
        self.calls = []

    def prepare(self, param):
        self.calls.append("prepare")

    def attach(self, net, test_nets, updates):
        assert net.learnable_params and test_nets == []
        updates.connect(RecordingExchange(self.calls))
        self.calls.append("attach")

    def begin_step(self, iteration, current_step):
        self.calls.append(f"begin_step {iteration} {current_step}")

    def begin_iteration(self, iteration):
        self.calls.append(f"begin_iteration {iteration}")

    def agree_requests(self, snapshot, stop):
        self.calls.append("agree_requests")
        return snapshot, stop


def test_the_loop_calls_the_seam_at_its_fixed_points(tmp_path):
    path = write_case(tmp_path, "calls", 4, 1, records=24, iter_size=2)
    parallel = Recording()
    solver = get_solver(str(path), parallel=parallel)
    solver.step(1)
    solver.close()
    calls = [c for i, c in enumerate(parallel.calls) if c != "gradients_ready" or parallel.calls[i - 1] != c]
    assert calls == ["prepare", "attach", "begin_step 0 0", "begin_iteration 0", "gradients_ready", "backward_done",
                     "arrived", "after_update", "mixes_after_update", "agree_requests"]
    # Gradients are handed over in the last pass only, once per parameter.
    assert parallel.calls.count("gradients_ready") == 4  # ip1, ip2 (shared by ip2a/ip2b), scale, ip3


class LateExchange(GradientExchange):
    """Gradients that arrive only when waited for: every update is deferred to the next forward of
    the layer that uses the blob, or to ArrivalUpdates.finish."""

    def __init__(self):
        self.waited = []
        self.current = None

    def begin_iteration(self, iteration):
        self.current = iteration

    def arrived(self, param_ids):
        return []

    def wait_for(self, param_ids):
        self.waited.append(list(param_ids))


class Late(Parallel):
    def __init__(self, exchange=None):
        self.exchange = exchange or LateExchange()

    def attach(self, net, test_nets, updates):
        updates.connect(self.exchange)

    def begin_iteration(self, iteration):
        self.exchange.begin_iteration(iteration)


@pytest.mark.parametrize("solver_type, iter_size", [("SGD", 1), ("Adam", 2), ("Nesterov", 1), ("AdaDelta", 2)])
def test_updates_deferred_to_the_next_forward_give_the_same_weights(tmp_path, solver_type, iter_size):
    extra = f'type: "{solver_type}"\n' + ("momentum2: 0.999\n" if solver_type == "Adam" else "")
    path = write_case(tmp_path, "late", 4, 5, records=24, test_records=24, test_iter=2, test_interval=2,
                      iter_size=iter_size, extra=extra)
    plain = get_solver(str(path))
    plain.solve()
    late = Late()
    deferred = get_solver(str(path), parallel=late)
    deferred.solve()
    for name, blobs in plain.net.params.items():
        for a, b in zip(blobs, deferred.net.params[name]):
            np.testing.assert_array_equal(b.data, a.data)
    for a, b in zip(plain.history, deferred.history):
        np.testing.assert_array_equal(b.data, a.data)
    assert deferred.test_scores == plain.test_scores
    # The forward of each layer with parameters waited for its own blobs, first ip1's.
    ip1 = deferred.net.layer_learnable_ids(deferred.net.layer_index("ip1"))
    assert late.exchange.waited[0] == ip1
    assert len(late.exchange.waited) > 5


class LateMixingExchange(LateExchange):
    """Late gradients, and an exchange that mixes the weights after the update of every third
    iteration (as easgd and hybrid do with tau 3)."""

    def __init__(self):
        super().__init__()
        self.asked = []
        self.updated = []

    def mixes_after_update(self, iteration):
        self.asked.append(iteration)
        return (iteration + 1) % 3 == 0

    def after_update(self, iteration):
        self.updated.append((iteration, self.current))


def test_after_update_names_the_iteration_it_ends_even_during_the_next_forward(tmp_path):
    # A deferred update completes in the next iteration's forward, after its begin_iteration: the
    # exchange must learn which iteration's update ended, or a tau-periodic rule mixes at the wrong
    # time (hybrid's group members then step differently and drift apart).
    path = write_case(tmp_path, "mix", 4, 6, records=24)
    late = Late(LateMixingExchange())
    solver = get_solver(str(path), parallel=late)
    solver.step(6)
    solver.close()
    assert late.exchange.asked == list(range(6))
    assert [ended for ended, _ in late.exchange.updated] == list(range(6))
    # Iterations 2 and 5 mix: their updates end within the iteration; the others' in the next one.
    assert [(ended, now) for ended, now in late.exchange.updated if ended == now] == [(2, 2), (5, 5)]


def test_clip_gradients_waits_for_every_gradient(tmp_path):
    path = write_case(tmp_path, "clip", 4, 2, records=24, extra="clip_gradients: 0.5\n")
    late = Late()
    solver = get_solver(str(path), parallel=late)
    solver.step(1)
    all_ids = list(range(len(solver.net.learnable_params)))
    assert late.exchange.waited[0] == all_ids
    solver.close()


def test_the_seam_is_narrow():
    """Lifecycle, tests, agreement and snapshots only: the gradients go through GradientExchange."""
    methods = [name for name, value in vars(Parallel).items() if callable(value) and not name.startswith("_")]
    assert len(methods) <= 15, methods
