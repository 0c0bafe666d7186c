"""NCCL on GPUs: when the synchronous rules sum over NCCL, and the fifo schedule's NCCL path.

When NCCL is used (``exchange_via``): on a GPU, for the allreduce and hybrid rules (hybrid inside each
group) and for the multicolour trees' rules (multicolor and fp16, over NCCL's point-to-point calls:
``nccl_trees.py``), when CuPy has NCCL on every rank and every rank drives a GPU of its own (NCCL
refuses two ranks of one communicator on a device unless ``NCCL_MULTI_RANK_GPU_ENABLE=1`` lets NCCL
2.30 or later allow it); ``auto`` falls back and says why, ``nccl`` ends the job instead. The fallback (and ``exchange_via:
mpi``) is, for the plain sums, MPI on device memory where every rank's library takes it
(``device_mpi.py``), else the staged path through pinned host buffers and MPI (``gradient_staging.py``).
The rules that move weights (easgd, gossip) always stage through the host.

How (``over_nccl``): the priority schedule (the default), the drivers without overlap, and every rule
but allreduce keep the rule and start its buckets and chunks through ``nccl_sum.NcclReduction`` (the
trees: ``nccl_trees.NcclTreeReduction``), so the next forward's first layers leave first. The fifo
schedule with overlap is ``NcclAllreduceExchange`` below, where the host never waits:

NCCL (through CuPy's ``cupy.cuda.nccl``; rank 0's unique id is broadcast over MPI) sums on a
communication stream of its own. When a layer's gradients are final (the net's backward hook hands
them over, as on the CPU) the communication stream waits for an event recorded on the compute stream
and one NCCL group sums that layer's diffs in place: the collective runs while the backward kernels of
the layers below it run. Each layer's group records an event.

The updates learn of the sums through the ``GradientExchange`` calls, in device order rather than
host time: ``arrived`` offers a blob once its event has completed; ``wait_for`` makes the compute
stream wait for the events of the blobs asked for (no host wait), so that the update queued next,
and the next forward of the layer that uses the blob, run after the sum and after nothing else. The
division by the rank count is left to the update's own kernel (``take_divisor``), one pass fewer.
Layers hand their gradients over in the same order on every rank, so the NCCL calls match.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import time

import numpy as np

from .exchange import ExchangeRule
from .graph_boundaries import boundaries_by_gradient_bytes
from .nccl_sum import CommunicatorEnd, communicator, nccl_types, unique_id, version_text

MULTI_RANK_VARIABLE = "NCCL_MULTI_RANK_GPU_ENABLE"
# The rules whose gradients NCCL can sum: the allreduce family's plain sum (hybrid's inside a group),
# and the multicolour trees' (over point-to-point calls).
NCCL_RULES = ("allreduce", "hybrid", "multicolor", "fp16")
# The rules whose plain sum the MPI library can make on device memory (``device_mpi.py``).
DEVICE_MPI_RULES = ("allreduce", "hybrid")


class NcclUnavailable(RuntimeError):
    """``exchange_via: nccl`` where NCCL cannot run."""


def _nccl_problem(cupy) -> str | None:
    """Why this process cannot use NCCL through CuPy, or None."""
    try:
        from cupy.cuda import nccl
        nccl.get_version()
    except Exception as exc:  # noqa: BLE001 - ImportError, or CuPy built without NCCL (its own error type)
        return f"CuPy has no NCCL here ({' '.join(str(exc).split())}; pip install nvidia-nccl-cu12 or -cu13)"
    return None


def nccl_choice(comm, params, options) -> tuple[bool, str]:
    """Collective: (whether the allreduce rule sums over NCCL, the route for the log: "MPI" on the
    CPU). Every rank reaches the same answer from the same gathered facts (``route_for``)."""
    modules = {blob.array_module for blob in params}
    if modules <= {np} or options.exchange_via in ("mpi", "shared_memory") or comm.size == 1:
        return False, "MPI" if modules <= {np} else _fallback(options.exchange, comm.device_buffers)
    (cupy,) = modules
    problem = _nccl_problem(cupy)
    mine = json.dumps([socket.gethostname(), cupy.cuda.Device().pci_bus_id, problem,
                       _multi_rank_refusal(problem)]).encode()
    gathered = [json.loads(b) for b in comm.allgather_bytes(mine)]
    refusals = [fact[3] for fact in gathered if fact[3]]
    return route_for([tuple(fact[:3]) for fact in gathered], options.exchange, options.exchange_via,
                     refusals[0] if refusals else None, comm.device_buffers)


# NCCL_MULTI_RANK_GPU_ENABLE is read from NCCL 2.30 on (ncclGetVersion's code 23000); an older NCCL
# refuses two ranks of one communicator on a GPU whatever it says (2.28.9 on an H200: ncclInvalidUsage).
MULTI_RANK_MIN_VERSION = 23000


def _multi_rank_refusal(problem: str | None) -> str | None:
    """Why two ranks of this process's NCCL may not share a GPU (the end of "ranks share a GPU,
    which ..."), or None where they may. ``problem``: why this process has no NCCL at all, if so."""
    if os.environ.get(MULTI_RANK_VARIABLE, "") != "1":
        return f"NCCL refuses (NCCL 2.30 and later allow two ranks per GPU with {MULTI_RANK_VARIABLE}=1)"
    if problem is not None:
        return "NCCL is not usable here"
    from cupy.cuda import nccl

    version = nccl.get_version()
    if version < MULTI_RANK_MIN_VERSION:
        return f"NCCL {version_text(version)} refuses ({MULTI_RANK_VARIABLE}=1 takes NCCL 2.30 or later)"
    return None


