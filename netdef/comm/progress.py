"""Progress drivers: who makes a started non-blocking exchange actually move.

An MPI library advances a non-blocking collective (``Iallreduce``) only while some thread is inside
one of its calls, unless it runs a progress thread of its own. Backprop is NumPy code that never
calls MPI, so without a driver the exchange started after the top layer mostly happens in the
final wait, and nothing overlaps. The drivers, one per ``NetdefDistributedParameter.ProgressMode``:

- ``POLL``: the training thread starts each bucket with ``Iallreduce`` and calls ``Testsome`` on
  the outstanding ones after every layer's backward (the exchange rule's hook calls ``poke()``).
  No extra thread; progress happens only between layers, so a long layer stalls the exchange.
- ``THREAD``: one communication thread owns every MPI call of the exchange: it starts the buckets
  handed to it and tests them every ``poll_interval`` seconds while any is in flight, sleeping
  (without the GIL) in between; NumPy's BLAS and element-wise kernels release the GIL, so backprop
  runs meanwhile. It needs MPI_THREAD_MULTIPLE or SERIALIZED (mpi4py asks for MULTIPLE).
- ``MPI_ASYNC``: ``Iallreduce`` and no polling: MPICH's own progress thread
  (``MPIR_CVAR_ASYNC_PROGRESS=1``, set before MPI starts) moves the exchange. That thread spins,
  so it needs a spare core per rank. With a library other than MPICH it degrades to POLL.
- ``AUTO``: POLL, the best measured so far (``choose_mode`` has the figures).

Each driver records, per bucket, when it started (``started_at``) and when its completion was
first seen (``done_at``).
"""
from __future__ import annotations

import os
import queue
import threading
import time

from ..proto import netdef_pb2 as pb
from .communicator import ASYNC_PROGRESS_VARIABLE, CommunicatorError

MODES = ("AUTO", "POLL", "THREAD", "MPI_ASYNC")


def mode_name(mode) -> str:
    """'AUTO'... from a ProgressMode number or a (case-insensitive) name."""
    if isinstance(mode, int):
        return pb.NetdefDistributedParameter.ProgressMode.Name(mode)
    name = str(mode).strip().upper().replace("-", "_")
    if name not in MODES:
        raise ValueError(f"unknown progress mode {mode!r}; use one of {', '.join(m.lower() for m in MODES)}")
    return name


def choose_mode(comm, requested: str = "AUTO") -> str:
    """The driver to use: ``requested``, with AUTO resolved and MPI_ASYNC checked.

    AUTO is POLL. Measured on a 2-core machine, 2 ranks over shared memory (mpich wheel), a 10-layer
    MLP of 1024x1024 InnerProducts (42 MB of gradients, batch 64, one BLAS thread per rank), ms per
    iteration: overlap off 125, POLL 120, THREAD 144, MPI_ASYNC 250 (its spinning thread halves the
    compute speed). Over an emulated 1 Gbit/s link (EMULATED-NETWORK.md's probe), per-layer polling
    hid 57% of the exchange and a communication thread 35%. POLL also needs no thread support from
    the MPI library. THREAD should pay where cores are idle during backprop (GPU training, spare
    cores per rank): ``benchmarks/overlap.py`` is where AUTO gets refined.

    MPI_ASYNC falls back to POLL when the library is not MPICH or its progress thread is not on
    (``MPIR_CVAR_ASYNC_PROGRESS`` must be set before MPI starts; ``create_communicator`` does it).
    """
    requested = mode_name(requested)
    if requested == "MPI_ASYNC":
        if getattr(comm, "library", "") != "MPICH" or os.environ.get(ASYNC_PROGRESS_VARIABLE, "0") in ("", "0"):
            return "POLL"
        return "MPI_ASYNC"
    if requested == "AUTO":
        return "POLL"
    return requested


