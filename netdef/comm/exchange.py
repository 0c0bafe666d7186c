"""Exchange rules: how the ranks' gradients (or parameters) are combined, one small class per rule.

A rule is a ``GradientExchange`` (``netdef/solver/arrival.py``): the solver's updates ask it whether
a parameter's combined gradient has arrived and wait for it (``gradients_ready``, ``backward_done``,
``arrived``, ``wait_for``, ``take_divisor``, ``mixes_after_update``, ``after_update``), and
``DataParallel`` drives the rest of its life (``broadcast_initial``, ``begin_iteration``, ``settle``,
the model for tests and snapshots, its part of the resume state, ``close``). Where each call falls
within an iteration is written once, in ``netdef/solver/parallel.py``. The solver never knows which
rule it has (ChainerMN's communicators are the model: each strategy overrides a few methods).

The base rule answers ``arrived`` and ``wait_for`` by calling ``finish()`` once per iteration (wait
for everything, then every gradient is there), which is all a rule that updates after the whole
exchange needs to override. Rules whose ranks train weights of their own (``trains_own_weights``:
easgd, gossip, hybrid in ``elastic.py`` and ``gossip.py``) derive from ``OwnWeightsRule``
(``own_weights.py``).

Rules register by name (``exchange: "allreduce"`` in NetdefDistributedParameter, ``--exchange``)::

    @register_exchange("myrule")
    class MyRule(ExchangeRule): ...

The built-in rules' modules are imported, so registered, in one place: ``_builtin.py``.

``AllreduceExchange`` ("allreduce") is synchronous data-parallel SGD: every rank applies the same
update from the gradient averaged over all ranks, so the weights stay identical everywhere and equal
those of one process with an N times larger batch. It packs gradients into flat buckets of at most
``bucket_bytes`` (small blobs such as biases share a bucket; a blob larger than that gets its own)
in the order the backward hooks hand them over, which is the same on every rank because backward
order is deterministic, so every rank starts the same buckets in the same order. A fused bucket
does not wait long for the layers below (``buckets.plan_buckets``). With ``overlap`` each bucket's
allreduce starts as soon as its last gradient is packed, during backward; without, the same
buckets start after backward. The progress driver (``progress.py``) makes them move; it is poked
after every layer's backward, layers without parameters included: ``layer_hooks()`` says which of
the net's layer hooks the rule needs, and DataParallel registers them.
A bucket of one blob is exchanged in the blob's own diff memory (no copies); fused buckets are
flat host buffers with copy-in and copy-out (GPU arrays are staged through them too).

How the buckets move is the schedule (``NetdefDistributedParameter.schedule``, ``--schedule``):

- ``priority`` (the default): the priority schedule of ``scheduler.py`` sends first what the next
  forward needs first, splits large buckets into chunks and bounds the bytes in flight (chunk and
  credit sizes measured in ``broadcast_initial`` and logged). ``arrived``/``wait_for`` answer per
  bucket, so the solver updates each blob as its average arrives and the next iteration's forward
  of a layer waits only for that layer's buckets: the exchange overlaps backward and the next
  forward. The previous iteration's exchange is drained when the next one's first gradient comes.
- ``fifo``: buckets go in backward order through a progress driver (``progress.py``), and the
  update waits for all of them (``finish``).

The first iteration learns the bucket layout (the hook order, which layer handed over which
gradients, and the blob sizes) and exchanges after backward; overlap starts with the second
iteration.
"""
from __future__ import annotations

import logging
import time

from .. import backend
from ..registry import Registry, UnknownNameError
from ..solver.arrival import GradientExchange
from .buckets import Bucket, plan_buckets
from .options import ExchangeOptions, check
from .gradient_staging import gradients_for, on_device
from .graph_boundaries import boundaries_by_gradient_bytes
from .device_mpi import DeviceMpiReduction
from .nccl_sum import NcclReduction
from .progress import choose_mode, make_driver, shared_memory_only
from .reduction import Reduction
from .shared_sum import SharedSum
from .scheduler import PriorityTransport, ScheduleThread, choose_sizes
from .timeline import BucketRecord, ChunkRecord, Measurements
from .watchdog import GRADIENT_EXCHANGE

