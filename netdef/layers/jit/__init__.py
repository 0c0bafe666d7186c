"""Compiled CPU kernels (numba), the CPU counterpart of kernels/*.cu.

NumPy runs every array operation on one core, one pass over memory at a time; the layers whose math is
a short loop over a small window (depthwise convolution, ...) need many such passes, while BLAS and
PyTorch use every core. The kernels here compute those layers in one parallel pass. Each has a
reference twin written against the array module (what runs on CuPy arrays, and what the tests compare
the kernels with); a layer picks the kernel for NumPy arrays when ``ENABLED`` (tests switch it off to
run the reference).

Compiled on first use for the dtype at hand (float32 and float64), cached on disk by numba
(``cache=True``) so later processes start fast; the first run on a machine compiles for most of a
minute, which ``compile_notice`` tells the user before it starts. Threads: numba's pool, ``NUMBA_NUM_THREADS`` or all
cores by default. Every kernel that is called from Python releases the GIL while it runs
(``nogil=True``): in distributed training the communication thread must get the interpreter to keep
the exchange moving, and a convolution's im2col copy or a pooling pass would hold it for as long as
it runs.
"""
from __future__ import annotations

import glob
import os

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


# How long the first run's compiles take, in the words of the notice (benchmarks/README.md, "Threads
# beside other processes", has the figures).
COMPILE_TIME = "a minute (longer while other processes keep the cores busy)"


def cache_directories() -> list[str]:
    """Where numba keeps this package's compiled kernels: under NUMBA_CACHE_DIR when set, else in
    ``__pycache__`` beside the modules (where it can write) or the user's cache directory."""
    chosen = os.environ.get("NUMBA_CACHE_DIR", "").strip()
    if chosen:
        return [chosen]
    return [os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__"),
            os.path.join(os.path.expanduser("~"), ".cache", "numba")]


def cache_is_cold(places: list[str] | None = None) -> bool:
    """Whether none of this package's compiled kernels is cached yet in ``places`` (``cache_directories``):
    numba names each kernel's index ``<module>.<function>-<line>.py<version>.nbi``."""
    modules = [name[:-3] for name in os.listdir(os.path.dirname(os.path.abspath(__file__)))
               if name.endswith(".py") and name != "__init__.py"]
    for place in cache_directories() if places is None else places:
        if not os.path.isdir(place):
            continue
        for module in modules:
            if glob.glob(os.path.join(place, "**", f"{module}.*.nbi"), recursive=True):
                return False
    return True


def compile_notice(places: list[str] | None = None) -> str | None:
    """The line that tells the user, before the first iteration, that the kernels are being compiled
    (``cache_is_cold``), and for about how long; None when they are cached."""
    if not ENABLED or not cache_is_cold(places):
        return None
    where = (places or cache_directories())[0]
    return (f"Compiling netdef's CPU kernels for this machine during the first iterations: about {COMPILE_TIME}, "
            f"once (they are cached in {where})")
