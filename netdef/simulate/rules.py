"""Per exchange rule, the iteration time of one worker out of ``workers`` (each rule's model).

Synchronous rules run the solver's schedule (``iteration.simulate_synchronous``) with the rule's
collective:

- ``allreduce``: the MPI library's allreduce (``Network.allreduce``: ring or recursive doubling).
- ``multicolor``: IBM's multi-colour allreduce over ``colors`` trees (``Network.multicolor_allreduce``).
- ``fp16``: the multicolour trees carrying half the bytes (netdef's fp16 sends float16 messages down
  ``multicolor``'s trees and sums in float32 at each node), plus the casts in and out (one pass over
  the float32 gradient, like an update's, on the training thread).

Asynchronous rules are closed forms (no rank waits for another's compute):

- ``easgd``: every ``tau`` iterations a rank fetches the centre and accumulates its difference into
  it (one-sided, the centre sharded over the ranks; ``Network.one_sided_exchange``) and moves its
  own weights: iteration = compute + (that exchange + two passes over the weights) / tau.
- ``gossip``: with probability ``gossip_probability`` per iteration a rank sends its weights to a
  random peer (non-blocking) and a receiver merges them (one pass): iteration = the larger of
  compute + the expected merges and the time the link needs for the expected bytes.
- ``hybrid``: synchronous allreduce inside groups of ``group_size`` consecutive ranks (inside a node
  when the group fits), and every ``tau`` iterations each group's first rank does the elastic step
  with the centre (sharded over every rank), then broadcasts the result in its group.

Defaults follow netdef's rules: tau 10 (Zhang et al.'s ImageNet runs), gossip probability 0.1,
``min(workers, 4)`` colours.

Every rule pays the iteration boundary (``boundary_s``): the solver's agreement on stop and snapshot
requests, a blocking allreduce of two integers after every iteration, and ``sync_s``, what waiting
there for the slowest rank costs beyond the collective (measured: benchmarks/scaling_model.py).

Speed-up and efficiency count samples per second; for the asynchronous rules they say nothing
about how many more iterations the looser coupling needs to reach the same accuracy.
"""
from __future__ import annotations

import dataclasses
import math

from ..comm.exchange import registered_exchanges
from ..comm.scheduler import LinkMeasurement, chunk_size, credit_size
from .iteration import IterationTimes, Progress, ScheduleOptions, simulate_synchronous
from .network import Network
from .profile import Profile

# A CPU's fused SGD-with-momentum update of a float32 blob, per byte of parameters: the time measured
# for fc6 of benchmarks/schedule.py's net over its bytes (benchmarks/README.md, "The figures behind the
# solver's, the exchange's and the data's choices").
CPU_UPDATE_S_PER_BYTE = 12e-3 / 33.6e6


class RuleError(ValueError):
    """An unknown rule or a parameter out of range; the message names the option."""