logger = logging.getLogger("netdef")


# ============================================================================================== registry
def _load_builtin_rules() -> None:
    # The other built-in rules' modules import this one; the registry imports them on its first lookup.
    from . import _builtin  # noqa: F401


#: Exchange rule names (``exchange: "fp16"``, ``--exchange``) -> ExchangeRule classes.
EXCHANGE_RULES: Registry[type] = Registry("exchange rule", load=_load_builtin_rules)


def register_exchange(name: str):
    """Class decorator: make an ExchangeRule subclass available as ``exchange: "<name>"``."""

    def add(cls):
        EXCHANGE_RULES.add(name, cls)
        cls.name = name
        return cls

    return add


def exchange_class(name: str) -> type:
    try:
        return EXCHANGE_RULES.get(name)
    except UnknownNameError as error:
        raise ValueError(f"unknown exchange rule {name!r}; registered: {', '.join(error.known)}") from None


def registered_exchanges() -> list[str]:
    return EXCHANGE_RULES.names()


# ============================================================================================== interface
class ExchangeRule(GradientExchange):
    """The base rule: the calls of the module docstring, each a no-op here except
    ``broadcast_initial``, and ``arrived``/``wait_for``, which wait for ``finish()`` once per
    iteration. ``self.comm`` (a Communicator: the ranks whose gradients it combines), ``self.net``
    (the train net), ``self.params`` (its learnable parameter Blobs), ``self.options``
    (ExchangeOptions, checked) and ``self.measurements`` (record the rule's timings in
    ``self.measurements.current``), ``self.seed`` (the run's random seed, the same on every rank, for
    a rule's own random choices).

    ``trains_own_weights``: whether each rank trains weights of its own, which then differ from the
    model that is tested and saved (``model_description`` says what that is, for the log);
    ``progress_mode``: what moves its non-blocking exchanges along (a mode of ``progress.py``; NONE where
    nothing needs to), for the log and the benchmarks."""

    name = ""
    progress_mode = "NONE"
    trains_own_weights = False
    model_description = "the weights (the same on every rank)"

    def __init__(self, comm, net, options: ExchangeOptions | None = None, measurements: Measurements | None = None,
                 clock=time.perf_counter, seed: int = 0):
        self.options = options or ExchangeOptions()
        check(self.options)
        self.comm = self.gradient_communicator(comm)
        self.net = net
        self.params = net.learnable_params
        self.measurements = measurements or Measurements()
        self.clock = clock
        self.seed = int(seed)
        self._finished = True
        self._leave_division = False
        self._undivided: dict[int, int] = {}

    def leave_division_to_update(self) -> None:
        """From now on the rule may leave a diff holding the sum over the ranks, to be divided by
        whoever updates the blob (``take_divisor``) in the same pass as the update: a rule that
        averages in the diff's own memory would otherwise add a pass over it. The solver's seam
        (DataParallel) asks for this; callers that read the diffs directly do not."""
        self._leave_division = True

    def take_divisor(self, param_id: int):
        return self._undivided.pop(param_id, 1)

    def describe(self) -> str:
        """One line for the log."""
        return self.name

    def gradient_communicator(self, comm):
        """The ranks, of all those of ``comm``, whose gradients this rule combines (``self.comm``):
        all of them but under ``hybrid``, whose groups do."""
        return comm

    def trace_to(self, timeline) -> None:
        """Record what the rule does on a GPU's streams in ``timeline`` (its ``device`` spans, when it
        has them); the host's side is recorded from the measurements."""

    def layer_hooks(self) -> dict:
        """The net's layer hooks this rule needs (``Net.register_layer_hooks`` keywords), e.g. to move
        its exchanges along between layers; the caller registers them and removes them at close."""
        return {}

    def run_boundaries(self) -> frozenset[int]:
        """Where the train net's stretches replayed from CUDA graphs must end (``NetHooks.split_runs_at``)
        so that this rule's work between layers still happens part way through a pass; none here: a
        rule that exchanges nothing during backward waits for nothing part way."""
        return frozenset()

    def broadcast_initial(self) -> None:
        """Make every rank's parameters rank 0's."""
        for blob in self.params:
            self.comm.broadcast(blob.data, root=0)

    def begin_iteration(self, iteration: int) -> None:
        self._finished = False

    def arrived(self, param_ids) -> list[int]:
        """Of ``param_ids``, those whose diffs the update may use now."""
        self._finish_once()
        return list(param_ids)

    def wait_for(self, param_ids) -> None:
        """Block until the diffs of ``param_ids`` may be used by the update."""
        self._finish_once()

    def _finish_once(self) -> None:
        if not self._finished:
            self._finished = True
            self.finish()

    def finish(self) -> None:
        """Wait for the whole exchange; the diffs then hold what the update should apply."""

    def settle(self) -> None:
        """Collective: complete whatever is in flight between the ranks (before a snapshot, at the end)."""

    def release(self) -> None:
        """Collective, after the last ``settle`` of a run: free what the ranks hold together (memory
        they all map). ``close`` is local: it also runs when this rank fails."""

    def swap_in_model(self) -> None:
        """Collective: put the model (what is tested and saved) into the net's parameters."""

    def swap_out_model(self) -> None:
        """Local: put this rank's own training weights back."""

    def own_weights(self) -> list:
        """This rank's own training weights, as host arrays by parameter (also while the model is in)."""
        return [backend.to_host(blob.data) for blob in self.params]

    def save_state(self, state) -> None:
        """Add this rule's per-rank resume state to ``state`` (a NetdefRankState)."""

    def restore_state(self, state) -> None:
        """After a restore put the snapshot's model (the ``learned_net``) into the net: take this rank's
        rule state from ``state`` (its NetdefRankState, or None when the snapshot was written by
        another number of ranks or holds none)."""

    def close(self) -> None:
        pass


