"""pycaffe's module-level functions that have no other home in netdef: ``layer_type_list``, ``Timer``,
``init_log``/``log``, and the solver-count and NCCL functions, as ``netdef.<name>``.

netdef trains on one device per process; several devices are several MPI processes
(``mpiexec -n N netdef train SOLVER``), each one solver. So the multi-GPU functions that Caffe's
``tools/train.py`` calls give a single process's answers: ``solver_count()`` is 1, ``solver_rank()`` 0,
``has_nccl()`` False, and asking for more (``set_solver_count(4)``, ``NCCL(solver, uid)``) stops with
one line that says how netdef trains on several devices instead.
"""
from __future__ import annotations

import logging
import sys
import time

from . import logs
from .layers.base import registered_types

log = logging.getLogger(logs.LOGGER_NAME)

#: glog's severities by number (``init_log(level)``): INFO, WARNING, ERROR, FATAL.
_GLOG_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
_SEVERAL_PROCESSES = "netdef trains on several devices as MPI ranks, one solver each: mpiexec -n N netdef train SOLVER"


def layer_type_list() -> list[str]:
    """The registered layer type names, sorted (as Caffe's registry, a std::map, lists them)."""
    return registered_types()


class Timer:
    """pycaffe's ``caffe.Timer``: ``start()``, ``stop()``, and ``ms``, the milliseconds from the last
    start to the last stop. ``start`` on a running timer and ``stop`` on a stopped one do nothing;
    reading ``ms`` stops a running timer, and reads 0 (with a warning) before any start, as Caffe's."""

    def __init__(self):
        self._started = 0.0
        self._elapsed_s = 0.0
        self._running = False
        self._has_run = False

    def start(self) -> None:
        if not self._running:
            self._started = time.perf_counter()
            self._running = True
            self._has_run = True

    def stop(self) -> None:
        if self._running:
            self._elapsed_s = time.perf_counter() - self._started
            self._running = False

    @property
    def ms(self) -> float:
        if not self._has_run:
            log.warning("Timer has never been run before reading time.")
            return 0.0
        self.stop()
        return self._elapsed_s * 1000.0


def init_log(level: int = 0, stderr: bool = True) -> None:
    """pycaffe's ``caffe.init_log``: netdef's log to stderr in glog's format, from glog severity
    ``level`` up (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL). With ``stderr=False`` glog writes its messages
    to log files and only ERROR and above to stderr; netdef keeps no log files, so it shows just those."""
    if isinstance(level, bool) or level not in range(len(_GLOG_LEVELS)):
        raise ValueError(f"init_log: level must be a glog severity 0 (INFO) to 3 (FATAL), got {level!r}")
    threshold = _GLOG_LEVELS[level] if stderr else max(_GLOG_LEVELS[level], logging.ERROR)
    logs.configure(threshold, sys.stderr)


def log_message(message: str) -> None:
    """pycaffe's ``caffe.log``: ``message`` as an INFO line of netdef's log."""
    log.info("%s", message)


def solver_count() -> int:
    """How many solvers train together in this process: always 1 (module docstring)."""
    return 1


def solver_rank() -> int:
    """This process's solver among ``solver_count()``: always 0 (module docstring)."""
    return 0


def set_solver_count(count: int) -> None:
    """Accepts the one value a netdef process has, 1; any other count stops with how to train on several."""
    if count != 1:
        raise ValueError(f"set_solver_count({count!r}): a netdef process runs one solver; {_SEVERAL_PROCESSES}")


def set_solver_rank(rank: int) -> None:
    """Accepts rank 0, the only solver of a netdef process; any other rank stops as set_solver_count."""
    if rank != 0:
        raise ValueError(f"set_solver_rank({rank!r}): a netdef process runs solver 0 alone; {_SEVERAL_PROCESSES}")


def set_multiprocess(multiprocess: bool) -> None:
    """Accepts False (one process per solver set, netdef's only kind); True stops as set_solver_count."""
    if multiprocess:
        raise ValueError(f"set_multiprocess(True): netdef has no multi-GPU solver set; {_SEVERAL_PROCESSES}")


def has_nccl() -> bool:
    """Whether pycaffe's NCCL class can synchronize solvers in this process: never in netdef."""
    return False


class NCCL:
    """pycaffe's ``caffe.NCCL(solver, uid)``, which netdef has not (``has_nccl()`` is False): building
    one, or asking ``NCCL.new_uid()``, stops with the way netdef trains on several devices."""

    def __init__(self, solver=None, uid: str = ""):
        raise RuntimeError(f"caffe.NCCL: netdef has no NCCL solver synchronization (has_nccl() is False); "
                           f"{_SEVERAL_PROCESSES}")

    @staticmethod
    def new_uid() -> str:
        raise RuntimeError(f"caffe.NCCL.new_uid: netdef has no NCCL solver synchronization (has_nccl() is "
                           f"False); {_SEVERAL_PROCESSES}")
