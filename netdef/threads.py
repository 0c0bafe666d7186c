"""How many threads compute uses: each rank's share of the cores, and data threads that yield to it.

NumPy's BLAS (OpenBLAS in its wheels) starts one thread per core of the machine in every process. Under
MPI several ranks share a machine, and so 2 ranks on 2 cores ran 4 BLAS threads that spin while they
wait for each other and take turns on 2 cores: training ran about ten times slower than with one BLAS
thread per rank (benchmarks/README.md, "The figures behind the solver's, the exchange's and the data's
choices"). ``share_cores`` gives each rank its share instead:

    threads per rank = max(1, cores the machine's ranks may run on together // ranks on the machine),
                       at most the cores this rank itself may run on

("may run on": the CPU affinity sets, so a launcher's binding (Open MPI binds ranks to cores by default,
``srun --cpu-bind``) or ``taskset`` around ``mpiexec`` are respected). A thread count the user chose
wins: when one of ``USER_THREAD_VARIABLES`` is set, the libraries keep what it says, and the compiled
kernels take the same count. One process alone has every core it may run on.

The compiled kernels (numba, layers/jit) have a thread pool of their own, which reads none of those
variables: it gets the same share, or the user's count (``NUMBA_NUM_THREADS``, numba's own variable,
wins over the others).

One process alone (and each rank, within its share) also bounds its threads by what it may really
use: a container's CPU quota (``cgroup_cpu_limit``: cgroup v2's ``cpu.max``, v1's ``cpu.cfs_quota_us``
over ``cpu.cfs_period_us``, rounded up to whole cores) and the cores other processes keep busy. A
parallel loop waits for its slowest thread, and a thread whose core another process holds runs only
when the scheduler gives it a turn: on 2 cores beside one busy process, the kernels' two threads made
the digits example several times slower than one thread (benchmarks/README.md, "Threads beside other
processes"). ``LoadAwareThreads`` starts from /proc/stat (the busy time of this process's cores less
its own CPU time: what other processes took), runs the kernels on the cores left over, at least one,
and now and then tries another count for a few iterations, kept only when they run faster. A count
the user chose (``USER_THREAD_VARIABLES``, ``NUMBA_NUM_THREADS``) is kept as it is. Whatever count
runs, the kernels cut their work for the plan's (``partition_width``): a matrix product cut into
other panels rounds differently, and a seeded run must give the same bits however loaded the
machine was.

A data layer's prefetch thread decodes the next batch while the layers compute, at the process's own
scheduling priority. It once ran at nice 19, to run only on what compute left idle; but beside other
busy processes a thread at nice 19 gets a sliver of a core, and while it holds the GIL or the next
batch the training thread waits for it: the digits example took 29-59 s beside one or two busy
processes against 6.6-9.5 s at the normal priority, and no slower on a quiet machine
(benchmarks/README.md, "Seeded runs follow the load; data threads at the process's priority"). Where
they do take time from compute, ``LoadAwareThreads`` sees it in the iterations' times.

Each data layer decodes and transforms its batches on ``data_threads()`` threads (the prefetch thread
among them): ``NETDEF_DATA_THREADS`` when set, else every core this process may run on. Under MPI
``share_cores`` sets that variable (unless the user did) to the rank's share of the machine's cores, the
same share as compute's: on the CPU the data threads then run on what the rank's compute leaves idle,
and on a GPU, where the host's cores have little else to do, nearly all of the share goes to the data.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Mapping

from .environment import positive_count

# Variables through which a user sets the thread count of OpenMP or a BLAS library himself.
USER_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
# numba reads this one itself when it starts its pool.
KERNEL_THREAD_VARIABLE = "NUMBA_NUM_THREADS"
# How many threads each data layer decodes and transforms on (netdef's own variable).
DATA_THREAD_VARIABLE = "NETDEF_DATA_THREADS"



@dataclasses.dataclass(frozen=True)
class ThreadPlan:
    """``threads`` for the BLAS/OpenMP pools of this process (None: leave the libraries' choice),
    ``reason``, the log's explanation, ``kernel_threads`` for the compiled kernels' pool (None:
    numba's choice: every core, or NUMBA_NUM_THREADS), and ``adapts_to_load``: whether the count may
    come down while other processes keep cores busy (``LoadAwareThreads``; not when the user chose)."""

    threads: int | None
    reason: str
    kernel_threads: int | None = None
    adapts_to_load: bool = False


def own_cores() -> set[int]:
    """The CPUs this process may run on (its affinity set; all of them where there is no such notion)."""
    if hasattr(os, "sched_getaffinity"):  # Linux; macOS and Windows have no affinity call in os
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def plan_compute_threads(local_ranks: int, local_cores: int, own_core_count: int,
                         environ: Mapping[str, str] | None = None, quota_cores: int | None = None) -> ThreadPlan:
    """The thread plan for one of ``local_ranks`` processes on a machine whose ranks may run on
    ``local_cores`` distinct cores together, this one on ``own_core_count`` of them, under a CPU quota
    of ``quota_cores`` whole cores (None: no quota; ``cgroup_cpu_limit``)."""
    env = os.environ if environ is None else environ
    chosen = [name for name in USER_THREAD_VARIABLES if env.get(name, "").strip()]
    if chosen:
        reason = f"{', '.join(f'{name}={env[name]}' for name in chosen)} from the environment"
        return ThreadPlan(None, reason, _users_kernel_threads(env, env[chosen[0]]))
    if local_ranks <= 1:
        threads, reason = own_core_count, f"the {own_core_count} cores this process may run on"
    else:
        threads = max(1, min(own_core_count, local_cores // local_ranks))
        reason = f"{local_cores} cores shared by {local_ranks} ranks on this machine"
    if quota_cores is not None and quota_cores < threads:
        threads, reason = max(1, quota_cores), f"{reason}, a CPU quota of {quota_cores} (cgroup)"
    users_kernels = bool(env.get(KERNEL_THREAD_VARIABLE, "").strip())
    adapts = not users_kernels and threads > 1
    reason += ", fewer while other processes keep cores busy" if adapts else ""
    return ThreadPlan(threads, f"{reason}; set OMP_NUM_THREADS to choose", None if users_kernels else threads,
                      adapts_to_load=adapts)


def _users_kernel_threads(env: Mapping[str, str], value: str) -> int | None:
    """The kernels' pool follows the user's BLAS/OpenMP count, unless NUMBA_NUM_THREADS says otherwise
    (or the count is not a positive number, which the libraries themselves ignore too)."""
    if env.get(KERNEL_THREAD_VARIABLE, "").strip():
        return None
    try:
        count = int(value.split(",")[0])  # OMP_NUM_THREADS may list counts per nesting level
    except ValueError:
        return None
    return count if count > 0 else None


def apply_thread_plan(plan: ThreadPlan):
    """Limit the BLAS and OpenMP pools loaded in this process to ``plan.threads`` (nothing when None).
    Returns threadpoolctl's limiter (its ``restore_original_limits()`` undoes it), or None."""
    if plan.kernel_threads is not None:
        set_partition_width(set_kernel_threads(plan.kernel_threads))
    if plan.threads is None:
        return None
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=plan.threads)


# What the compiled kernels' idle threads do between kernels. numba's OpenMP pool (GNU libgomp) spins
# 300,000 times after each parallel loop by default, and OpenBLAS's threads spin after each matrix
# product: while the two pools shared the cores they took turns, and a map right after a product waited
# for the other pool's spinner to give up its core. But a thread that sleeps at once
# (OMP_WAIT_POLICY=PASSIVE) must be woken for the next loop, which costs more than a small loop itself
# (benchmarks/parallel_wakeup.py), and LeNet's iteration runs dozens of loops. Since the layers' products
# run on this pool too (layers/matmul.py), nothing else wants the cores between two loops but the Python
# that launches the next one, which at batch 1 takes longer than the few thousand spins that were the
# compromise between the two pools: 30,000 spins keep a thread awake across that Python, and more gained
# nothing (benchmarks/README.md, "One thread pool", and "The figures behind the solver's, the
# exchange's and the data's choices").
KERNEL_SPIN = ("GOMP_SPINCOUNT", "30000")
# Either of these set by the user decides how libgomp's idle threads wait; netdef then sets nothing.
USER_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


# OpenBLAS's threads spin for 2^THREAD_TIMEOUT cycles after each matrix product (default 28, a long
# spin), while numba's kernels that follow want every core: sleeping at once instead (4, OpenBLAS's
# minimum) made every net faster. But then every product wakes a sleeping thread (as for the kernels'
# pool above), and SqueezeNet's 1x1 layers run one product per image: a short spin of 2^18 cycles
# (OpenBLAS's idle loop yields the core to any thread that wants it) keeps that gain without paying
# those wake-ups (benchmarks/README.md, "The figures behind the solver's, the exchange's and the data's choices").
# OpenBLAS reads it once, when it loads (with NumPy).
BLAS_WAIT_POLICY = ("OPENBLAS_THREAD_TIMEOUT", "18")


def let_idle_blas_threads_sleep(environ=None) -> bool:
    """Make OpenBLAS's idle threads sleep after a short spin (``BLAS_WAIT_POLICY``) unless the user set
    OPENBLAS_THREAD_TIMEOUT. Only takes effect before NumPy loads its BLAS, so ``netdef/__init__``
    calls it before importing anything else; returns False when NumPy was loaded first (a script that
    imports numpy before netdef keeps OpenBLAS's spinning threads unless it sets the variable)."""
    env = os.environ if environ is None else environ
    name, value = BLAS_WAIT_POLICY
    env.setdefault(name, value)
    return "numpy" not in sys.modules


def let_idle_kernel_threads_sleep(environ=None) -> None:
    """Make the kernels' OpenMP threads spin briefly when idle, then sleep (``KERNEL_SPIN``), unless the
    user set OMP_WAIT_POLICY or GOMP_SPINCOUNT. libgomp reads them once, when numba first starts its
    pool: every module of compiled kernels calls this before it imports numba."""
    env = os.environ if environ is None else environ
    if any(env.get(name, "").strip() for name in USER_WAIT_VARIABLES):
        return
    name, value = KERNEL_SPIN
    env[name] = value


def bound_kernel_pool_by_user(environ=None) -> None:
    """Start numba's pool with the user's OMP_NUM_THREADS (the first count of its list) when he set it
    and not NUMBA_NUM_THREADS: numba reads only its own variable, and a user who asked for one thread
    (in any program that uses netdef: a pycaffe script, ``netdef time``) gets one, not every core. Only
    takes effect before numba is imported."""
    env = os.environ if environ is None else environ
    if env.get(KERNEL_THREAD_VARIABLE, "").strip():
        return
    count = _users_kernel_threads(env, env.get("OMP_NUM_THREADS", "").strip())
    if count is not None:
        env[KERNEL_THREAD_VARIABLE] = str(count)


def prepare_kernel_pool(environ=None) -> None:
    """What must be set before numba starts its pool: how idle threads wait (``let_idle_kernel_threads_sleep``)
    and the user's thread count (``bound_kernel_pool_by_user``). Every module of compiled kernels calls
    it before it imports numba."""
    let_idle_kernel_threads_sleep(environ)
    bound_kernel_pool_by_user(environ)


def set_kernel_threads(count: int) -> int:
    """Run the compiled kernels' parallel loops on ``count`` threads (at most the pool numba started);
    returns the count in effect. numba keeps this per calling thread: call it from the thread that
    runs the layers."""
    prepare_kernel_pool()
    import numba

    count = max(1, min(count, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(count)
    return count


def kernel_threads() -> int:
    """The thread count of the compiled kernels' parallel loops launched from this thread."""
    import numba

    return numba.get_num_threads()


# The thread count the kernels cut their work for (``partition_width``): set by the thread plan, never by
# the count that follows the load. None until a plan sets it or the first call reads the pool's size.
_partition_width: int | None = None


def set_partition_width(count: int) -> None:
    """Cut the kernels' work for ``count`` threads from now on, whatever count runs it
    (``set_kernel_threads``)."""
    global _partition_width
    _partition_width = max(1, count)


def partition_width() -> int:
    """The thread count the kernels cut their work into parts for (the matrix products' panels, the
    direct convolution's row blocks): the plan's count, or the pool's size where no plan was applied.
    A product cut into other panels rounds differently (OpenBLAS picks another kernel for another
    panel shape), so the parts do not follow the threads running them: a count that follows the load
    (``LoadAwareThreads``) runs the same parts on fewer threads and changes no bit of a result. Read
    before every product: after the first call, a module variable (the pool's size never changes)."""
    global _partition_width
    if _partition_width is None:
        prepare_kernel_pool()
        import numba

        _partition_width = numba.config.NUMBA_NUM_THREADS
    return _partition_width


def blas_threads() -> int | None:
    """The thread count of the first BLAS library loaded in this process (None when none is)."""
    from threadpoolctl import threadpool_info

    for pool in threadpool_info():
        if pool.get("user_api") == "blas":
            return int(pool["num_threads"])
    return None


def share_cores(comm) -> tuple[str, LoadAwareThreads | None]:
    """Give this process, or this rank of ``comm`` (a Communicator), its share of the cores for BLAS,
    OpenMP and the compiled kernels (see the module docstring). Called once, before training; returns
    the log line and, where the plan adapts to load, the ``LoadAwareThreads`` that the training loop
    polls (its first look at the load is made here). The kernels' work stays cut for the plan's count
    (``partition_width``), so a seeded run gives the same bits whatever count the load leads to."""
    plan = plan_compute_threads(comm.local_size, comm.local_core_count(), len(own_cores()),
                                quota_cores=cgroup_cpu_limit())
    apply_thread_plan(plan)
    load = LoadAwareThreads(plan.threads) if plan.adapts_to_load else None
    reason = plan.reason if load is None else f"{load.settle()}; {plan.reason}"
    threads = blas_threads()
    count = "no BLAS library loaded" if threads is None else f"{threads} BLAS thread{'s' if threads != 1 else ''}"
    kernels = kernel_threads()
    per = " per rank" if comm.size > 1 else ""
    return (f"Compute threads{per}: {count}, {kernels} kernel thread{'s' if kernels != 1 else ''} ({reason})",
            load)


def set_compute_threads(count: int) -> None:
    """Run the compiled kernels and the BLAS library on ``count`` threads from now on."""
    set_kernel_threads(count)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=count, user_api="blas")


# Where the kernel mounts the control groups (cgroup v2's unified tree, or one directory per v1 controller).
CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_cpu_limit(cgroup_root: str = CGROUP_ROOT, membership: str | None = None) -> int | None:
    """Whole cores' worth of CPU time this process's control group may use: ceil(quota / period), the
    tightest of its group and the groups above it, from cgroup v2's ``cpu.max`` or v1's
    ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``; None where no quota is set or there are no cgroups.
    ``membership``: the text of /proc/self/cgroup (read when None; a container with its own cgroup
    namespace sees its group as the root)."""
    if membership is None:
        try:
            with open("/proc/self/cgroup") as handle:
                membership = handle.read()
        except OSError:
            membership = ""
    directories = {cgroup_root, os.path.join(cgroup_root, "cpu"), os.path.join(cgroup_root, "cpu,cpuacct")}
    for line in membership.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1], parts[2].strip().strip("/")
        if controllers and "cpu" not in controllers.split(","):
            continue
        mount = cgroup_root if not controllers else os.path.join(cgroup_root, controllers)
        while True:
            directories.add(os.path.join(mount, path) if path else mount)
            if not path:
                break
            path = os.path.dirname(path)
    quotas = [q for q in map(_cpu_quota_of, sorted(directories)) if q is not None]
    return max(1, math.ceil(min(quotas) - 1e-9)) if quotas else None


def _cpu_quota_of(directory: str) -> float | None:
    """The quota of one control group's directory in cores (quota / period); None where it sets none."""
    try:
        with open(os.path.join(directory, "cpu.max")) as handle:
            fields = handle.read().split()
        if len(fields) >= 2 and fields[0] != "max":
            return int(fields[0]) / int(fields[1])
        return None
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as handle:
            quota = int(handle.read())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as handle:
            period = int(handle.read())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class CpuSample:
    """A moment's counters: ``wall`` (monotonic seconds), ``busy`` (seconds the watched cores have
    spent running anything, from /proc/stat), ``own`` (seconds this process's threads have run)."""

    wall: float
    busy: float
    own: float


def sample_cpu(cores: set[int], stat_path: str = "/proc/stat") -> CpuSample | None:
    """The counters of ``cores`` now; None where /proc/stat cannot be read (not Linux)."""
    try:
        with open(stat_path) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, _, values = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        fields = [int(v) for v in values.split()]
        # user nice system idle iowait irq softirq steal (guest time is counted in user's)
        ticks += sum(fields[:8]) - fields[3] - fields[4]
    return CpuSample(time.monotonic(), ticks / os.sysconf("SC_CLK_TCK"), time.process_time())


def others_busy_cores(before: CpuSample, after: CpuSample) -> float:
    """How many of the watched cores other processes kept busy between two samples, on average."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


def threads_beside(most: int, cores: int, others_busy: float) -> int:
    """The threads that fit on ``cores`` while others keep ``others_busy`` of them busy: the cores left,
    a core counting as taken once others hold more than half of it; at least 1, at most ``most``."""
    return max(1, min(most, math.floor(cores - others_busy + 0.5)))


class LoadAwareThreads:
    """Keeps the compute threads where they run fastest beside the other processes: at most ``most``, at
    least one. ``poll()`` after each iteration. The first count comes from the load (``settle``: the
    cores other processes keep busy, ``threads_beside``); after that, once ``interval_s`` has passed
    and at least ``MIN_ITERATIONS`` iterations, it tries another count (the load's suggestion, or the
    neighbour of the current one) for ``PROBE_ITERATIONS`` iterations, goes back to the kept count for as many,
    and keeps the tried count when the mean time of its iterations (the slowest left out: a test phase, a
    snapshot) beats by ``GAIN`` both that of as many iterations just before and that of those just after. Both:
    a burst of other work during the iterations before made a worse count win and hold for its 2 s (LeNet beside
    two busy processes ran 2.9x its best that way), and a burst then is rarely still there after the probe. A
    mean, not a median: beside a busy process most iterations of 2 threads may run as fast as ever while every
    few waits for a thread the scheduler left off its core, and those decide. Whether a parallel loop gains
    beside a busy process depends on the loop and on who holds the cores (a process that is always runnable, or
    one that comes and goes; another container's): the load alone guesses wrong both ways (benchmarks/README.md,
    "Threads beside other processes"), the iterations' own times do not.
    A probe that loses costs its iterations at the worse count (LeNet beside a busy process: 2 threads took
    3x as long, and probing every 2 s made the default 1.22x its best), so while the load says what it said
    when a probe lost, the next waits twice as long as the last, in time and in iterations, up to
    ``MAX_BACKOFF`` times the interval and ``MIN_ITERATIONS``; the load is still looked at every interval,
    and a change in what it suggests is probed at once.
    ``cores``: the cores watched (this process's affinity set)."""

    MIN_WINDOW_S = 0.1  # shorter windows mistake a moment's burst for a busy core
    PROBE_ITERATIONS = 5
    MIN_ITERATIONS = 50  # so that a probe of a worse count costs a tenth of the iterations at most
    GAIN = 0.95
    MAX_BACKOFF = 16  # intervals between probes at most, while they keep losing in an unchanged load

    def __init__(self, most: int, interval_s: float = 2.0, cores: set[int] | None = None,
                 stat_path: str = "/proc/stat"):
        self.most = most
        self.threads = most
        self.interval_s = interval_s
        self.others_busy = 0.0
        self._cores = own_cores() if cores is None else set(cores)
        self._stat_path = stat_path
        self._last = sample_cpu(self._cores, stat_path)
        self._decided = time.monotonic()
        self._iterations = 0
        self._ended: float | None = None  # when the last iteration ended (perf_counter)
        self._recent: list[float] = []    # the last iterations' times at the current count
        self._probe: list[float] = []     # the iterations' times at the count being tried
        self._after: list[float] = []     # then those back at the kept count
        self._tried: int | None = None
        self._looked = self._decided      # when the load was last looked at for a probe
        self._suggested: int | None = None  # the load's suggestion when the probe under way began
        self._refused: int | None = None  # the load's suggestion when a probe last lost
        self._backoff = 1                 # intervals to wait before the next probe in that load

    def settle(self) -> str:
        """Choose the first count from the load now (after waiting out ``MIN_WINDOW_S`` since the first
        sample); returns what was chosen and why, in words for the log."""
        if self._last is not None:
            time.sleep(max(0.0, self._last.wall + self.MIN_WINDOW_S - time.monotonic()))
        self._look_at_load()
        suggested = threads_beside(self.most, len(self._cores), self.others_busy)
        if suggested != self.threads:
            self.threads = suggested
            set_compute_threads(suggested)
        return self.describe()

    def describe(self) -> str:
        return (f"{self.threads} of {self.most}: other processes kept {self.others_busy:.1f} of "
                f"{len(self._cores)} cores busy; tried again every {self.interval_s:g} s against the "
                f"iterations' times, less often while the load stays as it was when a try lost")

    @property
    def in_effect(self) -> int:
        """The count the kernels run on now: the one being tried, or the one kept."""
        return self._tried if self._probing else self.threads

    @property
    def _probing(self) -> bool:
        return self._tried is not None and len(self._probe) < self.PROBE_ITERATIONS

    def resume(self) -> None:
        """The next iteration starts now: the time since the last one went to other work (a benchmark's
        other contenders), which is no part of it."""
        self._ended = time.perf_counter()

    def poll(self) -> bool:
        """After an iteration: time it, try or judge another count; True when the count kept changed."""
        now = time.perf_counter()
        took, self._ended = (None if self._ended is None else now - self._ended), now
        changed = False
        if took is not None:
            changed = self._judge(took) if self._tried is not None else self._maybe_try(took)
        self._ended = time.perf_counter()  # a change of count is no part of the next iteration
        return changed

    def _maybe_try(self, took: float) -> bool:
        self._recent = (self._recent + [took])[-self.PROBE_ITERATIONS:]
        self._iterations += 1
        now = time.monotonic()
        if self._iterations < self.MIN_ITERATIONS or now - self._looked < self.interval_s:
            return False
        self._look_at_load()
        self._looked = now
        suggested = threads_beside(self.most, len(self._cores), self.others_busy)
        if suggested == self._refused and (now - self._decided < self.interval_s * self._backoff
                                           or self._iterations < self.MIN_ITERATIONS * self._backoff):
            return False  # the load as when the last probe lost: not yet (in time and in iterations)
        candidate = suggested if suggested != self.threads else (
            self.threads - 1 if self.threads > 1 else self.threads + 1)
        if candidate > self.most or len(self._recent) < self.PROBE_ITERATIONS:
            return False
        self._tried, self._probe, self._after, self._suggested = candidate, [], [], suggested
        set_kernel_threads(candidate)
        return False

    def _judge(self, took: float) -> bool:
        if self._probing:
            self._probe.append(took)
            if not self._probing:
                set_kernel_threads(self.threads)  # back to the kept count, for the iterations after
            return False
        self._after.append(took)
        if len(self._after) < self.PROBE_ITERATIONS:
            return False
        tried_mean = _trimmed_mean(self._probe)
        better = (tried_mean < self.GAIN * _trimmed_mean(self._recent)
                  and tried_mean < self.GAIN * _trimmed_mean(self._after))
        tried, self._tried = self._tried, None
        self._decided = self._looked = time.monotonic()
        self._iterations = 0
        if better:
            self.threads, self._recent = tried, list(self._probe)
            self._refused, self._backoff = None, 1
            set_compute_threads(tried)
            return True
        self._recent = list(self._after)
        same_load = self._suggested == self._refused
        self._backoff = min(2 * self._backoff, self.MAX_BACKOFF) if same_load else 2
        self._refused = self._suggested
        return False

    def _look_at_load(self) -> None:
        now = sample_cpu(self._cores, self._stat_path)
        if now is not None and self._last is not None:
            self.others_busy = others_busy_cores(self._last, now)
        self._last = now


def _trimmed_mean(seconds: list[float]) -> float:
    """The mean of ``seconds`` without the largest (one slow iteration for reasons of its own)."""
    kept = sorted(seconds)[:-1] or seconds
    return sum(kept) / len(kept)


def share_data_cores(comm) -> str:
    """Give each data layer of this rank of ``comm`` the rank's share of the machine's cores (through
    ``NETDEF_DATA_THREADS``, see the module docstring). Every rank calls it once, before its nets are
    built; returns the log line."""
    plan = plan_data_threads(comm.local_size, comm.local_core_count(), len(own_cores()))
    os.environ[DATA_THREAD_VARIABLE] = str(plan.threads)
    return f"Data threads per data layer: {plan.threads} ({plan.reason})"


@dataclasses.dataclass(frozen=True)
class DataThreadPlan:
    """``threads`` for each data layer of this process, and ``reason``, the log's explanation."""

    threads: int
    reason: str


def plan_data_threads(local_ranks: int, local_cores: int, own_core_count: int,
                      environ: Mapping[str, str] | None = None) -> DataThreadPlan:
    """How many threads each data layer of one of ``local_ranks`` processes decodes on: the user's
    ``NETDEF_DATA_THREADS``, else the rank's share of the ``local_cores`` (at most its own cores)."""
    env = os.environ if environ is None else environ
    if env.get(DATA_THREAD_VARIABLE, "").strip():
        threads = positive_count(DATA_THREAD_VARIABLE, "threads", own_core_count, env)
        return DataThreadPlan(threads, f"{DATA_THREAD_VARIABLE}={threads} from the environment")
    if local_ranks <= 1:
        return DataThreadPlan(max(1, own_core_count), f"the {own_core_count} cores this process may run on")
    threads = max(1, min(own_core_count, local_cores // local_ranks))
    return DataThreadPlan(threads, f"{local_cores} cores shared by {local_ranks} ranks on this machine; set "
                                   f"{DATA_THREAD_VARIABLE} to choose")


def data_threads(environ: Mapping[str, str] | None = None) -> int:
    """The thread count of each data layer of this process (see the module docstring)."""
    return plan_data_threads(1, 0, len(own_cores()), environ).threads
