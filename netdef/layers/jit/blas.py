"""Matrix products run by the kernels' thread pool: OpenBLAS's product called in one thread per panel.

Why: OpenBLAS (NumPy's BLAS) runs its products on a thread pool of its own, numba on another (OpenMP),
and a layer alternates between them (a product, then its bias and ReLU; a product, then a depthwise
convolution). Each pool's idle threads spin a while after their work (threads.py: sleeping at once
costs a thread wake-up per loop instead), so on a 2-core machine the pool that starts next finds its
second core held by the other pool's spinner: a small product and the map after it took several times
as long in turn as alone, whatever the two spin settings (benchmarks/README, "One thread pool" and "The
figures behind the other layers' choices"). Here the product runs on numba's pool too: C is cut into
``parts`` panels of its rows or its columns (layers/matmul.py chooses), and each thread of the pool
computes its panels by OpenBLAS's ``cblas_?gemm`` with OpenBLAS held at one thread for the call (its
count is restored after it, so NumPy's own products elsewhere keep their threads).

Panels only choose which elements of C a call computes, each element one BLAS dot product. Whether a
panel gives the bits one single-threaded call over the whole gives them depends on OpenBLAS's kernel
for the CPU: its micro-kernels of different widths round differently, so a panel edge must fall where
the whole call's tiles fall. Row panels begin on whole row tiles (``row_alignment``): on an AVX-512
machine (SkylakeX's kernels) a product cut into panels gave the whole call's bits in 46 of 47 cases
tried, the one apart having a panel small enough for OpenBLAS's small-matrix kernel. Column panels
round otherwise on AVX2 machines (Haswell's and Zen's sgemm tiles C's columns in blocks of 320, 16
wide with narrower tails), so there they agree with the whole call to rounding, not to the bit.
(OpenBLAS's own threads changed the bits of 16 of the 47 against one thread.)

Which BLAS: the ILP64 OpenBLAS of NumPy's wheels (``scipy_cblas_sgemm64_``, ``cblas_sgemm64_`` in the
1.x wheels), found once when this module loads; ``AVAILABLE`` is False with any other BLAS (MKL,
Accelerate, a distribution's NumPy) and the callers (layers/matmul.py) use NumPy's matmul. The
functions reach numba as named symbols (``llvmlite.binding.add_symbol``), so the compiled kernels
cache on disk like the others and find the library again in the next process.
"""
from __future__ import annotations

import ctypes
import os

from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

import numpy as np  # noqa: E402
from numba import njit, prange, types  # noqa: E402 (after the wait policy)

from .fusion import stage_addresses  # noqa: E402
from .kernel_calls import call11  # noqa: E402

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enumerations
# Column panels (and a matrix-vector product's panels of outputs) begin on multiples of this many.
COLUMN_ALIGN = 16
# Rows of C per row tile of OpenBLAS's kernels, by the kernel set it chose for the CPU (threadpoolctl's
# "architecture"), found by cutting products at every row: 12 for Haswell's and Zen's sgemm (2 for
# their dgemm), 16 for SkylakeX's; any other, 48, a multiple of both.
_ROW_TILES = {"haswell": 12, "zen": 12, "skylakex": 16, "cooperlake": 16, "sapphirerapids": 16}
_UNKNOWN_ROW_TILE = 48

_SYMBOLS = {"sgemm": "cblas_sgemm", "dgemm": "cblas_dgemm", "sgemv": "cblas_sgemv", "dgemv": "cblas_dgemv",
            "get_threads": "openblas_get_num_threads", "set_threads": "openblas_set_num_threads"}


def _numpy_openblas():
    """ctypes handle of the OpenBLAS library NumPy loaded, the prefix its symbols carry and the kernel
    set it chose for this CPU; None when NumPy's BLAS is another library or not an ILP64 OpenBLAS."""
    from threadpoolctl import threadpool_info

    numpy_dir = os.path.dirname(np.__file__)
    for pool in threadpool_info():
        if pool.get("internal_api") != "openblas" or not pool.get("filepath", "").startswith(numpy_dir):
            continue
        library = ctypes.CDLL(pool["filepath"])
        for prefix in ("scipy_", ""):
            if all(hasattr(library, f"{prefix}{name}64_") for name in _SYMBOLS.values()):
                return library, prefix, str(pool.get("architecture", ""))
    return None


def _bind() -> str | None:
    """Binds OpenBLAS's functions for the kernels; the kernel set's name, None where there is none."""
    found = _numpy_openblas()
    if found is None:
        return None
    import llvmlite.binding as llvm

    library, prefix, architecture = found
    for ours, theirs in _SYMBOLS.items():
        address = ctypes.cast(getattr(library, f"{prefix}{theirs}64_"), ctypes.c_void_p).value
        llvm.add_symbol(f"netdef_blas_{ours}", address)
    return architecture


_ARCHITECTURE = _bind()
AVAILABLE = _ARCHITECTURE is not None


