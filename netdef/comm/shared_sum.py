"""Sums over the ranks of one machine through memory they all map: the allreduce without MPI's copies.

When every rank runs on one machine, MPI's allreduce moves a bucket through the library's own
shared-memory queues: each rank copies its data in, waits for the other side at every step of the
algorithm, and copies the result out, and a step advances only while both ranks are inside an MPI
call. Backprop makes no MPI calls, so a bucket started during backward mostly waited for the end.

Here the buckets' buffers live in memory every rank maps (``Communicator.shared_memory``; one
segment per rank, bucket by bucket at the same offsets), so no rank needs another's help to read its
data. Each rank owns one part of every sum (``part_bounds``: 1/N of each buffer, by rank):

1. ``start``: the rank's gradients are in its own segment; it publishes how many reductions it has
   started (its ``READY`` counter).
2. Once every rank has started reduction s, a rank adds up its own part of s from every segment,
   in rank order, and stores the result into its part of every segment; then it publishes how many
   reductions it has pushed (``PUSHED``).
3. Once every rank has pushed s, every segment holds the whole sum: reduction s is complete here.

Nothing waits for the other ranks to be inside a call: a rank that tests between layers (the
``POLL`` driver, which this reduction asks for: a test reads a few counters) does its part as soon as
the others' data is there, so a bucket finished early in backward is summed during backward. Every
part is computed by one rank and copied to the others, so every rank holds the same bits (with two
ranks, the bits of MPI's sum: float addition is commutative).

Why the memory stays consistent without locks: reductions start in the same order on every rank
(the transports guarantee it), and each rank steps them through 2 in that order, so both counters
only grow. A rank reads another's part of s only after that rank has started s (its data is there),
and writes into another's segment only in the part it owns, which no other rank reads or writes
(the segment's owner wrote it before starting s and waits for s to complete); a segment is written
again by its own rank (the next iteration's gradients) only after reduction s has completed there,
i.e. after every rank has pushed, so no push of s can land later. ``fence`` orders the data against
the counters (``SharedMemory.fence``). With the allreduce rule a segment holds the parameters' diffs
themselves (``AllreduceExchange._keep_gradients_in_buckets``): backward writes them, and an update may,
both only once the reduction that read them has completed on this rank.

A blocked ``wait`` spins on the counters for a moment, then yields its core, then sleeps in short
steps: a rank far ahead of the others (one is saving a snapshot) does not hold a core they need.

The figures (benchmarks/README.md, "Sums in memory the ranks share"; ``benchmarks/reductions.py``):
several times faster than MPICH's allreduce on 2 and 3 ranks, whether waited for at once or tested
now and then by a communication thread.
"""
from __future__ import annotations

import collections
import os
import time

import numpy as np

from .communicator import Operation
from .reduction import Reduction

READY, PUSHED = 0, 1
_CONTROL_BYTES = 64      # the two counters, alone on their cache line
_ALIGN = 64              # every bucket's buffer starts on a cache line of its own


def part_bounds(count: int, parts: int, part: int) -> tuple[int, int]:
    """Elements ``start:stop`` of ``part`` when ``count`` are split into ``parts`` nearly equal runs."""
    return count * part // parts, count * (part + 1) // parts


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


