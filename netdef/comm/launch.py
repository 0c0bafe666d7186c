"""Was this process started by an MPI launcher, and as which rank of how many?

netdef launches nothing itself: ``mpiexec``/``mpirun`` (MPICH's Hydra, Open MPI, Intel MPI, MVAPICH)
or Slurm's ``srun`` start the processes and say so in the environment. Reading the environment first
keeps a plain ``netdef train`` from importing mpi4py (and initializing an MPI library) at all; once
these variables say that several processes were launched, MPI itself is the authority on rank and
size (``netdef.comm.communicator.create_communicator``).

``NETDEF_MPI=0`` forces a single process run (under a launcher too: every rank then trains alone);
``NETDEF_MPI=1`` forces the use of MPI (e.g. a launcher this module does not know, or a singleton
``MPI_Init`` for debugging).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What the launcher's environment says: ``rank`` of ``size`` processes, started by ``launcher``."""

    rank: int
    size: int
    launcher: str


# (launcher, rank variable, size variable), most specific first. Slurm comes last: an ``sbatch``
# script sees SLURM_NTASKS too, but only processes started by ``srun`` (a job step) are ranks.
_KNOWN = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("MVAPICH", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),
    ("PMIx", "PMIX_RANK", "PMIX_SIZE"),
    ("Hydra/PMI", "PMI_RANK", "PMI_SIZE"),
    ("Cray PALS", "PALS_RANKID", "PALS_SIZE"),
)


def _int(environ: Mapping[str, str], name: str) -> int | None:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None


def detect_launch(environ: Mapping[str, str] | None = None) -> LaunchInfo | None:
    """The launch the environment describes, or None when it describes none (or ``NETDEF_MPI=0``).

    With ``NETDEF_MPI=1`` and no launcher variables, rank and size are unknown until MPI starts:
    the result then says rank 0 of size 0.
    """
    env = os.environ if environ is None else environ
    forced = env.get("NETDEF_MPI", "").strip().lower()
    if forced in ("0", "no", "off", "false"):
        return None
    for launcher, rank_var, size_var in _KNOWN:
        rank, size = _int(env, rank_var), _int(env, size_var)
        if rank is not None and size is not None:
            return LaunchInfo(rank, size, launcher)
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    if step is not None and step != "batch":
        rank = _int(env, "SLURM_PROCID")
        size = _int(env, "SLURM_STEP_NUM_TASKS")
        size = _int(env, "SLURM_NTASKS") if size is None else size
        if rank is not None and size is not None:
            return LaunchInfo(rank, size, "Slurm srun")
    if forced in ("1", "yes", "on", "true"):
        return LaunchInfo(0, 0, "NETDEF_MPI=1")
    return None


def wants_mpi(environ: Mapping[str, str] | None = None) -> bool:
    """True when MPI should be initialized: launched as one of several processes, or forced."""
    info = detect_launch(environ)
    return info is not None and info.size != 1
