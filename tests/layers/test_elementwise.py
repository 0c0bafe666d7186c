"""The element-wise arithmetic of ReLU, Eltwise, Split and Scale (layers/elementwise.py): the compiled
kernels (layers/jit/elementwise.py) against their array-module twins on odd shapes in both dtypes,
their independence of the thread count, and the layers run with the kernels and with the twins: the
same results, in place or not, numerical gradients, and arrays reused from one call to the next."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.blob import Blob
from netdef.layers import elementwise, jit
from netdef.layers.jit import elementwise as kernels
from netdef.layers.reused import ReusedArrays
from tests.helpers import (assert_same_on_one_thread, build, check_gradients, default_dtype, make_layer,
                           parse_layer)

RNG = np.random.default_rng(20261125)
DTYPES = [np.float32, np.float64]
# Odd sizes, one block exactly, and sizes that end one element into a further block.
SHAPES = [(1,), (7,), (3, 5, 7), (kernels.BLOCK,), (2, kernels.BLOCK + 1), (3, 2, 5, 1093)]
SLOPES = [0.0, 0.1, -0.3]


def randn(shape, dtype, special=False):
    """Normal values; ``special``: also exact zeros of both signs, infinities and NaN."""
    a = RNG.standard_normal(shape).astype(dtype)
    if special and a.size >= 6:
        a.reshape(-1)[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]
    return a


def assert_same_bits(actual, expected):
    """Equal values, NaN where NaN, and zeros of the same sign."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)
    np.testing.assert_array_equal(np.signbit(actual), np.signbit(expected))


@pytest.fixture(autouse=True)
def _quiet_special_values():
    with np.errstate(invalid="ignore"):  # inf * 0 in the twins, on purpose
        yield