class SharedSum(Reduction):
    """See the module docstring. ``buffers(buckets)`` (collective, once the bucket layout is known)
    gives every bucket its buffer in this rank's segment; ``start`` then takes any part of one."""

    polls_cheaply = True
    # Every reduction in flight is summed as soon as every rank's data is there, in start order, by
    # the ranks' own cores: one chunk per bucket (up to 1 GiB) and no bound on what is in flight.
    unshared_link_sizes = (1 << 30, 1 << 40)
    spin_tests = 64            # tests before a waiting rank gives up its core
    yield_for_s = 0.002        # then yields its core for this long (stays ready to run)
    sleep_s = 50e-6            # then sleeps this long between tests

    def __init__(self, comm):
        super().__init__(comm)
        # Probed while waiting (no message is ever sent on it): see wait.
        self._progress_comm = comm.duplicate()
        self.memory = None
        self._segments: list[np.ndarray] = []
        self._counters: list[np.ndarray] = []
        self._started = 0
        self._to_push: collections.deque = collections.deque()
        self._incomplete: collections.deque = collections.deque()
        self._scratch = np.empty(0, dtype=np.uint8)

    def describe(self) -> str:
        return (f"summed in memory shared by the {self.comm.size} ranks of this machine (each rank adds up 1/"
                f"{self.comm.size} of every bucket)")

    # ------------------------------------------------------------------------------ memory
    def buffers(self, sizes_and_dtypes) -> list[np.ndarray]:
        """Flat buffers of the given (element count, dtype)s in this rank's segment, at the same
        offsets on every rank (collective; once: a second call would hand out new memory)."""
        if self.memory is not None:
            raise RuntimeError("SharedSum.buffers was already called: the bucket layout is planned once")
        layout = []
        offset = _CONTROL_BYTES
        for count, dtype in sizes_and_dtypes:
            dtype = np.dtype(dtype)
            layout.append((offset, int(count), dtype))
            offset += _aligned(int(count) * dtype.itemsize)
        self.memory = self.comm.shared_memory(offset)
        self._segments = self.memory.segments
        self._counters = [segment[:16].view(np.int64) for segment in self._segments]
        self._counters[self.comm.rank][:] = 0
        self.memory.fence()
        self.comm.barrier()  # every rank's counters are zero before any rank reads them
        mine = self._segments[self.comm.rank]
        return [mine[start:start + count * dtype.itemsize].view(dtype) for start, count, dtype in layout]

    def _offset(self, array: np.ndarray) -> int:
        if self._segments and isinstance(array, np.ndarray) and array.flags.c_contiguous:
            mine = self._segments[self.comm.rank]
            offset = array.__array_interface__["data"][0] - mine.__array_interface__["data"][0]
            if _CONTROL_BYTES <= offset and offset + array.nbytes <= mine.size:
                return offset
        raise ValueError("SharedSum sums only the buffers it gave out (SharedSum.buffers)")

    # ------------------------------------------------------------------------------ reductions
    def start(self, array):
        operation = SharedSumOperation(self, self._started, self._offset(array), array.size, array.dtype)
        self._started += 1
        self._publish(READY, self._started)
        self._to_push.append(operation)
        self._incomplete.append(operation)
        return operation

    def run(self, array) -> None:
        self.start(array).wait()

    def progress(self) -> None:
        """Push every reduction whose data every rank has, then mark complete every one every rank
        has pushed (steps 2 and 3 of the module docstring), without waiting."""
        if self._to_push:
            ready = self._least(READY)
            while self._to_push and self._to_push[0].sequence < ready:
                self._push(self._to_push.popleft())
        if self._incomplete:
            pushed = self._least(PUSHED)
            while self._incomplete and self._incomplete[0].sequence < pushed:
                self._incomplete.popleft().done = True

    def _least(self, counter: int) -> int:
        least = min(int(counters[counter]) for counters in self._counters)
        self.memory.fence()  # what the others stored before their counters is seen from here on
        return least

    def _publish(self, counter: int, value: int) -> None:
        self.memory.fence()  # what this rank stored is seen by whoever sees the counter
        self._counters[self.comm.rank][counter] = value

    def _push(self, operation: "SharedSumOperation") -> None:
        rank, size = self.comm.rank, self.comm.size
        start, stop = part_bounds(operation.count, size, rank)
        if stop > start and size > 1:
            itemsize = operation.dtype.itemsize
            first = operation.offset + start * itemsize
            views = [segment[first:first + (stop - start) * itemsize].view(operation.dtype)
                     for segment in self._segments]
            total = views[rank] if rank < 2 else self._scratch_for(stop - start, operation.dtype)
            np.add(views[0], views[1], out=total)  # in rank order: the same bits whoever computes them
            for other in views[2:]:
                np.add(total, other, out=total)
            for view in views:
                if view is not total:
                    view[...] = total
        self._publish(PUSHED, operation.sequence + 1)

    def _scratch_for(self, count: int, dtype) -> np.ndarray:
        nbytes = count * np.dtype(dtype).itemsize
        if self._scratch.size < nbytes:
            self._scratch = np.empty(nbytes, dtype=np.uint8)
        return self._scratch[:nbytes].view(dtype)

    def wait(self, operation: "SharedSumOperation") -> None:
        # The others may be blocked inside MPI (a priority schedule's mark) on this rank's part of an
        # MPI operation, and push their parts only once it completes: keep MPI moving while waiting.
        tests = 0
        yielding_since = None
        while not operation.test():
            tests += 1
            if tests % 16 == 0 or tests >= self.spin_tests:
                self._progress_comm.make_progress()
            if tests < self.spin_tests:
                continue
            now = time.perf_counter()
            if yielding_since is None:
                yielding_since = now
            if now - yielding_since < self.yield_for_s:
                os.sched_yield()
            else:
                time.sleep(self.sleep_s)

    def release(self) -> None:
        if self.memory is not None:
            self._segments, self._counters = [], []
            self.memory.free()
            self.memory = None
        # Buffers given out later are new memory, whose counters start from zero.
        self._started = 0
        self._to_push.clear()
        self._incomplete.clear()


class SharedSumOperation(Operation):
    """Reduction ``sequence`` of a ``SharedSum``: ``count`` elements of ``dtype`` at byte ``offset`` of
    every rank's segment."""

    __slots__ = ("reduction", "sequence", "offset", "count", "dtype", "done")

    def __init__(self, reduction: SharedSum, sequence: int, offset: int, count: int, dtype):
        self.reduction = reduction
        self.sequence = sequence
        self.offset = offset
        self.count = int(count)
        self.dtype = np.dtype(dtype)
        self.done = False

    def test(self) -> bool:
        if not self.done:
            self.reduction.progress()
        return self.done

    def wait(self) -> None:
        self.reduction.wait(self)
