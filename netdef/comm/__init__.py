"""Distributed data-parallel training over MPI (mpi4py).

``mpiexec -n 4 netdef train solver.prototxt`` runs four ranks, each on its own shard of the data,
exchanging gradients during backprop. The pieces, each replaceable on its own:

- ``launch``: was this process started by an MPI launcher (mpiexec/mpirun/srun)?
- ``communicator``: the few collectives training needs (``Communicator``; MPI or one process).
- ``exchange``: the exchange rule interface, its registry, and the synchronous bucketed allreduce.
- ``reduction``: the algorithm that sums a bucket or chunk (the MPI library's allreduce by default).
- the other exchange rules, one module each: ``multicolor`` (multi-colour trees over point-to-point),
  ``fp16`` (float16 messages over those trees), ``elastic`` (easgd, hybrid), ``gossip``; ``_builtin``
  is the one place that imports them so that they are registered (the registry does, on its first lookup).
- ``options``: the distributed options, each declared once (flag, check, agreement).
- ``progress``: who drives non-blocking exchanges forward (polling, a communication thread, MPI's
  own progress thread).
- ``timeline``: per-iteration measurements and the Chrome trace.
- ``data_parallel``: ``DataParallel``, the solver's parallel seam (``netdef.solver.parallel``) for N ranks.
- ``distributed``: ``create_solver`` (a solver holding a DataParallel), options, the failure guard.

Importing this package does not import mpi4py; ``create_communicator()`` does, and only when the
process was launched as one of several.
"""
from .communicator import (
    Communicator,
    CommunicatorError,
    MPICommunicator,
    SingleProcessCommunicator,
    create_communicator,
)
from .data_parallel import DataParallel
from .distributed import create_solver, options_from, run_guarded
from .exchange import (
    AllreduceExchange,
    ExchangeOptions,
    ExchangeRule,
    exchange_class,
    register_exchange,
    registered_exchanges,
)
from .fp16 import Fp16Exchange  # ``exchange: "fp16"``
from .launch import LaunchInfo, detect_launch
from .multicolor import MulticolorExchange  # ``exchange: "multicolor"``
from .timeline import Measurements, Timeline

__all__ = [
    "AllreduceExchange", "Communicator", "CommunicatorError", "DataParallel", "ExchangeOptions", "ExchangeRule",
    "Fp16Exchange", "LaunchInfo", "MPICommunicator", "Measurements", "MulticolorExchange",
    "SingleProcessCommunicator", "Timeline", "create_communicator",
    "create_solver", "detect_launch", "exchange_class", "options_from",
    "register_exchange", "registered_exchanges", "run_guarded",
]
