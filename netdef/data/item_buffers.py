"""Memory that the data layers decode the items of a batch into, reused batch after batch.

Why: a decoded 256 x 256 JPEG is 192 KiB, above the size at which the C allocator maps fresh pages
for each request and returns them on free (and the data threads' arenas trim what they free). Every
image then cost about 50 page faults and a third of its CPU time in the kernel, and on two data
threads the unmapping of one thread's pages interrupts the other's core (benchmarks/README.md, "Decoded
items in reused memory"). A batch's items are alive together only until the batch is transformed, so
each position of the batch keeps one buffer that the decoder writes the next batch's item into.

The contract: an item decoded into ``buffers.at(position)`` is valid until an item of the same position
of a later batch is decoded. The data layers read each batch's items (``read_batch``) and transform them
into the batch's own array before they decode the next batch, so no item outlives its buffer. Items
larger than ``MAX_REUSED_BYTES`` are decoded into fresh memory, so that one huge image does not pin its
size for the rest of the run.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

# 4 MiB: a 1,180 x 1,180 BGR image; ImageNet's originals average about 400 x 350.
MAX_REUSED_BYTES = 4 << 20

#: What a decoder is given: ``buffer(nbytes)`` is a writable uint8 array of at least ``nbytes`` bytes to
#: decode into, or None for fresh memory.
BufferFor = Callable[[int], "np.ndarray | None"]


class ItemBuffers:
    """One reusable decode buffer per batch position (the module docstring says how long an item lives)."""

    def __init__(self, max_bytes: int = MAX_REUSED_BYTES):
        self.max_bytes = int(max_bytes)
        self._buffers: dict[int, np.ndarray] = {}

    def at(self, position: int) -> BufferFor:
        """The buffer source of batch position ``position`` (one data thread decodes into it at a time)."""
        return lambda nbytes: self._buffer(int(position), int(nbytes))

    def _buffer(self, position: int, nbytes: int) -> np.ndarray | None:
        if nbytes > self.max_bytes:
            return None
        buffer = self._buffers.get(position)
        if buffer is None or buffer.nbytes < nbytes:
            # Each position's buffer grows to the largest item it has held; under MAX_REUSED_BYTES that
            # bounds the memory by batch size x 4 MiB.
            buffer = self._buffers[position] = np.empty(nbytes, dtype=np.uint8)
        return buffer

    def held_bytes(self) -> int:
        """The bytes the buffers hold now."""
        return sum(buffer.nbytes for buffer in self._buffers.values())
