"""The buckets the synchronous rules exchange: a bucket is the gradients of a few parameters back to
back in one flat buffer (``Bucket``), and ``plan_buckets`` lays them out from the order the gradients
become final, so that small blobs share one collective and a large one goes alone, and every rank
plans the same buckets in the same order.
"""
from __future__ import annotations

import numpy as np

from .. import backend


class Bucket:
    """A flat host buffer holding the gradients of ``param_ids`` back to back (``offsets``).

    Where a parameter's diff lives in the bucket (``home_of``: the allreduce rules put host diffs
    there once the layout is planned), packing and unpacking it copy nothing. Otherwise a diff is
    copied in and the average copied out, except that a bucket of one blob whose diff is a
    C-contiguous NumPy array of the bucket's dtype is exchanged in the diff's own memory.
    """

    def __init__(self, index: int, dtype, param_ids: list[int], shapes: list[tuple]):
        self.index = index
        self.dtype = np.dtype(dtype)
        self.param_ids = list(param_ids)
        self.shapes = [tuple(s) for s in shapes]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.offsets = [int(o) for o in np.cumsum([0] + self.sizes[:-1])]
        self._own = None  # allocated by the first pack that needs it (a GPU's staging brings its own)
        self._given = False  # the reduction's memory (give_buffer): gradients are always copied into it
        self.buffer = None
        self.in_place = False
        self.reset()

    @property
    def nbytes(self) -> int:
        return sum(self.sizes) * self.dtype.itemsize

    def reset(self) -> None:
        self.filled = 0
        self.handed_off = False
        self.unpacked = False
        self.ready_at = self.started_at = self.done_at = float("nan")

    @property
    def full(self) -> bool:
        return self.filled == len(self.param_ids)

    def home_of(self, slot: int) -> np.ndarray:
        """Where gradient ``slot`` is summed, in its shape: part of the bucket's own buffer (made now if
        it has none), where the parameter's diff may live (``AllreduceExchange`` keeps it there)."""
        start = self.offsets[slot]
        return self.own_buffer()[start:start + self.sizes[slot]].reshape(self.shapes[slot])

    def own_buffer(self) -> np.ndarray:
        """The bucket's own buffer (given, or made on first need)."""
        if self._own is None:
            self._own = np.empty(sum(self.sizes), dtype=self.dtype)
        return self._own

    def _is_home(self, slot: int, diff) -> bool:
        """Whether ``diff`` is the memory ``home_of(slot)`` gives: the gradient is already in place."""
        if self._own is None or not isinstance(diff, np.ndarray) or diff.dtype != self.dtype:
            return False
        start = self._own.__array_interface__["data"][0] + self.offsets[slot] * self.dtype.itemsize
        return (diff.__array_interface__["data"][0] == start and diff.size == self.sizes[slot]
                and diff.flags.c_contiguous)

    def pack(self, slot: int, diff) -> None:
        """Put one gradient into its place (nothing to do where the diff lives there, ``home_of``; a
        bucket of one may use the diff's own memory)."""
        self.filled += 1
        if self._is_home(slot, diff):
            self.buffer = self._own
            self.in_place = False
            return
        if (not self._given and len(self.param_ids) == 1 and isinstance(diff, np.ndarray) and diff.flags.c_contiguous
                and diff.dtype == self.dtype):
            self.buffer = diff.reshape(-1)
            self.in_place = True
            return
        self.buffer = self.own_buffer()
        self.in_place = False
        self.slot_view(slot)[...] = diff if isinstance(diff, np.ndarray) else backend.to_host(diff)

    def give_buffer(self, buffer: np.ndarray) -> None:
        """Hold the bucket's gradients in ``buffer`` (flat, the bucket's size and dtype: memory the
        reduction sums in, ``Reduction.buffers``) from now on, a bucket of one blob included."""
        if buffer.size != sum(self.sizes) or buffer.dtype != self.dtype:
            raise ValueError(f"bucket {self.index} holds {sum(self.sizes)} {self.dtype} values, not {buffer.size} "
                             f"{buffer.dtype}")
        self._own = buffer
        self._given = True

    def take_buffer(self, buffer: np.ndarray) -> None:
        """Count one more gradient as packed, into ``buffer`` (the whole bucket's, flat), which the
        caller fills (``gradient_staging.py``: a GPU's diffs are copied in asynchronously)."""
        self.filled += 1
        self.buffer = buffer
        self.in_place = False

    def slot_view(self, slot: int) -> np.ndarray:
        """The part of the buffer that holds gradient ``slot``, in its shape."""
        start = self.offsets[slot]
        return self.buffer[start:start + self.sizes[slot]].reshape(self.shapes[slot])

    def unpack(self, slot: int, diff, divisor, leave_division: bool = False) -> bool:
        """Write the summed values divided by ``divisor`` into ``diff``. With ``leave_division``, a
        bucket exchanged in the diff's own memory leaves the sum there; returns whether it did (the
        caller then owes the division)."""
        divisor = self.dtype.type(divisor)
        if self.in_place or self._is_home(slot, diff):
            if leave_division:
                return True
            summed = self.buffer if self.in_place else self.slot_view(slot)
            np.divide(summed, divisor, out=summed)
            return False
        values = self.slot_view(slot)
        if isinstance(diff, np.ndarray):
            np.divide(values, divisor, out=diff)
        else:
            diff[...] = backend.to_device(values / divisor, like=diff)
        return False


