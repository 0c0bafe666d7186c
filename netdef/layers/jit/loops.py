"""Vector loops and work splits the pooling and LRN kernels share.

Each loop runs over equal-length 1-D arrays (slices) indexed by the loop counter only: an index
computed as ``base + k`` gets numba's negative-index check, which stops LLVM vectorizing (see
jit/depthwise.py). Kernels that divide compile with ``error_model="numpy"`` (ERRORS): numba's default
checks every float division for zero, and that branch stops vectorizing too (and would raise where
NumPy gives inf or NaN).
"""
from __future__ import annotations

from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from numba import njit  # noqa: E402 (after the wait policy)

ERRORS = "numpy"
BLOCKS = 128  # at most this many blocks of work items (planes) for the threads to share
BLOCK_ITEMS = 8  # at least this many items per block: each block allocates its scratch once


@njit(inline="always")
def blocks(items):
    """How many blocks the threads share: many per thread, so that uneven loads even out, but few
    enough that allocating their scratch costs little against their work."""
    return max(1, min(BLOCKS, items // BLOCK_ITEMS))


@njit(inline="always")
def block_range(block, count, items):
    """The items of block ``block`` of ``count``."""
    return range(block * items // count, (block + 1) * items // count)


@njit(inline="always")
def copy(dst, src):
    for k in range(dst.shape[0]):
        dst[k] = src[k]


@njit(inline="always")
def add(dst, src):
    for k in range(dst.shape[0]):
        dst[k] += src[k]


@njit(inline="always")
def fill(dst, value):
    for k in range(dst.shape[0]):
        dst[k] = value
