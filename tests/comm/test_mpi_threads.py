"""Real MPI runs: each rank takes its share of the machine's cores for BLAS unless the user chose."""
from __future__ import annotations

import os

import pytest

from tests.comm.fixtures import mpi_available, run_netdef, write_case

AVAILABLE, WHY_NOT = mpi_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)

NO_USER_CHOICE = {"OMP_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": None, "MKL_NUM_THREADS": None,
                  "NUMBA_NUM_THREADS": None}


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def test_ranks_share_the_cores_by_default(tmp_path):
    solver = write_case(tmp_path, "threads", batch=4, max_iter=2)
    done = run_netdef(["train", str(solver)], 2, tmp_path, env=NO_USER_CHOICE)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    share = max(1, cores() // 2)
    if share == 1:
        expected = (f"1 BLAS thread, 1 kernel thread ({cores()} cores shared by 2 ranks on this machine; "
                    f"set OMP_NUM_THREADS to choose)")
        assert f"Compute threads per rank: {expected}" in log
    else:  # a share of several threads starts from the load (threads.LoadAwareThreads)
        assert "Compute threads per rank: " in log
        assert (f" of {share}: other processes kept " in log and f"; {cores()} cores shared by 2 ranks on this "
                f"machine, fewer while other processes keep cores busy; set OMP_NUM_THREADS to choose)" in log)


def test_the_users_thread_count_wins(tmp_path):
    solver = write_case(tmp_path, "threads", batch=4, max_iter=2)
    done = run_netdef(["train", str(solver)], 2, tmp_path, env=dict(NO_USER_CHOICE, OMP_NUM_THREADS="2"))
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    threads = min(2, cores())  # OpenBLAS starts no more threads than there are cores
    plural = "s" if threads != 1 else ""
    assert (f"Compute threads per rank: {threads} BLAS thread{plural}, {threads} kernel thread{plural} "
            f"(OMP_NUM_THREADS=2 from the environment)") in log
