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
wins: when one of ``USER_THREAD_VARIABLES`` is set, the libraries keep what it says. One process alone
keeps the libraries' default (every core).

The compiled kernels (numba, layers/jit) have a thread pool of their own, which reads none of those
variables: it gets the same share, or the user's count (``NUMBA_NUM_THREADS``, numba's own variable,
wins over the others).

A data layer's prefetch thread decodes the next batch while the layers compute; on a machine whose
cores all run BLAS threads it would take a core from one of them, and the others wait for that one at
the end of every matrix product. ``yield_cores_to_compute`` lowers the calling thread's scheduling
priority (Linux: nice 19 for that thread only), so it runs on what compute leaves idle.

Each data layer decodes and transforms its batches on ``data_threads()`` threads (the prefetch thread
among them, all at that low priority): ``NETDEF_DATA_THREADS`` when set, else every core this process
may run on. Under MPI ``share_cores`` sets that variable (unless the user did) to the rank's share of
the machine's cores, the same share as compute's: on the CPU the data threads then run on what the
rank's compute leaves idle, and on a GPU, where the host's cores have little else to do, nearly all of
the share goes to the data.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping

from .environment import positive_count

# Variables through which a user sets the thread count of OpenMP or a BLAS library himself.
USER_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
# numba reads this one itself when it starts its pool.
KERNEL_THREAD_VARIABLE = "NUMBA_NUM_THREADS"
# How many threads each data layer decodes and transforms on (netdef's own variable).
DATA_THREAD_VARIABLE = "NETDEF_DATA_THREADS"

DATA_THREAD_NICENESS = 19


@dataclasses.dataclass(frozen=True)
class ThreadPlan:
    """``threads`` for the BLAS/OpenMP pools of this process (None: leave the libraries' choice),
    ``reason``, the log's explanation, and ``kernel_threads`` for the compiled kernels' pool (None:
    numba's choice: every core, or NUMBA_NUM_THREADS)."""

    threads: int | None
    reason: str
    kernel_threads: int | None = None


def own_cores() -> set[int]:
    """The CPUs this process may run on (its affinity set; all of them where there is no such notion)."""
    if hasattr(os, "sched_getaffinity"):  # Linux; macOS and Windows have no affinity call in os
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def plan_compute_threads(local_ranks: int, local_cores: int, own_core_count: int,
                         environ: Mapping[str, str] | None = None) -> ThreadPlan:
    """The thread plan for one of ``local_ranks`` processes on a machine whose ranks may run on
    ``local_cores`` distinct cores together, this one on ``own_core_count`` of them."""
    env = os.environ if environ is None else environ
    chosen = [name for name in USER_THREAD_VARIABLES if env.get(name, "").strip()]
    if chosen:
        reason = f"{', '.join(f'{name}={env[name]}' for name in chosen)} from the environment"
        return ThreadPlan(None, reason, _users_kernel_threads(env, env[chosen[0]]))
    if local_ranks <= 1:
        return ThreadPlan(None, f"the BLAS library's default ({own_core_count} cores, 1 process on this machine)")
    threads = max(1, min(own_core_count, local_cores // local_ranks))
    kernel_threads = None if env.get(KERNEL_THREAD_VARIABLE, "").strip() else threads
    return ThreadPlan(threads, f"{local_cores} cores shared by {local_ranks} ranks on this machine"
                               f"; set OMP_NUM_THREADS to choose", kernel_threads)


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
        set_kernel_threads(plan.kernel_threads)
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


def set_kernel_threads(count: int) -> int:
    """Run the compiled kernels' parallel loops on ``count`` threads (at most the pool numba started);
    returns the count in effect. numba keeps this per calling thread: call it from the thread that
    runs the layers."""
    let_idle_kernel_threads_sleep()
    import numba

    count = max(1, min(count, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(count)
    return count


def kernel_threads() -> int:
    """The thread count of the compiled kernels' parallel loops launched from this thread."""
    import numba

    return numba.get_num_threads()


def blas_threads() -> int | None:
    """The thread count of the first BLAS library loaded in this process (None when none is)."""
    from threadpoolctl import threadpool_info

    for pool in threadpool_info():
        if pool.get("user_api") == "blas":
            return int(pool["num_threads"])
    return None


def share_cores(comm) -> str:
    """Give this rank of ``comm`` (a Communicator) its share of the machine's cores for BLAS and OpenMP
    (see the module docstring). Every rank calls it once, before training; returns the log line."""
    plan = plan_compute_threads(comm.local_size, comm.local_core_count(), len(own_cores()))
    apply_thread_plan(plan)
    threads = blas_threads()
    count = "no BLAS library loaded" if threads is None else f"{threads} BLAS thread{'s' if threads != 1 else ''}"
    kernels = kernel_threads()
    return f"Compute threads per rank: {count}, {kernels} kernel thread{'s' if kernels != 1 else ''} ({plan.reason})"


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
    return DataThreadPlan(threads, f"{local_cores} cores shared by {local_ranks} ranks on this machine, at low "
                                   f"priority beside compute; set {DATA_THREAD_VARIABLE} to choose")


def data_threads(environ: Mapping[str, str] | None = None) -> int:
    """The thread count of each data layer of this process (see the module docstring)."""
    return plan_data_threads(1, 0, len(own_cores()), environ).threads


def yield_cores_to_compute() -> None:
    """Lower the calling thread's scheduling priority so that it runs on cores compute leaves idle
    (Linux only: there a thread has a nice value of its own; elsewhere this does nothing)."""
    if not sys.platform.startswith("linux"):
        return
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), DATA_THREAD_NICENESS)
    except OSError:
        pass  # not permitted in this sandbox or container: the thread keeps its priority