class ProgressDriver:
    """Starts bucket exchanges and sees them through. A bucket has ``buffer`` (a NumPy array summed
    in place over the ranks), ``started_at`` and ``done_at``."""

    mode = "NONE"

    def __init__(self, comm, clock=time.perf_counter):
        self.comm = comm
        self.clock = clock

    def start(self, bucket) -> None:
        raise NotImplementedError

    def poke(self) -> None:
        """Called on the training thread between layers during backward."""

    def wait_all(self) -> None:
        """Block until every started bucket has completed."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources (after ``wait_all``)."""


class PollDriver(ProgressDriver):
    """Iallreduce on the training thread; ``Testsome`` between layers; ``Wait`` in order at the end."""

    mode = "POLL"

    def __init__(self, comm, clock=time.perf_counter):
        super().__init__(comm, clock)
        self._buckets: list = []
        self._requests: list = []

    def start(self, bucket) -> None:
        bucket.started_at = self.clock()
        self._requests.append(self.comm.iallreduce(bucket.buffer))
        self._buckets.append(bucket)

    def poke(self) -> None:
        if self._requests:
            done = self.comm.test_some(self._requests)
            if done:
                now = self.clock()
                for i in done:
                    self._buckets[i].done_at = now
                self._compact()

    def _compact(self) -> None:
        keep = [i for i, r in enumerate(self._requests) if r is not None]
        self._buckets = [self._buckets[i] for i in keep]
        self._requests = [self._requests[i] for i in keep]

    def wait_all(self) -> None:
        # One at a time, in start order (the order they complete in), to time each completion.
        for bucket, request in zip(self._buckets, self._requests):
            self.comm.wait_all([request])
            bucket.done_at = self.clock()
        self._buckets, self._requests = [], []


class MPIAsyncDriver(PollDriver):
    """Iallreduce, then nothing until the final wait: the MPI library's progress thread works."""

    mode = "MPI_ASYNC"

    def poke(self) -> None:
        pass


_STOP = object()


class ThreadDriver(ProgressDriver):
    """One communication thread owns the exchange's MPI calls (see the module docstring)."""

    mode = "THREAD"
    poll_interval = 0.0002

    def __init__(self, comm, clock=time.perf_counter):
        super().__init__(comm, clock)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._started = 0
        self._completed = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="netdef-comm", daemon=True)
        self._thread.start()

    def start(self, bucket) -> None:
        self._check()
        with self._cond:
            self._started += 1
        self._queue.put(bucket)

    def poke(self) -> None:
        self._check()

    def _check(self) -> None:
        if self._error is not None:
            raise CommunicatorError(f"the communication thread failed: {self._error}") from self._error

    def wait_all(self) -> None:
        with self._cond:
            while self._completed < self._started and self._error is None:
                self._cond.wait(timeout=1.0)
        self._check()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout=5)

    def _run(self) -> None:
        buckets: list = []
        requests: list = []
        try:
            while True:
                try:
                    item = self._queue.get(timeout=self.poll_interval) if requests else self._queue.get()
                except queue.Empty:
                    item = None
                while item is not None:
                    if item is _STOP:
                        # After wait_all nothing is in flight; after a failure on this rank, the job is
                        # being aborted and waiting for the others could block forever.
                        return
                    item.started_at = self.clock()
                    requests.append(self.comm.iallreduce(item.buffer))
                    buckets.append(item)
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        item = None
                if requests:
                    done = self.comm.test_some(requests)
                    if done:
                        now = self.clock()
                        for i in done:
                            buckets[i].done_at = now
                        keep = [i for i, r in enumerate(requests) if r is not None]
                        buckets = [buckets[i] for i in keep]
                        requests = [requests[i] for i in keep]
                        with self._cond:
                            self._completed += len(done)
                            self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            with self._cond:
                self._error = exc
                self._cond.notify_all()


DRIVERS = {"POLL": PollDriver, "THREAD": ThreadDriver, "MPI_ASYNC": MPIAsyncDriver}


def make_driver(comm, mode: str, clock=time.perf_counter) -> ProgressDriver:
    """The driver for a resolved mode (see ``choose_mode``)."""
    return DRIVERS[mode_name(mode)](comm, clock)