def over_nccl(rule: type, options) -> tuple[type, object]:
    """The rule class and options that sum over NCCL, for the registered ``rule`` and its ``options``,
    once ``nccl_choice`` has chosen NCCL: allreduce under the fifo schedule with overlap is
    ``NcclAllreduceExchange`` (one group per layer, ordered on the device, no host wait); every other
    case keeps its rule, whose transports (the priority schedule, or the drivers) start buckets and
    chunks through its NCCL reduction (``nccl_sum.NcclReduction``, the trees' ``nccl_trees.NcclTreeReduction``):
    the options then say ``exchange_via: nccl``."""
    if options.exchange == "allreduce" and options.schedule == "fifo" and options.overlap:
        return NcclAllreduceExchange, options
    return rule, dataclasses.replace(options, exchange_via="nccl")


def _fallback(exchange: str, device_buffers: bool, reason: str | None = None) -> str:
    """How a GPU run's gradients go without NCCL, for the log: MPI on device memory where every rank's
    library takes it and the rule sums plainly (``AllreduceExchange.make_reduction``), else staged."""
    if device_buffers and exchange in DEVICE_MPI_RULES:
        notes = ["CUDA-aware MPI"] + ([reason] if reason else [])
        return f"the MPI library's allreduce on device memory ({'; '.join(notes)})"
    return "pinned host buffers and MPI" + (f" ({reason})" if reason else "")


def route_for(facts, exchange: str, exchange_via: str, multi_rank_refusal: str | None,
              device_buffers: bool = False) -> tuple[bool, str]:
    """The decision of ``nccl_choice`` from every rank's (host, GPU bus id, NCCL problem or None);
    ``multi_rank_refusal``: why ranks may not share a GPU (``_multi_rank_refusal``), None where they may;
    ``device_buffers``: whether every rank's MPI library takes GPU memory (the way without NCCL)."""
    problems = [f"rank {rank}: {problem}" for rank, (_, _, problem) in enumerate(facts) if problem]
    places = [(host, bus) for host, bus, _ in facts]
    if problems:
        reason = "; ".join(problems)
    elif exchange not in NCCL_RULES:
        reason = f"the {exchange} rule exchanges through MPI"
    elif len(set(places)) < len(places) and multi_rank_refusal is not None:
        reason = f"ranks share a GPU, which {multi_rank_refusal}"
    else:
        return True, "NCCL"
    if exchange_via == "nccl":
        raise NcclUnavailable(f"netdef_distributed.exchange_via is nccl, but {reason}")
    return False, _fallback(exchange, device_buffers, reason)


