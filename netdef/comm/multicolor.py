"""The ``multicolor`` exchange rule: IBM's multi-colour allreduce over MPI point-to-point messages.

A buffer of n values is cut into k parts (the colours). Part c is summed up a spanning tree of all
ranks rooted at rank ``c * size // k`` and the sum sent back down the same tree; the k trees run at
once, each with its own messages, so a rank sends up one tree while it receives down another and
every link carries traffic in both directions (Cho et al., "PowerAI DDL", 2017, whose colours follow
the links of a torus; here the network is flat, so the trees differ by their roots).

The trees: in colour c a rank's position is ``(rank - root_c) % size`` and positions form a binary
heap (position p's parent is ``(p - 1) // 2``). With k = 2 the two roots are half the ranks apart,
so a rank that relays in one tree (a position below size / 2) is a leaf of the other.

k defaults to ``min(ranks, 4)`` (``multicolor_colors``, ``--colors``). With k = ranks every rank
roots one tree: for 2 and 3 ranks the trees are then stars and the exchange is a direct
reduce-scatter and allgather, each rank sending 2 (N - 1) / N of the buffer, as a ring allreduce
does. Beyond 4, more parts mean more and smaller messages per chunk (latency) for no link a rank
does not already use on a flat network. A k above the rank count is lowered to it (two trees with
one root would only add messages).

Sums are the same bytes on every rank, which synchronous SGD needs: each part is summed once, at
its root, in a fixed order (a node adds its children's partial sums to its own in the order of
their positions, whatever order they arrive in), and the root's bytes are what everyone receives.
The order differs from the MPI library's, so a sum may differ from ``allreduce``'s in the last bits.

What travels is set by a ``WireFormat``: here the values themselves; ``fp16.py`` sends float16.

A started reduction is a state machine (``TreeOperation``) that moves only when its requests are
tested, by the schedule's communication thread or the training thread's polls; MPICH's own progress
thread (``progress: MPI_ASYNC``) moves its messages but not the steps between them (adding the
children's sums, sending on), which then wait for the final wait.
"""
from __future__ import annotations

import numpy as np

from .colour_trees import TreeLinks, colour_count, colour_roots, describe_trees
from .communicator import Operation
from .exchange import AllreduceExchange, register_exchange
from .gradient_staging import on_device
from .nccl_trees import NcclTreeReduction
from .reduction import Reduction

MIN_TAG_WINDOW = 64  # operations that may be in flight at once (the tags of older ones are reused)


# ============================================================================================== wire format
class WireFormat:
    """How a part's values travel: as themselves (no rounding, no copy for what is sent as is).
    ``xp``: the array module of the parts and messages (NumPy; CuPy where the trees run on a GPU,
    ``nccl_trees.py``)."""

    def __init__(self, xp=np):
        self.xp = xp

    def describe(self) -> str:
        return "messages in the buffer's own dtype"

    def message_buffer(self, count: int, dtype):
        """An empty message able to hold ``count`` values of ``dtype``."""
        return self.xp.empty(count, dtype=dtype)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """The message for ``values``; may be ``values`` itself (which then must not change until sent)."""
        return values

    def decode(self, message: np.ndarray, out: np.ndarray) -> None:
        """``out[...]`` = the values of ``message``."""
        if message is not out:
            out[...] = message

    def accumulate(self, out, message) -> None:
        """``out += `` the values of ``message``."""
        self.xp.add(out, message, out=out)


# ============================================================================================== the operation
_UP, _DOWN = 0, 1


class _Colour:
    """The state of one colour's part on this rank (see TreeOperation)."""

    __slots__ = ("index", "part", "links", "from_children", "waiting_children", "sent_up", "down_message",
                 "arrived_down", "delivered", "sends")

    def __init__(self, index: int, part: np.ndarray, links: TreeLinks):
        self.index = index
        self.part = part
        self.links = links
        self.from_children: list[np.ndarray] = []
        self.waiting_children = len(links.children)
        self.sent_up = links.parent < 0        # the root sends nothing up
        self.down_message = None
        self.arrived_down = False
        self.delivered = False
        self.sends = 0                          # sends not yet complete


