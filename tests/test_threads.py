"""Compute threads: each rank's share of the cores, a user's own setting winning, data threads yielding."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from netdef.threads import (KERNEL_SPIN, CpuSample, LoadAwareThreads, ThreadPlan, cgroup_cpu_limit, data_threads,
                            kernel_threads, let_idle_blas_threads_sleep, let_idle_kernel_threads_sleep, others_busy_cores,
                            own_cores, plan_compute_threads, plan_data_threads, prepare_kernel_pool, sample_cpu, set_kernel_threads,
                            threads_beside)


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


def test_one_process_takes_its_cores_and_follows_the_load():
    plan = plan_compute_threads(1, 8, 8, environ={})
    assert plan == ThreadPlan(8, "the 8 cores this process may run on, fewer while other processes keep cores busy"
                                 "; set OMP_NUM_THREADS to choose", 8, adapts_to_load=True)
    assert not plan_compute_threads(1, 1, 1, environ={}).adapts_to_load  # one thread: nothing to lower


def test_a_cpu_quota_bounds_every_pool_and_the_log_says_so():
    plan = plan_compute_threads(1, 16, 16, environ={}, quota_cores=2)
    assert (plan.threads, plan.kernel_threads) == (2, 2) and "a CPU quota of 2 (cgroup)" in plan.reason
    assert plan_compute_threads(2, 16, 16, environ={}, quota_cores=4).threads == 4   # 8 each, the quota 4
    assert plan_compute_threads(1, 2, 2, environ={}, quota_cores=8).threads == 2     # a loose quota changes nothing
    assert plan_compute_threads(1, 16, 16, environ={"OMP_NUM_THREADS": "3"}, quota_cores=2).kernel_threads == 3


@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"])
def test_a_thread_count_from_the_user_wins(variable):
    plan = plan_compute_threads(2, 2, 2, environ={variable: "2"})
    assert plan == ThreadPlan(None, f"{variable}=2 from the environment", kernel_threads=2)
    # An empty variable is no choice.
    assert plan_compute_threads(2, 2, 2, environ={variable: ""}).threads == 1


def test_the_compiled_kernels_get_the_same_share():
    assert plan_compute_threads(2, 16, 16, environ={}).kernel_threads == 8
    assert plan_compute_threads(1, 16, 16, environ={}).kernel_threads == 16
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
def test_data_threads_run_at_the_process_priority():
    """Not lower: beside busy processes a thread at nice 19 holding the GIL or the next batch stalls
    training (threads.py)."""
    from netdef.data.workers import DataWorkers

    def niceness(_):
        time.sleep(0.05)  # so that every thread of the pool takes an item
        return threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    workers = DataWorkers(3)
    try:
        seen = dict(workers.map(niceness, range(6)))
    finally:
        workers.close()
    assert len(seen) >= 2 and set(seen.values()) == {os.getpriority(os.PRIO_PROCESS, threading.get_native_id())}


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


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_cgroup_v2_quota_is_read_rounded_up_to_whole_cores(tmp_path):
    assert cgroup_cpu_limit(str(tmp_path), membership="0::/\n") is None                 # no cgroup files
    _write(tmp_path / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(str(tmp_path), membership="0::/\n") is None                 # no quota
    _write(tmp_path / "cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(str(tmp_path), membership="0::/\n") == 2                    # 1.5 cores: 2 threads
    _write(tmp_path / "cpu.max", "50000 100000\n")
    assert cgroup_cpu_limit(str(tmp_path), membership="0::/\n") == 1
    # The tightest of the process's group and those above it.
    _write(tmp_path / "cpu.max", "max 100000\n")
    _write(tmp_path / "kubepods" / "cpu.max", "300000 100000\n")
    _write(tmp_path / "kubepods" / "pod1" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(str(tmp_path), membership="0::/kubepods/pod1\n") == 3


def test_the_cgroup_v1_quota_is_read_from_the_cpu_controller(tmp_path):
    group = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    _write(group / "cpu.cfs_quota_us", "-1\n")
    _write(group / "cpu.cfs_period_us", "100000\n")
    membership = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n"
    assert cgroup_cpu_limit(str(tmp_path), membership=membership) is None
    _write(group / "cpu.cfs_quota_us", "400000\n")
    assert cgroup_cpu_limit(str(tmp_path), membership=membership) == 4
    # Without a cgroup namespace the container's own group is mounted at the controller's root.
    _write(tmp_path / "cpu" / "cpu.cfs_quota_us", "200000\n")
    _write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(str(tmp_path), membership="4:cpu:/docker/other\n") == 2


def test_threads_fit_on_the_cores_other_processes_leave():
    assert threads_beside(2, 2, 0.0) == 2
    assert threads_beside(2, 2, 0.3) == 2        # a moment's work of others is no busy core
    assert threads_beside(2, 2, 0.7) == 1        # `yes` beside 2 threads gets 2/3 of a core
    assert threads_beside(2, 2, 2.0) == 1        # never fewer than one
    assert threads_beside(8, 16, 4.0) == 8       # never more than the plan's
    assert threads_beside(16, 16, 4.0) == 12


def test_others_busy_time_is_the_cores_busy_time_less_this_process(tmp_path):
    assert others_busy_cores(CpuSample(0.0, 10.0, 1.0), CpuSample(2.0, 13.0, 2.0)) == pytest.approx(1.0)
    assert others_busy_cores(CpuSample(0.0, 10.0, 1.0), CpuSample(2.0, 10.5, 2.0)) == 0.0  # tick rounding
    stat = tmp_path / "stat"
    _write(stat, "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 3 100 4 5 6 7 0 0\ncpu1 10 0 0 100 0 0 0 0 0 0\nintr 5\n")
    ticks = os.sysconf("SC_CLK_TCK")
    assert sample_cpu({0}, str(stat)).busy == pytest.approx((1 + 2 + 3 + 5 + 6 + 7) / ticks)
    assert sample_cpu({0, 1}, str(stat)).busy == pytest.approx(34 / ticks)
    assert sample_cpu({0}, str(tmp_path / "absent")) is None


def test_the_first_count_comes_from_the_load(tmp_path):
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    _write(stat, "cpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n")
    before = kernel_threads()
    load = LoadAwareThreads(2, cores={0, 1}, stat_path=str(stat))
    try:
        _write(stat, f"cpu0 {10 * ticks} 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n")  # far more than the window
        assert "1 of 2: other processes kept" in load.settle() and kernel_threads() == 1 == load.in_effect
    finally:
        set_kernel_threads(before)


def test_another_count_is_tried_and_kept_only_when_its_iterations_are_faster(tmp_path):
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba's pool has one thread")
    stat = tmp_path / "stat"
    _write(stat, "cpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n")
    before = kernel_threads()
    load = LoadAwareThreads(2, interval_s=0.0, cores={0, 1}, stat_path=str(stat))
    load.MIN_ITERATIONS = 5

    def iterations(count, seconds):
        changed = []
        for _ in range(count):
            load.resume()
            time.sleep(seconds[load.in_effect])
            changed.append(load.poll())
        return changed

    try:
        assert load.settle().startswith("2 of 2") and load.in_effect == 2
        probe = load.PROBE_ITERATIONS
        # 5 iterations at 2 threads, then 1 thread is tried for 5, then 2 again for 5: 1 is slower, 2 stay.
        assert iterations(5, {2: 0.01, 1: 0.03}) == [False] * 5 and load.in_effect == 1
        assert iterations(probe, {2: 0.01, 1: 0.03}) == [False] * probe and load.in_effect == 2 == kernel_threads()
        assert iterations(probe, {2: 0.01, 1: 0.03}) == [False] * probe and load.threads == 2 == load.in_effect
        assert kernel_threads() == 2
        # Now 1 thread runs faster (another process took a core): tried, and kept; tried after twice the
        # iterations, since the last try of 1 thread lost and the load (the stat file) reads as it did.
        assert not any(iterations(2 * 5, {2: 0.03, 1: 0.01})) and load.in_effect == 1
        assert not any(iterations(probe, {2: 0.03, 1: 0.01})) and load.in_effect == 2
        assert iterations(probe, {2: 0.03, 1: 0.01}) == [False] * (probe - 1) + [True]
        assert load.threads == 1 == kernel_threads()
        # A burst of other work slowed the iterations before the probe of 2 threads, and was gone after
        # it: 2 beat the iterations before, not those after, and 1 thread stays.
        assert not any(iterations(5, {1: 0.04, 2: 0.02})) and load.in_effect == 2
        assert not any(iterations(probe, {1: 0.04, 2: 0.02})) and load.in_effect == 1
        assert not any(iterations(probe, {1: 0.01, 2: 0.02})) and load.threads == 1 == kernel_threads()
    finally:
        set_kernel_threads(before)


def test_a_count_that_keeps_losing_is_tried_less_and_less_often_until_the_load_changes(tmp_path):
    """Each lost probe costs its iterations at the worse count: in an unchanged load the next waits twice
    as long, up to MAX_BACKOFF intervals; a change in what the load suggests is tried at the next look."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba's pool has one thread")
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    _write(stat, "cpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n")
    before = kernel_threads()
    interval = 0.02
    load = LoadAwareThreads(2, interval_s=interval, cores={0, 1}, stat_path=str(stat))
    load.MIN_ITERATIONS = 5
    started = time.monotonic()
    busy_from = None  # from then on another process keeps core 0 busy (its ticks written as time passes)
    probes = []       # when each probe began

    def run(seconds_total):
        end = time.monotonic() + seconds_total
        while time.monotonic() < end:
            if busy_from is not None:
                busy = int((time.monotonic() - busy_from) * ticks * 3)  # far more than a core: others busy
                _write(stat, f"cpu0 {busy} 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n")
            was_probing = load.in_effect != load.threads
            load.resume()
            time.sleep({2: 0.002, 1: 0.006}[load.in_effect])  # 1 thread always loses in the quiet load
            load.poll()
            if load.in_effect != load.threads and not was_probing:
                probes.append(time.monotonic() - started)

    try:
        assert load.settle().startswith("2 of 2")
        run(2.0)
        assert load.threads == 2 and len(probes) >= 4
        gaps = [b - a for a, b in zip(probes, probes[1:])]
        # Without the back-off a probe came every interval plus its 10 iterations (about 0.06 s here).
        assert gaps[-1] > 4 * gaps[0] and len(probes) < 2.0 / (4 * interval), gaps
        assert load.MAX_BACKOFF * interval >= max(gaps) - 0.1
        # Another process takes a core: the load now suggests 1 thread, which is tried without waiting.
        busy_from, quiet_probes = time.monotonic(), len(probes)
        run(6 * interval + 0.1)
        assert len(probes) > quiet_probes and probes[quiet_probes] - (busy_from - started) < 4 * interval + 0.1
    finally:
        set_kernel_threads(before)


