"""The distributed-training options, each declared once: ``ExchangeOptions``.

An option is a field of ``NetdefDistributedParameter`` (the solver file's ``netdef_distributed``),
whose default is the schema's; its declaration (``_option`` below, in the dataclass) adds what the
rest is made from:

- the command-line flag of ``netdef train`` (``add_flags``), which overrides the file (``options_from``);
- the check of its value, naming the field, applied to the file's and the flag's (``check``);
- the fact the ranks of a run must agree on (``agreed``, compared by ``agreement.py``).

A new option is one new schema field and one new line here.
"""
from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np

from ..proto import netdef_pb2 as pb
from .progress import MODES, mode_name

_SCHEMA = pb.NetdefDistributedParameter.DESCRIPTOR
EXCHANGE_ROUTES = ("auto", "shared_memory", "nccl", "mpi")


def on_off(value: str) -> bool:
    """A command line's on/off (true/false, 1/0, yes/no) as a bool."""
    lowered = value.strip().lower()
    if lowered in ("on", "true", "1", "yes"):
        return True
    if lowered in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")


def _schema_default(name: str):
    field = _SCHEMA.fields_by_name[name]
    if field.enum_type is not None:
        return field.enum_type.values_by_number[field.default_value].name
    return field.default_value


def _option(name: str, help: str, *, flag: str | None = None, parse=None, metavar=None, choices=None,
            convert=None, check=None, must: str = "", label: str | None = None, fact: str | None = None,
            per_rank: bool = False):
    """A field of ExchangeOptions declared as the option ``name`` of NetdefDistributedParameter.

    ``help`` for the flag ``--<flag>`` (default: the name; ``{default}`` in it is the schema's
    default), its argparse ``parse``, ``metavar`` and ``choices``; ``convert`` turns the file's or a
    caller's value into the option's (default: its type); ``check(value)`` is true for a valid value,
    and ``must`` says what a valid value is (errors name the option as ``label``,
    ``netdef_distributed.<name>`` by default); ``fact``: the agreement's name for the option when only
    whether it is set must agree; ``per_rank``: each rank's own setting, which the ranks need not agree on."""
    declared = {"flag": flag or name, "help": help, "parse": parse, "metavar": metavar, "choices": choices,
                "convert": convert, "check": check, "must": must, "label": label or f"netdef_distributed.{name}",
                "fact": fact, "per_rank": per_rank}
    return dataclasses.field(default=_schema_default(name), metadata=declared)


def _seconds(value: float) -> bool:
    return math.isfinite(value) and value >= 0


@dataclasses.dataclass
class ExchangeOptions:
    """NetdefDistributedParameter's fields, resolved (``progress`` as a name)."""

    exchange: str = _option("exchange", "the gradient exchange rule (default: allreduce)")
    overlap: bool = _option("overlap", "start each layer's exchange during backward (on, the default) or after it "
                            "(off)", parse=on_off, metavar="on|off")
    bucket_bytes: int = _option("bucket_bytes", "size bound of a fused gradient bucket (default {default})", parse=int,
                                metavar="BYTES", check=lambda v: v > 0, must="be positive")
    progress: str = _option("progress", "what drives non-blocking exchanges: auto, poll (between layers), thread (a "
                            "communication thread), mpi_async (MPICH's progress thread)", parse=str.upper,
                            choices=list(MODES), convert=mode_name)
    schedule: str = _option("schedule", "priority: first what the next forward needs, in chunks, each blob updated as "
                            "its gradient arrives; fifo: backward order, update after the whole exchange",
                            parse=str.lower, choices=["fifo", "priority"], check=lambda v: v in ("fifo", "priority"),
                            must="be fifo or priority")
    chunk_bytes: int = _option("chunk_bytes", "priority: chunk size (default: measured)", parse=int, metavar="BYTES",
                               check=lambda v: v >= 0, must="not be negative (0: measured)")
    credit_bytes: int = _option("credit_bytes", "priority: bytes in flight (default: measured)", parse=int,
                                metavar="BYTES", check=lambda v: v >= 0, must="not be negative (0: measured)")
    # A negative number can only come from the command line (the field is unsigned): say so.
    multicolor_colors: int = _option("multicolor_colors", "multicolor and fp16: trees the gradients are split over "
                                     "(default: min(ranks, 4); at most one per rank)", flag="colors", parse=int,
                                     metavar="K", check=lambda v: v >= 0,
                                     must="not be negative (0: chosen from the rank count)", label="--colors")
    timeline: str = _option("timeline", "write a Chrome trace (Perfetto) of every rank here", metavar="TRACE_JSON",
                            fact="timeline written")
    tau: int = _option("tau", "easgd, hybrid: updates between elastic steps (default {default})", parse=int,
                       metavar="N", check=lambda v: v >= 1, must="be at least 1")
    alpha: float = _option("alpha", "easgd, hybrid: the elastic moving rate (default: beta / the number of ranks or "
                           "groups)", parse=float, check=lambda v: 0 <= v < 1,
                           must="lie in [0, 1) (0: beta / participants)")
    beta: float = _option("beta", "easgd, hybrid: alpha = beta / ranks or groups when alpha is not set (default "
                          "{default})", parse=float, check=lambda v: 0 < v <= 1, must="lie in (0, 1]")
    group_size: int = _option("group_size", "hybrid: ranks per synchronous group (default {default})", parse=int,
                              metavar="N", check=lambda v: v >= 1, must="be at least 1")
    gossip_probability: float = _option("gossip_probability", "gossip: probability of sending the weights to a random "
                                        "peer after an update (default {default})", parse=float, metavar="P",
                                        check=lambda v: 0 <= v <= 1, must="lie in [0, 1]")
    # The stall watchdog (watchdog.py).
    stall_warning_seconds: float = _option("stall_warning_seconds", "a rank that has waited this long for the "
                                           "others logs which ranks have not reached the exchange, and again each "
                                           "time as long again (default {default}; 0: never)", flag="stall_warning",
                                           parse=float, metavar="SECONDS", check=_seconds,
                                           must="be a number of seconds >= 0 (0: off)", per_rank=True)
    stall_abort_seconds: float = _option("stall_abort_seconds", "a rank that has waited this long ends the job with "
                                         "one line naming the ranks that have not come (default {default}; 0: "
                                         "never)", flag="stall_abort", parse=float, metavar="SECONDS",
                                         check=_seconds, must="be a number of seconds >= 0 (0: off)", per_rank=True)
    # On a GPU (nccl.py).
    exchange_via: str = _option("exchange_via", "how allreduce (hybrid inside its groups; multicolor and fp16 over "
                                "NCCL's point-to-point calls) sums: auto (on the CPU in memory the ranks share when all run on one machine, else MPI; on a GPU NCCL where "
                                "every rank drives its own GPU, else MPI on device memory where the library takes it, "
                                "else pinned host buffers and MPI), shared_memory, nccl, or mpi (default {default})",
                                choices=list(EXCHANGE_ROUTES), convert=lambda v: str(v).lower(),
                                check=lambda v: v in EXCHANGE_ROUTES, must="be auto, shared_memory, nccl or mpi")