@pytest.fixture(params=[True, False], ids=["compiled", "reference"])
def compiled(request, monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", request.param)
    return request.param


# ------------------------------------------------------------------------------------- kernels vs twins
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("slope", SLOPES)
def test_relu_kernels_match_reference(shape, dtype, slope):
    x, dy = randn(shape, dtype, special=True), randn(shape, dtype, special=True)
    assert_same_bits(elementwise.relu_forward(x, slope, np.empty_like(x)),
                     elementwise.relu_forward_reference(x, slope, np.empty_like(x)))
    assert_same_bits(elementwise.relu_backward(x, dy, slope, np.empty_like(x)),
                     elementwise.relu_backward_reference(x, dy, slope, np.empty_like(x)))


def test_relu_kernel_values():
    x = np.array([-2.0, -0.0, 0.0, 3.0, np.nan], dtype=np.float32)
    y = elementwise.relu_forward(x, 0.0, np.empty_like(x))
    assert_same_bits(y, np.array([0.0, 0.0, 0.0, 3.0, np.nan], dtype=np.float32))  # NumPy's max(x, 0)
    y = elementwise.relu_forward(x, 0.5, np.empty_like(x))
    np.testing.assert_array_equal(y, np.array([-1.0, 0.0, 0.0, 3.0, np.nan], dtype=np.float32))
    dx = elementwise.relu_backward(x, np.full_like(x, 2.0), 0.5, np.empty_like(x))
    np.testing.assert_array_equal(dx, [1.0, 1.0, 1.0, 2.0, 1.0])  # x == 0 takes the slope


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("coeffs", [(1.0, 1.0), (0.5, -1.25, 3.0), (1.0, 1.0, 1.0, 1.0), (-2.0,)])
def test_weighted_sum_kernel_matches_reference(shape, dtype, coeffs):
    xs = [randn(shape, dtype, special=k == 0) for k in range(len(coeffs))]
    assert_same_bits(elementwise.weighted_sum(xs, coeffs, np.empty_like(xs[0])),
                     elementwise.weighted_sum_reference(xs, coeffs, np.empty_like(xs[0])))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("stable", [True, False])
def test_product_kernels_match_reference(shape, dtype, k, stable):
    xs = [randn(shape, dtype) for _ in range(k)]
    dy = randn(shape, dtype)
    assert_same_bits(elementwise.product(xs, np.empty_like(dy)), elementwise.product_reference(xs, np.empty_like(dy)))
    wanted = [0, k - 1] if k > 2 else [1]
    got = elementwise.product_gradients(xs, dy, stable, {j: np.empty_like(dy) for j in wanted})
    expected = elementwise.product_gradients_reference(xs, dy, stable, {j: np.empty_like(dy) for j in wanted})
    assert sorted(got) == wanted
    for j in wanted:
        assert_same_bits(got[j], expected[j])


def test_product_gradient_by_division_where_an_input_is_zero():
    xs = [np.array([0.0, 2.0, 0.0]), np.array([3.0, 0.0, 0.0])]
    dy = np.ones(3)
    with np.errstate(divide="ignore", invalid="ignore"):
        got = elementwise.product_gradients(xs, dy, False, {0: np.empty(3), 1: np.empty(3)})
        expected = elementwise.product_gradients_reference(xs, dy, False, {0: np.empty(3), 1: np.empty(3)})
    for k in (0, 1):
        assert_same_bits(got[k], expected[k])
    assert np.isnan(got[0][[0, 2]]).all()  # 0 / 0, as Caffe without stable_prod_grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("k", [2, 3])
def test_maximum_kernels_match_reference(shape, dtype, k):
    # Small integers: many ties, which Caffe resolves in a particular order.
    xs = [RNG.integers(-2, 3, shape).astype(dtype) for _ in range(k)]
    dy = randn(shape, dtype, special=True)
    mask, mask_ref = np.empty(shape, np.int32), np.empty(shape, np.int32)
    assert_same_bits(elementwise.maximum(xs, np.empty_like(dy), mask),
                     elementwise.maximum_reference(xs, np.empty_like(dy), mask_ref))
    np.testing.assert_array_equal(mask, mask_ref)
    wanted = list(range(k))
    got = elementwise.maximum_gradients(dy, mask, {j: np.empty_like(dy) for j in wanted})
    expected = elementwise.maximum_gradients_reference(dy, mask, {j: np.empty_like(dy) for j in wanted})
    for j in wanted:
        assert_same_bits(got[j], expected[j])


def test_maximum_ties_follow_caffe():
    a = np.array([1.0, 2.0, 2.0, 0.0])
    b = np.array([1.0, 1.0, 2.0, 3.0])
    c = np.array([1.0, 2.0, 5.0, 3.0])
    mask = np.empty(4, np.int32)
    y = elementwise.maximum([a, b, c], np.empty(4), mask)
    np.testing.assert_array_equal(y, [1.0, 2.0, 5.0, 3.0])
    np.testing.assert_array_equal(mask, [1, 0, 2, 1])  # a beats b only when above; c only when above


# (O, D, I): I larger than a block, I of 1, a single scale for everything
SCALE_SHAPES = [(2, 3, 5), (3, 4, 1), (1, 1, 2 * kernels.BLOCK + 3), (2, 5, kernels.BLOCK + 1), (1, 7, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SCALE_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_scale_forward_kernel_matches_reference(shape, dtype, bias):
    x = randn(shape, dtype, special=True)
    s, b = randn(shape[1], dtype), (randn(shape[1], dtype) if bias else None)
    assert_same_bits(elementwise.scale_forward(x, s, b, np.empty_like(x)),
                     elementwise.scale_forward_reference(x, s, b, np.empty_like(x)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SCALE_SHAPES)
@pytest.mark.parametrize("want_scale,want_dx", [(True, True), (False, True), (True, False)])
def test_scale_backward_kernel_matches_reference(shape, dtype, want_scale, want_dx):
    x, dy, s = randn(shape, dtype), randn(shape, dtype), randn(shape[1], dtype)
    dx = np.full_like(x, 7.0) if want_dx else None
    sum_dy, sum_xdy = elementwise.scale_backward(x if want_scale else None, dy, s, dx)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    # Summed in float64: as close to the exact sums as float64 gets.
    np.testing.assert_allclose(sum_dy, dy64.sum(axis=(0, 2)), rtol=1e-12, atol=1e-12)
    if want_scale:
        np.testing.assert_allclose(sum_xdy, (x64 * dy64).sum(axis=(0, 2)), rtol=1e-12, atol=1e-12)
    else:
        assert sum_xdy is None
    if want_dx:
        assert_same_bits(dx, dy * s.reshape(1, -1, 1))
    ref_dy, ref_xdy = elementwise.scale_backward_reference(x if want_scale else None, dy, s,
                                                           np.empty_like(x) if want_dx else None)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(sum_dy, ref_dy, rtol=tol, atol=tol * shape[0] * shape[2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SCALE_SHAPES)
def test_channel_sums_kernel_adds_float64_sums(shape, dtype):
    """A convolution's bias gradient: added to what the output held, each channel summed in float64."""
    x = randn(shape, dtype)
    start = randn(shape[1], dtype)
    got = elementwise.add_channel_sums(x, start.copy())
    exact = start.astype(np.float64) + x.astype(np.float64).sum(axis=(0, 2))
    np.testing.assert_allclose(got, exact, rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-6)
    twin = elementwise.add_channel_sums_reference(x, start.copy())
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, twin, rtol=tol, atol=tol * shape[0] * shape[2])


def test_kernels_refuse_what_they_cannot_take(monkeypatch):
    x = np.ones((4, 6), np.float32)
    assert jit.usable(x, None, x)
    assert not jit.usable(x, x.astype(np.float64))  # mixed dtypes
    assert not jit.usable(x[:, ::2])                 # not contiguous
    assert not jit.usable(np.ones(0, np.float32))    # empty
    assert not jit.usable(x.astype(np.int32))
    assert not jit.usable(x.astype(np.float16))
    monkeypatch.setattr(jit, "ENABLED", False)
    assert not jit.usable(x)
    # The twin then runs, on the strided view too.
    view = RNG.standard_normal((4, 6))[:, ::2]
    np.testing.assert_array_equal(elementwise.relu_forward(view, 0.0, np.empty((4, 3))), np.maximum(view, 0))


def test_results_do_not_depend_on_the_thread_count():
    shape = (3, 4, kernels.BLOCK + 77)
    x, dy = randn(shape, np.float32), randn(shape, np.float32)
    s, b = randn(4, np.float32), randn(4, np.float32)

    def run():
        y = elementwise.scale_forward(x, s, b, np.empty_like(x))
        dx = np.empty_like(x)
        sums = elementwise.scale_backward(x, dy, s, dx)
        total = elementwise.weighted_sum([x, dy, y], [1.0, 0.5, -2.0], np.empty_like(x))
        channel_sums = elementwise.add_channel_sums(dy, np.zeros(4, np.float32))
        return [y, dx, *sums, total, channel_sums]

    assert_same_on_one_thread(run)


# ------------------------------------------------------------------------------------- the layers
def run_layer(text, xs, dys, in_place=False, params=None, dtype=np.float64):
    """Forward and backward of one layer; returns (tops' data, bottoms' diffs, params' diffs), copied."""
    with default_dtype(dtype):
        layer = make_layer(parse_layer(text))
        bottom = [Blob(x.shape, dtype=dtype) for x in xs]
        for blob, x in zip(bottom, xs):
            blob.data[...] = x
        top = [bottom[0]] if in_place else [Blob(dtype=dtype) for _ in dys]
        layer.setup_layer(bottom, top)
        for p, v in zip(layer.blobs, params or []):
            p.data[...] = v
    layer.forward(bottom, top)
    ys = [np.array(t.data) for t in top]
    for t, dy in zip(top, dys):
        t.diff = dy.copy()
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward(top, [True] * len(bottom), bottom)
    return ys, [np.array(b.diff) for b in bottom], [np.array(p.diff) for p in layer.blobs]


LAYER_CASES = [
    ('type: "ReLU"', 1, 1),
    ('type: "ReLU" relu_param { negative_slope: 0.2 }', 1, 1),
    ('type: "ReLU" relu_param { negative_slope: -0.4 }', 1, 1),
    ('type: "Eltwise" eltwise_param { operation: SUM }', 2, 1),
    ('type: "Eltwise" eltwise_param { operation: SUM coeff: 0.5 coeff: -1 coeff: 2 }', 3, 1),
    ('type: "Eltwise" eltwise_param { operation: PROD }', 3, 1),
    ('type: "Eltwise" eltwise_param { operation: PROD stable_prod_grad: false }', 2, 1),
    ('type: "Eltwise" eltwise_param { operation: MAX }', 3, 1),
    ('type: "Split"', 1, 3),
    ('type: "Split"', 1, 1),
    ('type: "Scale" scale_param { bias_term: true }', 1, 1),
    ('type: "Scale" scale_param { axis: 0 num_axes: 2 }', 1, 1),
    ('type: "Scale" scale_param { axis: 1 bias_term: true }', 2, 1),
]
LAYER_IDS = [f"{t} x{nb}->{nt}" for t, nb, nt in LAYER_CASES]


def _inputs(text, nb, nt, shape, dtype):
    xs = [randn(shape, dtype) for _ in range(nb)]
    if "axis: 1 bias_term" in text:
        xs[1] = randn(shape[1:2], dtype)
    return xs, [randn(shape, dtype) for _ in range(nt)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("text,nb,nt", LAYER_CASES, ids=LAYER_IDS)
def test_layers_match_with_and_without_kernels(monkeypatch, text, nb, nt, dtype):
    xs, dys = _inputs(text, nb, nt, (3, 5, 4, 7), dtype)
    monkeypatch.setattr(jit, "ENABLED", True)
    compiled = run_layer(text, xs, dys, dtype=dtype)
    monkeypatch.setattr(jit, "ENABLED", False)
    reference = run_layer(text, xs, dys, dtype=dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for got, expected in zip(compiled, reference):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("text,nb,nt", [c for c in LAYER_CASES if c[2] == 1 and "Split" not in c[0]],
                         ids=[i for c, i in zip(LAYER_CASES, LAYER_IDS) if c[2] == 1 and "Split" not in c[0]])
def test_layers_in_place_match_out_of_place(compiled, text, nb, nt):
    xs, dys = _inputs(text, nb, nt, (2, 3, 4, 5), np.float64)
    out_of_place = run_layer(text, xs, dys)
    in_place = run_layer(text, xs, dys, in_place=True)
    for got, expected in zip(in_place, out_of_place):
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("text,nb,nt", LAYER_CASES, ids=LAYER_IDS)
def test_layer_gradients(compiled, text, nb, nt):
    xs, dys = _inputs(text, nb, nt, (2, 3, 2, 3), np.float64)
    if "ReLU" in text:  # keep away from the kink at 0
        xs = [x + np.sign(x) * 0.1 for x in xs]
    if "MAX" in text:   # and away from ties
        xs = [x + k for k, x in enumerate(xs)]
    check_gradients(parse_layer(text), xs, num_tops=nt)


def test_outputs_are_reused_and_never_overwrite_the_input(compiled, monkeypatch):
    monkeypatch.setattr(ReusedArrays, "KEEP_FROM_BYTES", 0)  # keep arrays of every size
    layer, bottom, top = build(parse_layer('type: "ReLU"'), [randn((2, 3, 4), np.float64)], 1)
    top = bottom  # in place
    layer.forward(bottom, bottom)
    first = bottom[0].data
    x = randn((2, 3, 4), np.float64)
    bottom[0].data = x
    layer.forward(bottom, top)
    assert top[0].data is first  # the same array as the first call's output
    # A Python data layer writes its batch into whatever array the blob holds: this layer's output.
    top[0].data[...] = x
    layer.forward(bottom, top)
    assert top[0].data is not first
    np.testing.assert_array_equal(first, x)  # the input survived
    np.testing.assert_array_equal(top[0].data, np.maximum(x, 0))
    bottom[0].diff = np.ones_like(x)
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, x > 0)


def test_eltwise_sum_and_split_pass_gradients_on_without_copies(compiled):
    xs, dys = _inputs("", 2, 1, (2, 3), np.float64)
    layer, bottom, top = build(parse_layer('type: "Eltwise"'), xs, 1)
    layer.forward(bottom, top)
    top[0].diff = dys[0]
    layer.backward(top, [True, True], bottom)
    assert bottom[0].diff is top[0].diff and bottom[1].diff is top[0].diff
    layer, bottom, top = build(parse_layer('type: "Split"'), xs[:1], 1)
    layer.forward(bottom, top)
    top[0].diff = dys[0]
    layer.backward(top, [True], bottom)
    assert bottom[0].diff is top[0].diff
