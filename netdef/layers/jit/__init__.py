"""Compiled CPU kernels (numba), the CPU counterpart of kernels/*.cu.

NumPy runs every array operation on one core, one pass over memory at a time; the layers whose math is
a short loop over a small window (depthwise convolution, ...) need many such passes, while BLAS and
PyTorch use every core. The kernels here compute those layers in one parallel pass. Each has a
reference twin written against the array module (what runs on CuPy arrays, and what the tests compare
the kernels with); a layer picks the kernel for NumPy arrays when ``ENABLED`` (tests switch it off to
run the reference).

Compiled on first use for the dtype at hand (float32 and float64), cached on disk by numba
(``cache=True``) so later processes start fast. Threads: numba's pool, ``NUMBA_NUM_THREADS`` or all
cores by default. Every kernel that is called from Python releases the GIL while it runs
(``nogil=True``): in distributed training the communication thread must get the interpreter to keep
the exchange moving, and a convolution's im2col copy or a pooling pass would hold it for as long as
it runs.
"""
from __future__ import annotations

import numpy as np

_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)

ENABLED = True  # tests switch the kernels off to compare them with the reference functions


def usable(*arrays) -> bool:
    """Whether the kernels take these arrays: ``ENABLED``, and every array (None entries, absent
    optional ones, aside) a non-empty C-contiguous NumPy array, all float32 or all float64."""
    # A plain loop: asked before every kernel call (MobileNet v2 at batch 1: 200 a forward), where
    # generators over the arrays cost microseconds.
    if not ENABLED:
        return False
    dtype = None
    for a in arrays:
        if a is None:
            continue
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.size:
            return False
        if dtype is None:
            dtype = a.dtype
            if dtype != _FLOAT32 and dtype != _FLOAT64:
                return False
        elif a.dtype != dtype:
            return False
    return dtype is not None


def planes(a):
    """(N, C, ...) as (N*C, ...): the planes the pooling and LRN kernels loop over."""
    return a.reshape((-1,) + a.shape[2:])


def cells(a):
    """(N, C, ...) as (N, C, cells): the channels and cells the LRN kernels loop over."""
    return a.reshape(a.shape[:2] + (-1,))
