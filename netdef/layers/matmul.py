"""``matmul(a, b, out=None)``: the layers' matrix products, on the compiled kernels' thread pool.

NumPy's ``matmul`` for what it is given, computed by jit/blas.py where that can: float32 or float64
NumPy arrays, 2-D or 3-D (a batch of matrices; a 2-D operand is broadcast over the other's batch as
NumPy does), each matrix with one unit stride (C-contiguous or a transposed view of one, as BLAS
reads it), ``out`` (when given) with contiguous rows and sharing no memory with the operands. Every
other case (CuPy arrays, other dtypes, odd strides, empty matrices, a dot product, another
BLAS under NumPy, ``jit.ENABLED`` off) is NumPy's or CuPy's own ``matmul``, which is also the twin the
tests compare with. A row times a matrix, or a matrix times a column (2-D), is a matrix-vector
product, in panels of its outputs (jit/blas.py's ``gemv_panels``).

Threads: the products use the kernels' pool, as many threads as its other loops (``numba.get_num_threads``,
which ``threads.share_cores`` sets per rank). Their panels are cut for ``threads.partition_width()``, the
plan's count, not for the count running now: a count that follows the load runs the same panels, so
the same bits come out. A product of fewer than PARALLEL_MIN_MULTIPLY_ADDS is
NumPy's: OpenBLAS runs those in the calling thread too, and in less time than the checks here take
(benchmarks/README.md, "The figures behind the other layers' choices").
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from ..threads import partition_width
from . import jit
from .fusion import mapper_arguments

# Below this OpenBLAS runs a product on one thread (2^18 multiply-adds per thread, 2 threads).
PARALLEL_MIN_MULTIPLY_ADDS = 1 << 19
# Panels split C's rows when it has at least this many (or more rows than columns): of the rows or
# the columns of LeNet's, MobileNet's and others' products, splitting the columns was the faster only
# where C has few rows, and the slower by far for a tall C (benchmarks/README.md, "The figures behind
# the other layers' choices").
SPLIT_ROWS_FROM = 128
# Products of at most this many rows by a transposed matrix are cut into panels of SKINNY_COLUMNS
# columns when each panel stays under this many multiply-adds (``_skinny_panels``).
SKINNY_MAX_ROWS = 8
SKINNY_MAX_MULTIPLY_ADDS = 1 << 20
SKINNY_COLUMNS = 16

_NO_TRANS, _TRANS = 111, 112  # CBLAS's enumerations (jit/blas.py)


def matmul(a, b, out=None):
    """``np.matmul(a, b, out=out)``, on the kernels' pool where it can (the module docstring)."""
    blas = _pool_blas(a, b, out)
    if blas is None:
        return get_array_module(a).matmul(a, b, out=out)
    if a.shape[-2] == 1 or b.shape[-1] == 1:
        return _matrix_vector(blas, a, b, out)
    if out is None:
        out = np.empty(_product_shape(a, b), a.dtype)
    panels = _gemm_panels(a, b, out)
    if panels is None:
        return np.matmul(a, b, out=out)
    blas.gemm_panels(*panels)
    return out


def matmul_row_mapped(a, b, out, row_map) -> bool:
    """out = ``row_map``(a @ b), where each row of the product (of each matrix of a batch) is one
    channel of the map (layers/fusion.ChannelMap: a pointwise convolution's output channels):
    every panel of the product is mapped by the thread that computed it, while it is still in
    cache, instead of in a pass of its own over ``out`` afterwards. The same bits as ``matmul``
    and then ``fusion.apply``. False, with nothing written, where ``matmul`` would not run the
    product on jit/blas.py's panels (NumPy's products, matrix-vector ones), where ``out`` is not
    C-contiguous, or where the map's per-channel values are not over the product's rows."""
    blas = _pool_blas(a, b, out)
    if blas is None:
        return False
    if a.shape[-2] == 1 or b.shape[-1] == 1 or not out.flags.c_contiguous:
        return False
    if row_map.dims is not None and row_map.dims[1] != a.shape[-2]:
        return False
    if not jit.usable(out, row_map.shift, row_map.mean, row_map.std, row_map.scale, row_map.bias):
        return False
    panels = _gemm_panels(a, b, out)
    if panels is None:
        return False
    blas.gemm_panels_mapped(*panels, *mapper_arguments(row_map, out.dtype))
    return True


