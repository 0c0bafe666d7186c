"""Clocks for ``netdef time``: where the steps of a net run, how long each took.

On the CPU a step has finished when its call returns, so the wall clock around the call is its time.
On a GPU the call only queues kernels; as ``caffe time -gpu`` does, a CUDA event is recorded on the
stream before and after each step and the time between them read on the device. The host waits once
per iteration (``settle``), after the last step, so the timing does not serialize the queue between
layers; the events' times are read after that.
"""
from __future__ import annotations

import time


class HostClock:
    """Wall-clock time on the host (``time.perf_counter``)."""

    def mark(self) -> float:
        return time.perf_counter()

    def settle(self) -> None:
        """Nothing to wait for: a step on the CPU is done when its call returns."""

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1000


class CudaClock:
    """Time on the current CUDA device's stream, between events recorded on it."""

    def __init__(self):
        import cupy

        self._cupy = cupy
        self._last = None

    def mark(self):
        event = self._cupy.cuda.Event()
        event.record()
        self._last = event
        return event

    def settle(self) -> None:
        """Wait until every event marked so far has been reached (then ``elapsed_ms`` may read them)."""
        if self._last is not None:
            self._last.synchronize()

    def elapsed_ms(self, start, end) -> float:
        return float(self._cupy.cuda.get_elapsed_time(start, end))


def clock_for(gpu_id: int | None):
    """The clock for a run on ``gpu_id`` (None: the CPU)."""
    return HostClock() if gpu_id is None else CudaClock()


class LayerTimer:
    """Sums of the times of a net's steps over the iterations of a benchmark, by layer index, as
    ``netdef time`` prints them: a step (a chain of layers the net runs as one, or one layer) is
    timed forward on its first layer and backward on its last (where the gradients it hands on
    become ready). A net no layer of which needs backward (a deploy net) has no backward pass: only
    its forward is run and timed, and its backward times stay 0."""

    def __init__(self, net, clock):
        self.net = net
        self.clock = clock
        self.times_backward = any(net.layer_need_backward)
        self.steps = net.forward_steps()
        self.forward_ms = [0.0] * len(net.layers)
        self.backward_ms = [0.0] * len(net.layers)
        self.total_forward_ms = 0.0
        self.total_backward_ms = 0.0

    def run_iteration(self) -> float:
        """One forward and backward pass, its times added; returns the pass's own time (ms)."""
        net, clock = self.net, self.clock
        begin = clock.mark()
        forward = []
        for first, last in self.steps:
            start = clock.mark()
            net.forward_range(first, last)
            forward.append((first, start, clock.mark()))
        middle = clock.mark()
        backward = []
        if self.times_backward:
            net._fill_loss_diffs(0, len(net.layers) - 1)
            for first, last in reversed(self.steps):
                start = clock.mark()
                net.backward_range(last, first)
                backward.append((last, start, clock.mark()))
            end = clock.mark()
        clock.settle()
        for index, start, stop in forward:
            self.forward_ms[index] += clock.elapsed_ms(start, stop)
        for index, start, stop in backward:
            self.backward_ms[index] += clock.elapsed_ms(start, stop)
        forward_ms = clock.elapsed_ms(begin, middle)
        backward_ms = clock.elapsed_ms(middle, end) if self.times_backward else 0.0
        self.total_forward_ms += forward_ms
        self.total_backward_ms += backward_ms
        return forward_ms + backward_ms
