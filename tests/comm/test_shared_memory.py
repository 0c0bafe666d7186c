"""An aborted MPI job leaves no shared-memory file behind (issue 11, fault 11): MPICH creates one
``/dev/shm/mpich_shm_*`` per job and machine at MPI_Init and removes it in MPI_Finalize, which an
aborted job never reaches; netdef's abort path unlinks the job's own segments first."""
from __future__ import annotations

import os
import re

import pytest

from tests.comm.fixtures import mpi_available, run_python

AVAILABLE, WHY_NOT = mpi_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)

JOB = """
from netdef.comm.communicator import create_communicator, mapped_mpi_segments
comm = create_communicator()
print("segments", comm.rank, *mapped_mpi_segments(), flush=True)
comm.barrier()
if comm.rank == 1:
    comm.abort(3)
import time
time.sleep(30)
"""


def test_an_aborted_job_removes_its_segment(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    run = run_python(["job.py"], 2, tmp_path, timeout=60)
    assert run.returncode != 0
    segments = set(re.findall(r"/dev/shm/\S+", run.stdout))
    if not segments:
        pytest.skip("this MPI library maps no mpich_shm segment (not MPICH, or no shared memory transport)")
    assert not [s for s in segments if os.path.exists(s)], f"left behind: {segments}"
