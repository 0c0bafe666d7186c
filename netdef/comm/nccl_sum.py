"""NCCL's allreduce as a ``Reduction``: the buckets and chunks of the allreduce family summed on the GPU.

The transports of the CPU path (the priority schedule of ``scheduler.py``, the progress drivers of
``progress.py``) decide which bucket or chunk is summed when; this reduction is how. With it the
buckets are flat arrays on the device (``buffers``), the gradients are copied into them on the
compute stream (``gradient_staging.DeviceBuckets``), and a chunk's ``start`` enqueues NCCL's
in-place allreduce on a communication stream of its own and records an event after it. A started
chunk is a ``DeviceEventOperation``: tested by asking whether its event has completed (a cheap
query, so the exchange asks for a driver that tests between layers), waited for by waiting on the
event. So the schedule's priorities and chunks apply to NCCL as they do to MPI: the next forward's
first layers leave first, and a late, urgent bucket overtakes the rest of a large one, because the
credit bounds how much is enqueued on the stream ahead of it.

What this costs against ``nccl.NcclAllreduceExchange`` (the fifo schedule over NCCL, one group per
layer, no host wait at all): the host learns on its own clock, by testing events, when a bucket's
gradients are final and when a chunk is summed, so its decisions lag the device by a test; in return
it can choose the order. A chunk starts only once its bucket's gradients are final on the device (the
transports start nothing before ``copied``), so the NCCL stream never waits behind a bucket that is
still being computed.

The communicator is over the rule's gradient communicator (all ranks, or ``hybrid``'s group): rank
0's unique id is broadcast over MPI. Everything here is called by one host thread at a time (the
training thread, or the schedule's communication thread), with this rank's GPU made current for it.
"""
from __future__ import annotations

import logging

import numpy as np

from .communicator import Operation
from .reduction import DeviceMemoryReduction

log = logging.getLogger("netdef")

UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES


def unique_id(comm, nccl) -> bytes:
    """Rank 0's NCCL unique id, its 128 raw bytes, on every rank of ``comm`` (collective)."""
    buffer = np.zeros(UNIQUE_ID_BYTES, dtype=np.uint8)
    if comm.rank == 0:
        buffer[:] = np.frombuffer(id_bytes(nccl.get_unique_id()), dtype=np.uint8)
    comm.broadcast(buffer, root=0)
    return buffer.tobytes()


def id_bytes(unique_id) -> bytes:
    """The raw bytes of an id as CuPy's ``get_unique_id`` returns it: bytes (CuPy 14), or a tuple of
    signed chars as ints (earlier CuPy)."""
    if isinstance(unique_id, (bytes, bytearray)):
        raw = bytes(unique_id)
    else:
        raw = np.asarray([int(v) for v in unique_id], dtype=np.int64).astype(np.int8).tobytes()
    if len(raw) != UNIQUE_ID_BYTES:
        raise ValueError(f"NCCL unique id of {len(raw)} bytes, expected {UNIQUE_ID_BYTES}")
    return raw


def communicator(nccl, size: int, unique: bytes, rank: int):
    """CuPy's NcclCommunicator for ``unique``, passed as the CuPy in use takes it: bytes, or (earlier
    CuPy) a tuple of signed chars. The argument is converted before NCCL is called, so a form the
    constructor refuses costs nothing."""
    try:
        return nccl.NcclCommunicator(size, unique, rank)
    except TypeError:
        return nccl.NcclCommunicator(size, tuple(int(v) for v in np.frombuffer(unique, dtype=np.int8)), rank)


class CommunicatorEnd:
    """How a rank's NCCL communicator ends, once: destroyed at the end of a run (``destroy``, collective:
    every rank's queued collectives run to their end), or aborted where the rank closes without that
    end (``abort``, local: destroying would wait for collectives that a failed peer never joins). An
    error from the abort is logged, not raised: a failing rank's own error is the one to report."""

    def __init__(self, communicator):
        self._communicator = communicator
        self._ended = False

    def destroy(self) -> None:
        if not self._ended:
            self._communicator.destroy()
            self._ended = True

    def abort(self) -> None:
        if not self._ended:
            self._ended = True
            try:
                self._communicator.abort()
            except Exception as exc:  # noqa: BLE001 - see the class docstring
                log.warning("NCCL's communicator could not be aborted: %s", exc)


def nccl_types(nccl) -> dict:
    """NCCL's data type for each dtype a gradient may have."""
    return {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
            np.dtype(np.float16): nccl.NCCL_FLOAT16}


def version_text(code: int) -> str:
    """NCCL's version code as major.minor.patch (2.28.9 is 22809)."""
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


class DeviceEventOperation(Operation):
    """A reduction enqueued on a stream, complete once the event recorded after it has completed.
    ``kept``: device buffers its calls use that nothing else holds, kept alive until then."""

    def __init__(self, event, kept=()):
        self.event = event
        self.kept = kept

    def test(self) -> bool:
        return self.event.done

    def wait(self) -> None:
        self.event.synchronize()


class NcclStreamReduction(DeviceMemoryReduction):
    """What the reductions that queue NCCL calls on a communication stream of their own share (NCCL's
    allreduce below, the multicolour trees of ``nccl_trees.py``): the communicator over ``comm``, the
    stream, NCCL's data types, the timeline's spans, and a started reduction that is the event after
    its calls. ``cupy``/``nccl``: the modules to use (default: CuPy and its NCCL; a test of the
    bookkeeping gives stand-ins)."""

    polls_cheaply = True  # a test asks whether an event has completed

    def __init__(self, comm, cupy=None, nccl=None):
        super().__init__(comm, cupy)
        if nccl is None:
            from cupy.cuda import nccl
        self._nccl = nccl
        self.stream = self.cupy.cuda.Stream(non_blocking=True)
        self._types = nccl_types(nccl)
        self._spans = None                      # a timeline's DeviceSpans, when one is written
        self.communicator = communicator(nccl, comm.size, unique_id(comm, nccl), comm.rank)
        self._end = CommunicatorEnd(self.communicator)

    def version(self) -> str:
        return version_text(self._nccl.get_version())

    def trace_to(self, spans) -> None:
        self._spans = spans

    def start(self, array):
        kept = []
        with self.device, self.stream:
            started = self._spans.begin(self.stream) if self._spans is not None else None
            name = self.enqueue(array, kept)
            if started is not None:
                self._spans.end(f"{name} of {array.nbytes} bytes", started, self.stream, lane="device exchange",
                                category="exchange", args={"bytes": int(array.nbytes)})
            return DeviceEventOperation(self.stream.record(), kept)

    def enqueue(self, array, kept: list) -> str:
        """Queue the sum of ``array`` on ``stream`` (current, with this rank's GPU); keep in ``kept`` the
        buffers the calls use that nothing else holds. Returns what it is called on the timeline."""
        raise NotImplementedError

    def run(self, array) -> None:
        self.start(array).wait()

    def copy_of(self, array):
        with self.device, self.stream:
            return array.copy()

    def release(self) -> None:
        self._end.destroy()

    def close(self) -> None:
        self._end.abort()


class NcclReduction(NcclStreamReduction):
    """Sum device arrays over the ranks of ``comm`` with NCCL's allreduce (module docstring)."""

    def describe(self) -> str:
        return f"summed by NCCL {self.version()}'s allreduce on a communication stream of its own"

    def enqueue(self, array, kept: list) -> str:
        self.communicator.allReduce(array.data.ptr, array.data.ptr, array.size, self._types[np.dtype(array.dtype)],
                                    self._nccl.NCCL_SUM, self.stream.ptr)
        return "allreduce"