OPTIONS = dataclasses.fields(ExchangeOptions)
DEFAULT_BUCKET_BYTES = _schema_default("bucket_bytes")


def _value(option, value):
    """``value`` (the file's, or a caller's) as the option's type."""
    convert = option.metadata["convert"]
    if convert is not None:
        return convert(value)
    return {"bool": bool, "int": int, "float": float, "str": str}[option.type](value)


def add_flags(group) -> None:
    """One ``--<flag>`` (and Caffe's ``-<flag>``) per option, default None: the file's value stays."""
    for option in OPTIONS:
        declared = option.metadata
        extra = {key: declared[key] for key in ("metavar", "choices") if declared[key] is not None}
        if declared["parse"] is not None:
            extra["type"] = declared["parse"]
        default = option.default
        shown = str(np.float32(default)) if isinstance(default, float) else str(default)  # 0.9, not 0.899999...
        group.add_argument(f"--{declared['flag']}", f"-{declared['flag']}", help=declared["help"].format(default=shown),
                           **extra)


def flag_values(args: argparse.Namespace) -> dict:
    """The options given on the command line, by option name (None where not given)."""
    given = vars(args)
    return {option.name: given[option.metadata["flag"]] for option in OPTIONS}


def options_from(param: pb.SolverParameter, **overrides) -> ExchangeOptions:
    """The solver file's ``netdef_distributed`` settings with the given (command line) overrides, by
    option name (None: not given), checked."""
    from .exchange import exchange_class

    unknown = set(overrides) - {option.name for option in OPTIONS}
    if unknown:
        raise TypeError(f"unknown distributed option(s): {', '.join(sorted(unknown))}")
    in_file = param.netdef_distributed
    options = ExchangeOptions(**{
        option.name: _value(option, getattr(in_file, option.name) if overrides.get(option.name) is None
                            else overrides[option.name])
        for option in OPTIONS})
    check(options)
    exchange_class(options.exchange)  # an unknown rule: a clear error before anything is built
    return options


def check(options: ExchangeOptions) -> None:
    """ValueError naming the first option whose value is not valid."""
    for option in OPTIONS:
        declared, value = option.metadata, getattr(options, option.name)
        if declared["check"] is not None and not declared["check"](value):
            raise ValueError(f"{declared['label']} must {declared['must']}, got {value!r}")


def agreed(options: ExchangeOptions) -> dict:
    """What the ranks of a run must agree on, by fact name: each option's value, or whether it is
    set where only that matters (see agreement.py)."""
    out = {}
    for option in OPTIONS:
        if option.metadata["per_rank"]:
            continue
        value = getattr(options, option.name)
        fact = option.metadata["fact"]
        out[fact or option.name] = bool(value) if fact else value
    return out
