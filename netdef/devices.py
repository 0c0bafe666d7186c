"""Which GPU each process drives: ``--gpu`` read as Caffe and Horovod users write it.

One process: ``--gpu N`` runs on GPU N (a list runs on its first id, said once, as several GPUs in
one process are not supported). Under MPI every rank runs the same command line, so the choice has to
differ per rank: the ranks of one machine (MPI's shared-memory split: ``Communicator.local_rank`` of
``local_size``) take the listed GPUs in turn, ``--gpu all`` meaning every GPU the machine shows.
Local rank r drives ``ids[r % len(ids)]``: one rank per GPU when there are as many ranks as GPUs,
and ranks sharing a GPU (said in the log) when there are more, which is how a one-GPU machine runs
a two-rank test.

A GPU that a rank cannot use (no CuPy, no driver, no such device, or one that refuses a context)
ends a multi-rank job with one line naming the rank, its machine and the reason: the other ranks
would otherwise train on GPUs while this one trains on the CPU, at a fraction of their speed. One
process keeps Caffe-like leniency and runs on the CPU with a warning (``commands/common.py``).
"""
from __future__ import annotations

import dataclasses

ALL = "all"


class GpuRequestError(ValueError):
    """``--gpu`` names no GPU in a form netdef reads, or one this machine does not have."""


def parse_gpu_request(text: str) -> list[int] | None:
    """``--gpu``'s ids in order (``0``, ``0,1``, ``2, 3``), or None for ``all``. Ids must be whole
    numbers >= 0 and listed once."""
    text = text.strip()
    if text.lower() == ALL:
        return None
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise GpuRequestError(f"--gpu takes GPU ids (0, or 0,1) or all, not {text!r}") from None
    if any(i < 0 for i in ids):
        raise GpuRequestError(f"--gpu ids are 0 or more, not {text!r}")
    if len(set(ids)) != len(ids):
        raise GpuRequestError(f"--gpu lists a GPU twice: {text!r}")
    return ids


@dataclasses.dataclass(frozen=True)
class GpuChoice:
    """The GPU of one rank: ``device_id``, and ``sharing``, how many of the machine's ranks drive it."""

    device_id: int
    sharing: int


def choose_gpu(ids: list[int] | None, device_count: int, local_rank: int, local_size: int) -> GpuChoice:
    """The GPU of local rank ``local_rank`` of ``local_size`` on a machine with ``device_count`` GPUs,
    given ``--gpu``'s ids (None: all of them)."""
    if ids is None:
        if device_count < 1:
            raise GpuRequestError("--gpu all: this machine shows no GPU")
        ids = list(range(device_count))
    missing = [i for i in ids if i >= device_count]
    if missing:
        raise GpuRequestError(f"--gpu {','.join(map(str, ids))}: there is no GPU {missing[0]} "
                              f"({device_count} found)")
    slot = local_rank % len(ids)
    sharing = sum(1 for r in range(local_size) if r % len(ids) == slot)
    return GpuChoice(ids[slot], sharing)


def describe_assignment(assignments: list[tuple[int, str, int]]) -> str:
    """The log's line for every rank's (rank, machine, GPU), gathered on one rank."""
    parts = []
    for rank, host, device_id in assignments:
        sharers = [r for r, h, d in assignments if h == host and d == device_id]
        shared = f" (shared with rank(s) {', '.join(str(r) for r in sharers if r != rank)})" if len(sharers) > 1 else ""
        parts.append(f"rank {rank} -> GPU {device_id} on {host}{shared}")
    return "GPUs: " + "; ".join(parts)
