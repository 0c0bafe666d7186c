"""What a distributed iteration spent its time on: per-iteration measurements and a Chrome trace.

``Measurements`` keeps one ``IterationRecord`` per iteration (the most recent ``keep``): the forward
and backward time, the time the training thread spent inside exchange calls (packing buckets,
starting them, polling), the time it waited before the update for exchanges still in flight, when
the last backward pass began and ended and when the update was done, and every bucket's size and
ready, start and completion times. ``summary()`` condenses them for benchmarks::

    solver = netdef.comm.distributed.create_solver("solver.prototxt", comm)
    solver.step(50)
    solver.measurements.summary()   # {"iterations": 49, "backward_s": ..., "wait_s": ..., ...}

``Timeline`` collects Chrome trace events ("X" complete events, microseconds) for one rank: each
layer's forward and backward (``instrument_net``, through the net's layer hooks), each bucket's exchange from the moment it was
ready to its completion, the wait before the update, test passes. ``write_chrome_trace`` writes all
ranks' events to one JSON file (one process per rank) that Perfetto (ui.perfetto.dev) and
chrome://tracing open. Times are seconds of ``time.perf_counter`` relative to an origin taken right
after a barrier, so the ranks' clocks line up to within the barrier's skew.

A completion time is when the progress driver *observed* the completion: with polling, at the next
poll; with MPI's own progress thread, during the final wait.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import statistics
import threading
import time

import numpy as np

from .. import files
from ..solver.arrival import UpdateObserver


@dataclasses.dataclass
class BucketRecord:
    """One bucket's exchange in one iteration (times in seconds of ``time.perf_counter``)."""

    index: int
    nbytes: int
    num_params: int
    ready_at: float = math.nan      # its last gradient was packed
    started_at: float = math.nan    # its collective started: after backward with overlap off; on the
                                    # communication thread's clock with THREAD progress
    done_at: float = math.nan       # its completion was seen


@dataclasses.dataclass
class ChunkRecord:
    """One chunk of a bucket in one iteration, with the priority schedule (scheduler.py)."""

    bucket: int
    number: int
    nbytes: int
    started_at: float = math.nan
    done_at: float = math.nan
    priority: int = 0


@dataclasses.dataclass
class IterationRecord:
    """One iteration's measurements; durations in seconds."""

    iteration: int
    start: float
    forward_s: float = 0.0          # all forward passes (iter_size of them)
    backward_s: float = 0.0         # all backward passes, exchange calls inside them included
    exchange_call_s: float = 0.0    # inside the exchange rule's calls on the training thread
    wait_s: float = 0.0             # blocked before the update for exchanges still in flight
    unpack_s: float = 0.0           # copying the combined gradients back into the diffs
    bytes: int = 0                  # payload this rank contributed to the exchanges
    buckets: list = dataclasses.field(default_factory=list)
    chunks: list = dataclasses.field(default_factory=list)   # ChunkRecords (priority schedule)
    backward_start_at: float = math.nan  # the last backward pass (the one that exchanges) began
    backward_end_at: float = math.nan    # ... and ended (perf_counter seconds)
    end_at: float = math.nan             # the update was applied

    @property
    def iteration_s(self) -> float:
        """From the iteration's start to its update's end (nan until the update is done)."""
        return self.end_at - self.start

    @property
    def exchange_s(self) -> float:
        """From the first bucket's start to the last bucket's observed completion."""
        if not self.buckets:
            return 0.0
        return max(b.done_at for b in self.buckets) - min(b.started_at for b in self.buckets)


class Measurements:
    """The most recent ``keep`` iteration records; ``current`` is the one being measured."""

    def __init__(self, keep: int = 10000):
        self.records: collections.deque[IterationRecord] = collections.deque(maxlen=keep)
        self.current: IterationRecord | None = None

    def begin(self, iteration: int, start: float) -> IterationRecord:
        self.current = IterationRecord(iteration, start)
        self.records.append(self.current)
        return self.current

    def summary(self, skip: int = 1) -> dict:
        """Medians over the recorded iterations after the first ``skip`` (the first iteration lays out
        the buckets and exchanges without overlap). Keys: iterations, forward_s, backward_s,
        exchange_call_s, wait_s, unpack_s, exchange_s, bytes, buckets, and iteration_s over the
        iterations whose update has been applied (nan when none has)."""
        records = list(self.records)[skip:] or list(self.records)
        if not records:
            return {"iterations": 0}
        out = {"iterations": len(records)}
        for name in ("forward_s", "backward_s", "exchange_call_s", "wait_s", "unpack_s", "exchange_s"):
            out[name] = statistics.median(getattr(r, name) for r in records)
        finished = [r.iteration_s for r in records if not math.isnan(r.end_at)]
        out["iteration_s"] = statistics.median(finished) if finished else math.nan
        out["bytes"] = int(statistics.median(r.bytes for r in records))
        out["buckets"] = int(statistics.median(len(r.buckets) for r in records))
        return out