def _pool_blas(a, b, out):
    """jit/blas.py where it computes a @ b on the kernels' pool (operands it takes, enough
    multiply-adds to be worth the pool), else None: NumPy's product."""
    blas = _blas()
    if blas is None or not _takes(a, b, out) or _multiply_adds(a, b) < PARALLEL_MIN_MULTIPLY_ADDS:
        return None
    return blas


def _product_shape(a, b) -> tuple:
    m, n = a.shape[-2], b.shape[-1]
    return (_items(a, b), m, n) if max(a.ndim, b.ndim) == 3 else (m, n)


def _gemm_panels(a, b, out):
    """jit/blas.py's ``gemm_panels`` arguments for out = a @ b (operands ``matmul`` takes), or None
    where ``out`` does not fit (its shape, memory shared with an operand, rows not contiguous) or an
    operand has no unit stride: NumPy's product then."""
    if np.may_share_memory(out, a) or np.may_share_memory(out, b):
        return None
    key = (a.shape, a.strides, b.shape, b.strides, out.shape, out.strides, a.dtype.char, partition_width())
    layout = _LAYOUTS.get(key, _UNKNOWN)
    if layout is _UNKNOWN:
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = _layout(a, b, out, key[-1])
    if layout is None:
        return None
    double, trans_a, trans_b, m, n, k, lda, step_a, ldb, step_b, ldc, step_c, items, parts, split_rows, align = layout
    address = _blas().data_address
    return (double, trans_a, trans_b, m, n, k, address(a), lda, step_a, address(b), ldb, step_b, address(out), ldc,
            step_c, items, parts, split_rows, align)


# What _layout works out depends only on the operands' shapes, strides and dtype and the pool's threads:
# kept by those (MobileNet v2's TEST forward at batch 1 runs 34 products, each of which spent about as
# long working it out again as the 7 x 7 product itself takes). Cleared when it holds _LAYOUTS_KEPT,
# which a process meets only if it keeps making products of new shapes.
_LAYOUTS: dict = {}
_LAYOUTS_KEPT = 4096
_UNKNOWN = object()


def _layout(a, b, out, threads: int):
    """Everything ``gemm_panels`` takes for out = a @ b but the three data addresses, or None where
    NumPy's product must run (see ``_gemm_panels``)."""
    items = _items(a, b)
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if out.shape != _product_shape(a, b):
        return None
    operands = [_matrix(x) for x in (a, b)]
    c = _matrix(out)
    if None in operands or c is None or c[0] != _NO_TRANS:
        return None
    (trans_a, lda, step_a), (trans_b, ldb, step_b) = operands
    if items == 1 and trans_b == _TRANS:
        parts, split_rows, align = _skinny_panels(m, n, k, threads)
    else:
        parts, split_rows, align = _panels(items, m, n, threads)
    return (a.dtype == np.float64, trans_a, trans_b, m, n, k, lda, step_a, ldb, step_b, c[1], c[2], items, parts,
            split_rows, align)


_BLAS = []  # jit/blas.py once imported (it binds OpenBLAS's functions when first imported)


def _blas():
    """jit/blas.py when it can run here, else None."""
    if not jit.ENABLED:
        return None
    if not _BLAS:
        from .jit import blas

        _BLAS.append(blas if blas.AVAILABLE else None)
    return _BLAS[0]


def _items(a, b) -> int:
    """Matrices in the product's batch (1 for two 2-D operands)."""
    return max(a.shape[0] if a.ndim == 3 else 1, b.shape[0] if b.ndim == 3 else 1)


def _multiply_adds(a, b) -> int:
    return _items(a, b) * a.shape[-2] * a.shape[-1] * b.shape[-1]


def _takes(a, b, out) -> bool:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.dtype != b.dtype:
        return False
    if a.dtype not in (np.float32, np.float64) or not (2 <= a.ndim <= 3 and 2 <= b.ndim <= 3):
        return False
    if a.shape[-1] != b.shape[-2] or 0 in a.shape or 0 in b.shape:
        return False
    if a.shape[-2] == 1 and b.shape[-1] == 1:
        return False  # a dot product
    if (a.shape[-2] == 1 or b.shape[-1] == 1) and (a.ndim == 3 or b.ndim == 3):
        return False  # matrix-vector products are taken 2-D only (``_matrix_vector``)
    if a.ndim == 3 and b.ndim == 3 and a.shape[0] != b.shape[0]:
        return False
    return out is None or (isinstance(out, np.ndarray) and out.dtype == a.dtype)


