"""One rank's synchronous data-parallel iterations, simulated as the solver and its exchange run them.

The training thread (one rank; every rank is alike in a synchronous rule):

- forward, layer by layer in definition order; before a layer's forward, the previous iteration's
  updates of that layer's parameters that are still waiting for their averaged gradient wait for
  it and are applied (solver.py ``_before_forward``);
- backward in reverse; after each layer the gradients that are final there go to their buckets
  (``buckets.plan_buckets``, the solver's own bucket plan, on the same hook order), and a full
  bucket is handed to the schedule (with overlap; without, every bucket when backward ends). The
  first gradient of an iteration first drains the previous iteration's exchange;
- the update: each blob whose gradient has arrived is updated now, the rest when the next forward
  needs them (``priority``); with ``fifo`` the update waits for the whole exchange.

The link (``Link``) is what the MPI library does with the collectives started on it: each occupies
the network for its ``transfer_s`` one after the other, and completes ``latency_s`` after its
transfer (collectives in flight together overlap their latency, not their bytes).

``priority`` follows ``scheduler.PrioritySchedule``: buckets split into chunks of ``chunk_bytes``, at
most ``credit_bytes`` in flight, and the next chunk is the most urgent (forward position) of the
buckets that every rank is known to have ready, which a rank learns from the marks of the chunks
started after the bucket became ready; else the next in backward order once ready. ``fifo`` starts
whole buckets in backward order.

The exchange's own CPU work (copies, the reduction, the TCP stack: ``exchange_cpu_s_per_byte`` of
the rank's gradient bytes) takes cores from compute where none is spare: a layer that computes while
the link is busy takes longer by that work's share of the overlap (while the training thread waits,
the work is free). On a GPU or with a spare core it is 0.

Who moves the exchange (``Progress``, after progress.py's drivers):

- ``thread``: the communication thread (``scheduler.ScheduleThread``) tests the collectives in flight
  every poll interval, and every urgent interval while the training thread waits. An MPI library
  advances a non-blocking collective only inside such a test: the first test sends the first
  round's messages and each later one the next round's, so a collective of ``rounds`` rounds
  completes no sooner than ``(rounds + 1)`` tests after it starts (``Progress.polls``): 2 ranks, one
  round: two poll intervals, however small the collective (a measurement agrees, benchmarks/README.md,
  "The figures behind the solver's, the exchange's and the data's choices"). Decisions of the
  schedule wait for the same tests. Where that time was measured (``ScheduleOptions.polled_s``:
  benchmarks/scaling_model.py measures a polled tiny allreduce), the measurement replaces the
  rounds + 1 polls: over Open MPI's TCP each round's send and receive wait for a test on both ranks,
  whose polls are out of phase, so a collective takes longer than rounds + 1 polls (same section).
- ``deferred``: no MPI call during compute (the DEFERRED driver the solver picks between ranks that
  share memory): what was started moves only while the training thread blocks in MPI, at the
  iteration's end or in a wait before a layer; while it computes, the collectives in flight and
  the link stand still.

The iteration boundary (``boundary_s``): the solver agrees on stop and snapshot requests with a
blocking allreduce of two integers after every iteration (``Solver.take_requests``); every rank
waits there for the slowest, which on a machine whose cores are all busy, or with stragglers, costs
more than the collective's latency (``rules.RuleOptions.sync_s``, measured).

Not modelled: jitter between the ranks other than through ``boundary_s`` (every rank computes alike).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..comm.buckets import plan_buckets
from ..comm.options import DEFAULT_BUCKET_BYTES
from ..comm.scheduler import ScheduleThread
from .profile import Profile


@dataclasses.dataclass(frozen=True)
class ScheduleOptions:
    """The exchange settings the simulation follows (``ExchangeOptions``' fields that matter)."""

    schedule: str = "priority"
    overlap: bool = True
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    chunk_bytes: int = 0          # 0: scheduler.chunk_size of the network, as the solver measures it
    credit_bytes: int = 0         # 0: scheduler.credit_size
    progress: str = "thread"      # or "deferred" (module docstring)
    poll_s: float = ScheduleThread.poll_interval   # the communication thread's; 0: nothing polls (NCCL)
    polled_s: float = 0.0         # measured: a tiny collective tested every poll_s; 0: (rounds + 1) polls

    @property
    def urgent_poll_s(self) -> float:
        """The thread's interval while the training thread waits, in the solver's proportion."""
        return self.poll_s * ScheduleThread.urgent_poll_interval / ScheduleThread.poll_interval


@dataclasses.dataclass(frozen=True)
class Progress:
    """What drives the exchange (module docstring): ``mode`` "thread" or "deferred"; with a thread,
    the least time a collective in flight takes: ``polled_s`` while the training thread computes
    (its tests every poll interval), ``urgent_polled_s`` once it waits (tests every urgent interval).
    The default (0, 0) is a thread that never delays anything: MPI's own progress, NCCL."""

    mode: str = "thread"
    polled_s: float = 0.0
    urgent_polled_s: float = 0.0

    @classmethod
    def polling(cls, poll_s: float, urgent_poll_s: float, rounds: int) -> "Progress":
        """A communication thread testing every ``poll_s`` (``urgent_poll_s`` while the training thread
        waits), for collectives of ``rounds`` rounds: ``polls(rounds)`` tests each."""
        return cls("thread", cls.polls(rounds) * poll_s, cls.polls(rounds) * urgent_poll_s)

    @classmethod
    def measured(cls, polled_s: float, poll_s: float, urgent_poll_s: float) -> "Progress":
        """A communication thread whose tiny collective, tested every ``poll_s``, was measured to take
        ``polled_s``; once the training thread waits, the tests come ``poll_s / urgent_poll_s`` times
        as often and the collective takes that much less."""
        return cls("thread", polled_s, polled_s * urgent_poll_s / poll_s if poll_s > 0 else polled_s)

    @staticmethod
    def polls(rounds: int) -> int:
        """Tests a non-blocking collective of ``rounds`` rounds needs: one to send each round's
        messages, one to see the last round's arrive."""
        return rounds + 1 if rounds > 0 else 0


@dataclasses.dataclass(frozen=True)
class IterationTimes:
    iteration_s: float
    compute_s: float

    @property
    def exposed_s(self) -> float:
        return max(0.0, self.iteration_s - self.compute_s)


class _ParamShape:
    """What ``plan_buckets`` reads of a parameter (its diff's size, dtype and shape), without memory."""

    def __init__(self, nbytes: int):
        count = max(0, int(nbytes) // 4)
        self.diff = np.broadcast_to(np.zeros((), np.float32), (count,))
        self.shape = (count,)


class Link:
    """The network as the collectives of one rank see it (module docstring)."""

    def __init__(self):
        self.free_at = 0.0
        self._busy: list[tuple[float, float, float]] = []   # (begin, end, CPU seconds of the work)

    def start(self, at: float, cost, cpu_s: float = 0.0) -> float:
        """Start a collective at ``at`` that costs the rank ``cpu_s`` of CPU; returns when it completes."""
        begin = max(at, self.free_at)
        self.free_at = begin + cost.transfer_s
        if cpu_s:
            self._busy.append((begin, self.free_at, cpu_s))
        return self.free_at + cost.latency_s

    def pause(self, at: float, seconds: float) -> None:
        """Nothing moves for ``seconds`` from ``at`` (deferred progress while the training thread computes)."""
        if self.free_at > at:
            self.free_at += seconds

    def compute(self, at: float, seconds: float) -> float:
        """When ``seconds`` of compute started at ``at`` end, slowed by the exchange's CPU work
        that runs meanwhile (as far as it is known: what has started)."""
        end = at + seconds
        extra = 0.0
        for begin, stop, cpu_s in self._busy:
            overlap = min(end, stop) - max(at, begin)
            if overlap > 0:
                extra += cpu_s * overlap / max(stop - begin, 1e-12)
        self._busy = [b for b in self._busy if b[1] > at]
        return end + extra


class _Chunk:
    __slots__ = ("bucket", "nbytes", "started", "arrived", "done", "mark")

    def __init__(self, bucket: int, nbytes: int):
        self.bucket, self.nbytes = bucket, nbytes
        self.started = self.arrived = self.done = None   # arrived: over the link; done: seen by a test
        self.mark = 0

    def seen(self, progress: Progress, waiting_from: float | None) -> float:
        """When the rank knows this chunk complete: at the communication thread's tests, which come
        every urgent interval once the training thread waits (from ``waiting_from``)."""
        if waiting_from is None:
            return self.done
        urgent = max(self.arrived, max(waiting_from, self.started) + progress.urgent_polled_s)
        return min(self.done, urgent)


class _Exchange:
    """One iteration's exchange on the link: buckets become ready at given times, chunks start by
    the rule of ``schedule``; ``complete(b)`` is when bucket b has arrived."""

    def __init__(self, buckets, priorities, cost_of, link: Link, options: ScheduleOptions, chunk: int, credit: int,
                 cpu_s_per_byte: float = 0.0, progress: Progress = Progress()):
        self.cost_of, self.link, self.cpu_s_per_byte = cost_of, link, cpu_s_per_byte
        self.progress = progress
        self.priority = options.schedule == "priority"
        self.sizes = [b.nbytes for b in buckets]
        self.priorities = priorities
        self.ready_at: list[float | None] = [None] * len(buckets)
        self.chunk, self.credit = chunk, credit
        self.chunks: list[_Chunk] = []
        self.of_bucket: list[list[_Chunk]] = []
        for index, size in enumerate(self.sizes):
            pieces = ([_Chunk(index, min(chunk, size - start)) for start in range(0, size, chunk)]
                      if self.priority else [_Chunk(index, size)])
            self.of_bucket.append(pieces)
            self.chunks.extend(pieces)
        self.unsent = list(self.chunks)
        self.started: list[_Chunk] = []
        self.now = 0.0

    def ready(self, bucket: int, at: float) -> None:
        self.ready_at[bucket] = at
        self.advance(at)

    def complete(self, bucket: int, waiting_from: float | None = None) -> float:
        """When ``bucket`` has arrived (simulating the link until then), for a training thread that
        waits for it from ``waiting_from`` (None: that only looks)."""
        while any(c.done is None for c in self.of_bucket[bucket]):
            if not self._step(float("inf")):
                raise RuntimeError(f"bucket {bucket} can never complete: a bucket before it was never made ready")
        return max(c.seen(self.progress, waiting_from) for c in self.of_bucket[bucket])

    def all_complete(self, waiting_from: float | None = None) -> float:
        return max((self.complete(b, waiting_from) for b in range(len(self.sizes))), default=self.now)

    def pause(self, at: float, seconds: float) -> None:
        """Deferred progress: the chunks still in flight at ``at`` arrive ``seconds`` later."""
        for chunk in self.started:
            if chunk.arrived > at:
                chunk.arrived += seconds
                chunk.done += seconds

    # ------------------------------------------------------------------------------ the schedule
    def advance(self, until: float) -> None:
        """Start every chunk the schedule starts by ``until``."""
        while self._step(until):
            pass

    def _step(self, until: float) -> bool:
        """Start the next chunk if it may start by ``until``; False when nothing more can start then."""
        if not self.unsent:
            return False
        at, chosen = self._next(until)
        if chosen is None:
            return False
        self.now = max(self.now, at)
        self.unsent.remove(chosen)
        chosen.started = self.now
        chosen.mark = sum(1 for r in self.ready_at if r is not None and r <= self.now)
        chosen.arrived = self.link.start(self.now, self.cost_of(chosen.nbytes), chosen.nbytes * self.cpu_s_per_byte)
        chosen.done = max(chosen.arrived, self.now + self.progress.polled_s)
        self.started.append(chosen)
        return True

    def _next(self, until: float):
        if not self.priority:
            first = self.unsent[0]
            ready = self.ready_at[first.bucket]
            return (ready, first) if ready is not None and ready <= until else (None, None)
        # The decision waits for the acknowledged prefix (scheduler.PrioritySchedule._acknowledged).
        room, count, in_flight = self.credit - self.chunk, len(self.started), 0
        while count > 0 and in_flight + self.started[count - 1].nbytes <= room:
            count -= 1
            in_flight += self.started[count].nbytes
        at, everywhere = self.now, 0
        if count:
            at = max(at, max(c.done for c in self.started[:count]))
            everywhere = self.started[count - 1].mark
        if at > until:
            return None, None
        urgent = [c for c in self.unsent if c.bucket < everywhere]
        if urgent:
            return at, min(urgent, key=lambda c: (self.priorities[c.bucket], c.bucket))
        first = self.unsent[0]
        ready = self.ready_at[first.bucket]
        if ready is None or max(at, ready) > until:
            return None, None
        return max(at, ready), first


def simulate_synchronous(profile: Profile, cost_of, options: ScheduleOptions, chunk: int, credit: int,
                         update_s_per_byte: float, exchange_cpu_s_per_byte: float = 0.0,
                         pack_s_per_byte: float = 0.0, iterations: int = 4, progress: Progress = Progress(),
                         boundary_s: float = 0.0) -> IterationTimes:
    """Steady-state iteration time of a synchronous rule whose collective on ``n`` bytes costs
    ``cost_of(n)`` (a ``network.Cost``), and the compute alone (one worker: no exchange).
    ``pack_s_per_byte``: what the training thread spends putting a bucket on the wire and taking it
    off (a cast to float16 and back), when the bucket is full. ``progress``: who moves the
    exchange; ``boundary_s``: what the agreement at each iteration's end costs (module docstring)."""
    if progress.mode not in ("thread", "deferred"):
        raise ValueError(f"progress must be thread or deferred, got {progress.mode!r}")
    params = [_ParamShape(p.nbytes) for p in profile.params]
    layers = profile.layers
    order = [pid for layer in reversed(layers) for pid in layer.final]
    by_layer = [list(layer.final) for layer in reversed(layers) if layer.final]
    buckets = plan_buckets(order, params, options.bucket_bytes, by_layer) if order else []
    bucket_of = {pid: b.index for b in buckets for pid in b.param_ids}
    first_use: dict[int, int] = {}
    for li, layer in enumerate(layers):
        for pid in layer.uses:
            first_use.setdefault(pid, li)
    priorities = [min(first_use.get(pid, len(layers)) for pid in b.param_ids) for b in buckets]
    update_s = [p.nbytes * update_s_per_byte for p in profile.params]
    compute_s = profile.forward_s + profile.backward_s + sum(update_s)
    if cost_of is None or not buckets:
        return IterationTimes(compute_s, compute_s)

    link = Link()
    now = 0.0
    previous: _Exchange | None = None
    exchange: _Exchange | None = None
    deferred = progress.mode == "deferred"
    unstarted: list[int] = []     # deferred: buckets handed over that move once the training thread blocks

    def compute(at: float, seconds: float) -> float:
        if deferred:
            # No MPI call while the training thread computes: what is in flight stands still, and
            # the exchange's CPU work is done while it waits.
            for active in {id(e): e for e in (previous, exchange) if e is not None}.values():
                active.pause(at, seconds)   # between iterations both name the same exchange
            link.pause(at, seconds)
            return at + seconds
        # What the schedule starts meanwhile is decided by what is already known (readiness and
        # completions), so it can be started before the compute whose CPU it competes for.
        for active in (previous, exchange):
            if active is not None:
                active.advance(at + seconds)
        return link.compute(at, seconds)

    def hand_over(bucket: int, at: float) -> None:
        if deferred:
            unstarted.append(bucket)
        else:
            exchange.ready(bucket, at)

    def block(at: float) -> None:
        """The training thread enters a blocking MPI call at ``at``: deferred buckets start moving."""
        for bucket in unstarted:
            exchange.ready(bucket, at)
        unstarted.clear()

    waiting: set[int] = set()     # parameters whose update waits for the previous exchange
    starts = []
    for _ in range(iterations):
        starts.append(now)
        for li, layer in enumerate(layers):
            for pid in layer.uses:
                if pid in waiting:
                    now = max(now, previous.complete(bucket_of[pid], now)) + update_s[pid]
                    waiting.discard(pid)
            now = compute(now, layer.forward_s)
        exchange = _Exchange(buckets, priorities, cost_of, link, options, chunk, credit, exchange_cpu_s_per_byte,
                             progress)
        filled = [0] * len(buckets)
        drained = False
        for layer in reversed(layers):
            now = compute(now, layer.backward_s)
            if not layer.final:
                continue
            if not drained and previous is not None:
                now = max(now, previous.all_complete(now))
                for pid in sorted(waiting):
                    now += update_s[pid]
                waiting.clear()
            drained = True
            for pid in layer.final:
                if pid not in bucket_of:
                    continue
                b = bucket_of[pid]
                filled[b] += 1
                if filled[b] == len(buckets[b].param_ids):
                    now += buckets[b].nbytes * pack_s_per_byte
                    if options.overlap:
                        hand_over(b, now)
        if not options.overlap:
            for b in range(len(buckets)):
                hand_over(b, now)
        if options.schedule == "fifo":
            block(now)
            now = max(now, exchange.all_complete(now))
            now += sum(update_s)
        else:
            for pid, b in sorted(bucket_of.items()):
                if not unstarted and exchange.complete(b) <= now:
                    now += update_s[pid]
                else:
                    waiting.add(pid)
        # The agreement on stop/snapshot requests: a blocking collective in which deferred buckets move.
        block(now)
        now += boundary_s
        previous = exchange
    starts.append(now)
    # The next iteration's start waits for the first layer's parameters: account for it by the
    # start-to-start time of the last two whole iterations.
    return IterationTimes((starts[-1] - starts[-3]) / 2, compute_s)
