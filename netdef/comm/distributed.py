"""Data-parallel training over MPI: building the solver, its options, and the failure guard.

``create_solver(path, comm)`` returns the solver the file asks for (SGD, Adam...) holding a
``DataParallel`` (``data_parallel.py``) as its parallel seam: the Solver calls it at fixed points
and knows nothing else of MPI. It also starts the communicator's stall watchdog (``watchdog.py``). Every rank runs the same program (``mpiexec -n 4 netdef train
solver.prototxt``); only rank 0 logs (``netdef train`` quiets the others to warnings and errors).

Failures: ``netdef train`` runs each rank inside ``run_guarded``: an exception prints the rank's
traceback and calls ``MPI_Abort``, so the launcher ends every rank within seconds instead of leaving
them waiting in a collective; a rank killed outright makes the launcher end the job too. A script
using this API should do the same (``run_guarded(comm, main)``, or ``python -m mpi4py script.py``).
"""
from __future__ import annotations

import logging
import math
import sys
import traceback

from ..proto import netdef_pb2 as pb
from ..solver.solver import Solver, get_solver, read_solver_param
from .agreement import RanksDisagreeError
from .communicator import Communicator, create_communicator
from .data_parallel import DataParallel
from .exchange import ExchangeOptions, exchange_class
from .progress import mode_name

logger = logging.getLogger("netdef")


# ============================================================================================== options
def options_from(param: pb.SolverParameter, *, exchange: str | None = None, overlap: bool | None = None,
                 bucket_bytes: int | None = None, progress: str | None = None,
                 timeline: str | None = None, schedule: str | None = None, chunk_bytes: int | None = None,
                 credit_bytes: int | None = None, multicolor_colors: int | None = None, tau: int | None = None,
                 alpha: float | None = None, beta: float | None = None, group_size: int | None = None,
                 gossip_probability: float | None = None, stall_warning_s: float | None = None,
                 stall_abort_s: float | None = None) -> ExchangeOptions:
    """The solver file's ``netdef_distributed`` settings with the given (command line) overrides."""
    d = param.netdef_distributed
    options = ExchangeOptions(exchange=d.exchange, overlap=d.overlap, bucket_bytes=int(d.bucket_bytes),
                              progress=mode_name(d.progress), timeline=d.timeline, schedule=d.schedule,
                              chunk_bytes=int(d.chunk_bytes), credit_bytes=int(d.credit_bytes),
                              multicolor_colors=int(d.multicolor_colors), tau=int(d.tau),
                              alpha=float(d.alpha), beta=float(d.beta), group_size=int(d.group_size),
                              gossip_probability=float(d.gossip_probability),
                              stall_warning_s=float(d.stall_warning_seconds), stall_abort_s=float(d.stall_abort_seconds))
    _override_asynchronous(options, tau=tau, alpha=alpha, beta=beta, group_size=group_size,
                           gossip_probability=gossip_probability)
    if schedule is not None:
        options.schedule = schedule
    if chunk_bytes is not None:
        options.chunk_bytes = int(chunk_bytes)
    if credit_bytes is not None:
        options.credit_bytes = int(credit_bytes)
    if options.schedule not in ("fifo", "priority"):
        raise ValueError(f"netdef_distributed.schedule must be fifo or priority, got {options.schedule!r}")
    if options.chunk_bytes < 0 or options.credit_bytes < 0:
        raise ValueError("netdef_distributed.chunk_bytes and credit_bytes must not be negative")
    if multicolor_colors is not None:
        if multicolor_colors < 0:
            raise ValueError(f"--colors must not be negative (0: chosen from the rank count), got {multicolor_colors}")
        options.multicolor_colors = int(multicolor_colors)
    if exchange is not None:
        options.exchange = exchange
    if overlap is not None:
        options.overlap = bool(overlap)
    if bucket_bytes is not None:
        options.bucket_bytes = int(bucket_bytes)
    if progress is not None:
        options.progress = mode_name(progress)
    if timeline is not None:
        options.timeline = timeline
    if options.bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {options.bucket_bytes}")
    _override_stall_times(options, stall_warning_s, stall_abort_s)
    exchange_class(options.exchange)  # an unknown rule: a clear error before anything is built
    return options


def _override_asynchronous(options: ExchangeOptions, **given) -> None:
    """The asynchronous rules' settings from the command line, checked (the rules check how they combine)."""
    for name, value in given.items():
        if value is not None:
            setattr(options, name, type(getattr(options, name))(value))
    if options.tau < 1:
        raise ValueError(f"netdef_distributed.tau must be at least 1, got {options.tau}")
    if not 0 <= options.alpha < 1:
        raise ValueError(f"netdef_distributed.alpha must lie in [0, 1) (0: beta / participants), got {options.alpha}")
    if not 0 < options.beta <= 1:
        raise ValueError(f"netdef_distributed.beta must lie in (0, 1], got {options.beta}")
    if options.group_size < 1:
        raise ValueError(f"netdef_distributed.group_size must be at least 1, got {options.group_size}")
    if not 0 <= options.gossip_probability <= 1:
        raise ValueError(f"netdef_distributed.gossip_probability must lie in [0, 1], got {options.gossip_probability}")


def _override_stall_times(options: ExchangeOptions, warning_s: float | None, abort_s: float | None) -> None:
    """The stall watchdog's times from the command line, checked."""
    if warning_s is not None:
        options.stall_warning_s = float(warning_s)
    if abort_s is not None:
        options.stall_abort_s = float(abort_s)
    for name, value in (("stall_warning_seconds", options.stall_warning_s),
                        ("stall_abort_seconds", options.stall_abort_s)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"netdef_distributed.{name} must be a number of seconds >= 0 (0: off), got {value}")


def create_solver(solver, comm: Communicator | None = None, options: ExchangeOptions | None = None,
                  solver_file: str | None = None) -> Solver:
    """``get_solver`` for a distributed run: the solver class for the file's ``type``, with data
    parallelism over ``comm`` (default: ``create_communicator()``) as its parallel seam. ``options``
    default to the solver file's ``netdef_distributed``. The solver file is read once."""
    param, path = read_solver_param(solver)
    options = options or options_from(param)
    if comm is None:
        comm = create_communicator(async_progress=options.progress == "MPI_ASYNC")
    comm.watch_stalls(options.stall_warning_s, options.stall_abort_s)
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