class TreeOperation(Operation):
    """One multicolour allreduce of ``array`` in progress: a small state machine per colour over
    Isend/Irecv requests, moved along by ``test`` (never blocking) and ``wait``.

    Per colour: every receive is posted at the start (the children's partial sums, the sum from the
    parent). Once every child's has arrived, they are added to this rank's part in child order; a
    non-root sends the partial sum up; the root encodes the sum, takes the encoded values as its
    own and sends them down. When the sum arrives from the parent, and this rank's own message up
    has left (the part is its buffer), it becomes the part and is passed on to the children as
    received. Messages of one operation and colour differ by tag (``tag_base`` + 2 colour + phase),
    and operations by ``tag_base``, so parts of chunks in flight together never match each other's
    receives."""

    def __init__(self, comm, array: np.ndarray, colours: int, wire: WireFormat, tag_base: int):
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ValueError("a multicolour allreduce needs a C-contiguous NumPy array")
        self.comm = comm
        self.array = array
        self.wire = wire
        self.tag_base = tag_base
        self._requests: list = []
        self._events: list[tuple[str, _Colour] | None] = []   # what each request is, by index
        self._keep: list[np.ndarray] = []  # buffers of requests in flight
        flat = array.reshape(-1)
        bounds = [flat.size * c // colours for c in range(colours + 1)]
        roots = colour_roots(comm.size, colours)
        self._colours = []
        for c in range(colours):
            if bounds[c + 1] > bounds[c]:  # fewer values than colours: some colours carry nothing
                self._colours.append(_Colour(c, flat[bounds[c]:bounds[c + 1]],
                                             TreeLinks(comm.size, roots[c], comm.rank)))
        for colour in self._colours:
            self._post_receives(colour)
        for colour in self._colours:
            if colour.waiting_children == 0:
                self._reduced(colour)

    # ------------------------------------------------------------------------------ progress
    def test(self) -> bool:
        while self._handle(self.comm.test_some(self._requests)):
            pass
        return self.done

    def wait(self) -> None:
        while not self.test():
            self._handle(self.comm.wait_some(self._requests))

    @property
    def done(self) -> bool:
        return all(c.delivered and c.sends == 0 and c.sent_up for c in self._colours)

    def _handle(self, indices) -> bool:
        for i in indices:
            kind, colour = self._events[i]
            self._events[i] = None
            if kind == "child":
                colour.waiting_children -= 1
                if colour.waiting_children == 0:
                    self._reduced(colour)
            elif kind == "up":
                colour.sent_up = True
                self._deliver_if_ready(colour)
            elif kind == "down":
                colour.arrived_down = True
                self._deliver_if_ready(colour)
            else:  # a send down completed
                colour.sends -= 1
        return bool(indices)

    # ------------------------------------------------------------------------------ steps
    def _tag(self, colour: _Colour, phase: int) -> int:
        return self.tag_base + 2 * colour.index + phase

    def _add(self, request, kind: str, colour: _Colour, buffer: np.ndarray) -> None:
        self._requests.append(request)
        self._events.append((kind, colour))
        self._keep.append(buffer)

    def _post_receives(self, colour: _Colour) -> None:
        part, links = colour.part, colour.links
        for child in links.children:
            message = self.wire.message_buffer(part.size, part.dtype)
            colour.from_children.append(message)
            self._add(self.comm.irecv(message, child, self._tag(colour, _UP)), "child", colour, message)
        if links.parent >= 0:
            colour.down_message = self.wire.message_buffer(part.size, part.dtype)
            self._add(self.comm.irecv(colour.down_message, links.parent, self._tag(colour, _DOWN)), "down", colour,
                      colour.down_message)

    def _reduced(self, colour: _Colour) -> None:
        """Every child's partial sum is in: add them (in child order) and send up, or, at the root, down."""
        for message in colour.from_children:
            self.wire.accumulate(colour.part, message)
        colour.from_children = []
        message = self.wire.encode(colour.part)
        if colour.links.parent >= 0:
            self._add(self.comm.isend(message, colour.links.parent, self._tag(colour, _UP)), "up", colour, message)
            return
        # The root keeps what the others will receive (for float16, the rounded sum).
        self.wire.decode(message, colour.part)
        colour.delivered = True
        self._send_down(colour, message)

    def _deliver_if_ready(self, colour: _Colour) -> None:
        if colour.delivered or not (colour.arrived_down and colour.sent_up):
            return
        self.wire.decode(colour.down_message, colour.part)
        colour.delivered = True
        self._send_down(colour, colour.down_message)

    def _send_down(self, colour: _Colour, message: np.ndarray) -> None:
        for child in colour.links.children:
            colour.sends += 1
            self._add(self.comm.isend(message, child, self._tag(colour, _DOWN)), "sent", colour, message)


class TreeReduction(Reduction):
    """Multicolour allreduce (``TreeOperation``) with ``colours`` trees and messages in ``wire``'s format.
    Every rank must start the same reductions in the same order (the transports do): the i-th
    reduction's tags are the same everywhere."""

    def __init__(self, comm, colours: int, wire: WireFormat | None = None):
        super().__init__(comm)
        self.colours = colour_count(comm.size, colours)
        self.wire = wire or WireFormat()
        # Tags cycle through as many operations as fit below the library's bound; far more than are
        # ever in flight at once (a few chunks, or one iteration's buckets).
        self._tag_window = (comm.max_tag + 1) // (2 * self.colours)
        if self._tag_window < MIN_TAG_WINDOW:
            raise ValueError(f"multicolor_colors {self.colours}: too many colours for this MPI library's largest "
                             f"tag ({comm.max_tag}); use at most {(comm.max_tag + 1) // (2 * MIN_TAG_WINDOW)}")
        self._started = 0

    def describe(self) -> str:
        return f"{describe_trees(self.comm.size, self.colours)}, over MPI point-to-point, {self.wire.describe()}"

    def start(self, array):
        tag_base = (self._started % self._tag_window) * 2 * self.colours
        self._started += 1
        return TreeOperation(self.comm, array, self.colours, self.wire, tag_base)

    def run(self, array) -> None:
        self.comm.wait_all([self.start(array)])


# ============================================================================================== the rule
@register_exchange("multicolor")
class MulticolorExchange(AllreduceExchange):
    """Synchronous data parallelism as ``allreduce`` (buckets, overlap, schedules), each bucket or
    chunk summed by the multicolour allreduce (module docstring) instead of the MPI library's."""

    def make_reduction(self) -> Reduction:
        """The trees over NCCL where the gradients are on a GPU and ``exchange_via`` is nccl
        (``DataParallel`` resolves auto to it where every rank can use NCCL: ``nccl.nccl_choice``),
        else over MPI on host arrays (from a GPU, through the pinned staging)."""
        if on_device(self.params) and self.options.exchange_via == "nccl":
            device = self.params[0].array_module
            return NcclTreeReduction(self.comm, self.options.multicolor_colors, self.wire_for(device))
        return TreeReduction(self.comm, self.options.multicolor_colors, self.wire_for(np))

    @classmethod
    def wire_for(cls, xp) -> WireFormat:
        """The messages' format, made by array module ``xp`` (NumPy, or the GPU's)."""
        return WireFormat(xp)

    def describe(self) -> str:
        asked = self.options.multicolor_colors
        chosen = ("chosen from the rank count" if asked <= 0 else
                  "as set" if asked == self.reduction.colours else f"{asked} asked, at most one per rank")
        return f"{super().describe()}; multicolour allreduce: {self.reduction.describe()} ({chosen})"