def kernel_set() -> str:
    """The kernel set NumPy's OpenBLAS chose for this CPU, lower case ("haswell", "skylakex", ...); ""
    where NumPy's BLAS is not one these kernels bind."""
    return (_ARCHITECTURE or "").lower()


def row_alignment() -> int:
    """Row panels begin on multiples of this many rows of C: whole row tiles of OpenBLAS's kernels here.
    An argument of the kernels, not a constant in them: their compiled code is cached on disk, and a
    cache may move to another CPU."""
    return _ROW_TILES.get(kernel_set(), _UNKNOWN_ROW_TILE)

_i32, _i64, _ptr = types.int32, types.int64, types.intp


def _gemm_type(real):
    # cblas_?gemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), 64-bit integers.
    return types.void(_i32, _i32, _i32, _i64, _i64, _i64, real, _ptr, _i64, _ptr, _i64, real, _ptr, _i64)


def _gemv_type(real):
    # cblas_?gemv(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy), 64-bit integers.
    return types.void(_i32, _i32, _i64, _i64, real, _ptr, _i64, _ptr, _i64, real, _ptr, _i64)


_sgemm = types.ExternalFunction("netdef_blas_sgemm", _gemm_type(types.float32))
_sgemv = types.ExternalFunction("netdef_blas_sgemv", _gemv_type(types.float32))
_dgemv = types.ExternalFunction("netdef_blas_dgemv", _gemv_type(types.float64))
_dgemm = types.ExternalFunction("netdef_blas_dgemm", _gemm_type(types.float64))
_get_threads = types.ExternalFunction("netdef_blas_get_threads", _i32())
_set_threads = types.ExternalFunction("netdef_blas_set_threads", types.void(_i32))


