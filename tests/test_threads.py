"""Compute threads: each rank's share of the cores, a user's own setting winning, data threads yielding."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from netdef.threads import (KERNEL_SPIN, ThreadPlan, data_threads, kernel_threads, let_idle_blas_threads_sleep, let_idle_kernel_threads_sleep, own_cores,
                            plan_compute_threads, plan_data_threads, set_kernel_threads, yield_cores_to_compute)


def test_ranks_share_the_cores_of_their_machine():
    assert plan_compute_threads(2, 2, 2, environ={}).threads == 1
    assert plan_compute_threads(4, 16, 16, environ={}).threads == 4
    assert plan_compute_threads(3, 16, 16, environ={}).threads == 5   # the remainder stays idle
    assert plan_compute_threads(8, 2, 2, environ={}).threads == 1     # oversubscribed: never fewer than 1


def test_a_rank_bound_to_fewer_cores_than_its_share_uses_those():
    # Open MPI binds each rank to a core by default: 16 cores, 4 ranks, each may run on 1.
    assert plan_compute_threads(4, 16, 1, environ={}).threads == 1
    # taskset -c 0-3 mpiexec -n 4: every rank may run on the same 4 cores.
    assert plan_compute_threads(4, 4, 4, environ={}).threads == 1


def test_data_threads_take_the_ranks_share_unless_the_user_chose():
    assert plan_data_threads(1, 16, 16, environ={}).threads == 16    # one process: every core it may use
    assert plan_data_threads(4, 16, 16, environ={}).threads == 4     # four ranks on a 16-core machine
    assert plan_data_threads(4, 16, 1, environ={}).threads == 1      # a rank bound to one core
    assert plan_data_threads(8, 2, 2, environ={}).threads == 1
    plan = plan_data_threads(4, 16, 16, environ={"NETDEF_DATA_THREADS": "12"})
    assert plan.threads == 12 and "NETDEF_DATA_THREADS=12" in plan.reason
    assert data_threads(environ={}) == len(own_cores())
    with pytest.raises(ValueError, match="NETDEF_DATA_THREADS='0': expected a positive number of threads"):
        data_threads(environ={"NETDEF_DATA_THREADS": "0"})


def test_each_rank_tells_its_data_layers_their_share(monkeypatch):
    from netdef.threads import share_data_cores

    class FourRanksOnThisMachine:  # what share_data_cores asks of a Communicator
        local_size = 4

        @staticmethod
        def local_core_count():
            return 4 * len(own_cores())

    monkeypatch.delenv("NETDEF_DATA_THREADS", raising=False)
    line = share_data_cores(FourRanksOnThisMachine())
    assert os.environ["NETDEF_DATA_THREADS"] == str(len(own_cores()))
    assert line.startswith(f"Data threads per data layer: {len(own_cores())} (") and "4 ranks" in line


def test_one_process_keeps_the_library_default():
    plan = plan_compute_threads(1, 8, 8, environ={})
    assert plan.threads is None and "default" in plan.reason


@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"])
def test_a_thread_count_from_the_user_wins(variable):
    plan = plan_compute_threads(2, 2, 2, environ={variable: "2"})
    assert plan == ThreadPlan(None, f"{variable}=2 from the environment", kernel_threads=2)
    # An empty variable is no choice.
    assert plan_compute_threads(2, 2, 2, environ={variable: ""}).threads == 1


def test_the_compiled_kernels_get_the_same_share():
    assert plan_compute_threads(2, 16, 16, environ={}).kernel_threads == 8
    assert plan_compute_threads(1, 16, 16, environ={}).kernel_threads is None   # numba's default: every core
    # The user's BLAS/OpenMP count holds for the kernels too, unless numba's own variable is set.
    assert plan_compute_threads(2, 16, 16, environ={"OMP_NUM_THREADS": "3"}).kernel_threads == 3
    assert plan_compute_threads(2, 16, 16, environ={"OMP_NUM_THREADS": "3,2"}).kernel_threads == 3
    assert plan_compute_threads(2, 16, 16, environ={"OMP_NUM_THREADS": "x"}).kernel_threads is None
    env = {"OMP_NUM_THREADS": "3", "NUMBA_NUM_THREADS": "5"}
    assert plan_compute_threads(2, 16, 16, environ=env).kernel_threads is None
    assert plan_compute_threads(2, 16, 16, environ={"NUMBA_NUM_THREADS": "5"}) == ThreadPlan(
        8, "16 cores shared by 2 ranks on this machine; set OMP_NUM_THREADS to choose", None)


def test_setting_the_kernel_threads_takes_effect_and_is_capped_by_the_pool():
    import numba

    before = kernel_threads()
    try:
        assert set_kernel_threads(1) == 1 and kernel_threads() == 1
        assert set_kernel_threads(10 ** 6) == numba.config.NUMBA_NUM_THREADS == kernel_threads()
    finally:
        set_kernel_threads(before)


def test_own_cores_are_this_process_affinity():
    cores = own_cores()
    assert cores and all(isinstance(c, int) for c in cores)
    if hasattr(os, "sched_getaffinity"):
        assert cores == set(os.sched_getaffinity(0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread has its own nice value only on Linux")
def test_a_data_thread_yields_to_compute_and_the_rest_of_the_process_does_not():
    seen = {}

    def body():
        yield_cores_to_compute()
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert seen["thread"] == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def _output_of_fresh_process(code: str, variable: str, user: str | None, also_unset: tuple = ()) -> str:
    """What ``python -c code`` prints in a fresh process whose environment holds ``variable`` only when
    the user set it (``user``), and none of ``also_unset``; the process must succeed."""
    env = {k: v for k, v in os.environ.items() if k != variable and k not in also_unset}
    if user:
        env[variable] = user
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_idle_kernel_threads_spin_briefly_unless_the_user_chose():
    env = {}
    let_idle_kernel_threads_sleep(env)
    assert env == {KERNEL_SPIN[0]: KERNEL_SPIN[1]}
    for chosen in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"}):
        env = dict(chosen)
        let_idle_kernel_threads_sleep(env)
        assert env == chosen
    env = {"OMP_WAIT_POLICY": " "}  # blank: not a choice
    let_idle_kernel_threads_sleep(env)
    assert env["GOMP_SPINCOUNT"] == KERNEL_SPIN[1]


@pytest.mark.parametrize("user", [None, "100"])
def test_the_spin_count_is_set_before_the_kernels_pool_starts(user):
    # A fresh process: libgomp reads the variable when numba first starts its pool.
    code = ("import os, numpy as np\n"
            "from netdef.layers.jit import elementwise\n"
            "import numba\n"
            "numba.njit(parallel=True)(lambda a: a.sum())(np.ones(4))\n"
            "print(os.environ['GOMP_SPINCOUNT'], os.environ.get('OMP_WAIT_POLICY', 'unset'), numba.threading_layer())\n")
    printed = _output_of_fresh_process(code, "GOMP_SPINCOUNT", user, also_unset=("OMP_WAIT_POLICY",)).split()
    assert printed[:2] == [user or KERNEL_SPIN[1], "unset"]


def test_idle_blas_threads_sleep_unless_the_user_chose():
    env = {}
    let_idle_blas_threads_sleep(env)
    assert env == {"OPENBLAS_THREAD_TIMEOUT": "18"}
    env = {"OPENBLAS_THREAD_TIMEOUT": "28"}
    let_idle_blas_threads_sleep(env)
    assert env == {"OPENBLAS_THREAD_TIMEOUT": "28"}


@pytest.mark.parametrize("user", [None, "28"])
def test_importing_netdef_sets_the_blas_wait_before_numpy_loads(user):
    # OpenBLAS reads the variable once, when NumPy loads it: a finder notes its value at that moment.
    code = ("import os, sys\n"
            "class Watch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'numpy':\n"
            "            print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))\n"
            "sys.meta_path.insert(0, Watch())\n"
            "import netdef\n")
    assert _output_of_fresh_process(code, "OPENBLAS_THREAD_TIMEOUT", user).split() == [user or "18"]
