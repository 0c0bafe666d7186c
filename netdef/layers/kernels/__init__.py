"""CUDA kernels of the vision layers, compiled from the ``.cu`` sources beside this file with CuPy.

Each source holds plain ``extern "C" __global__`` functions written for a floating type ``real``
(``-Dreal=float`` or ``-Dreal=double``). Every kernel takes its work-item count first and runs a
grid-stride loop. Each kernel has a NumPy twin, the CPU implementation (named in the source's header),
and the layers call a kernel only when their arrays are CuPy arrays; nothing here imports CuPy until a
kernel is loaded.
"""
from __future__ import annotations

import functools
import pathlib
import re

import numpy as np

from ...memory import BlobTooLargeError

DIRECTORY = pathlib.Path(__file__).resolve().parent
THREADS_PER_BLOCK = 512
MAX_BLOCKS = 65535
_REAL = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
# Compiler options of a source beyond the defaults: the BatchNorm chain's values follow the CPU
# kernels' roundings, so no product may be fused into a sum (nvrtc contracts ``a * b + c`` otherwise).
_SOURCE_OPTIONS = {"batchnorm_chain.cu": ("--fmad=false",)}


def sources() -> list[pathlib.Path]:
    """The .cu files, sorted by name."""
    return sorted(DIRECTORY.glob("*.cu"))


@functools.lru_cache(maxsize=None)
def kernel_names() -> dict[str, pathlib.Path]:
    """Kernel name -> the source that defines it."""
    found = {}
    for path in sources():
        for name in re.findall(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(', path.read_text()):
            found[name] = path
    return found


def real_type(dtype) -> str:
    try:
        return _REAL[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"CUDA kernels run on float32 or float64 arrays, not {np.dtype(dtype)}") from None


@functools.lru_cache(maxsize=None)
def load_kernel(name: str, dtype=np.float32):
    """The CuPy RawKernel ``name`` compiled for ``dtype`` (float32 or float64); GPU only."""
    import cupy

    try:
        path = kernel_names()[name]
    except KeyError:
        raise KeyError(f"no CUDA kernel {name!r} in {DIRECTORY} (known: {', '.join(sorted(kernel_names()))})") from None
    options = ("--std=c++14", f"-Dreal={real_type(dtype)}") + _SOURCE_OPTIONS.get(path.name, ())
    return cupy.RawKernel(path.read_text(), name, options=options)


def usable(*arrays) -> bool:
    """Whether the kernels take these arrays: every one (None entries aside) a non-empty C-contiguous
    CuPy array, all float32 or all float64."""
    dtype = None
    for a in arrays:
        if a is None:
            continue
        if type(a) is np.ndarray or not type(a).__module__.startswith("cupy") or not a.flags.c_contiguous or not a.size:
            return False
        if dtype is None:
            dtype = a.dtype
            if dtype not in _REAL:
                return False
        elif a.dtype != dtype:
            return False
    return dtype is not None


#: The largest count or size a kernel's ``int`` takes (its indices are 32-bit, as Caffe's).
MAX_INT = 2**31 - 1


def int_args(*values) -> tuple:
    """The kernels' ``int`` arguments, as ``launch`` takes them: a ``numpy.int32`` each. A value over
    ``MAX_INT`` is refused (NumPy 1 would wrap it silently, and the kernel would run on a wrong count)."""
    for value in values:
        _check_int(value)
    return tuple(np.int32(v) for v in values)


def _check_sizes(nthreads: int, args) -> None:
    """The count and every array a kernel indexes within ``MAX_INT`` (a kernel's work items may be
    fewer than the values it reads: pooling's and LRN's address their whole input)."""
    _check_int(nthreads)
    for arg in args:
        if not isinstance(arg, (np.generic, int, float)):  # an array (NumPy's np.size would cost CuPy more)
            _check_int(arg.size)


def _check_int(value) -> None:
    if int(value) > MAX_INT:
        raise BlobTooLargeError(f"{int(value)} values is more than netdef's GPU kernels index ({MAX_INT}, "
                                f"32-bit): a smaller batch_size")


def _real_dtype(args):
    for a in args:  # arrays and NumPy scalars have a dtype (ndim 0 for a scalar); Python numbers do not
        dtype = getattr(a, "dtype", None)
        if dtype is not None and getattr(a, "ndim", 0) > 0 and np.dtype(dtype) in _REAL:
            return np.dtype(dtype)
    raise TypeError("a kernel launch needs at least one float32/float64 array argument")


def launch(name: str, nthreads: int, args: tuple) -> None:
    """Run kernel ``name`` over ``nthreads`` work items. ``args`` follow the count, in the source's
    order: C-contiguous arrays, ``numpy.int32`` for ``int`` and a scalar of the arrays' float type
    for ``real`` (the first float array decides which build runs)."""
    if nthreads <= 0:
        return
    _check_sizes(nthreads, args)
    kernel = load_kernel(name, _real_dtype(args))
    blocks = min((nthreads + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK, MAX_BLOCKS)
    kernel((blocks,), (THREADS_PER_BLOCK,), (np.int32(nthreads),) + tuple(args))


def launch_blocks(name: str, dtype, grid: tuple, block: int, args: tuple) -> None:
    """Run the ``dtype`` build of kernel ``name`` on ``grid`` blocks of ``block`` threads (kernels
    that work block by block, such as a reduction's, or whose first float array is not of type
    ``real``); ``args`` as for ``launch``, without the count."""
    _check_sizes(0, args)
    load_kernel(name, np.dtype(dtype))(tuple(grid), (block,), tuple(args))
