"""layers/matmul.py: the layers' products on the kernels' pool (jit/blas.py) against NumPy's matmul:
transposed views, batches and a broadcast operand, ``out``, both dtypes, panels on 1 and 2 threads,
matrix-vector products; the cases it hands to NumPy; OpenBLAS's thread count left as it was."""
from __future__ import annotations

import itertools

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from netdef.layers import matmul as products
from netdef.layers.jit import blas

pytestmark = pytest.mark.skipif(not blas.AVAILABLE, reason="NumPy's BLAS here is not the ILP64 OpenBLAS of its "
                                                           "wheels: matmul is NumPy's own")

SHAPES = [  # m, k, n: all above PARALLEL_MIN_MULTIPLY_ADDS
    (960, 160, 49),   # MobileNet v2's 7x7 expansion at batch 1: panels of rows
    (32, 192, 784),   # panels of columns
    (500, 64, 800),   # panels of rows, though C is wider than high
    (4096, 1, 200),   # k = 1
    (33, 300, 70),    # sides that are not whole panels
]


def operand(rng, rows, cols, dtype, transposed):
    """A (rows x cols) matrix, stored as it is or as the transpose of a (cols x rows) array."""
    if transposed:
        return rng.standard_normal((cols, rows)).astype(dtype).T
    return rng.standard_normal((rows, cols)).astype(dtype)


def close_to_numpy(got, a, b):
    """Within a few roundings of NumPy's product (a wrong offset, stride or transpose is off by O(1))."""
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    eps = np.finfo(a.dtype).eps
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    assert got.dtype == a.dtype and got.shape == want.shape
    assert np.all(np.abs(got - want) <= 4 * a.shape[-1] * eps * scale + 1e-30)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
@pytest.mark.parametrize("threads", [1, 2])
def test_products_of_every_layout(dtype, shape, threads):
    m, k, n = shape
    assert m * k * n >= products.PARALLEL_MIN_MULTIPLY_ADDS
    rng = np.random.default_rng(sum(shape))
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        for trans_a, trans_b in itertools.product([False, True], repeat=2):
            a = operand(rng, m, k, dtype, trans_a)
            b = operand(rng, k, n, dtype, trans_b)
            close_to_numpy(products.matmul(a, b), a, b)
            out = np.full((m, n), np.nan, dtype)
            assert products.matmul(a, b, out=out) is out
            close_to_numpy(out, a, b)
    finally:
        numba.set_num_threads(before)