# ============================================================================================== trace
class DeviceSpans:
    """Spans of a GPU's streams, timed by CUDA events and placed on the host's time axis: one
    reference event, recorded and waited for when this is made, ties the device's clock to the
    host's; a span is written into the timeline once its end event has completed (``resolve``).

    CUDA gives the time between two events as float32 milliseconds, so a span's place, measured from
    the reference, grows coarser as the run goes on (float32's 24 bits: ten minutes in, its steps are
    a sixteenth of a millisecond, longer than many kernels); its length is measured between its own
    two events, as fine as CUDA's timer however long the run, so that a layer's time stays readable."""

    def __init__(self, cupy, timeline: "Timeline"):
        self.cupy = cupy
        self.timeline = timeline
        self.reference = cupy.cuda.get_current_stream().record()
        self.reference.synchronize()
        self.reference_at = time.perf_counter()
        self._pending: list[tuple] = []
        # A schedule's communication thread may end spans (NCCL's chunks) while the training thread resolves.
        self._lock = threading.Lock()

    def begin(self, stream=None):
        """An event on ``stream`` (the current one by default) where a span starts."""
        return (stream or self.cupy.cuda.get_current_stream()).record()

    def end(self, name: str, started, stream=None, lane: str = "device compute", category: str = "device",
            args: dict | None = None) -> None:
        """The span ``name`` from event ``started`` to now on ``stream``."""
        ended = (stream or self.cupy.cuda.get_current_stream()).record()
        with self._lock:
            self._pending.append((name, started, ended, lane, category, args))

    def resolve(self, wait: bool = False) -> None:
        """Write the spans whose end has completed (with ``wait``, all of them) into the timeline."""
        with self._lock:
            pending, self._pending = self._pending, []
        waiting = []
        for name, started, ended, lane, category, args in pending:
            if wait:
                ended.synchronize()
            if not ended.done:
                waiting.append((name, started, ended, lane, category, args))
                continue
            begun = self._host_time(started)
            self.timeline.span(name, begun, begun + self.cupy.cuda.get_elapsed_time(started, ended) / 1e3, lane,
                               category, args)
        with self._lock:
            self._pending[:0] = waiting

    def _host_time(self, event) -> float:
        return self.reference_at + self.cupy.cuda.get_elapsed_time(self.reference, event) / 1e3


class Timeline:
    """Chrome trace events of one rank. Lanes (trace threads): "compute" (layers, the wait, tests),
    "exchange" (the exchange rule's calls) and one per bucket index; on a GPU also "device compute"
    and "device exchange", the streams' own spans (``device``)."""

    def __init__(self, rank: int, origin: float, max_events: int = 2_000_000):
        self.rank = rank
        self.origin = origin
        self.max_events = max_events
        self._events: list[dict] = []
        self._lanes: dict[str, int] = {}
        self.dropped = 0
        self.device: DeviceSpans | None = None

    def on_device(self, array_module) -> None:
        """Also time the streams of the GPU whose arrays ``array_module`` makes (CuPy; NumPy: nothing)."""
        if array_module is not np and self.device is None:
            self.device = DeviceSpans(array_module, self)

    def _lane(self, lane: str) -> int:
        if lane not in self._lanes:
            self._lanes[lane] = len(self._lanes) + 1
        return self._lanes[lane]

    def span(self, name: str, start: float, end: float, lane: str = "compute", category: str = "compute",
             args: dict | None = None) -> None:
        """A complete event from ``start`` to ``end`` (perf_counter seconds)."""
        if len(self._events) >= self.max_events:
            self.dropped += 1
            return
        event = {"name": name, "cat": category, "ph": "X", "pid": self.rank, "tid": self._lane(lane),
                 "ts": round((start - self.origin) * 1e6, 3), "dur": round(max(end - start, 0.0) * 1e6, 3)}
        if args:
            event["args"] = args
        self._events.append(event)

    def record_iteration(self, record: IterationRecord) -> None:
        """The buckets of an iteration, one lane per bucket index, and with the priority schedule
        each chunk's transfer in its bucket's lane."""
        for b in record.buckets:
            self.span(f"bucket {b.index}", b.started_at, b.done_at, lane=f"bucket {b.index}", category="exchange",
                      args={"bytes": b.nbytes, "params": b.num_params, "iteration": record.iteration,
                            "ready_ms": round((b.started_at - b.ready_at) * 1e3, 3)})
        for c in record.chunks:
            self.span(f"bucket {c.bucket} chunk {c.number}", c.started_at, c.done_at, lane=f"bucket {c.bucket}",
                      category="chunk", args={"bytes": c.nbytes, "priority": c.priority, "iteration": record.iteration})

    def events(self) -> list[dict]:
        """The events with the metadata that names the rank and its lanes."""
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}},
                {"name": "process_sort_index", "ph": "M", "pid": self.rank, "args": {"sort_index": self.rank}}]
        for lane, tid in self._lanes.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": lane}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": tid,
                         "args": {"sort_index": tid}})
        return meta + self._events

    def to_json(self) -> bytes:
        if self.device is not None:
            self.device.resolve(wait=True)
        return json.dumps(self.events(), separators=(",", ":")).encode("utf-8")