def test_omp_num_threads_1_leaves_the_kernels_pool_at_one_thread():
    # What `netdef train` does on one process, in a fresh one (numba starts its pool once).
    code = ("import numpy as np\n"
            "from netdef.comm.communicator import Communicator\n"
            "from netdef.threads import share_cores, kernel_threads, blas_threads\n"
            "from netdef.layers.jit import elementwise\n"
            "line, load = share_cores(Communicator())\n"
            "print(kernel_threads(), blas_threads(), load)\n"
            "print(line)\n")
    printed = _output_of_fresh_process(code, "OMP_NUM_THREADS", "1", also_unset=("NUMBA_NUM_THREADS",)).splitlines()
    assert printed[0].split() == ["1", "1", "None"]
    assert printed[1] == ("Compute threads: 1 BLAS thread, 1 kernel thread (OMP_NUM_THREADS=1 from the environment)")


def test_the_users_omp_num_threads_sizes_the_kernels_pool_in_any_program():
    env = {"OMP_NUM_THREADS": "1"}
    prepare_kernel_pool(env)
    assert env["NUMBA_NUM_THREADS"] == "1"
    env = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "2"}  # numba's own variable wins
    prepare_kernel_pool(env)
    assert env["NUMBA_NUM_THREADS"] == "2"
    env = {}
    prepare_kernel_pool(env)
    assert "NUMBA_NUM_THREADS" not in env
    # A pycaffe script: no `netdef train`, the pool itself has one thread.
    code = ("import netdef\n"
            "from netdef.layers.jit import elementwise\n"
            "import numba\n"
            "print(numba.config.NUMBA_NUM_THREADS, numba.get_num_threads())\n")
    assert _output_of_fresh_process(code, "OMP_NUM_THREADS", "1", also_unset=("NUMBA_NUM_THREADS",)).split() == ["1", "1"]