FUSE_ACROSS_LAYERS_BYTES = 256 << 10


def plan_buckets(order: list[int], params, bucket_bytes: int, layers: list[list[int]] | None = None) -> list[Bucket]:
    """Buckets for the parameter ids in hook ``order``, in the order they fill up.

    A blob of at least ``bucket_bytes`` is a bucket of its own, started as soon as it is final.
    Smaller blobs (biases, small layers) are fused in hook order into buckets of at most
    ``bucket_bytes`` and one dtype. Fusing must not hold gradients back for long, since what waits
    for the layers below reaches the link late, and what is still waiting when backward ends is
    exposed in full:

    - a big blob closes the fused bucket before it (what became final before it leaves before it);
    - with ``layers`` (``order`` split by the backward hook call that handed the ids over, one per
      layer), a fused bucket also closes at the end of a layer once it holds at least
      ``min(bucket_bytes, FUSE_ACROSS_LAYERS_BYTES)``: only small layers (biases, small
      convolutions) wait for the next layer's backward, and the last bucket, which starts when
      backward ends, holds only the bottom layers' gradients.

    Empty blobs are left out.
    """
    buckets: list[Bucket] = []
    group: list[int] = []
    group_bytes = 0
    layer_ends: set[int] = set()
    if layers:
        for ids in layers:
            if ids:
                layer_ends.add(ids[-1])
    fuse_across = min(bucket_bytes, FUSE_ACROSS_LAYERS_BYTES)

    def emit(ids):
        dtype = params[ids[0]].diff.dtype
        buckets.append(Bucket(len(buckets), dtype, ids, [params[i].shape for i in ids]))

    for pid in order:
        diff = params[pid].diff
        nbytes = int(diff.size) * diff.dtype.itemsize
        if nbytes >= bucket_bytes:
            if group:
                emit(group)
                group, group_bytes = [], 0
            emit([pid])
        elif nbytes:
            if group and (diff.dtype != params[group[0]].diff.dtype or group_bytes + nbytes > bucket_bytes):
                emit(group)
                group, group_bytes = [], 0
            group.append(pid)
            group_bytes += nbytes
        if pid in layer_ends and group and group_bytes >= fuse_across:
            emit(group)
            group, group_bytes = [], 0
    if group:
        emit(group)
    # Number them in the order they fill up during backward: the order they start in.
    position = {pid: i for i, pid in enumerate(order)}
    buckets.sort(key=lambda b: position[b.param_ids[-1]])
    for index, bucket in enumerate(buckets):
        bucket.index = index
    return buckets