def write_chrome_trace(path, per_rank_json: list[bytes]) -> None:
    """Write the ranks' ``Timeline.to_json()`` as one trace file (atomically)."""
    events = []
    for data in per_rank_json:
        events.extend(json.loads(data))
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"producer": "netdef", "ranks": len(per_rank_json)}}
    files.write_bytes_atomically(path, json.dumps(doc, separators=(",", ":")).encode("utf-8"))


class IterationClock(UpdateObserver):
    """Measures one rank's training iterations, as an observer: from ``begin(iteration)`` until the
    iteration's update is applied, each forward and each backward pass (the train net's layer hooks:
    a forward ends after the last layer's, a backward after the first layer's), and the end of the
    update (the solver's ``ArrivalUpdates``). With a ``timeline`` it also records the passes, the
    waits for gradients and each blob's update as spans."""

    def __init__(self, net, measurements: Measurements, timeline: Timeline | None = None, clock=time.perf_counter):
        self.measurements = measurements
        self.timeline = timeline
        self.clock = clock
        self._last_layer = len(net.layers) - 1
        self._param_names = [blob.name for blob in net.learnable_params]
        self._record: IterationRecord | None = None  # while an iteration is measured
        self._mark = 0.0
        # It marks the ends of the passes (the last layer's forward, the first's backward): edges do.
        net.register_layer_hooks(after_forward=self._after_forward, after_backward=self._after_backward,
                                 at_run_edges=True)

    def begin(self, iteration: int) -> None:
        self._mark = self.clock()
        self._record = self.measurements.begin(iteration, self._mark)

    def _after_forward(self, layer_index: int) -> None:
        if layer_index == self._last_layer and self._record is not None:
            now = self.clock()
            self._record.forward_s += now - self._mark
            if self.timeline is not None:
                self.timeline.span("forward", self._mark, now, lane="passes")
            self._mark = now

    def _after_backward(self, layer_index: int) -> None:
        if layer_index == 0 and self._record is not None:
            now = self.clock()
            self._record.backward_s += now - self._mark
            if self.timeline is not None:
                self.timeline.span("backward", self._mark, now, lane="passes")
            # Overwritten by each pass: what stays is the last pass's, the one that exchanges.
            self._record.backward_start_at, self._record.backward_end_at = self._mark, now
            self._mark = now

    def arrivals_checked(self, start: float, end: float) -> None:
        if self.timeline is not None:
            self.timeline.span("wait for exchanges + average", start, end)

    def waited(self, param_ids, start: float, end: float) -> None:
        if self.timeline is not None:
            names = ", ".join(self._param_names[i] for i in param_ids)
            self.timeline.span(f"wait for {names}", start, end, category="wait")

    def blob_updated(self, param_id: int, start: float, end: float) -> None:
        if self.timeline is not None:
            self.timeline.span(f"update {self._param_names[param_id]}", start, end, lane="updates", category="update")

    def applied(self) -> None:
        if self._record is not None:
            self._record.end_at = self.clock()
            self._record = None


def instrument_net(net, timeline: Timeline, prefix: str = "") -> tuple:
    """Record each layer's forward and backward of ``net`` in ``timeline`` through the net's layer
    hooks (``net.remove_layer_hooks(handle)`` with the returned handle stops it). A layer that does
    not run backward (data layers, layers below which nothing learns) gets no backward span."""
    clock = time.perf_counter
    labels = [f"{prefix}{layer.name}" for layer in net.layers]
    needs_backward = net.layer_need_backward
    started = [0.0, 0.0]  # forward, backward: layers do not nest, one start of each is enough
    device = timeline.device  # on a GPU, the kernels' own spans beside the host's calls
    on_device = [None, None]

    def before_forward(li):
        started[0] = clock()
        if device is not None:
            if li == 0:
                device.resolve()  # what the last iteration's events have finished
            on_device[0] = device.begin()

    def after_forward(li):
        timeline.span(f"{labels[li]} forward", started[0], clock())
        if device is not None:
            device.end(f"{labels[li]} forward", on_device[0])

    def before_backward(li):
        started[1] = clock()
        if device is not None:
            on_device[1] = device.begin()

    def after_backward(li):
        if needs_backward[li]:
            timeline.span(f"{labels[li]} backward", started[1], clock())
            if device is not None:
                device.end(f"{labels[li]} backward", on_device[1])

    return net.register_layer_hooks(before_forward, after_forward, before_backward, after_backward)