def test_layouts_kept_by_shape_and_strides_give_each_product_its_own():
    """The product's layout is worked out once per operands' shapes, strides, dtype and thread count
    (``_LAYOUTS``): operands of one shape in other strides, views at other offsets of one array and
    another thread count each get their own product, in turn and again."""
    rng = np.random.default_rng(7)
    m, k, n = 96, 80, 112
    big = rng.standard_normal((2 * m, 2 * k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    cases = [rng.standard_normal((m, k)).astype(np.float32),       # C-contiguous
             rng.standard_normal((k, m)).astype(np.float32).T,     # the same shape, transposed strides
             big[:m, :k], big[m:, k:], big[5:5 + m, 3:3 + k]]      # one layout, three addresses
    before = numba.get_num_threads()
    try:
        for _ in range(2):
            for threads in (1, 2):
                numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
                for a in cases:
                    close_to_numpy(products.matmul(a, b), a, b)
    finally:
        numba.set_num_threads(before)
    keys = [key for key in products._LAYOUTS if key[0] == (m, k) and key[2] == (k, n)]
    assert len({key[1] for key in keys}) == 3  # strides: contiguous, transposed, rows of ``big``


def test_data_address_is_the_first_element_of_any_view():
    a = np.arange(600, dtype=np.float32).reshape(20, 30)
    for view in (a, a.T, a[3:, 5:], a[3:, 5:].T, a[::2, 1:].reshape(1, 10, 29)[:, 2:]):
        assert blas.data_address(view) == view.ctypes.data


@pytest.mark.parametrize("rows", [2, 5, 8])
def test_a_few_rows_by_a_large_transposed_matrix(rows):
    """A fully connected layer's forward at a small batch (x @ w.T) runs in panels of SKINNY_COLUMNS
    columns; more rows than SKINNY_MAX_ROWS, or panels past SKINNY_MAX_MULTIPLY_ADDS, do not."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 3000)).astype(np.float32)
    w = rng.standard_normal((300, 3000)).astype(np.float32)
    width = products.SKINNY_COLUMNS
    assert products._skinny_panels(rows, 300, 3000, 2) == (-(-300 // width), False, width)
    close_to_numpy(products.matmul(x, w.T), x, w.T)
    assert products._skinny_panels(products.SKINNY_MAX_ROWS + 1, 300, 3000, 2) == products._panels(1, 9, 300, 2)
    if rows * width * 25088 > products.SKINNY_MAX_MULTIPLY_ADDS:  # VGG's fc6 at 5 or 8 rows
        assert products._skinny_panels(rows, 300, 25088, 2) == products._panels(1, rows, 300, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_panels_equal_one_whole_product(dtype):
    """A product cut into row panels on 2 threads gives the bits of one single-threaded BLAS call over
    it: the panels begin on whole row tiles of this CPU's OpenBLAS kernel (sides far above its
    small-matrix kernels, which a panel and the whole could pick apart). 500 rows: an edge on a
    multiple of 16 but not of 12 (256) rounds otherwise on an AVX2 machine."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((500, 300)).astype(dtype)
    b = rng.standard_normal((300, 256)).astype(dtype)
    with threadpool_limits(1):
        want = np.matmul(a, b)
    parts, split_rows, align = products._panels(1, 500, 256, numba.get_num_threads())
    assert (parts, split_rows, align) == (min(2, numba.get_num_threads()), True, blas.row_alignment())
    np.testing.assert_array_equal(products.matmul(a, b), want)


def test_column_panels_agree_with_one_whole_product():
    """Column panels (C with few rows) agree with one whole call to rounding; to the bit only where the
    CPU's kernel tiles columns as they fall (not Haswell's or Zen's sgemm: jit/blas.py)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((64, 300)).astype(np.float32)
    b = rng.standard_normal((300, 800)).astype(np.float32)
    parts, split_rows, align = products._panels(1, 64, 800, 2)
    assert (parts, split_rows, align) == (2, False, blas.COLUMN_ALIGN)
    close_to_numpy(products.matmul(a, b), a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batches_and_a_broadcast_operand(dtype):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 30)).astype(dtype)
    x = rng.standard_normal((3, 30, 700)).astype(dtype)
    g = rng.standard_normal((3, 64, 30)).astype(dtype)
    for a, b in [(w, x), (g, x), (g, x[0]), (g.transpose(0, 2, 1).copy().transpose(0, 2, 1), x)]:
        got = products.matmul(a, b)
        assert got.shape == (3, 64, 700)
        for i in range(3):
            close_to_numpy(got[i], a[i] if a.ndim == 3 else a, b[i] if b.ndim == 3 else b)
    out = np.zeros((3, 64, 700), dtype)
    products.matmul(g, x, out=out[:, :, :])
    close_to_numpy(out[1], g[1], x[1])


def test_a_strided_out_and_row_slices():
    """``out`` with a leading dimension above its width, operands sliced out of larger arrays."""
    rng = np.random.default_rng(3)
    big_a = rng.standard_normal((200, 80)).astype(np.float32)
    big_b = rng.standard_normal((90, 120)).astype(np.float32)
    out = np.zeros((128, 200), np.float32)
    a, b = big_a[10:138, 5:65], big_b[20:80, 7:107]
    assert products._multiply_adds(a, b) >= products.PARALLEL_MIN_MULTIPLY_ADDS
    products.matmul(a, b, out=out[:, 50:150])
    close_to_numpy(out[:, 50:150], a, b)
    assert not out[:, :50].any() and not out[:, 150:].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_matrix_vector_products(dtype, threads):
    """A row times a matrix (a fully connected layer at batch 1: x @ w.T forward, dy @ w for the input
    gradient) and a matrix times a column, every layout, ``out`` given, a vector with a stride."""
    rng = np.random.default_rng(5)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        for trans in (False, True):
            matrix = operand(rng, 3000, 700, dtype, trans)
            row = rng.standard_normal((1, 3000)).astype(dtype)
            column = rng.standard_normal((700, 1)).astype(dtype)
            strided_row = rng.standard_normal((1, 6000)).astype(dtype)[:, ::2]
            for a, b in [(row, matrix), (matrix, column), (strided_row, matrix)]:
                assert products._multiply_adds(a, b) >= products.PARALLEL_MIN_MULTIPLY_ADDS
                close_to_numpy(products.matmul(a, b), a, b)
                out = np.full((a.shape[0], b.shape[1]), np.nan, dtype)
                assert products.matmul(a, b, out=out) is out
                close_to_numpy(out, a, b)
    finally:
        numba.set_num_threads(before)


def test_a_fully_connected_forward_at_batch_one_does_not_depend_on_the_threads():
    """x @ w.T is cut into panels of w's rows, each output one dot product of a row with x whatever
    panel holds it: 1 and 2 threads give the same bits (a deployed net answers the same everywhere)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 4096)).astype(np.float32)
    w = rng.standard_normal((1000, 4096)).astype(np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = products.matmul(x, w.T)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        assert products._panels(1, 1000, 1, numba.get_num_threads())[0] == numba.get_num_threads()
        np.testing.assert_array_equal(products.matmul(x, w.T), one)
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("case", ["dot", "int", "mixed", "strided", "overlap", "empty", "small", "off"])
def test_what_numpy_computes(case, monkeypatch):
    """Cases the kernels do not take give NumPy's own answer, bit for bit."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((400, 50)).astype(np.float32)
    b = rng.standard_normal((50, 60)).astype(np.float32)
    out = None
    if case == "dot":
        a = rng.standard_normal((1, 1 << 20)).astype(np.float32)
        b = rng.standard_normal((1 << 20, 1)).astype(np.float32)
    elif case == "int":
        a, b = (a * 10).astype(np.int64), (b * 10).astype(np.int64)
    elif case == "mixed":
        b = b.astype(np.float64)
    elif case == "strided":
        a = rng.standard_normal((800, 100)).astype(np.float32)[::2, ::2]
    elif case == "overlap":
        a = rng.standard_normal((50, 50)).astype(np.float32)
        b = rng.standard_normal((50, 50)).astype(np.float32)
        out = b  # NumPy computes into a copy when out is an operand
    elif case == "small":
        a = a[:20]
    elif case == "empty":
        a = a[:, :0]
        b = b[:0]
    elif case == "off":
        monkeypatch.setattr(products.jit, "ENABLED", False)
    want = np.matmul(a, b if out is None else b.copy())
    got = products.matmul(a, b, out=out)
    np.testing.assert_array_equal(got, want)


def test_openblas_keeps_its_thread_count():
    """The panels run with OpenBLAS held at one thread; NumPy's products elsewhere get its count back."""
    def openblas_threads():
        return [pool["num_threads"] for pool in threadpool_info() if pool.get("internal_api") == "openblas"]

    before = openblas_threads()
    with threadpool_limits(2, user_api="blas"):
        during = openblas_threads()
        a = np.ones((256, 256), np.float32)
        products.matmul(a, a)
        assert openblas_threads() == during
    assert openblas_threads() == before


def _row_map(dims, dtype, rng, stages):
    """A channel map with the given stages over products of ``dims`` (items, rows, columns), a
    channel per row (layers/fusion.ChannelMap)."""
    from netdef.layers.fusion import ChannelMap

    v = lambda: rng.standard_normal(dims[1]).astype(dtype)  # noqa: E731
    if stages == "relu":
        return ChannelMap(negative_slope=0.0)
    if stages == "bias+batchnorm+scale+relu":
        return ChannelMap(dims, v(), v(), np.abs(v()) + dtype(0.5), v(), v(), 0.0)
    return ChannelMap(dims, mean=v(), std=np.abs(v()) + dtype(0.5), scale=v(), bias=v())  # batchnorm+scale


def test_maps_of_any_stages_run_in_one_compiled_panel_kernel():
    """The mapped panels take every map with the same argument types (jit/fusion.rows_mapper's
    address and the stages' arrays): other stages compile no second whole kernel."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((96, 40)).astype(np.float32)
    b = rng.standard_normal((40, 300)).astype(np.float32)
    blas = products._pool_blas(a, b, np.empty((96, 300), np.float32))
    if blas is None:
        pytest.skip("the products run on NumPy here (no pool BLAS, or the product is below its size)")
    compiled = None
    for stages in ("relu", "batchnorm+scale", "bias+batchnorm+scale+relu"):
        got = np.empty((96, 300), np.float32)
        assert products.matmul_row_mapped(a, b, got, _row_map((1, 96, 300), np.float32, rng, stages)), stages
        compiled = compiled or len(blas.gemm_panels_mapped.signatures)
        assert len(blas.gemm_panels_mapped.signatures) == compiled, stages


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("stages", ["bias+batchnorm+scale+relu", "batchnorm+scale", "relu"])
def test_a_product_mapped_by_panels_gives_the_product_then_the_map(dtype, threads, stages):
    """matmul_row_mapped (each panel through the channel map of its rows as it is computed) against
    matmul and then fusion.apply: the same bits, for panels of rows, of columns, a batch (one matrix
    per image, the weights broadcast), a transposed operand; NaN, infinities and signed zeros."""
    from netdef.layers import fusion

    rng = np.random.default_rng(7)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        for m, k, n, batch, trans_b in [(960, 160, 49, None, False), (32, 192, 784, None, False),
                                        (64, 30, 700, 3, False), (33, 300, 70, None, True)]:
            a = rng.standard_normal((m, k)).astype(dtype)
            b = (operand(rng, k, n, dtype, trans_b) if batch is None
                 else rng.standard_normal((batch, k, n)).astype(dtype))
            b[..., 0, :3] = [np.nan, np.inf, -np.inf]
            a[0, :2] = [0.0, -0.0]
            m_map = _row_map((batch or 1, m, n), dtype, rng, stages)
            want = products.matmul(a, b)
            fusion.apply(m_map, want, want)
            got = np.full(want.shape, 7.0, dtype)
            assert products.matmul_row_mapped(a, b, got, m_map)
            assert np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want))
    finally:
        numba.set_num_threads(before)


def test_a_mapped_product_it_cannot_take_is_left_to_the_caller():
    """Too small for the pool, a matrix-vector product, a map over other channels than the rows, or a
    non-contiguous ``out``: False and nothing written."""
    from netdef.layers.fusion import ChannelMap

    rng = np.random.default_rng(8)
    relu = ChannelMap(negative_slope=0.0)
    a, b = rng.standard_normal((64, 100)).astype(np.float32), rng.standard_normal((100, 300)).astype(np.float32)
    small = np.full((8, 30), 7.0, np.float32)
    assert not products.matmul_row_mapped(a[:8, :10], b[:10, :30], small, relu)
    column = np.full((64, 1), 7.0, np.float32)
    assert not products.matmul_row_mapped(a, b[:, :1].copy(), column, relu)
    out = np.full((64, 300), 7.0, np.float32)
    assert not products.matmul_row_mapped(a, b, out, ChannelMap((1, 300, 1), scale=np.ones(300, np.float32)))
    wide = np.full((64, 400), 7.0, np.float32)
    assert not products.matmul_row_mapped(a, b, wide[:, :300], relu)
    assert (small == 7).all() and (column == 7).all() and (out == 7).all() and (wide == 7).all()
