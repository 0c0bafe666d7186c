"""The compiled pooling kernels (layers/jit/pooling.py) against their NumPy twins (vision.max_pool_forward
... ave_pool_backward with jit.ENABLED off) and Caffe's loop: geometries with padding, ceil-rounded
windows past the input, strides below, at and above the kernel, odd widths, global pooling; ties,
NaN, -inf and -FLT_MAX cells; both dtypes; the same bits whatever the thread count; numerical
gradients of the Pooling layer on both paths."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from netdef.layers import jit, vision
from netdef.layers.jit import pooling as kernels
from netdef.proto import netdef_pb2 as pb
from tests.helpers import check_gradients
from tests.layers.test_vision import distinct, naive_max_pool, pool_text

MAX, AVE = pb.PoolingParameter.MAX, pb.PoolingParameter.AVE
LOWEST = -np.finfo(np.float32).max

GEOMETRIES = [  # kernel, stride, pad, input (H, W)
    ((3, 3), (2, 2), (0, 0), (32, 32)),   # CIFAR-10's pool1: ceil adds a window past the input
    ((3, 3), (2, 2), (0, 0), (13, 13)),   # AlexNet's pool5: odd width, a last unpaired cell per row
    ((3, 3), (2, 2), (1, 1), (7, 9)),     # odd padding: the row's cell 0 goes to the odd phase
    ((2, 2), (2, 2), (1, 1), (5, 7)),
    ((3, 3), (1, 1), (1, 1), (9, 8)),     # stride 1 (GoogLeNet's inception pooling)
    ((3, 2), (1, 2), (2, 1), (6, 5)),     # non-square, pad = kernel - 1
    ((2, 2), (3, 3), (0, 0), (7, 8)),     # stride > kernel: cells that no window reads
    ((1, 1), (3, 3), (0, 0), (6, 6)),     # a ceil-rounded window wholly past the input
    ((3, 3), (3, 3), (1, 1), (10, 11)),   # stride 3: the generic strided split
    ((4, 3), (3, 2), (2, 1), (12, 9)),
    ((7, 7), (1, 1), (0, 0), (7, 7)),     # global pooling: one loop per window
    ((6, 7), (6, 7), (0, 0), (6, 7)),
    ((6, 6), (2, 2), (3, 3), (7, 8)),     # many cells per window, few outputs
]
IDS = [f"k{k[0]}x{k[1]}-s{s[0]}x{s[1]}-p{p[0]}x{p[1]}-{hw[0]}x{hw[1]}" for k, s, p, hw in GEOMETRIES]


@pytest.fixture(params=[True, False], ids=["compiled", "reference"])
def compiled(request, monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", request.param)
    return request.param


def awkward(shape, dtype, seed=0):
    """Small integers (ties everywhere) with NaN, -inf and -FLT_MAX cells, a plane of -inf only and a
    corner of NaN only."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 3, shape).astype(np.float64)
    special = rng.random(shape)
    x[special < 0.08] = np.nan
    x[(special >= 0.08) & (special < 0.12)] = -np.inf
    x[(special >= 0.12) & (special < 0.14)] = LOWEST
    x[0, 0] = -np.inf
    x[-1, -1, :3, :3] = np.nan
    return x.astype(dtype)


def pooled(method, geometry, x, dy, enabled, monkeypatch):
    """(top, Caffe's mask or None, bottom gradient, mask kind) of one Pool2D on one path."""
    kernel, stride, pad, hw = geometry
    monkeypatch.setattr(jit, "ENABLED", enabled)
    pool = vision.Pool2D(method, kernel, stride, pad, hw, vision.pooled_shape(*hw, kernel, stride, pad))
    y = pool.forward(x).copy()
    mask = vision.max_mask_flat(pool.state[1], pool).copy() if method == MAX else None
    kind = pool.state[1][0] if method == MAX else None
    dx = pool.backward(dy, x.shape, np.full_like(x, np.nan)).copy()
    return y, mask, dx, kind


def test_geometries_take_both_algorithms():
    """The list covers the staged kernels and the per-window loop."""
    staged = []
    for kernel, stride, pad, hw in GEOMETRIES:
        out = vision.pooled_shape(*hw, kernel, stride, pad)
        rows, wq = kernels._layout(*hw, *out, *kernel, *stride, *pad)
        staged.append(kernels._staged(*out, *kernel, stride[0], rows, wq))
    assert any(staged) and not all(staged)
    assert staged[0] and not staged[GEOMETRIES.index(((7, 7), (1, 1), (0, 0), (7, 7)))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_max_pooling_kernels_match_reference(monkeypatch, geometry, dtype):
    x = awkward((2, 3) + geometry[3], dtype)
    out = vision.pooled_shape(*geometry[3], *geometry[:3])
    dy = np.random.default_rng(1).standard_normal((2, 3) + out).astype(dtype)
    y, mask, dx, kind = pooled(MAX, geometry, x, dy, True, monkeypatch)
    ref_y, ref_mask, ref_dx, ref_kind = pooled(MAX, geometry, x, dy, False, monkeypatch)
    assert kind == "flat" and ref_kind != "flat"  # the kernels ran, then the NumPy passes
    np.testing.assert_array_equal(y, ref_y)
    np.testing.assert_array_equal(mask, ref_mask)
    tol = 1e-6 if dtype == np.float32 else 1e-14  # overlapping windows add in another order
    np.testing.assert_allclose(dx, ref_dx, rtol=tol, atol=tol)
    expected, expected_mask = naive_max_pool(x, *geometry[:3], out)
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(mask, expected_mask)
    assert (y >= LOWEST).all() and y.dtype == dtype  # NaN never wins


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_ave_pooling_kernels_match_reference(monkeypatch, geometry, dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3) + geometry[3]).astype(dtype)
    x[1, 2, 0, 0] = np.nan  # spreads over its windows only
    out = vision.pooled_shape(*geometry[3], *geometry[:3])
    dy = rng.standard_normal((2, 3) + out).astype(dtype)
    y, _, dx, _ = pooled(AVE, geometry, x, dy, True, monkeypatch)
    ref_y, _, ref_dx, _ = pooled(AVE, geometry, x, dy, False, monkeypatch)
    tol = 2e-6 if dtype == np.float32 else 1e-14  # the window sums associate by rows
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(y, ref_y, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, ref_dx, rtol=tol, atol=tol)
    assert np.isnan(y).sum() == np.isnan(ref_y).sum() > 0
    assert y.dtype == dx.dtype == dtype


