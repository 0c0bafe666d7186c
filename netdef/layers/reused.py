"""Arrays a layer writes its results into: the same large ones from call to call, small ones fresh.

glibc's malloc serves an array below its mmap threshold (at most 32 MiB on 64-bit Linux) from memory
that earlier arrays freed: no page faults, and likely still in cache. A larger array is mapped afresh
on every allocation and unmapped when freed, so each call pays a page fault per 4 KiB page. Keeping
every output costs memory that keeping only the large ones does not, and gains no time below glibc's
threshold; above it, fresh arrays made ResNet-50's elementwise layers markedly slower (benchmarks/README.md,
"The figures behind the other layers' choices"), so only NumPy arrays of ``KEEP_FROM_BYTES`` or more
are kept (CuPy has its own caching pool).

The rule that makes a kept array safe to write again: a layer writes only into arrays it owns (its own
``ReusedArrays``), assigns them to its tops (``top.data = out``) or bottoms' diffs, and keeps
references to its *inputs* (never copies) for backward. A later layer, in place or not, replaces a
blob's array instead of writing into it, so an input stays as it was until the next iteration's
forward. A kept array is never given out where it overlaps the call's inputs: a user's Python data
layer writes its batch into whatever array its top holds, which can be an in-place consumer's output
from the last iteration, and that consumer then gets its other array (two are kept per name).
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import get_array_module


class ReusedArrays:
    """``get(name, like, avoid)``: an uninitialized array of ``like``'s shape, dtype and array module
    (or ``shape``, ``dtype``) that overlaps none of ``avoid`` (None entries are ignored): one kept
    from an earlier call under ``name`` where the array is large, else a fresh one."""

    KEEP_FROM_BYTES = 32 * 2 ** 20
    KEPT_PER_NAME = 2

    def __init__(self):
        self._kept: dict[str, list] = {}

    def get(self, name: str, like, avoid=(), shape=None, dtype=None):
        xp = get_array_module(like)
        shape = tuple(like.shape if shape is None else shape)
        dtype = np.dtype(like.dtype if dtype is None else dtype)
        if xp is not np or math.prod(shape) * dtype.itemsize < self.KEEP_FROM_BYTES:
            return xp.empty(shape, dtype)
        kept = [a for a in self._kept.get(name, []) if a.shape == shape and a.dtype == dtype]
        for a in kept:
            if not any(b is not None and np.may_share_memory(a, b) for b in avoid):
                return a
        fresh = np.empty(shape, dtype)
        self._kept[name] = (kept + [fresh])[-self.KEPT_PER_NAME:]
        return fresh
