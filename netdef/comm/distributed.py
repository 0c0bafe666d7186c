"""Data-parallel training over MPI: building the solver, its options, and the failure guard.

``create_solver(path, comm)`` returns the solver the file asks for (SGD, Adam...) holding a
``DataParallel`` (``data_parallel.py``) as its parallel seam: the Solver calls it at fixed points
and knows nothing else of MPI. Its options are the file's ``netdef_distributed`` (``options.py``);
it also starts the communicator's stall watchdog (``watchdog.py``). Every rank runs the same program
(``mpiexec -n 4 netdef train solver.prototxt``); only rank 0 logs (``netdef train`` quiets the others to
warnings and errors).

Failures: ``netdef train`` runs each rank inside ``run_guarded``: an exception prints the rank's
traceback and calls ``MPI_Abort``, so the launcher ends every rank within seconds instead of leaving
them waiting in a collective; a rank killed outright makes the launcher end the job too. A script
using this API should do the same (``run_guarded(comm, main)``, or ``python -m mpi4py script.py``).
"""
from __future__ import annotations

import logging
import sys
import traceback

from ..solver.solver import Solver, read_solver_param
from ..solver.solver_types import get_solver
from .agreement import RanksDisagreeError
from .communicator import Communicator, create_communicator
from .data_parallel import DataParallel
from .options import ExchangeOptions, options_from

logger = logging.getLogger("netdef")


def create_solver(solver, comm: Communicator | None = None, options: ExchangeOptions | None = None,
                  solver_file: str | None = None) -> Solver:
    """``get_solver`` for a distributed run: the solver class for the file's ``type``, with data
    parallelism over ``comm`` (default: ``create_communicator()``) as its parallel seam. ``options``
    default to the solver file's ``netdef_distributed``. The solver file is read once."""
    param, path = read_solver_param(solver)
    options = options or options_from(param)
    if comm is None:
        comm = create_communicator(async_progress=options.progress == "MPI_ASYNC")
    comm.watch_stalls(options.stall_warning_seconds, options.stall_abort_seconds)
    return get_solver(param, solver_file=path or solver_file, parallel=DataParallel(comm, options))


# ============================================================================================== failure
def run_guarded(comm: Communicator, fn, *args, debug: bool = False, **kwargs):
    """``fn(*args, **kwargs)``; when it raises in a run of several ranks, print one line naming this rank
    and the error to stderr (with the traceback before it when ``debug``) and abort the whole job
    (MPI_Abort), so that no rank waits forever in a collective for this one. With one rank the
    exception propagates. A RanksDisagreeError, raised by every rank alike, propagates on rank 0 only
    (one line for the job); the other ranks exit with status 1 silently."""
    if comm.size == 1:
        return fn(*args, **kwargs)
    try:
        return fn(*args, **kwargs)
    except RanksDisagreeError:
        # Every rank raised it at the same point: nobody waits, so no abort; rank 0 says it once.
        if comm.rank == 0:
            raise
        raise SystemExit(1) from None
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            raise
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) if debug else ""
        message = " ".join((str(exc) if not isinstance(exc, SystemExit) else str(exc.code)).split())
        sys.stderr.write(f"{detail}netdef: error: rank {comm.rank} of {comm.size} failed: {type(exc).__name__}: "
                         f"{message}; aborting all {comm.size} ranks\n")
        comm.abort(1)
        raise  # not reached