# Two inner products, the second's input gradient (64 x 500 by 500 x 800) large enough to be cut into
# panels for the kernels' threads (layers/matmul.py).
_PANELLED_NET = """name: "panelled"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 64 dim: 800 } shape { dim: 64 }
                     data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 3 } } }
layer { name: "ip0" type: "InnerProduct" bottom: "data" top: "ip0"
  inner_product_param { num_output: 800 weight_filler { type: "xavier" } } }
layer { name: "ip1" type: "InnerProduct" bottom: "ip0" top: "ip1"
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo), empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_the_thread_count_in_effect_changes_no_bit_of_a_seeded_run(tmp_path):
    """``LoadAwareThreads`` moves the count that runs the kernels; the work stays cut for the plan's count
    (``partition_width``), so three seeded iterations end with the same weights on 1 thread as on 2.
    The control: cutting the work for 1 thread instead changes them, so the check can fail."""
    (tmp_path / "net.prototxt").write_text(_PANELLED_NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0.1 momentum: 0.9 weight_decay: 0.001 lr_policy: "fixed" max_iter: 3 '
        'display: 0 random_seed: 7 solver_mode: CPU snapshot_prefix: "s"')
    code = ("import hashlib, os, sys\n"
            "os.chdir(sys.argv[1])\n"
            "import netdef\n"
            "from netdef.threads import set_kernel_threads, set_partition_width\n"
            "for threads, width in ((1, 2), (2, 2), (1, 1)):\n"
            "    set_partition_width(width)\n"
            "    assert set_kernel_threads(threads) == threads\n"
            "    solver = netdef.get_solver('solver.prototxt')\n"
            "    solver.step(3)\n"
            "    digest = hashlib.sha256()\n"
            "    for blob in solver.net.params['ip0'] + solver.net.params['ip1']:\n"
            "        digest.update(blob.data.tobytes())\n"
            "    print(threads, width, digest.hexdigest())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    env["NUMBA_NUM_THREADS"] = "2"  # a pool of two threads even on a one-core machine
    # The control needs products whose bits depend on where the panels are cut. With OpenBLAS's AVX-512
    # kernels (SkylakeX, chosen on an AMD EPYC here) both cuts gave the same bits, so the run takes its
    # AVX2 kernels (Haswell's) wherever the CPU has AVX2, as on the machines this was written on.
    if {"avx2", "fma"} <= _cpu_flags():
        env["OPENBLAS_CORETYPE"] = "Haswell"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = {tuple(line.split()[:2]): line.split()[2] for line in done.stdout.splitlines()}
    assert runs[("1", "2")] == runs[("2", "2")]
    assert runs[("1", "1")] != runs[("2", "2")]  # the control: another cut, other bits


def test_one_process_follows_the_load_and_says_so():
    code = ("from netdef.comm.communicator import Communicator\n"
            "from netdef.threads import share_cores\n"
            "from netdef.layers.jit import elementwise\n"
            "line, load = share_cores(Communicator())\n"
            "print(type(load).__name__)\n"
            "print(line)\n")
    printed = _output_of_fresh_process(code, "OMP_NUM_THREADS", None,
                                       also_unset=("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                                   "BLIS_NUM_THREADS")).splitlines()
    if len(own_cores()) == 1:  # one core: nothing to follow, nothing said
        assert printed[0] == "NoneType"
    else:
        assert printed[0] == "LoadAwareThreads"
        assert "tried again every 2 s against the iterations' times" in printed[1]