class NcclAllreduceExchange(ExchangeRule):
    """The allreduce rule under the fifo schedule, its gradients summed by NCCL on the device (module
    docstring): the rule's name and options, one NCCL group per layer in place of the host's buckets
    and drivers."""

    name = "allreduce"
    progress_mode = "DEVICE"  # the streams order everything; the host only queues

    def __init__(self, comm, net, options=None, measurements=None, clock=time.perf_counter, seed: int = 0):
        super().__init__(comm, net, options, measurements, clock, seed)
        import cupy
        from cupy.cuda import nccl

        self.cupy = cupy
        self._nccl = nccl
        self.communicator = communicator(nccl, self.comm.size, unique_id(self.comm, nccl), self.comm.rank)
        self._end = CommunicatorEnd(self.communicator)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.compute_stream = cupy.cuda.get_current_stream()
        self._summed: dict[int, object] = {}   # param id -> the event after its layer's NCCL group
        self._spans = None  # a timeline's DeviceSpans, when one is written
        self._types = nccl_types(nccl)

    def describe(self) -> str:
        return (f"allreduce over NCCL {version_text(self._nccl.get_version())} (fifo: one group per layer as its "
                f"gradients become final, on a communication stream of its own; the updates wait for it on the device)")

    def trace_to(self, timeline) -> None:
        self._spans = timeline.device

    def run_boundaries(self) -> frozenset[int]:
        return boundaries_by_gradient_bytes(self.net, self.options.bucket_bytes)

    # ------------------------------------------------------------------------------ the iteration
    def gradients_ready(self, param_ids) -> None:
        ids = [pid for pid in param_ids if self.params[pid].count]
        if not ids or self.comm.size == 1:
            return
        start = self.clock()
        nccl = self._nccl
        self.stream.wait_event(self.compute_stream.record())
        started = self._spans.begin(self.stream) if self._spans is not None else None
        nccl.groupStart()
        try:
            for pid in ids:
                diff = self.params[pid].diff
                self.communicator.allReduce(diff.data.ptr, diff.data.ptr, diff.size, self._types[diff.dtype],
                                            nccl.NCCL_SUM, self.stream.ptr)
        finally:
            nccl.groupEnd()
        if not self._leave_division:  # a caller that reads the diffs gets the average
            with self.stream:
                for pid in ids:
                    diff = self.params[pid].diff
                    self.cupy.divide(diff, diff.dtype.type(self.comm.size), out=diff)
        if started is not None:
            names = ", ".join(self.params[pid].name for pid in ids)
            self._spans.end(f"allreduce {names}", started, self.stream, lane="device exchange", category="exchange",
                            args={"bytes": sum(int(self.params[pid].diff.nbytes) for pid in ids)})
        summed = self.stream.record()
        for pid in ids:
            self._summed[pid] = summed
            if self._leave_division:
                self._undivided[pid] = self.comm.size
        if self.measurements.current is not None:
            self.measurements.current.exchange_call_s += self.clock() - start

    def arrived(self, param_ids) -> list[int]:
        out = []
        for pid in param_ids:
            event = self._summed.get(pid)
            if event is None or event.done:
                self._summed.pop(pid, None)
                out.append(pid)
        return out

    def wait_for(self, param_ids) -> None:
        events = {id(e): e for e in (self._summed.pop(pid, None) for pid in param_ids) if e is not None}
        for event in events.values():
            self.compute_stream.wait_event(event)

    def finish(self) -> None:
        self.wait_for(list(self._summed))

    def settle(self) -> None:
        self.finish()

    def release(self) -> None:
        self._end.destroy()

    def close(self) -> None:
        self._end.abort()  # local, also when this rank fails