def test_ave_pooling_window_past_the_input_divides_by_zero(monkeypatch):
    """A ceil-rounded window wholly past the unpadded input has no cells and divisor 0: inf or NaN
    as NumPy (and Caffe) divide, no error; its gradient reaches no cell."""
    geometry = ((1, 1), (3, 3), (0, 0), (6, 6))
    x = np.arange(72.0).reshape(2, 1, 6, 6)
    dy = np.ones((2, 1, 3, 3))
    y, _, dx, _ = pooled(AVE, geometry, x, dy, True, monkeypatch)
    assert np.isnan(y[:, :, 2]).all() and np.isnan(y[:, :, :, 2]).all()
    np.testing.assert_array_equal(y[:, :, :2, :2], x[:, :, :4:3, :4:3])
    assert dx.sum() == 8 and (dx[:, :, :4:3, :4:3] == 1).all()


@pytest.mark.parametrize("method", [MAX, AVE], ids=["MAX", "AVE"])
def test_pooling_kernels_same_bits_for_any_thread_count(method):
    geometry = ((3, 3), (2, 2), (0, 0), (16, 16), (8, 8))
    x = np.random.default_rng(3).standard_normal((4, 40, 16, 16)).astype(np.float32)
    dy = np.random.default_rng(4).standard_normal((4, 40, 8, 8)).astype(np.float32)
    threads = numba.get_num_threads()
    results = []
    try:
        for count in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(count)
            pool = vision.Pool2D(method, *geometry)
            results.append((pool.forward(x).copy(), pool.backward(dy, x.shape, np.empty_like(x)).copy()))
    finally:
        numba.set_num_threads(threads)
    for a, b in zip(*results):
        assert a.tobytes() == b.tobytes()


def test_flat_mask_backward_without_the_kernels(monkeypatch):
    """A mask from the compiled forward, its backward on the NumPy path (kernels switched off in
    between): the same gradient, to the bit (both add the outputs in row-major order)."""
    geometry = ((3, 3), (2, 2), (1, 1), (9, 10))
    x = awkward((2, 3, 9, 10), np.float64, seed=5)
    pool = vision.Pool2D(MAX, *geometry[:3], geometry[3], vision.pooled_shape(9, 10, *geometry[:3]))
    pool.forward(x)
    dy = np.random.default_rng(6).standard_normal((2, 3) + pool.out)
    compiled_dx = pool.backward(dy, x.shape, np.empty_like(x)).copy()
    monkeypatch.setattr(jit, "ENABLED", False)
    assert pool.state[1][0] == "flat"
    np.testing.assert_array_equal(pool.backward(dy, x.shape, np.empty_like(x)), compiled_dx)


def test_pooling_kernels_take_contiguous_numpy_arrays_only(monkeypatch):
    calls = []
    monkeypatch.setattr(kernels, "max_forward", lambda *args: calls.append("max_forward"))
    pool = vision.Pool2D(MAX, (2, 2), (2, 2), (0, 0), (4, 6), (2, 3))
    x = np.random.default_rng(7).standard_normal((2, 6, 4, 6))
    pool.forward(x.astype(np.float32))
    assert calls == ["max_forward"]
    y = pool.forward(x[:, ::2])  # not contiguous: the NumPy passes
    np.testing.assert_array_equal(y, x[:, ::2].reshape(2, 3, 2, 2, 3, 2).max(axis=(3, 5)))
    monkeypatch.setattr(jit, "ENABLED", False)
    pool.forward(x)
    assert calls == ["max_forward"]


@pytest.mark.parametrize("fields,shape", [
    (dict(pool="MAX", kernel_size=3, stride=2), (2, 2, 7, 9)),
    (dict(pool="MAX", kernel_size=3, stride=2, pad=1), (1, 2, 7, 6)),
    (dict(pool="MAX", kernel_size=3, stride=1, pad=1), (1, 2, 5, 6)),
    (dict(pool="MAX", kernel_size=2, stride=3), (1, 2, 7, 8)),
    (dict(pool="MAX", global_pooling=True), (1, 3, 4, 5)),
    (dict(pool="AVE", kernel_size=3, stride=2, pad=1), (2, 2, 6, 7)),
    (dict(pool="AVE", kernel_h=3, kernel_w=2, stride_h=3, stride_w=1, pad_h=1, pad_w=1), (1, 2, 8, 5)),
    (dict(pool="AVE", kernel_size=2, stride=3, round_mode="FLOOR"), (1, 2, 7, 8)),
    (dict(pool="AVE", global_pooling=True), (1, 3, 4, 5)),
], ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else str(v))
def test_pooling_gradients_on_both_paths(compiled, fields, shape):
    check_gradients(pool_text(**fields), [distinct(*shape)], num_tops=2 if fields["pool"] == "MAX" else 1)
