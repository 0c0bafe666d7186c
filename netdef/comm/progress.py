"""Progress drivers: who makes a started non-blocking exchange actually move.

An MPI library advances a non-blocking collective (``Iallreduce``) only while some thread is inside
one of its calls, unless it runs a progress thread of its own. Backprop is NumPy code that never
calls MPI, so without a driver the exchange started after the top layer mostly happens in the
final wait, and nothing overlaps. The drivers, one per ``NetdefDistributedParameter.ProgressMode``:

- ``POLL``: the training thread starts each bucket with ``Iallreduce`` and calls ``Testsome`` on
  the outstanding ones after every layer's backward, layers without parameters included (the
  exchange rule's layer hook calls ``poke()``). No extra thread; progress happens only between
  layers, so a long layer stalls the exchange.
- ``THREAD``: one communication thread owns every MPI call of the exchange: it starts the buckets
  handed to it and tests them every ``poll_interval`` seconds while any is in flight, sleeping
  (without the GIL) in between; NumPy's BLAS and element-wise kernels release the GIL, so backprop
  runs meanwhile. Once the training thread waits before the update, the thread blocks inside MPI
  instead. It needs MPI_THREAD_MULTIPLE or SERIALIZED (mpi4py asks for MULTIPLE).
- ``MPI_ASYNC``: ``Iallreduce`` and no polling: MPICH's own progress thread
  (``MPIR_CVAR_ASYNC_PROGRESS=1``, set before MPI starts) moves the exchange. That thread spins,
  so it needs a spare core per rank. With a library other than MPICH it degrades to POLL.
- ``AUTO``: over a network THREAD; between ranks that share memory ``DEFERRED`` (netdef's own, not
  in the enum): the buckets are started as they fill, with no MPI call during backward, and the
  wait before the update does the work (``choose_mode`` has the measurements behind it).

Each driver records, per bucket, when it started (``started_at``) and when its completion was
first seen (``done_at``).
"""
from __future__ import annotations

import os
import queue
import threading
import time

from ..proto import netdef_pb2 as pb
from ..registry import Registry
from .communicator import ASYNC_PROGRESS_VARIABLE, CommunicatorError
from .reduction import Reduction

#: The modes a user chooses from, as the schema names them: "AUTO", "POLL", "THREAD", "MPI_ASYNC".
MODES = tuple(pb.NetdefDistributedParameter.ProgressMode.keys())


def mode_name(mode) -> str:
    """'AUTO'... from a ProgressMode number or a (case-insensitive) name."""
    if isinstance(mode, int):
        return pb.NetdefDistributedParameter.ProgressMode.Name(mode)
    name = str(mode).strip().upper().replace("-", "_")
    if name not in MODES:
        raise ValueError(f"unknown progress mode {mode!r}; use one of {', '.join(m.lower() for m in MODES)}")
    return name


def shared_memory_only(comm, environ=None) -> bool:
    """True when every rank runs on this machine (``comm.local_size == comm.size``) and nothing in
    the environment keeps the MPI library from using shared memory between them: Open MPI's
    ``OMPI_MCA_btl`` (``mpiexec --mca btl ...``) without ``sm``/``vader`` or excluding them, MPICH's
    ``MPIR_CVAR_NOLOCAL=1``."""
    env = os.environ if environ is None else environ
    if comm.local_size != comm.size:
        return False
    btl = env.get("OMPI_MCA_btl", "").strip()
    if btl:
        excluded = btl.startswith("^")
        names = {n.strip() for n in btl.lstrip("^").split(",")}
        if bool(names & {"sm", "vader"}) == excluded:
            return False
    return env.get("MPIR_CVAR_NOLOCAL", "0").strip() in ("", "0")


_THREAD_SERIALIZED = 2  # MPI_THREAD_SERIALIZED in MPICH and Open MPI


def choose_mode(comm, requested: str = "AUTO", environ=None, cheap_polls: bool = False) -> str:
    """The driver to use: ``requested``, with AUTO resolved and MPI_ASYNC checked.

    AUTO is DEFERRED when the ranks exchange through shared memory (``shared_memory_only``), THREAD
    when they exchange over a network (and the library gives a thread level of at least
    SERIALIZED; else POLL). Why, as ``benchmarks/overlap.py`` measured it (the figures:
    benchmarks/README.md, "The figures behind the solver's, the exchange's and the data's choices"):

    - Shared memory: the exchange is a short run of copies by the same cores that compute. Moving it
      into backward costs backprop more than it saves (caches, memory bandwidth): POLL and THREAD
      are no faster than exchanging after backward, DEFERRED is as exchanging after backward, and
      MPI_ASYNC is far slower (MPICH's progress thread spins on a core backprop needs).
    - A slow network (TCP at 1 Gbit/s): the exchange waits on the link. THREAD hides nearly all of
      it behind backward; POLL, which moves the exchange only between layers, hides less.
    - A fast network (TCP at 10 Gbit/s): the exchange is mostly CPU time on a machine without a spare
      core; THREAD hides the wait, backprop grows by about as much: every mode is within noise.

    With ``cheap_polls`` (the exchange sums through a reduction whose tests read memory rather than
    enter the MPI library: ``shared_sum.py``) AUTO is POLL: a bucket is summed between the layers of
    backward as soon as every rank has it.

    MPI_ASYNC falls back to POLL when the library is not MPICH or its progress thread is not on
    (``MPIR_CVAR_ASYNC_PROGRESS`` must be set before MPI starts; ``create_communicator`` does it).
    """
    env = os.environ if environ is None else environ
    requested = mode_name(requested)
    if requested == "MPI_ASYNC":
        if comm.library != "MPICH" or env.get(ASYNC_PROGRESS_VARIABLE, "0") in ("", "0"):
            return "POLL"
        return "MPI_ASYNC"
    if requested == "AUTO":
        if cheap_polls:
            return "POLL"
        if shared_memory_only(comm, env):
            return "DEFERRED"
        return "THREAD" if comm.thread_level >= _THREAD_SERIALIZED else "POLL"
    return requested