@dataclasses.dataclass(frozen=True)
class RuleOptions:
    rule: str = "allreduce"
    colors: int = 0               # multicolor: 0 = default_colors(workers)
    tau: int = 10                 # easgd, hybrid: iterations between elastic steps
    gossip_probability: float = 0.1
    group_size: int = 2           # hybrid
    schedule: ScheduleOptions = ScheduleOptions()
    update_s_per_byte: float = CPU_UPDATE_S_PER_BYTE
    exchange_cpu_s_per_byte: float = 0.0
    sync_s: float = 0.0           # per iteration: the wait for the slowest rank beyond the agreement's latency

    def __post_init__(self):
        if self.rule not in RULES:
            raise RuleError(f"--exchange must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.tau < 1:
            raise RuleError(f"--tau must be at least 1, got {self.tau}")
        if not 0 <= self.gossip_probability <= 1:
            raise RuleError(f"--gossip_probability must be in [0, 1], got {self.gossip_probability}")
        if self.group_size < 1:
            raise RuleError(f"--group_size must be at least 1, got {self.group_size}")
        if self.colors < 0:
            raise RuleError(f"--colors must be >= 0, got {self.colors}")
        if self.schedule.schedule not in ("priority", "fifo"):
            raise RuleError(f"--schedule must be priority or fifo, got {self.schedule.schedule!r}")
        if self.schedule.progress not in ("thread", "deferred"):
            raise RuleError(f"--progress must be thread or deferred, got {self.schedule.progress!r}")
        if not self.schedule.poll_s >= 0:
            raise RuleError(f"--poll_ms must be >= 0, got {self.schedule.poll_s * 1e3:g}")
        if not self.schedule.polled_s >= 0:
            raise RuleError(f"--polled_ms must be >= 0, got {self.schedule.polled_s * 1e3:g}")
        if not self.sync_s >= 0:
            raise RuleError(f"--sync_ms must be >= 0, got {self.sync_s * 1e3:g}")


def default_colors(workers: int) -> int:
    """The number of multicolour trees netdef's ``multicolor`` chooses: one per rank, at most 4."""
    return max(1, min(4, workers))


def measured_sizes(cost_of, schedule: ScheduleOptions) -> tuple[int, int]:
    """(chunk_bytes, credit_bytes) as ``scheduler.choose_sizes`` would choose them on this network:
    the blocking allreduce's latency and rate fitted between 64 KiB and 1 MiB, a chunk's completion
    when tested every poll interval."""
    small, large = 64 << 10, 1 << 20
    t_small, t_large = cost_of(small).total_s, cost_of(large).total_s
    per_byte = max((t_large - t_small) / (large - small), 1e-12)
    latency = max(t_small - small * per_byte, 1e-6)
    chunk = schedule.chunk_bytes or chunk_size(latency, 1.0 / per_byte)
    poll = schedule.poll_s
    polled = math.ceil(cost_of(chunk).total_s / poll) * poll if poll > 0 else cost_of(chunk).total_s
    credit = schedule.credit_bytes or credit_size(chunk, LinkMeasurement(latency, 1.0 / per_byte, polled))
    return int(chunk), int(max(credit, chunk))


def progress_of(schedule: ScheduleOptions, workers: int) -> Progress:
    """How the exchange moves for ``workers`` ranks: deferred, or a thread that tests every
    ``poll_s``; a collective's rounds are recursive doubling's, ceil(log2 p), as MPI libraries run
    the small ones whose rounds a test can hold up. A measured ``polled_s`` replaces the rounds'
    polls (it was measured at one rank count: it applies to every count simulated)."""
    if schedule.progress == "deferred":
        return Progress("deferred")
    if schedule.polled_s > 0 and workers > 1:
        return Progress.measured(schedule.polled_s, schedule.poll_s, schedule.urgent_poll_s)
    rounds = math.ceil(math.log2(workers)) if workers > 1 else 0
    return Progress.polling(schedule.poll_s, schedule.urgent_poll_s, rounds)


def boundary(network: Network, workers: int, options: RuleOptions) -> float:
    """The iteration boundary: the agreement's blocking allreduce of two int32 (MPI's, whatever
    algorithm the exchange's collective is given: the library picks the cheapest for 8 bytes) and
    the wait for the slowest."""
    if workers <= 1:
        return 0.0
    return dataclasses.replace(network, algorithm="auto").allreduce(8, workers).total_s + options.sync_s


def _synchronous(case: "_Case", cost_of, pack_s_per_byte: float = 0.0):
    options = case.options
    chunk, credit = measured_sizes(cost_of, options.schedule)
    return simulate_synchronous(case.profile, cost_of, options.schedule, chunk, credit, options.update_s_per_byte,
                                options.exchange_cpu_s_per_byte, pack_s_per_byte,
                                progress=progress_of(options.schedule, case.workers), boundary_s=case.boundary)


@dataclasses.dataclass(frozen=True)
class _Case:
    """What every rule's model is given: ``compute`` is one worker's iteration, ``weights`` the
    parameter bytes, ``one_pass`` the time of one pass over them (an update's), ``boundary`` the
    iteration boundary (``boundary``)."""

    profile: Profile
    network: Network
    workers: int
    options: RuleOptions
    compute: float
    weights: int
    one_pass: float
    boundary: float


def _allreduce(case: _Case) -> IterationTimes:
    return _synchronous(case, lambda n: case.network.allreduce(n, case.workers))


def _multicolor(case: _Case) -> IterationTimes:
    colors = case.options.colors or default_colors(case.workers)
    return _synchronous(case, lambda n: case.network.multicolor_allreduce(n, case.workers, colors))


def _fp16(case: _Case) -> IterationTimes:
    colors = case.options.colors or default_colors(case.workers)
    return _synchronous(case, lambda n: case.network.multicolor_allreduce(n / 2, case.workers, colors),
                        pack_s_per_byte=case.options.update_s_per_byte)


def _easgd(case: _Case) -> IterationTimes:
    step = case.network.one_sided_exchange(case.weights, case.workers).total_s + 2 * case.one_pass
    return IterationTimes(case.compute + step / case.options.tau + case.boundary, case.compute)


def _gossip(case: _Case) -> IterationTimes:
    network, q = case.network, case.options.gossip_probability
    if network.topology == "shared":
        link_s = case.workers * q * case.weights / network.bytes_per_s
    else:
        across_nodes = network.topology == "nodes" and case.workers > network.ranks_per_node
        sharing = network.ranks_per_node if across_nodes else 1
        link_s = sharing * q * network.point_to_point(case.weights).total_s
    return IterationTimes(max(case.compute + q * case.one_pass + case.boundary, link_s), case.compute)


def _hybrid(case: _Case) -> IterationTimes:
    network, options = case.network, case.options
    group = min(options.group_size, case.workers)
    groups = -(-case.workers // group)
    inside = (iteration_times(case.profile, network, group, dataclasses.replace(options, rule="allreduce"))
              if group > 1 else IterationTimes(case.compute, case.compute))
    if groups == 1:
        return inside
    # The agreement spans every rank, not the group.
    inside = IterationTimes(inside.iteration_s - boundary(network, group, options) + case.boundary, case.compute)
    elastic = network.one_sided_exchange(case.weights, case.workers, stepping=groups).total_s + 2 * case.one_pass
    crosses = not (network.topology == "nodes" and group <= network.ranks_per_node)
    broadcast = math.ceil(math.log2(group)) * network.point_to_point(case.weights, crosses).total_s if group > 1 else 0.0
    return IterationTimes(inside.iteration_s + (elastic + broadcast) / options.tau, case.compute)


# Each exchange rule's model, under the rule's registered name (``comm.exchange.EXCHANGE_RULES``).
_MODELS = {"allreduce": _allreduce, "multicolor": _multicolor, "fp16": _fp16, "easgd": _easgd, "gossip": _gossip,
           "hybrid": _hybrid}

#: The exchange rules that can be simulated: the registered ones with a model here, sorted (every
#: built-in rule: tests/simulate/test_model.py checks).
RULES = tuple(name for name in registered_exchanges() if name in _MODELS)


def iteration_times(profile: Profile, network: Network, workers: int, options: RuleOptions) -> IterationTimes:
    """One worker's steady-state iteration and its compute alone, for ``workers`` workers."""
    if workers < 1:
        raise RuleError(f"--workers must be at least 1, got {workers}")
    alone = simulate_synchronous(profile, None, options.schedule, 1, 1, options.update_s_per_byte)
    if workers == 1:
        return alone
    weights = profile.gradient_bytes
    return _MODELS[options.rule](_Case(profile, network, workers, options, alone.compute_s, weights,
                                       weights * options.update_s_per_byte, boundary(network, workers, options)))


@dataclasses.dataclass(frozen=True)
class Prediction:
    workers: int
    iteration_s: float
    compute_s: float
    exposed_s: float
    efficiency: float
    speedup: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def predict(profile: Profile, network: Network, workers_list, options: RuleOptions) -> list[Prediction]:
    """Iteration time, compute, exposed exchange, efficiency (one worker's iteration over this
    one's) and speed-up (samples per second over one worker's) for each worker count."""
    single = iteration_times(profile, network, 1, options).iteration_s
    out = []
    for workers in workers_list:
        times = iteration_times(profile, network, workers, options)
        efficiency = single / times.iteration_s if times.iteration_s > 0 else 1.0
        out.append(Prediction(workers, times.iteration_s, times.compute_s, max(0.0, times.iteration_s - single),
                              efficiency, efficiency * workers))
    return out
