"""The multicolour trees of ``multicolor.py`` over NCCL's point-to-point calls: the multicolor and
fp16 rules' buckets and chunks summed on the GPU.

On the host the trees move by MPI requests that the host tests (``multicolor.TreeOperation``): each
step (add the children's sums, send on) runs when the host sees its messages arrive. On a GPU every
step can be queued at once, in an order the device keeps: a chunk's ``start`` enqueues the whole
reduction on a communication stream of its own and records an event after it, so the transports test
and wait for it as they do for NCCL's allreduce (``nccl_sum.DeviceEventOperation``). The wire
format's arithmetic (the float16 scales and casts of ``fp16.Float16DeviceWire``, the float32 sums)
runs as device kernels on the same stream, between the NCCL calls.

The order goes by the levels of the trees. A rank's depth in a colour's tree is that of its heap
position (``colour_trees.heap_depth``); every tree spans all ranks, so all are D = depth(size - 1)
deep. Up the trees, for each level L from D to 1, one NCCL group holds, for every colour, the sends of
the ranks at depth L to their parents and their parents' receives; after it each rank at depth L - 1
adds its children's messages to its part, in child order. The roots then encode their sums and keep
the encoded values themselves, as on the host. Down the trees, for L from 1 to D, one group holds the
sends of depth L - 1 to their children and the receives at depth L; a receiver decodes the message
into its part and passes it on, as received, in the next group. A rank issues a group's calls colour
by colour, children in order, so the calls between two ranks pair up in the order NCCL pairs them
(in the order issued), and an op of one level pairs only with the same level's: no cycle of waits.

Against the host's trees: a level waits for the whole level across the colours, where the host lets
each colour run ahead; in return the host does nothing while a reduction runs, and nothing crosses
the PCIe bus. The additions are the host's, in the same order, and the messages the same bits, so
every rank ends with its root's bytes, as on the host.
"""
from __future__ import annotations

import numpy as np

from ..backend import address
from .colour_trees import TreeLinks, colour_count, colour_roots, describe_trees, heap_depth
from .nccl_sum import NcclStreamReduction


class _Part:
    """One colour's part of the array being summed, on this rank, while its reduction is queued."""

    __slots__ = ("links", "depth", "values", "inbox", "down")

    def __init__(self, links: TreeLinks, depth: int, values):
        self.links = links
        self.depth = depth
        self.values = values
        self.inbox = []     # the children's messages, in child order
        self.down = None    # the message passed down the tree: the root's encoded sum


class NcclTreeReduction(NcclStreamReduction):
    """The multicolour allreduce of device arrays over the ranks of ``comm`` (module docstring):
    ``colours`` trees (0: the default count), messages in ``wire``'s format, whose array module is
    the device's. ``cupy``/``nccl``: the modules to use (a test of the bookkeeping gives stand-ins)."""

    def __init__(self, comm, colours: int, wire, cupy=None, nccl=None):
        super().__init__(comm, cupy, nccl)
        self.colours = colour_count(comm.size, colours)
        self.wire = wire
        self._places = [(TreeLinks(comm.size, root, comm.rank), heap_depth((comm.rank - root) % comm.size))
                        for root in colour_roots(comm.size, self.colours)]
        self.levels = heap_depth(comm.size - 1)

    def describe(self) -> str:
        return (f"{describe_trees(self.comm.size, self.colours)}, over NCCL {self.version()}'s point-to-point "
                f"calls on a communication stream of its own, {self.wire.describe()}")

    def enqueue(self, array, kept: list) -> str:
        flat = array.reshape(-1)
        bounds = [flat.size * c // self.colours for c in range(self.colours + 1)]
        # Fewer values than colours: some colours carry nothing, on every rank alike.
        parts = [_Part(links, depth, flat[bounds[c]:bounds[c + 1]])
                 for c, (links, depth) in enumerate(self._places) if bounds[c + 1] > bounds[c]]
        for level in range(self.levels, 0, -1):
            self._up(parts, level, kept)
        for level in range(1, self.levels + 1):
            self._down(parts, level, kept)
        return "multicolour allreduce"

    # ------------------------------------------------------------------------------ one level
    def _up(self, parts: list[_Part], level: int, kept: list) -> None:
        """Depth ``level`` sends its partial sums up; depth ``level - 1`` receives and adds them."""
        calls = []
        for part in parts:
            if part.depth == level:
                calls.append((self.communicator.send, self.wire.encode(part.values), part.links.parent))
            elif part.depth == level - 1:
                for child in part.links.children:
                    part.inbox.append(self.wire.message_buffer(part.values.size, part.values.dtype))
                    calls.append((self.communicator.recv, part.inbox[-1], child))
        self._group(calls, kept)
        for part in parts:
            if part.depth != level - 1:
                continue
            for message in part.inbox:
                self.wire.accumulate(part.values, message)
            part.inbox = []
            if part.depth == 0:  # the root keeps what the others will receive (for float16, the rounded sum)
                part.down = self.wire.encode(part.values)
                self.wire.decode(part.down, part.values)
                kept.append(part.down)

    def _down(self, parts: list[_Part], level: int, kept: list) -> None:
        """Depth ``level - 1`` sends the sum down; depth ``level`` receives it and takes it as its part."""
        calls = []
        for part in parts:
            if part.depth == level - 1:
                calls += [(self.communicator.send, part.down, child) for child in part.links.children]
            elif part.depth == level:
                part.down = self.wire.message_buffer(part.values.size, part.values.dtype)
                calls.append((self.communicator.recv, part.down, part.links.parent))
        self._group(calls, kept)
        for part in parts:
            if part.depth == level:
                self.wire.decode(part.down, part.values)

    def _group(self, calls: list, kept: list) -> None:
        """One NCCL group of ``calls`` (send or receive, buffer, peer) on the communication stream."""
        if not calls:
            return
        nccl = self._nccl
        nccl.groupStart()
        try:
            for call, buffer, peer in calls:
                call(address(buffer), buffer.size, self._types[np.dtype(buffer.dtype)], peer, self.stream.ptr)
                kept.append(buffer)
        finally:
            nccl.groupEnd()
