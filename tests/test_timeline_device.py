"""A GPU's spans in the timeline (netdef/comm/timeline.py ``DeviceSpans``), what the CPU can check:
where spans land and how long they last, through a stand-in for CuPy's events whose clock is set by
the test and whose elapsed times are rounded to float32 milliseconds, as CUDA's are. The spans of a
real run are checked on a GPU (tests/test_gpu_ranks.py)."""
from __future__ import annotations

import types

import numpy as np

from netdef.comm.timeline import DeviceSpans, Timeline


class StandInCupy:
    """Events stamped with ``now`` (device seconds) when recorded, done at once."""

    def __init__(self):
        self.now = 0.0
        stand_in = self

        class Event:
            done = True

            def __init__(self):
                self.at = stand_in.now

            def synchronize(self):
                pass

        class Stream:
            def record(self):
                return Event()

        stream = Stream()
        self.cuda = types.SimpleNamespace(
            get_current_stream=lambda: stream,
            # CUDA's cudaEventElapsedTime: float32 milliseconds
            get_elapsed_time=lambda start, end: float(np.float32((end.at - start.at) * 1e3)))


def test_a_short_span_an_hour_into_a_run_keeps_its_length():
    cupy = StandInCupy()
    timeline = Timeline(rank=0, origin=0.0)
    spans = DeviceSpans(cupy, timeline)
    for started_at in (1.0, 3600.0):  # a second in, and an hour in
        cupy.now = started_at
        started = spans.begin()
        cupy.now = started_at + 30e-6  # a kernel of 30 us
        spans.end("conv1 forward", started)
    spans.resolve()
    first, late = [event for event in timeline.events() if event["ph"] == "X"]
    assert abs(first["dur"] - 30.0) < 0.01
    # float32 milliseconds an hour from the reference step by 0.25 ms: measured from the reference,
    # the span would last 0 or 250 us; from its own events it lasts what it lasted.
    assert abs(late["dur"] - 30.0) < 0.01, late
    assert abs(late["ts"] - (spans.reference_at + 3600.0) * 1e6) < 300  # placed within float32's step