# ============================================================================================== allreduce
@register_exchange("allreduce")
class AllreduceExchange(ExchangeRule):
    """Synchronous data parallelism: gradients summed over the ranks by allreduce, divided by the
    number of ranks (see the module docstring for buckets and overlap).

    Subclasses change the collective by overriding ``make_reduction``: the drivers and the priority
    schedule start every bucket or chunk through it (``reduction.py``; ``multicolor`` and ``fp16``
    do so), and what is summed by overriding ``pack_bucket``/``unpack_bucket``.
    """

    def __init__(self, comm, net, options=None, measurements=None, clock=time.perf_counter, seed: int = 0):
        super().__init__(comm, net, options, measurements, clock, seed)
        comm = self.comm  # the ranks this rule combines the gradients of
        self.reduction = self.make_reduction() if comm.size > 1 else None
        # How gradients reach the buckets, which the reduction decides: in place on the CPU, through
        # pinned buffers from a GPU, or into device buckets for a GPU collective; asynchronous ones
        # wait in _copying (in order) until their copies are done.
        self.gradients = self.reduction.gradients_for(self.params) if self.reduction else gradients_for(self.params)
        self._copying: list[Bucket] = []
        self.progress_mode = (choose_mode(comm, self.options.progress, cheap_polls=self.reduction.polls_cheaply)
                              if comm.size > 1 else "NONE")
        prioritized = comm.size > 1 and self.options.schedule == "priority"
        self.driver = (make_driver(comm, self.progress_mode, clock, self.reduction)
                       if comm.size > 1 and not prioritized else None)
        # The priority schedule; its chunk and credit sizes are settled in broadcast_initial.
        self.transport = (PriorityTransport(comm, self.progress_mode, self.options.chunk_bytes,
                                            max(self.options.credit_bytes, self.options.chunk_bytes), clock,
                                            self.reduction)
                          if prioritized else None)
        self._record = None                         # the iteration whose buckets are exchanging
        self._fresh = False                         # priority: this iteration's exchange has not begun
        self.buckets: list[Bucket] | None = None   # planned in the first iteration
        self._slot: dict[int, tuple[Bucket, int]] = {}
        self._order: list[int] = []                 # hook order seen while learning the layout
        self._layers: list[list[int]] = []          # ... split by hook call (one per layer)
        self._expected = 0                          # next position in the frozen hook order
        self._hook_order: list[int] = []
        self._active = False
        self._in_flight = 0                         # buckets started during this backward
        self._homed: list[int] = []                 # the params whose diffs live in their buckets

    def describe(self) -> str:
        return f"{self.name} ({self.schedule_text()})"

    def trace_to(self, timeline) -> None:
        self.gradients.trace_to(timeline.device)
        if self.reduction is not None and timeline.device is not None:
            self.reduction.trace_to(timeline.device)

    def schedule_text(self) -> str:
        """How the buckets go, for the log: overlap, bucket size, progress, schedule, chunks."""
        text = (f"overlap {'on' if self.options.overlap else 'off'}, buckets of at most "
                f"{self.options.bucket_bytes} bytes, progress {self.progress_mode}, schedule {self.options.schedule}")
        if self.transport is not None and self.transport.chunk_bytes:
            text += f": chunks of {self.transport.chunk_bytes} bytes, {self.transport.credit_bytes} bytes in flight"
        if self.reduction is not None and self.reduction.named_in_log:
            text += f"; {self.reduction.describe()}"
        return text

    def run_boundaries(self) -> frozenset[int]:
        # Buckets leave as backward goes and the next forward waits layer by layer: stretches of about
        # a bucket's bytes (at most GRAPH_STRETCHES of them) keep both.
        return boundaries_by_gradient_bytes(self.net, self.options.bucket_bytes)

    def layer_hooks(self) -> dict:
        # Between any two layers of backward (those without parameters too), let a polling driver
        # move the started exchanges along ...
        if self.transport is not None and self.transport.pumps_between_layers:
            # ... and, with priorities, between the layers of the next forward, which the exchange overlaps.
            return {"after_forward": self._pump, "after_backward": self._pump}
        if self.driver is not None and self.options.overlap and self.driver.polls_between_layers:
            return {"after_backward": self._after_layer}
        return {}

    def broadcast_initial(self) -> None:
        super().broadcast_initial()
        if self.transport is None or (self.options.chunk_bytes and self.options.credit_bytes):
            return
        chunk, credit = self.options.chunk_bytes, self.options.credit_bytes
        unshared = self.reduction.unshared_link_sizes
        if unshared is not None:
            # Nothing to measure: no link is shared, chunks and credit would only add reductions.
            chunk, credit = chunk or unshared[0], credit or unshared[1]
        if not chunk or not credit:
            measured_chunk, measured_credit, link = choose_sizes(self.comm, self.clock, reduction=self.reduction)
            if self.comm.rank == 0:
                logger.info("Priority schedule: measured allreduce latency %.0f us, %.0f MB/s, %.1f ms for a chunk "
                            "tested every %.0f ms: chunks of %d bytes, at most %d bytes in flight%s",
                            link.latency_s * 1e6, link.bytes_per_s / 1e6, link.polled_s * 1e3,
                            ScheduleThread.poll_interval * 1e3,
                            chunk or measured_chunk, max(credit or measured_credit, chunk or measured_chunk),
                            " (as set)" if chunk or credit else "")
            chunk, credit = chunk or measured_chunk, credit or measured_credit
        self.transport.chunk_bytes, self.transport.credit_bytes = int(chunk), int(max(credit, chunk))
        if self.buckets is not None:
            self.transport.plan(self.buckets, self._priorities())

    # ------------------------------------------------------------------------------ the iteration
    def begin_iteration(self, iteration: int) -> None:
        super().begin_iteration(iteration)
        self._order = []
        self._layers = []
        self._expected = 0
        self._in_flight = 0
        if self.transport is None:
            self._active = self.comm.size > 1
            self._record = self.measurements.current
            if self.buckets is not None:
                for bucket in self.buckets:
                    bucket.reset()
        else:
            # The previous iteration's buckets may still be exchanging (its updates wait for them in
            # this iteration's forward); they are drained when this iteration's first gradient comes.
            self._fresh = self.comm.size > 1

    def _begin_exchange(self) -> None:
        if not self._fresh:
            return
        self._fresh = False
        self.finish()
        self.transport.begin()
        self._active = True
        self._record = self.measurements.current
        if self.buckets is not None:
            for bucket in self.buckets:
                bucket.reset()

    def gradients_ready(self, param_ids) -> None:
        if self.transport is not None:
            self._begin_exchange()
        if not self._active:
            return
        start = self.clock()
        if self.buckets is None:
            self._order.extend(param_ids)
            self._layers.append(list(param_ids))
        else:
            for pid in param_ids:
                self._pack_frozen(pid)
            self._start_copied()
            if self._in_flight and self.driver is not None:
                self.driver.poke()
        self.measurements.current.exchange_call_s += self.clock() - start

    def _pump(self, layer_index: int) -> None:
        start = self.clock()
        self.transport.between_layers()
        if self.measurements.current is not None:
            self.measurements.current.exchange_call_s += self.clock() - start

    def _after_layer(self, layer_index: int) -> None:
        if self._active and self._in_flight:
            start = self.clock()
            self.driver.poke()
            self.measurements.current.exchange_call_s += self.clock() - start

    def _pack_frozen(self, pid: int) -> None:
        if pid not in self._slot:
            return  # an empty blob
        if self._expected >= len(self._hook_order) or self._hook_order[self._expected] != pid:
            expected = self._hook_order[self._expected] if self._expected < len(self._hook_order) else None
            raise RuntimeError(f"gradient of parameter {self.params[pid].name!r} became final out of the order of "
                               f"the first iteration (expected {expected}); the bucket layout must be the same on "
                               f"every rank and iteration")
        self._expected += 1
        bucket, slot = self._slot[pid]
        self.pack_bucket(bucket, slot, self.params[pid].diff)
        if bucket.full:
            bucket.ready_at = self.clock()
            if self.options.overlap:
                self._start(bucket)

    def _start(self, bucket: Bucket) -> None:
        bucket.handed_off = True
        if self.gradients.asynchronous:
            self._copying.append(bucket)
            self._start_copied()
            return
        self._in_flight += 1
        self.start_bucket(bucket)

    def _start_copied(self, wait: bool = False) -> None:
        """Start the buckets whose gradients have reached the host, in order (every rank starts its
        collectives in the same order); with ``wait``, all of them, waiting for each copy."""
        while self._copying and (wait or self.gradients.copied(self._copying[0])):
            bucket = self._copying.pop(0)
            self.gradients.wait_copied(bucket)
            self._in_flight += 1
            self.start_bucket(bucket)

    def backward_done(self) -> None:
        if self.transport is not None:
            self._begin_exchange()
        if not self._active:
            return
        start = self.clock()
        if self.buckets is None:
            self._plan(self._order, self._layers)
            for pid in self._order:
                self._pack_frozen(pid)
        missing = [b for b in self.buckets if not b.full]
        if missing:
            names = [self.params[p].name for b in missing for p in b.param_ids][:5]
            raise RuntimeError(f"backward ended before the gradients of {', '.join(names)} were handed to the "
                               f"exchange")
        for bucket in self.buckets:
            if not bucket.handed_off:
                self._start(bucket)
        self._start_copied(wait=True)
        self.measurements.current.exchange_call_s += self.clock() - start

    def _plan(self, order: list[int], layers: list[list[int]] | None = None) -> None:
        self.buckets = plan_buckets(order, self.params, self.options.bucket_bytes, layers)
        buffers = self.reduction.buffers([(sum(b.sizes), b.dtype) for b in self.buckets])
        if buffers is not None:
            for bucket, buffer in zip(self.buckets, buffers):
                bucket.give_buffer(buffer)
        self._slot = {pid: (b, slot) for b in self.buckets for slot, pid in enumerate(b.param_ids)}
        self._keep_gradients_in_buckets()
        self._hook_order = [pid for pid in order if pid in self._slot]
        if self.transport is not None:
            if not self.transport.chunk_bytes:
                raise RuntimeError("the priority schedule has no chunk size yet: call broadcast_initial() before "
                                   "the first iteration")
            self.transport.plan(self.buckets, self._priorities())

    def _keep_gradients_in_buckets(self) -> None:
        """Move each host parameter's diff into its place in its bucket (``Bucket.home_of``), so that
        backward writes every gradient where it is summed: no copy into the bucket before the exchange
        and none back after it (PyTorch's DDP calls it gradient_as_bucket_view). It matters most for
        the shared-memory sums, whose buckets are memory the ranks map, so that every gradient was
        copied in and out, big ones too (benchmarks/README.md, "Gradients where they are summed").
        A diff another blob shares stays where it is, and is copied as before. A GPU's diffs live in
        device buckets where the reduction sums device memory (NCCL, CUDA-aware MPI), not in the staged
        path's pinned host buffers (``gradient_staging``). (Every bucket holds diffs of its own dtype:
        ``plan_buckets``.)"""
        if not self.gradients.diffs_may_live_in_buckets:
            return
        self._homed = []
        for bucket in self.buckets:
            for slot, pid in enumerate(bucket.param_ids):
                blob = self.params[pid]
                if blob.diff_is_shared:
                    continue
                blob.keep_diff_in(bucket.home_of(slot))
                self._homed.append(pid)

    def _take_gradients_home(self) -> None:
        """Give every diff kept in a bucket memory of its own again (before the reduction frees what
        it gave out), and forget the bucket plan: a later iteration plans it anew."""
        for pid in self._homed:
            blob = self.params[pid]
            blob.keep_diff_in(blob.array_module.empty(blob.shape, dtype=blob.dtype))
        self._homed = []
        self.buckets = None
        self._slot = {}
        self._hook_order = []

    def _priorities(self) -> list[int]:
        """By bucket: the forward position of the first layer that uses one of its parameters."""
        first_use: dict[int, int] = {}
        for li in range(len(self.net.layers)):
            for pid in self.net.layer_learnable_ids(li):
                first_use.setdefault(pid, li)
        return [min(first_use.get(pid, len(self.net.layers)) for pid in b.param_ids) for b in self.buckets]

    def _start_transfer(self, bucket: Bucket) -> None:
        if self.transport is not None:
            self.transport.ready(bucket)
        else:
            self.driver.start(bucket)

    # ------------------------------------------------------------------------------ arrival
    def arrived(self, param_ids) -> list[int]:
        if self.transport is None or not self._active:
            return super().arrived(param_ids)
        start = self.clock()
        self.transport.poll()
        out = []
        for pid in param_ids:
            entry = self._slot.get(pid)
            if entry is None:
                out.append(pid)  # not exchanged (no gradient, or empty)
            elif entry[0].unpacked or self.transport.complete(entry[0]):
                self._unpack(entry[0])
                out.append(pid)
        self._record.exchange_call_s += self.clock() - start
        return out

    def wait_for(self, param_ids) -> None:
        if self.transport is None or not self._active:
            super().wait_for(param_ids)
            return
        buckets = list({id(e[0]): e[0] for e in (self._slot.get(pid) for pid in param_ids)
                        if e is not None and not e[0].unpacked}.values())
        if not buckets:
            return
        start = self.clock()
        with self.comm.watchdog.waiting(GRADIENT_EXCHANGE):
            self.transport.wait(buckets)
        self._record.wait_s += self.clock() - start
        for bucket in buckets:
            self._unpack(bucket)

    def _unpack(self, bucket: Bucket) -> None:
        if bucket.unpacked:
            return
        start = self.clock()
        self.unpack_bucket(bucket)
        bucket.unpacked = True
        record = self._record
        record.buckets.append(BucketRecord(bucket.index, bucket.nbytes, len(bucket.param_ids), bucket.ready_at,
                                           bucket.started_at, bucket.done_at))
        record.bytes += bucket.nbytes
        if self.transport is not None:
            schedule = self.transport.schedule
            for chunk in schedule.chunks_of(bucket):
                record.chunks.append(ChunkRecord(bucket.index, chunk.number, chunk.nbytes, chunk.started_at,
                                                 chunk.done_at, schedule.priorities[bucket.index]))
        record.unpack_s += self.clock() - start

    def finish(self) -> None:
        """Wait for the whole exchange and average every bucket into the diffs."""
        if not self._active:
            return
        start = self.clock()
        with self.comm.watchdog.waiting(GRADIENT_EXCHANGE):
            if self.transport is not None:
                self.transport.wait(self.buckets)
            else:
                self.driver.wait_all()
        self._record.wait_s += self.clock() - start
        for bucket in self.buckets:
            self._unpack(bucket)
        self._active = False
        self._in_flight = 0

    def close(self) -> None:
        # The reduction first: aborting NCCL's communicator ends the collectives the threads below may
        # be waiting on, where a failed peer never joins them.
        if self.reduction is not None:
            self.reduction.close()
        if self.driver is not None:
            self.driver.close()
        if self.transport is not None:
            self.transport.close()

    def release(self) -> None:
        self._take_gradients_home()
        if self.reduction is not None:
            self.reduction.release()

    # ------------------------------------------------------------------------------ overridable steps
    def make_reduction(self) -> Reduction:
        """The algorithm that sums a bucket or chunk over the ranks (built once, with two ranks or
        more): NCCL on the device where the gradients are on a GPU and ``exchange_via`` is nccl
        (``DataParallel`` resolves auto to it where every rank can use NCCL: ``nccl.nccl_choice``), else
        there MPI on device memory where the library takes it (``device_mpi.py``; else the staged path); in
        memory the ranks share where every rank runs on this machine and the gradients are host arrays
        (``shared_sum.py``; ``exchange_via: mpi`` declines it); else MPI's allreduce."""
        via = self.options.exchange_via
        gpu = on_device(self.params)
        if gpu and via == "nccl":
            return NcclReduction(self.comm)
        if gpu and via in ("auto", "mpi") and self.comm.device_buffers:
            return DeviceMpiReduction(self.comm)
        shared = shared_memory_only(self.comm) and not gpu
        if via == "shared_memory" and not shared:
            raise ValueError("netdef_distributed.exchange_via is shared_memory, but "
                             + ("the gradients are on a GPU (use nccl or mpi)" if gpu else
                                f"the ranks do not all share this machine's memory ({self.comm.local_size} of the "
                                f"{self.comm.size} reach this rank's; MPIR_CVAR_NOLOCAL=1, or Open MPI's btl without "
                                f"vader or sm, keeps them apart too)"))
        if shared and via in ("auto", "shared_memory"):
            return SharedSum(self.comm)
        return Reduction(self.comm)

    def pack_bucket(self, bucket: Bucket, slot: int, diff) -> None:
        """Copy one gradient into its place in the bucket (from a GPU: start copying it)."""
        self.gradients.pack(bucket, slot, diff)

    def start_bucket(self, bucket: Bucket) -> None:
        """Hand a full bucket to the progress driver or the priority schedule (sum over the ranks,
        in place)."""
        self._start_transfer(bucket)

    def unpack_bucket(self, bucket: Bucket) -> None:
        """Average the summed bucket and copy it back into the diffs (or, see
        ``leave_division_to_update``, leave an in-place sum to the update)."""
        for slot, pid in enumerate(bucket.param_ids):
            if self.gradients.unpack(bucket, slot, self.params[pid].diff, self.comm.size, self._leave_division):
                self._undivided[pid] = self.comm.size
