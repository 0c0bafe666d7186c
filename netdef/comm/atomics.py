"""A memory barrier and an atomic compare-and-swap on memory the ranks of a machine share, done by the
processor's own instructions without letting go of the GIL.

MPI offers both on a shared window (``Win.Sync``, ``Win.Compare_and_swap`` + ``Win.Flush``), but
mpi4py lets go of the GIL around every MPI call. A rank's training thread polls the shared-memory sums
between layers, several barriers a poll, while its data thread decodes the next batch: after each
call the training thread must take the GIL back, and where the data thread holds it, that waits for
the data thread's switch interval: in a 2-rank training run of the digits example a compare-and-swap
through MPI took some thirty times as long as alone (benchmarks/README.md, "A rank that falls behind
holds up no one").

On shared memory these are plain instructions (``mfence``, ``lock cmpxchg`` on x86-64; ``dmb`` and
exclusive loads and stores on Arm), valid between processes that map the same pages, so they need
no library at all: each is one LLVM instruction in a function numba compiles (and caches), called
with the GIL held.
"""
from __future__ import annotations

import numpy as np

from ..threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from llvmlite import ir  # noqa: E402  (numba's own dependency)
from numba import njit, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402


@intrinsic
def _fence(typingctx):
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _cmpxchg(typingctx, address, expected, new):
    if not all(isinstance(arg, types.Integer) for arg in (address, expected, new)):
        return None

    def codegen(context, builder, signature, args):
        word = ir.IntType(64)
        pointer = builder.inttoptr(args[0], word.as_pointer())
        old_and_swapped = builder.cmpxchg(pointer, context.cast(builder, args[1], signature.args[1], types.int64),
                                          context.cast(builder, args[2], signature.args[2], types.int64),
                                          "seq_cst", "seq_cst")
        return builder.extract_value(old_and_swapped, 0)

    return types.int64(address, expected, new), codegen


@njit(cache=True)
def _full_fence_compiled():
    _fence()


@njit(cache=True)
def _compare_and_swap_compiled(address, expected, new):
    return _cmpxchg(address, expected, new)


def full_fence() -> None:
    """A full memory barrier: this process's loads and stores before it are ordered before those
    after it, as the other processes that share the memory see them."""
    _full_fence_compiled()


def compare_and_swap(address: int, expected: int, new: int) -> int:
    """Atomically: where the int64 at ``address`` (8-byte aligned, in memory this process maps) is
    ``expected``, make it ``new``; return what it was. A full barrier, as ``full_fence``."""
    if address % 8:
        raise ValueError(f"compare_and_swap needs an 8-byte aligned address, not {address:#x}")
    return int(_compare_and_swap_compiled(address, expected, new))


def address_of(array: np.ndarray) -> int:
    """Where ``array``'s first element lies in this process's memory."""
    return int(array.__array_interface__["data"][0])