class ProgressDriver:
    """Starts bucket exchanges and sees them through. A bucket has ``buffer`` (a NumPy array summed
    in place over the ranks by ``reduction``, by default MPI's Iallreduce), ``started_at`` and
    ``done_at``. ``polls_between_layers``: whether ``poke()`` does anything, so that the exchange rule
    calls it after every layer's backward."""

    mode = "NONE"
    polls_between_layers = False

    def __init__(self, comm, clock=time.perf_counter, reduction: Reduction | None = None):
        self.comm = comm
        self.clock = clock
        self.reduction = reduction or Reduction(comm)

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
    polls_between_layers = True

    def __init__(self, comm, clock=time.perf_counter, reduction: Reduction | None = None):
        super().__init__(comm, clock, reduction)
        self._buckets: list = []
        self._requests: list = []

    def start(self, bucket) -> None:
        bucket.started_at = self.clock()
        self._requests.append(self.reduction.start(bucket.buffer))
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


class DeferredDriver(PollDriver):
    """Iallreduce as each bucket fills, then no MPI call until the final wait, which does the work."""

    mode = "DEFERRED"
    polls_between_layers = False

    def poke(self) -> None:
        pass


class MPIAsyncDriver(DeferredDriver):
    """Iallreduce, then nothing until the final wait: the MPI library's progress thread works."""

    mode = "MPI_ASYNC"


_STOP = object()
_URGENT = object()


class ThreadDriver(ProgressDriver):
    """One communication thread owns the exchange's MPI calls (see the module docstring).

    Two phases per iteration. While backward runs, the thread tests the buckets in flight every
    ``poll_interval`` seconds and sleeps in between: each wake-up takes a core from backprop, and
    on a machine whose cores all compute that costs more than the exchange gains from polls more
    frequent than the network needs. Once the training thread waits (``wait_all``), nothing else
    wants the core: the thread then blocks inside MPI on the oldest bucket (no sleeping, no GIL),
    so the last buckets, started when backward ended, complete as fast as the library can move them.
    """

    mode = "THREAD"
    poll_interval = 0.002

    def __init__(self, comm, clock=time.perf_counter, poll_interval: float | None = None,
                 reduction: Reduction | None = None):
        super().__init__(comm, clock, reduction)
        if poll_interval is not None:
            self.poll_interval = float(poll_interval)
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
            if self._completed >= self._started or self._error is not None:
                self._check()
                return
        self._queue.put(_URGENT)
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
        urgent = False

        def completed(indices) -> None:
            nonlocal buckets, requests
            now = self.clock()
            for i in indices:
                buckets[i].done_at = now
            keep = [i for i, r in enumerate(requests) if r is not None]
            buckets = [buckets[i] for i in keep]
            requests = [requests[i] for i in keep]
            with self._cond:
                self._completed += len(indices)
                self._cond.notify_all()

        try:
            while True:
                try:
                    if not requests:
                        item = self._queue.get()
                    elif urgent:
                        item = self._queue.get_nowait()
                    else:
                        item = self._queue.get(timeout=self.poll_interval)
                except queue.Empty:
                    item = None
                while item is not None:
                    if item is _STOP:
                        # After wait_all nothing is in flight; after a failure on this rank, the job is
                        # being aborted and waiting for the others could block forever.
                        return
                    if item is _URGENT:
                        urgent = True
                    else:
                        item.started_at = self.clock()
                        requests.append(self.reduction.start(item.buffer))
                        buckets.append(item)
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        item = None
                if requests and urgent:
                    # The training thread waits: block on the oldest (they complete in start order).
                    oldest = [requests[0]]
                    self.comm.wait_all(oldest)
                    requests[0] = None
                    done = [0] + self.comm.test_some(requests)
                    completed(done)
                elif requests:
                    done = self.comm.test_some(requests)
                    if done:
                        completed(done)
                if not requests:
                    urgent = False  # the next iteration's backward starts with sleeping polls
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            with self._cond:
                self._error = exc
                self._cond.notify_all()


#: A resolved mode (every one of MODES but AUTO, and DEFERRED) -> its driver class.
DRIVERS: Registry[type] = Registry("progress driver", {
    "POLL": PollDriver, "THREAD": ThreadDriver, "MPI_ASYNC": MPIAsyncDriver, "DEFERRED": DeferredDriver})


def make_driver(comm, mode: str, clock=time.perf_counter, reduction: Reduction | None = None) -> ProgressDriver:
    """The driver for a resolved mode (see ``choose_mode``; DEFERRED is one too), starting buckets
    through ``reduction`` (default: MPI's Iallreduce)."""
    name = str(mode).strip().upper()
    return DRIVERS.get(name if name == "DEFERRED" else mode_name(mode))(comm, clock, reduction=reduction)
