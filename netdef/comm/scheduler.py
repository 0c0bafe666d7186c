"""The priority schedule of one iteration's exchange: which piece of which bucket goes next.

Buckets fill during backward in backward order, so in first-in first-out order the first layers'
gradients, which the next forward needs first, leave last. This schedule (after P3's priorities and
ByteScheduler's partitioning and credit) sends first what the next forward needs first:

- Priority: a bucket's priority is the forward position of the first layer that uses one of its
  parameters (lower goes first).
- Chunks: a bucket larger than ``chunk_bytes`` is split into chunks, each its own allreduce, so that
  a high-priority bucket that becomes ready late overtakes the rest of a large one.
- Credit: at most ``credit_bytes`` in flight. MPI libraries progress every outstanding collective
  together, so whatever was handed over shares the link; keeping little in flight makes each choice
  late, when it can still favour the urgent.

Every rank must start the same collectives in the same order, but each rank's backward runs at its
own pace, so the choice may not depend on local timing. Each chunk's allreduce is followed by a
one-integer MIN allreduce of how many buckets this rank had ready when it started the chunk (its
mark); once complete, every rank knows the same number W, and every bucket below W is ready on every
rank. Decision j (the j-th chunk started) first needs the oldest chunks complete until those started
after them leave room for a chunk within the credit: a prefix that depends only on earlier
decisions; W is the mark of the last chunk of that prefix. It then starts the most urgent unsent
chunk of the buckets below W, or, when there is none, the unsent chunk first in backward order once
that is ready here. Buckets are numbered in the order they fill (``plan_buckets``), so "ready here"
is a count.

``pump(block)`` makes the decisions that can be made and notes completions; it makes every MPI call
of the schedule, so it runs on one thread only (the training thread between layers and in waits,
or the communication thread of ``ScheduleThread``).
"""
from __future__ import annotations

import threading
import time
from typing import NamedTuple

import numpy as np

from .reduction import Reduction


class Chunk:
    """Elements ``start:stop`` of a bucket's flat buffer, exchanged as one reduction."""

    __slots__ = ("bucket", "number", "start", "stop", "nbytes", "request", "mark", "mark_request", "started_at",
                 "done_at")

    def __init__(self, bucket, number: int, start: int, stop: int):
        self.bucket = bucket
        self.number = number            # within its bucket
        self.start, self.stop = start, stop
        self.nbytes = (stop - start) * bucket.dtype.itemsize
        self.reset()

    def reset(self) -> None:
        self.request = self.mark_request = None
        self.mark = np.zeros(1, dtype=np.int64)
        self.started_at = self.done_at = float("nan")


