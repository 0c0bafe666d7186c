"""What the verbs of ``netdef <verb>`` share: Caffe's flag spellings, the device and precision flags,
the checks of counts, and the error for flags that do not fit together."""
from __future__ import annotations

import argparse
import logging

log = logging.getLogger("netdef")


class CommandLineError(ValueError):
    """Flags that do not make sense together or out of range; the message names the flag."""


def positive_iterations(args, verb: str) -> int:
    if args.iterations < 1:
        raise CommandLineError(f"{verb}: --iterations must be at least 1, got {args.iterations}")
    return args.iterations


def positive_int(value: str) -> int:
    from netdef.environment import positive_int

    number = positive_int(value)
    if number is None:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {value!r}")
    return number


def caffe_flag(parser, name: str, **kwargs):
    """Add ``--name`` with Caffe's ``-name`` spelling as an alias."""
    parser.add_argument(f"--{name}", f"-{name}", **kwargs)


def set_device(gpu: str | None, comm=None) -> int | None:
    """Put new blobs on the GPU that --gpu names (each rank's own under MPI: ``netdef.devices``);
    returns its id (None without --gpu, or where one process falls back to the CPU)."""
    import netdef
    from netdef.devices import GpuRequestError, parse_gpu_request

    if gpu in (None, ""):
        return None
    try:
        ids = parse_gpu_request(gpu)
    except GpuRequestError as exc:
        raise CommandLineError(str(exc)) from None
    if comm is not None and comm.size > 1:
        return _set_rank_device(gpu, ids, comm)
    ids = ids or [0]  # all: one process drives the first
    if len(ids) > 1:
        log.warning("several GPUs in one process are not supported; use MPI ranks (mpiexec -n N). Using GPU %d", ids[0])
    problem = netdef.backend.gpu_problem(ids[0])
    if problem is not None:
        # As solver_mode: GPU in a solver file (solver.py): the same run, on the CPU, said once.
        log.warning("--gpu %d: no usable GPU, %s; running on the CPU (leave out --gpu to say so)", ids[0], problem)
        netdef.set_device("cpu")
        return None
    netdef.set_device("gpu", ids[0])
    return ids[0]


def _set_rank_device(gpu: str, ids: list[int] | None, comm) -> int:
    """One rank's GPU under MPI; a rank that has none ends the job (``run_guarded`` says which)."""
    import json
    import socket

    import netdef
    from netdef.devices import GpuRequestError, choose_gpu, describe_assignment

    host = socket.gethostname()
    where = f"rank {comm.rank} (local rank {comm.local_rank} of {comm.local_size} on {host})"
    count, problem = netdef.backend.gpu_count()
    if problem is not None:
        raise CommandLineError(f"--gpu {gpu}: {where} has no usable GPU: {problem}")
    try:
        choice = choose_gpu(ids, count, comm.local_rank, comm.local_size)
    except GpuRequestError as exc:
        raise CommandLineError(f"{exc} for {where}") from None
    problem = netdef.backend.gpu_problem(choice.device_id)
    if problem is not None:
        raise CommandLineError(f"--gpu {gpu}: {where} cannot use GPU {choice.device_id}: {problem}")
    netdef.set_device("gpu", choice.device_id)
    everyone = [json.loads(b) for b in comm.allgather_bytes(json.dumps([comm.rank, host, choice.device_id]).encode())]
    log.info("%s", describe_assignment([tuple(a) for a in everyone]))
    return choice.device_id


def precision_flag(parser) -> None:
    from netdef.backend import PRECISIONS

    caffe_flag(parser, "precision", choices=list(PRECISIONS),
          help="what float32 convolutions and matrix products on a GPU compute in: float32 (strict, "
               "Caffe's; the default, or the solver file's precision) or tf32 (TensorFloat-32 tensor cores)")


def cuda_graphs_flag(parser) -> None:
    caffe_flag(parser, "cuda_graphs", action="store_true",
               help="on a GPU, replay stretches of layers from CUDA graphs recorded once (the host launches one "
                    "graph instead of every kernel; the same bits); under mpiexec too")


def set_precision(args) -> None:
    """--precision for the verbs without a solver file (test, time)."""
    import netdef

    if args.precision:
        netdef.set_precision(args.precision)


def stages(args) -> list[str]:
    return [s for s in (args.stage or "").split(",") if s]
