"""Sums over the ranks of one machine through memory they all map: the allreduce without MPI's copies.

When every rank runs on one machine, MPI's allreduce moves a bucket through the library's own
shared-memory queues: each rank copies its data in, waits for the other side at every step of the
algorithm, and copies the result out, and a step advances only while both ranks are inside an MPI
call. Backprop makes no MPI calls, so a bucket started during backward mostly waited for the end.

Here the buckets' buffers live in memory every rank maps (``Communicator.shared_memory``; one
segment per rank, bucket by bucket at the same offsets), so no rank needs another's help to read its
data. Every sum is cut into one part per rank (``part_bounds``: 1/N of each buffer), and each part is
summed by one rank, whichever claims it first:

1. ``start``: the rank's gradients are in its own segment; it publishes how many reductions it has
   started (its ``READY`` counter).
2. Once every rank has started reduction s, a rank claims its own part of s, and, once it has waited
   for s a while (spun on the counters with nothing else to do), any other part no rank has claimed
   yet: a claim is an atomic compare-and-swap of the part's ``CLAIMED`` counter (in the segment of the
   rank the part is named after) from s to s + 1, so exactly one rank wins each. The winner adds up
   the part from every segment, in rank order, stores the result into that part of every segment, and
   then publishes that the part is summed (the part's ``DONE`` counter, s + 1). Ranks that keep up
   claim their own parts first, so each sums its share, in parallel.
3. Once every part of s is done, every segment holds the whole sum: reduction s is complete here.

Nothing waits for the other ranks to be inside a call: a rank that tests between layers (the
``POLL`` driver, which this reduction asks for: a test reads a few counters) does what it can as soon
as the others' data is there, so a bucket finished early in backward is summed during backward. And
nothing waits for another rank to do work once its data is there: a rank that falls behind after
starting s (another process took its core) has its part summed by a rank that is waiting, as MPI's
allreduce of two ranks needs only the other's data. Every part is computed by one rank, in rank order
whoever it is, and copied to the others, so every rank holds the same bits (with two ranks, the bits of
MPI's sum: float addition is commutative).

Why the memory stays consistent without locks: reductions start in the same order on every rank
(the transports guarantee it), and a part's claims and ``DONE`` go in that order too (a part of s is
claimed only once the same part of s - 1 is done), so every counter only grows. A part is read only
by the rank that claimed it, only after every rank has started s (their data is there), and written
(in every segment) only by that rank; a segment is written again by its own rank (the next
iteration's gradients) only after reduction s has completed there, i.e. after every part of s is done,
so no sum of s can land later. ``fence`` orders the data against the counters
(``SharedMemory.fence``). With the allreduce rule a segment holds the parameters' diffs themselves
(``AllreduceExchange._keep_gradients_in_buckets``): backward writes them, and an update may, both only
once the reduction that read them has completed on this rank.

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

# The int64 counters at the start of each rank's segment: READY is the rank's own (reductions it has
# started); CLAIMED and DONE belong to the part named after the rank (reductions whose part has been
# claimed, and summed), written by whichever rank claims it.
READY, CLAIMED, DONE = 0, 1, 2
_CONTROL_BYTES = 64      # the counters, alone on their cache line
_ALIGN = 64              # every bucket's buffer starts on a cache line of its own


def part_bounds(count: int, parts: int, part: int) -> tuple[int, int]:
    """Elements ``start:stop`` of ``part`` when ``count`` are split into ``parts`` nearly equal runs."""
    return count * part // parts, count * (part + 1) // parts


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


class SharedSum(Reduction):
    """See the module docstring. ``buffers(buckets)`` (collective, once the bucket layout is known)
    gives every bucket its buffer in this rank's segment; ``start`` then takes any part of one."""

    named_in_log = True
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
        self._to_claim: collections.deque = collections.deque()
        self._incomplete: collections.deque = collections.deque()
        self._scratch = np.empty(0, dtype=np.uint8)
        # This rank's part first (when every rank keeps up, each sums its own), then the others'.
        self._part_order = [(comm.rank + k) % comm.size for k in range(comm.size)]

    def describe(self) -> str:
        return (f"summed in memory shared by the {self.comm.size} ranks of this machine (each rank adds up 1/"
                f"{self.comm.size} of every bucket, and a waiting rank the parts of any rank behind)")

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
        self._counters = [segment[:_CONTROL_BYTES].view(np.int64) for segment in self._segments]
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
        self._to_claim.append(operation)
        self._incomplete.append(operation)
        return operation

    def run(self, array) -> None:
        self.start(array).wait()

    def progress(self, take_over: bool = False) -> None:
        """Sum the parts of the started reductions that this rank may claim, then mark complete every
        reduction whose parts are all done (steps 2 and 3 of the module docstring), without waiting.
        A test between layers claims only this rank's own parts: with every rank keeping up, each does
        its share. ``take_over`` (a rank that has waited through its spins, with nothing else to do)
        claims the parts no rank has claimed too."""
        if self._to_claim:
            ready = self._least(READY)
            parts = self._part_order if take_over else self._part_order[:1]
            settled, leading = 0, True
            for operation in self._to_claim:
                if operation.sequence >= ready:
                    break
                every_part_claimed = self._claim(operation, parts)
                leading = leading and every_part_claimed
                if leading:
                    settled += 1  # the reductions at the front with nothing left to claim leave the queue
            for _ in range(settled):
                self._to_claim.popleft()
        if self._incomplete:
            done = self._least(DONE)
            while self._incomplete and self._incomplete[0].sequence < done:
                self._incomplete.popleft().done = True

    def _least(self, counter: int) -> int:
        least = min(int(counters[counter]) for counters in self._counters)
        self.memory.fence()  # what the others stored before their counters is seen from here on
        return least

    def _publish(self, counter: int, value: int, part: int | None = None) -> None:
        """Store ``value`` into ``counter`` of this rank's segment, or of ``part``'s."""
        self.memory.fence()  # what this rank stored is seen by whoever sees the counter
        self._counters[self.comm.rank if part is None else part][counter] = value

    def _claim(self, operation: "SharedSumOperation", parts) -> bool:
        """Claim and sum each of ``parts`` of ``operation`` that no rank has claimed; whether every part
        of it is claimed now (by this rank or another)."""
        sequence = operation.sequence
        for part in parts:
            counters = self._counters[part]
            done = int(counters[DONE])
            if done > sequence or int(counters[CLAIMED]) > sequence:
                continue  # summed, or being summed by the rank that claimed it
            if done < sequence:
                continue  # the same part of the reduction before is still being summed: later
            if self.memory.compare_and_swap(part, CLAIMED * 8, sequence, sequence + 1) == sequence:
                self._sum_part(operation, part)
                self._publish(DONE, sequence + 1, part)
        # CLAIMED only grows, so a stale read can only keep the reduction queued for one more try.
        return all(int(self._counters[part][CLAIMED]) > sequence for part in self._part_order)

    def _sum_part(self, operation: "SharedSumOperation", part: int) -> None:
        size = self.comm.size
        start, stop = part_bounds(operation.count, size, part)
        if stop <= start or size == 1:
            return
        rank = self.comm.rank
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

    def _scratch_for(self, count: int, dtype) -> np.ndarray:
        nbytes = count * np.dtype(dtype).itemsize
        if self._scratch.size < nbytes:
            self._scratch = np.empty(nbytes, dtype=np.uint8)
        return self._scratch[:nbytes].view(dtype)

    def wait(self, operation: "SharedSumOperation") -> None:
        # The others may be blocked inside MPI (a priority schedule's mark) on this rank's part of an
        # MPI operation, and start their reductions only once it completes: keep MPI moving while waiting.
        tests = 0
        yielding_since = None
        while True:
            # Past its spins a rank takes over the parts no rank has claimed: a rank that keeps up claims
            # its own within them, so ranks in step each sum their share, in parallel.
            self.progress(take_over=tests >= self.spin_tests)
            if operation.done:
                return
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
        self._to_claim.clear()
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
