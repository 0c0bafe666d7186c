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


def set_device(gpu: str | None) -> int | None:
    """Put new blobs on the GPU that --gpu names; returns its id (None without --gpu)."""
    import netdef

    if gpu in (None, ""):
        return None
    if gpu == "all":
        gpu = "0"
    try:
        ids = [int(g) for g in gpu.split(",")]
    except ValueError:
        raise CommandLineError(f"--gpu takes GPU ids (0, or 0,1) or all, not {gpu!r}") from None
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


def precision_flag(parser) -> None:
    from netdef.backend import PRECISIONS

    caffe_flag(parser, "precision", choices=list(PRECISIONS),
          help="what float32 convolutions and matrix products on a GPU compute in: float32 (strict, "
               "Caffe's; the default, or the solver file's precision) or tf32 (TensorFloat-32 tensor cores)")


def set_precision(args) -> None:
    """--precision for the verbs without a solver file (test, time)."""
    import netdef

    if args.precision:
        netdef.set_precision(args.precision)


def stages(args) -> list[str]:
    return [s for s in (args.stage or "").split(",") if s]