def _matrix_vector(blas, a, b, out):
    """``matmul`` of a row by a matrix (m = 1: an InnerProduct at batch 1) or a matrix by a column
    (n = 1), 2-D: one ``cblas_?gemv`` per panel of the outputs on the kernels' pool, as the products
    (NumPy's gemv ran on OpenBLAS's own threads, which met the pool's spinning ones and ran slower in a
    net than alone)."""
    m, n = a.shape[0], b.shape[1]
    if out is None:
        out = np.empty((m, n), a.dtype)
    elif out.shape != (m, n) or np.may_share_memory(out, a) or np.may_share_memory(out, b):
        return np.matmul(a, b, out=out)
    if m == 1:  # out^T = op(b)^T a^T
        vector, matrix, outputs, flip = a[0], b, n, True
        y = out[0]
    else:  # out = op(a) b
        vector, matrix, outputs, flip = b[:, 0], a, m, False
        y = out[:, 0]
    layout = _matrix(matrix)
    incx, incy = _increment(vector), _increment(y)
    if layout is None or incx is None or incy is None:
        return np.matmul(a, b, out=out)
    stored, lead, _ = layout
    rows, cols = matrix.shape if stored == _NO_TRANS else matrix.shape[::-1]
    # BLAS's op on the stored (row-major) matrix: a stored b is read transposed for out^T = b^T a^T.
    trans = (_TRANS if stored == _NO_TRANS else _NO_TRANS) if flip else stored
    parts = max(1, min(partition_width(), -(-outputs // blas.COLUMN_ALIGN)))
    blas.gemv_panels(a.dtype == np.float64, trans, rows, cols, matrix.ctypes.data, lead, vector.ctypes.data, incx,
                     y.ctypes.data, incy, parts)
    return out


def _increment(v):
    """The step between a 1-D view's elements, in elements; None where BLAS cannot take it."""
    step, size = v.strides[0], v.itemsize
    if v.shape[0] == 1:
        return 1
    return step // size if step > 0 and step % size == 0 else None


def _matrix(x):
    """(CBLAS transpose flag, leading dimension, step between batch items), in elements, of the
    matrices of ``x`` as BLAS reads them; None when a matrix has no unit stride."""
    size = x.itemsize
    rows, cols = x.shape[-2:]
    row_stride, col_stride = x.strides[-2:]
    step = x.strides[0] if x.ndim == 3 else 0
    if step < 0 or step % size:
        return None
    if cols == 1 or col_stride == size:  # rows of contiguous elements: stored as it is
        lead = row_stride // size if rows > 1 else cols
        if row_stride % size or lead < cols:
            return None
        return _NO_TRANS, lead, step // size
    if rows == 1 or row_stride == size:  # columns of contiguous elements: the transpose of a stored matrix
        lead = col_stride // size
        if col_stride % size or lead < rows:
            return None
        return _TRANS, lead, step // size
    return None


def _skinny_panels(m: int, n: int, k: int, threads: int) -> tuple[int, bool, int]:
    """A few rows times a large transposed matrix (a fully connected layer's forward at batch 1-8: x @
    w.T): panels of SKINNY_COLUMNS columns of C, each one pass over as many rows of w, small enough
    (SKINNY_MAX_MULTIPLY_ADDS) for OpenBLAS's small-matrix kernel, which reads them as they are where
    one product packs all of w through a transposing copy first: VGG-16's fc6 and fc7 several times
    faster (benchmarks/README.md, "The figures behind the other layers' choices"). Larger panels than
    that kernel takes ran as slowly as the whole product."""
    if m > SKINNY_MAX_ROWS or m * SKINNY_COLUMNS * k > SKINNY_MAX_MULTIPLY_ADDS:
        return _panels(1, m, n, threads)
    return -(-n // SKINNY_COLUMNS), False, SKINNY_COLUMNS


def _panels(items: int, m: int, n: int, threads: int) -> tuple[int, bool, int]:
    """(panels per matrix, whether they split the rows, the multiple their edges fall on): C's rows
    (SPLIT_ROWS_FROM) or columns cut so that every thread of ``threads`` gets work, each panel at least
    one alignment unit (jit/blas.py: whole row tiles of OpenBLAS's kernel, or COLUMN_ALIGN columns)."""
    split_rows = m >= n or m >= SPLIT_ROWS_FROM
    align = _blas().row_alignment() if split_rows else _blas().COLUMN_ALIGN
    if threads == 1 or items >= threads:
        return 1, split_rows, align
    side = m if split_rows else n
    return max(1, min(-(-threads // items), -(-side // align))), split_rows, align