class PrioritySchedule:
    """See the module docstring. ``buckets`` in fill order (``bucket.index``), ``priorities`` by
    bucket index (lower first); each chunk is summed by ``reduction`` (default: MPI's Iallreduce), the
    marks by Iallreduce."""

    def __init__(self, comm, buckets, priorities, chunk_bytes: int, credit_bytes: int, clock=time.perf_counter,
                 reduction: Reduction | None = None):
        if chunk_bytes <= 0 or credit_bytes < chunk_bytes:
            raise ValueError(f"need 0 < chunk_bytes <= credit_bytes, got {chunk_bytes} and {credit_bytes}")
        self.comm = comm
        self.reduction = reduction or Reduction(comm)
        self.buckets = list(buckets)
        self.priorities = list(priorities)
        self.chunk_bytes = int(chunk_bytes)
        self.credit_bytes = int(credit_bytes)
        self.clock = clock
        self.chunks: list[Chunk] = []
        self._chunks_of: list[list[Chunk]] = []
        for bucket in self.buckets:
            size = sum(bucket.sizes)
            per_chunk = max(1, self.chunk_bytes // bucket.dtype.itemsize)
            pieces = [Chunk(bucket, n, start, min(start + per_chunk, size))
                      for n, start in enumerate(range(0, size, per_chunk))]
            self._chunks_of.append(pieces)
            self.chunks.extend(pieces)
        self.local_ready = 0
        # Held by pump() and reset(): with a communication thread, the training thread resets.
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """A new iteration (everything of the previous one has completed)."""
        with self.lock:
            self._reset()

    def _reset(self) -> None:
        for chunk in self.chunks:
            chunk.reset()
        self.local_ready = 0
        self.started: list[Chunk] = []
        self._settled = 0                         # started[:_settled] complete, marks included
        self._unsent = list(self.chunks)          # in backward order
        self._inflight: list[Chunk] = []
        self._left = [len(c) for c in self._chunks_of]
        self.completed_buckets = 0
        # Whether a decision may have become possible since the last one was refused: only a
        # completion or a bucket readied here make one possible (most pumps find neither).
        self._news = True

    # ------------------------------------------------------------------------------ readiness
    def bucket_ready(self, bucket) -> None:
        """``bucket`` is packed (its buffer is final) on this rank."""
        self.local_ready = max(self.local_ready, bucket.index + 1)
        self._news = True

    @property
    def done(self) -> bool:
        """Every chunk started and complete, marks included."""
        return not self._unsent and not self._inflight

    @property
    def in_flight(self) -> bool:
        """Some started chunk (or its mark) has not completed: a test may find something new. When
        nothing is, only ``bucket_ready`` can let the schedule go on."""
        return bool(self._inflight)

    # ------------------------------------------------------------------------------ progress
    def pump(self, block: bool = False) -> bool:
        """Note completions and start what may start. With ``block`` and nothing else done, wait
        inside MPI for the oldest chunk in flight (for waits: a rank that started a chunk completes
        it without waiting for anything else). Returns whether anything started or completed;
        callers that wait call it again until what they wait for is there."""
        with self.lock:
            progressed = self._test()
            if progressed or self._news:
                self._news = False
                while self._decide():
                    progressed = True
            if block and not progressed and self._inflight:
                self._wait_oldest()
                progressed = True
                while self._decide():
                    pass
            return progressed

    def _test(self) -> bool:
        if not self._inflight:
            return False
        requests = []
        for chunk in self._inflight:
            requests += [chunk.request, chunk.mark_request]
        if not self.comm.test_some(requests):
            return False
        for k, chunk in enumerate(self._inflight):
            chunk.request, chunk.mark_request = requests[2 * k], requests[2 * k + 1]
        self._collect()
        return True

    def _wait_oldest(self) -> None:
        chunk = self._inflight[0]
        pair = [chunk.request, chunk.mark_request]
        self.comm.wait_all(pair)
        chunk.request = chunk.mark_request = None
        self._collect()

    def _collect(self) -> None:
        now = self.clock()
        keep = []
        for chunk in self._inflight:
            if chunk.request is None and np.isnan(chunk.done_at):
                chunk.done_at = now
                self._left[chunk.bucket.index] -= 1
                if self._left[chunk.bucket.index] == 0:
                    chunk.bucket.done_at = now
                    self.completed_buckets += 1
            if chunk.request is not None or chunk.mark_request is not None:
                keep.append(chunk)
        self._inflight = keep
        started = self.started
        while self._settled < len(started) and started[self._settled].request is None \
                and started[self._settled].mark_request is None:
            self._settled += 1

    def _acknowledged(self) -> int:
        """How many of the started chunks must be complete before the next decision: the shortest
        prefix after which the bytes started leave room for a chunk within the credit."""
        room = self.credit_bytes - self.chunk_bytes
        count = len(self.started)
        in_flight = 0
        while count > 0 and in_flight + self.started[count - 1].nbytes <= room:
            count -= 1
            in_flight += self.started[count].nbytes
        return count

    def _decide(self) -> bool:
        if not self._unsent:
            return False
        acknowledged = self._acknowledged()
        if acknowledged:
            if acknowledged > self._settled:
                return False
            everywhere = int(self.started[acknowledged - 1].mark[0])
        else:
            everywhere = 0
        urgent = [c for c in self._unsent if c.bucket.index < everywhere]
        if urgent:
            chosen = min(urgent, key=lambda c: (self.priorities[c.bucket.index], c.bucket.index, c.number))
        else:
            chosen = self._unsent[0]
            if chosen.bucket.index >= self.local_ready:
                return False
        self._start(chosen)
        return True

    def _start(self, chunk: Chunk) -> None:
        self._unsent.remove(chunk)
        chunk.started_at = self.clock()
        if np.isnan(chunk.bucket.started_at):
            chunk.bucket.started_at = chunk.started_at
        chunk.request = self.reduction.start(chunk.bucket.buffer[chunk.start:chunk.stop])
        chunk.mark[0] = self.local_ready
        chunk.mark_request = self.comm.iallreduce(chunk.mark, op="min")
        self.started.append(chunk)
        self._inflight.append(chunk)

    def bucket_complete(self, bucket) -> bool:
        return self._left[bucket.index] == 0

    def chunks_of(self, bucket) -> list[Chunk]:
        return self._chunks_of[bucket.index]


class ScheduleThread:
    """A communication thread that owns every MPI call of the schedule (the THREAD progress mode):
    it pumps every ``poll_interval`` seconds while chunks are in flight, and every
    ``urgent_poll_interval`` while the training thread waits, sleeping without the GIL in between.
    With nothing in flight it sleeps until it is nudged (a bucket is ready, the training thread
    waits, a new iteration): a test could find nothing, and each wake-up takes a core from a rank's
    compute and the GIL from its training thread: polling whenever the iteration's exchange was
    unfinished woke it a thousand times an iteration, almost always for nothing.

    It never blocks inside MPI: MPI libraries wait by spinning, and with every core computing (ranks
    share the machine's cores) a spinning thread takes a core from another rank's backprop; not
    blocking cut the thread's CPU time per iteration by a fifth (benchmarks/README.md, "The figures
    behind the solver's, the exchange's and the data's choices")."""

    poll_interval = 0.002
    urgent_poll_interval = 0.0002

    def __init__(self, schedule_source, poll_interval: float | None = None):
        self._source = schedule_source     # () -> the current PrioritySchedule or None
        if poll_interval is not None:
            self.poll_interval = float(poll_interval)
        self._cond = threading.Condition()
        self._waiting = 0
        self._nudges = 0        # counts nudges, so that one made while the thread pumps is not missed
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="netdef-comm", daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        """Something changed (a bucket is ready, a new iteration): look now."""
        with self._cond:
            self._nudges += 1
            self._cond.notify_all()

    def wait_until(self, predicate) -> None:
        """Block the calling (training) thread until ``predicate()`` holds."""
        with self._cond:
            self._waiting += 1
            self._nudges += 1
            self._cond.notify_all()
            try:
                while not predicate() and self.error is None:
                    self._cond.wait(timeout=0.5)
            finally:
                self._waiting -= 1
        if self.error is not None:
            raise RuntimeError(f"the communication thread failed: {self.error}") from self.error

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._stop:
                        return
                    nudges = self._nudges
                schedule = self._source()
                progressed = schedule.pump() if schedule is not None else False
                with self._cond:
                    if progressed:
                        self._cond.notify_all()
                    if self._stop:
                        return
                    if not progressed and nudges == self._nudges:
                        in_flight = schedule is not None and schedule.in_flight
                        self._cond.wait(timeout=None if not in_flight else
                                        self.urgent_poll_interval if self._waiting else self.poll_interval)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            with self._cond:
                self.error = exc
                self._cond.notify_all()


class PriorityTransport:
    """Runs a ``PrioritySchedule`` for the allreduce rule: on the training thread (``pump`` between
    layers and in waits) or on a ``ScheduleThread`` (THREAD progress). ``plan`` once the bucket
    layout is known; per iteration ``begin`` (after the previous exchange is drained), ``ready``
    for each packed bucket, ``wait`` for the buckets the caller needs. Chunks are summed by
    ``reduction`` (default: MPI's Iallreduce)."""

    def __init__(self, comm, mode: str, chunk_bytes: int, credit_bytes: int, clock=time.perf_counter,
                 reduction: Reduction | None = None):
        self.comm = comm
        self.reduction = reduction
        self.mode = mode
        self.chunk_bytes = int(chunk_bytes)
        self.credit_bytes = int(credit_bytes)
        self.clock = clock
        self.schedule: PrioritySchedule | None = None
        self._thread = ScheduleThread(lambda: self.schedule) if mode == "THREAD" else None
        # Only POLL pumps between layers; DEFERRED and MPI_ASYNC leave the link to the starts and the
        # waits (progress.choose_mode has the measurements).
        self.pumps_between_layers = mode == "POLL"

    def plan(self, buckets, priorities) -> None:
        self.schedule = PrioritySchedule(self.comm, buckets, priorities, self.chunk_bytes, self.credit_bytes,
                                         self.clock, self.reduction)

    def begin(self) -> None:
        """Wait for the previous iteration's last marks, then start afresh."""
        schedule = self.schedule
        if schedule is None:
            return
        self._wait_until(lambda: schedule.done)
        schedule.reset()

    def ready(self, bucket) -> None:
        self.schedule.bucket_ready(bucket)
        if self._thread is not None:
            self._thread.nudge()
        else:
            self.schedule.pump()

    def between_layers(self) -> None:
        if self.schedule is not None and not self.schedule.done:
            self.schedule.pump()

    def poll(self) -> None:
        """Note what completed (the communication thread does that by itself)."""
        if self._thread is None:
            self.schedule.pump()

    def complete(self, bucket) -> bool:
        return self.schedule.bucket_complete(bucket)

    def wait(self, buckets) -> None:
        schedule = self.schedule
        self._wait_until(lambda: all(schedule.bucket_complete(b) for b in buckets))

    def _wait_until(self, predicate) -> None:
        if self._thread is not None:
            self._thread.wait_until(predicate)
            return
        while not predicate():
            self.schedule.pump(block=True)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.close()


class LinkMeasurement(NamedTuple):
    """What ``measure_link`` found: a blocking allreduce costs ``latency_s`` plus one second per
    ``bytes_per_s`` bytes of the vector; one chunk's non-blocking allreduce, tested every poll
    interval as the communication thread does, completes after ``polled_s``."""

    latency_s: float
    bytes_per_s: float
    polled_s: float


CHUNK_FLOOR, CHUNK_CEILING = 256 << 10, 8 << 20
CREDIT_CEILING = 16 << 20


def chunk_size(latency_s: float, bytes_per_s: float) -> int:
    """Large enough that a chunk's latency is at most 5% of its transfer (19 latencies' worth of
    bytes), between 256 KiB and 8 MiB, rounded down to a power of two."""
    chunk = int(min(max(19 * latency_s * bytes_per_s, CHUNK_FLOOR), CHUNK_CEILING))
    return 1 << (chunk.bit_length() - 1)


def credit_size(chunk: int, link: LinkMeasurement) -> int:
    """The bytes in flight that keep the link busy: what the link moves while one chunk completes
    when it is only tested now and then (Little's law), plus one chunk for the tests the training
    thread delays; at least two chunks, at most 16 MiB, a whole number of chunks.

    Why the polled time and not the blocking latency: every step of the MPI library's protocol (a
    rendezvous handshake, each round of the allreduce) waits until both ranks next test, so a small
    allreduce that is tested now and then takes many times its blocking latency, and a few chunks in
    flight move only part of what a blocking allreduce moves. With the eager limit netdef sets
    (``communicator.OPEN_MPI_TCP_EAGER``) two chunks move nearly all of it (benchmarks/polled_link.py;
    the figures: benchmarks/README.md, "The figures behind the solver's, the exchange's and the data's
    choices").

    Why no more: the ranks learn that a bucket is ready everywhere from the marks of chunks started
    after it, which queue behind the bytes in flight, and its own chunk queues behind them again;
    the next forward's first layer waits about twice the credit's transfer time at each iteration's
    start."""
    wanted = link.polled_s * link.bytes_per_s + chunk
    chunks = max(2, -(-int(wanted) // chunk))
    return min(chunks * chunk, max(2 * chunk, CREDIT_CEILING // chunk * chunk))


def measure_blocking(comm, clock=time.perf_counter, repeats: int = 5, reduction: Reduction | None = None
                     ) -> tuple[float, float]:
    """(latency_s, bytes_per_s) of this rank's blocking reductions (default: MPI's allreduce) of 64 KiB
    and 1 MiB (a collective call)."""
    reduction = reduction or Reduction(comm)
    small, large = 64 << 10, 1 << 20
    times = {}
    for size in (small, large):
        buffer = reduction.empty(size // 4)
        reduction.run(buffer)  # warm-up
        comm.barrier()
        start = clock()
        for _ in range(repeats):
            reduction.run(buffer)
        times[size] = (clock() - start) / repeats
    per_byte = max((times[large] - times[small]) / (large - small), 1e-12)
    return max(times[small] - small * per_byte, 1e-6), 1.0 / per_byte


def measure_polled(comm, chunk: int, clock=time.perf_counter, sleep=time.sleep, repeats: int = 5,
                   poll_interval: float | None = None, reduction: Reduction | None = None) -> float:
    """The median time this rank sees one ``chunk``-byte non-blocking reduction (default: MPI's
    allreduce) take when it is tested every ``poll_interval`` (the communication thread's); a
    collective call, ``chunk`` the same on every rank."""
    reduction = reduction or Reduction(comm)
    poll_interval = ScheduleThread.poll_interval if poll_interval is None else poll_interval
    buffer = reduction.empty(chunk // 4)
    times = []
    for _ in range(repeats):
        comm.barrier()
        start = clock()
        pending = [reduction.start(buffer)]
        while not comm.test_some(pending):
            sleep(poll_interval)
        times.append(clock() - start)
    return float(np.median(times))


def choose_sizes(comm, clock=time.perf_counter, sleep=time.sleep, repeats: int = 5,
                 reduction: Reduction | None = None) -> tuple[int, int, LinkMeasurement]:
    """(chunk_bytes, credit_bytes, rank 0's measurement), the same on every rank (a collective call),
    measured with the reduction the chunks will use (default: MPI's allreduce)."""
    latency, rate = measure_blocking(comm, clock, repeats, reduction)
    chunk = comm.broadcast_int(chunk_size(latency, rate))
    link = LinkMeasurement(latency, rate, measure_polled(comm, chunk, clock, sleep, repeats, reduction=reduction))
    credit = comm.broadcast_int(credit_size(chunk, link))
    return chunk, credit, link
