"""Launch detection from the environment, and the communicator a plain process gets."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from netdef.comm.communicator import Communicator, create_communicator, set_library_defaults
from netdef.comm.launch import LaunchInfo, detect_launch, wants_mpi


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"PMI_RANK": "2", "PMI_SIZE": "4"}, LaunchInfo(2, 4, "Hydra/PMI")),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3", "PMIX_RANK": "1"}, LaunchInfo(1, 3, "Open MPI")),
    ({"PMIX_RANK": "0", "PMIX_SIZE": "2"}, LaunchInfo(0, 2, "PMIx")),
    ({"MV2_COMM_WORLD_RANK": "5", "MV2_COMM_WORLD_SIZE": "8"}, LaunchInfo(5, 8, "MVAPICH")),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, LaunchInfo(3, 4, "Slurm srun")),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "2"},
     LaunchInfo(1, 2, "Slurm srun")),
    # An sbatch script is not a rank: no job step.
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None),
    ({"SLURM_STEP_ID": "batch", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "NETDEF_MPI": "0"}, None),
    ({"NETDEF_MPI": "1"}, LaunchInfo(0, 0, "NETDEF_MPI=1")),
    ({"PMI_RANK": "x", "PMI_SIZE": "2"}, None),
])
def test_detect_launch(env, expected):
    assert detect_launch(env) == expected


def test_wants_mpi_only_for_several_processes():
    assert not wants_mpi({})
    assert not wants_mpi({"PMI_RANK": "0", "PMI_SIZE": "1"})  # mpiexec -n 1
    assert wants_mpi({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert wants_mpi({"NETDEF_MPI": "1"})


def test_plain_process_gets_single_communicator_without_importing_mpi4py(monkeypatch):
    for name in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMIX_SIZE",
                 "SLURM_STEP_ID", "SLURM_STEPID", "NETDEF_MPI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "mpi4py", raising=False)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    comm = create_communicator()
    assert type(comm) is Communicator and comm.rank == 0 and comm.size == 1
    assert "mpi4py.MPI" not in sys.modules


def test_single_communicator_collectives_are_identity():
    comm = Communicator()
    a = np.arange(6, dtype=np.float32)
    comm.broadcast(a)
    comm.allreduce(a)
    requests = [comm.iallreduce(a), comm.iallreduce(a)]
    assert comm.test_some(requests) == [0, 1] and requests == [None, None]
    np.testing.assert_array_equal(a, np.arange(6, dtype=np.float32))
    assert comm.gather_bytes(b"xy") == [b"xy"]
    assert comm.broadcast_int(7) == 7


def test_missing_mpi4py_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpi4py(name, *args, **kwargs):
        if name.startswith("mpi4py"):
            raise ImportError("No module named 'mpi4py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpi4py)
    from netdef.comm.communicator import CommunicatorError

    with pytest.raises(CommunicatorError, match=r"rank 1 of 2.*netdef-trainer\[mpi\]"):
        create_communicator(launch=LaunchInfo(1, 2, "Hydra/PMI"))


def test_library_defaults_set_before_mpi_starts_and_the_users_win():
    environ = {"OMPI_MCA_btl_tcp_eager_limit": "65536"}
    set_library_defaults(environ)
    assert environ["OMPI_MCA_btl_tcp_eager_limit"] == "65536"          # the user's value stays
    assert environ["OMPI_MCA_btl_tcp_max_send_size"] == str(1 << 20)   # Open MPI's TCP: chunks go eagerly
    assert "MPIR_CVAR_ASYNC_PROGRESS" not in environ
    set_library_defaults(environ, async_progress=True)
    assert environ["MPIR_CVAR_ASYNC_PROGRESS"] == "1"