@njit(inline="always")
def _bounds(part, parts, side, align):
    """(lo, hi): panel ``part`` of ``parts`` near-equal runs of whole ``align`` units over ``side``."""
    units = (side + align - 1) // align
    return min(side, units * part // parts * align), min(side, units * (part + 1) // parts * align)


@njit(inline="always")
def _panel(task, parts, split_rows, align, m, n, trans_a, lda, trans_b, ldb, ldc):
    """(batch item, rows, columns, offsets into a, b and c in elements) of panel ``task``: the panels cut
    C's rows (``split_rows``) or its columns on multiples of ``align``."""
    item = task // parts
    lo, hi = _bounds(task % parts, parts, m if split_rows else n, align)
    if split_rows:  # rows lo..hi of op(a) and c
        return item, hi - lo, n, lo * (1 if trans_a == TRANS else lda), 0, lo * ldc
    return item, m, hi - lo, 0, lo * (ldb if trans_b == TRANS else 1), lo  # columns lo..hi of op(b) and c


@njit(inline="always")
def _gemm_panel(task, double, trans_a, trans_b, m, n, k, a, lda, step_a, b, ldb, step_b, c, ldc, step_c, parts,
                split_rows, align):
    item, rows, cols, da, db, dc = _panel(task, parts, split_rows, align, m, n, trans_a, lda, trans_b, ldb, ldc)
    if rows <= 0 or cols <= 0:
        return
    size = 8 if double else 4
    a_at, b_at, c_at = a + size * (item * step_a + da), b + size * (item * step_b + db), c + size * (item * step_c + dc)
    if double:
        _dgemm(ROW_MAJOR, trans_a, trans_b, rows, cols, k, 1.0, a_at, lda, b_at, ldb, 0.0, c_at, ldc)
    else:
        _sgemm(ROW_MAJOR, trans_a, trans_b, rows, cols, k, np.float32(1.0), a_at, lda, b_at, ldb, np.float32(0.0),
               c_at, ldc)


@njit(inline="always")
def _map_panel(task, parts, split_rows, align, m, n, c, size, mapper, stages):
    """Panel ``task``'s elements of C (at address ``c``: items x m x n, elements of ``size`` bytes)
    through the channel map (``mapper``: jit/fusion.rows_mapper's address; ``stages``: the addresses
    of the map's arrays), row r of each matrix being channel r."""
    item = task // parts
    lo, hi = _bounds(task % parts, parts, m if split_rows else n, align)
    rows = (lo, hi) if split_rows else (0, m)
    cols = (0, n) if split_rows else (lo, hi)
    if cols[1] <= cols[0] or rows[1] <= rows[0]:
        return
    shifts, means, stds, scales, biases, slope = stages
    call11(mapper, c + size * ((item * m + rows[0]) * n + cols[0]), np.int64(cols[1] - cols[0]), np.int64(n),
           np.int64(rows[1] - rows[0]), np.int64(rows[0]), shifts, means, stds, scales, biases, slope)


@njit(inline="always")
def _run_panels(double, trans_a, trans_b, m, n, k, a, lda, step_a, b, ldb, step_b, c, ldc, step_c, items, parts,
                split_rows, align, mapper, stages):
    """The panels of ``gemm_panels``, each then mapped by ``_map_panel`` where ``mapper`` is not 0
    (C then contiguous: ldc n, step_c m*n)."""
    size = 8 if double else 4
    threads = _get_threads()
    if threads != 1:
        _set_threads(1)
    if items * parts == 1:
        _gemm_panel(0, double, trans_a, trans_b, m, n, k, a, lda, step_a, b, ldb, step_b, c, ldc, step_c, 1,
                    split_rows, align)
        if mapper != 0:
            _map_panel(0, 1, split_rows, align, m, n, c, size, mapper, stages)
    else:
        for task in prange(items * parts):
            _gemm_panel(task, double, trans_a, trans_b, m, n, k, a, lda, step_a, b, ldb, step_b, c, ldc, step_c,
                        parts, split_rows, align)
            if mapper != 0:
                _map_panel(task, parts, split_rows, align, m, n, c, size, mapper, stages)
    if threads != 1:
        _set_threads(threads)


@njit(nogil=True, parallel=True, cache=True)
def gemm_panels(double, trans_a, trans_b, m, n, k, a, lda, step_a, b, ldb, step_b, c, ldc, step_c, items, parts,
                split_rows, align):
    """c[i] = op(a[i]) @ op(b[i]) for the ``items`` matrices (float64 when ``double``, else float32) at
    addresses a + i * step_a elements (and so on; steps and leading dimensions in elements, a step of 0
    broadcasts), each cut into ``parts`` panels of its rows (``split_rows``) or its columns, edges on
    multiples of ``align``: one OpenBLAS call per panel on the pool's threads (one panel: in the calling
    thread)."""
    _run_panels(double, trans_a, trans_b, m, n, k, a, lda, step_a, b, ldb, step_b, c, ldc, step_c, items, parts,
                split_rows, align, 0, (0, 0, 0, 0, 0, 0))


@njit(nogil=True, parallel=True, cache=True)
def gemm_panels_mapped(double, trans_a, trans_b, m, n, k, a, lda, step_a, b, ldb, step_b, c, ldc, step_c, items,
                       parts, split_rows, align, mapper, shift, mean, std, scale, bias, slope):
    """``gemm_panels`` with C contiguous (ldc n, step_c m*n), then each panel through a channel map
    (layers/fusion.py; row r of each matrix is channel r) by the thread that computed it, while it is
    in cache: ``mapper`` is jit/fusion.rows_mapper's address, ``shift`` ... ``bias`` the map's
    per-channel arrays and ``slope`` its negative slope as one value (arrays whatever stages the map
    has: the mapper reads only its own)."""
    stages = stage_addresses(shift, mean, std, scale, bias, slope)
    _run_panels(double, trans_a, trans_b, m, n, k, a, lda, step_a, b, ldb, step_b, c, ldc, step_c, items, parts,
                split_rows, align, mapper, stages)


@njit(nogil=True, cache=True)
def data_address(x):
    """The address of ``x``'s first element, what ``x.ctypes.data`` gives: NumPy builds a ctypes helper
    object for that, which costs more than a small product does; this call a fraction of it."""
    return x.ctypes.data


@njit(inline="always")
def _gemv_panel(part, double, trans, rows, cols, a, lda, x, incx, y, incy, parts):
    # The outputs lo..hi of panel ``part``: rows lo..hi of a (NO_TRANS) or its columns (TRANS).
    lo, hi = _bounds(part, parts, cols if trans == TRANS else rows, COLUMN_ALIGN)
    if hi <= lo:
        return
    size = 8 if double else 4
    if trans == TRANS:
        m, n, a_at = rows, hi - lo, a + size * lo
    else:
        m, n, a_at = hi - lo, cols, a + size * lo * lda
    y_at = y + size * lo * incy
    if double:
        _dgemv(ROW_MAJOR, trans, m, n, 1.0, a_at, lda, x, incx, 0.0, y_at, incy)
    else:
        _sgemv(ROW_MAJOR, trans, m, n, np.float32(1.0), a_at, lda, x, incx, np.float32(0.0), y_at, incy)


@njit(nogil=True, parallel=True, cache=True)
def gemv_panels(double, trans, rows, cols, a, lda, x, incx, y, incy, parts):
    """y = op(a) @ x, a a rows x cols matrix (row-major, leading dimension ``lda``; op: TRANS or
    NO_TRANS) at address ``a``, x and y vectors of elements ``incx`` and ``incy`` apart: y's elements
    cut into ``parts`` panels of whole COLUMN_ALIGN runs, one OpenBLAS ``cblas_?gemv`` per panel on the
    pool's threads, OpenBLAS held at one thread as in ``gemm_panels``. Each element of y is one dot
    product whichever panel computes it."""
    threads = _get_threads()
    if threads != 1:
        _set_threads(1)
    if parts == 1:
        _gemv_panel(0, double, trans, rows, cols, a, lda, x, incx, y, incy, 1)
    else:
        for part in prange(parts):
            _gemv_panel(part, double, trans, rows, cols, a, lda, x, incx, y, incy, parts)
    if threads != 1:
        _set_threads(threads)
