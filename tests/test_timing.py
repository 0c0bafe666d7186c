"""netdef/timing.py: how ``netdef time`` attributes its clock's readings to layers, checked with a
clock that records what it was asked (the CUDA clock's order: every mark of an iteration, one wait,
then the readings), and the host clock against the wall."""
from __future__ import annotations

import time

from netdef.timing import HostClock, LayerTimer, clock_for


class FakeNet:
    """Four layers, the middle two run as one step; records the calls in ``log``."""

    def __init__(self, log, need_backward=(False, True, True, True)):
        self.log = log
        self.layers = ["data", "conv", "relu", "loss"]
        self.layer_need_backward = list(need_backward)

    def forward_steps(self):
        return [(0, 0), (1, 2), (3, 3)]

    def forward_range(self, first, last):
        self.log.append(("forward", first, last))

    def backward_range(self, last, first):
        self.log.append(("backward", last, first))

    def _fill_loss_diffs(self, start, end):
        self.log.append(("fill", start, end))


class RecordingClock:
    """Mark n is at time 2**n ms, so a reading names the pair of marks it spans; readings are refused
    until ``settle``."""

    def __init__(self, log):
        self.log = log
        self.marks = 0
        self.settled = False

    def mark(self):
        assert not self.settled, "marked after the iteration settled"
        self.log.append(("mark", self.marks))
        self.marks += 1
        return self.marks - 1

    def settle(self):
        self.log.append(("settle",))
        self.settled = True

    def elapsed_ms(self, start, end):
        assert self.settled, "read before the marks were waited for"
        assert start < end
        return float(2 ** end - 2 ** start)


def test_each_step_is_timed_on_its_first_layer_forward_and_its_last_backward():
    log = []
    clock = RecordingClock(log)
    timer = LayerTimer(FakeNet(log), clock)
    total = timer.run_iteration()
    calls = [entry for entry in log if entry[0] != "mark"]
    assert calls == [("forward", 0, 0), ("forward", 1, 2), ("forward", 3, 3), ("fill", 0, 3),
                     ("backward", 3, 3), ("backward", 2, 1), ("backward", 0, 0), ("settle",)]
    assert log[-1] == ("settle",) and log.count(("settle",)) == 1  # one wait, after the last mark
    # Marks: 0 begin; 1-2, 3-4, 5-6 the forward steps; 7 middle; 8-9, 10-11, 12-13 backward; 14 end.
    def span(first_mark, last_mark):
        return float(2 ** last_mark - 2 ** first_mark)

    assert timer.forward_ms == [span(1, 2), span(3, 4), 0.0, span(5, 6)]
    assert timer.backward_ms == [span(12, 13), 0.0, span(10, 11), span(8, 9)]
    assert timer.total_forward_ms == span(0, 7) and timer.total_backward_ms == span(7, 14)
    assert total == span(0, 14)


def test_a_net_without_backward_is_timed_forward_only():
    """A deploy net: no layer needs backward, so no backward is run, and none is reported."""
    log = []
    clock = RecordingClock(log)
    timer = LayerTimer(FakeNet(log, need_backward=(False,) * 4), clock)
    total = timer.run_iteration()
    assert [entry for entry in log if entry[0] != "mark"] == [
        ("forward", 0, 0), ("forward", 1, 2), ("forward", 3, 3), ("settle",)]
    # Marks: 0 begin; 1-2, 3-4, 5-6 the forward steps; 7 the end of forward.
    assert timer.backward_ms == [0.0] * 4 and timer.total_backward_ms == 0.0
    assert total == timer.total_forward_ms == float(2 ** 7 - 2 ** 0)


def test_times_add_up_over_iterations():
    timer = LayerTimer(FakeNet([]), HostClock())
    timer.run_iteration()
    first = list(timer.forward_ms)
    timer.run_iteration()
    assert all(b >= a for a, b in zip(first, timer.forward_ms))
    assert timer.forward_ms[2] == 0.0 and timer.backward_ms[1] == 0.0  # inside the chain


def test_host_clock_reads_the_wall_in_milliseconds():
    clock = clock_for(None)
    assert isinstance(clock, HostClock)
    start = clock.mark()
    time.sleep(0.02)
    end = clock.mark()
    clock.settle()
    assert 19.5 <= clock.elapsed_ms(start, end) < 1000  # not seconds, not microseconds
