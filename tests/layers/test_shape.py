"""Eltwise, Concat, Slice, Split, Flatten, Reshape, Crop, Silence, Tile, Reduction, Filter,
BatchReindex: numerical gradients, shapes, views, hand-computed values and the Caffe oracles."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import build, check_gradients, layer_case_names, parse_layer, run_caffe_case, shared_path

RNG = np.random.default_rng(4321)


def randn(*shape):
    return RNG.standard_normal(shape)


def layer(text):
    return parse_layer(text)




def forward_backward(text, bottoms, num_tops, top_diffs, propagate=None):
    lay, bottom, top = build(layer(text), bottoms, num_tops)
    lay.forward(bottom, top)
    for t, d in zip(top, top_diffs):
        t.diff = np.asarray(d, dtype=np.float64)
    lay.backward(top, propagate or [True] * len(bottom), bottom)
    return lay, bottom, top


# ------------------------------------------------------------------------------------ Eltwise
@pytest.mark.parametrize("param,n", [
    ("eltwise_param { operation: SUM }", 2),
    ("eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 }", 3),
    ("eltwise_param { operation: PROD }", 2),
    ("eltwise_param { operation: PROD }", 4),
    ("eltwise_param { operation: PROD stable_prod_grad: false }", 3),
    ("eltwise_param { operation: MAX }", 2),
    ("eltwise_param { operation: MAX }", 3),
])
def test_eltwise_gradient(param, n):
    check_gradients(layer(f'type: "Eltwise" {param}'), [randn(2, 3, 2) for _ in range(n)])


def test_eltwise_sum_coeff_values():
    a, b = randn(2, 3), randn(2, 3)
    lay, bottom, top = forward_backward('type: "Eltwise" eltwise_param { coeff: 2 coeff: -3 }', [a, b], 1,
                                        [np.ones((2, 3))])
    np.testing.assert_allclose(top[0].data, 2 * a - 3 * b)
    np.testing.assert_allclose(bottom[0].diff, 2.0)
    np.testing.assert_allclose(bottom[1].diff, -3.0)


def test_eltwise_prod_stable_gradient_with_zero():
    a = np.array([[0.0, 2.0]])
    b = np.array([[3.0, 0.0]])
    c = np.array([[5.0, 7.0]])
    _, bottom, top = forward_backward('type: "Eltwise" eltwise_param { operation: PROD }', [a, b, c], 1,
                                      [np.ones((1, 2))])
    np.testing.assert_allclose(top[0].data, [[0.0, 0.0]])
    np.testing.assert_allclose(bottom[0].diff, [[15.0, 0.0]])
    np.testing.assert_allclose(bottom[1].diff, [[0.0, 14.0]])
    np.testing.assert_allclose(bottom[2].diff, [[0.0, 0.0]])


def test_eltwise_max_tie_goes_where_caffe_sends_it():
    # Caffe: bottom 0 beats bottom 1 only when strictly greater; later bottoms must be strictly
    # greater than the running max.
    a = np.array([[1.0, 2.0, 5.0]])
    b = np.array([[1.0, 3.0, 0.0]])
    c = np.array([[0.0, 3.0, 5.0]])
    _, bottom, top = forward_backward('type: "Eltwise" eltwise_param { operation: MAX }', [a, b, c], 1,
                                      [np.array([[10.0, 20.0, 30.0]])])
    np.testing.assert_allclose(top[0].data, [[1.0, 3.0, 5.0]])
    np.testing.assert_allclose(bottom[0].diff, [[0.0, 0.0, 30.0]])
    np.testing.assert_allclose(bottom[1].diff, [[10.0, 20.0, 0.0]])
    np.testing.assert_allclose(bottom[2].diff, [[0.0, 0.0, 0.0]])


@pytest.mark.parametrize("param", ["eltwise_param { operation: PROD coeff: 1 coeff: 2 }",
                                   "eltwise_param { coeff: 1 }"])
def test_eltwise_bad_coeff(param):
    with pytest.raises(Exception, match="coefficient"):
        build(layer(f'type: "Eltwise" {param}'), [randn(2), randn(2)], 1)


def test_eltwise_shape_mismatch():
    with pytest.raises(Exception, match="shape"):
        build(layer('type: "Eltwise"'), [randn(2, 3), randn(3, 2)], 1)


# ------------------------------------------------------------------------------------ Concat / Slice
@pytest.mark.parametrize("param,shapes,out", [
    ("concat_param { axis: 1 }", [(2, 3, 2), (2, 1, 2), (2, 2, 2)], (2, 6, 2)),
    ("concat_param { axis: 0 }", [(1, 3, 2), (2, 3, 2)], (3, 3, 2)),
    ("concat_param { axis: -1 }", [(2, 3, 2), (2, 3, 1)], (2, 3, 3)),
    ("concat_param { concat_dim: 2 }", [(2, 2, 1), (2, 2, 3)], (2, 2, 4)),
    ("", [(2, 3), (2, 2)], (2, 5)),
    ("", [(2, 3)], (2, 3)),
])
def test_concat_gradient_and_shape(param, shapes, out):
    check_gradients(layer(f'type: "Concat" {param}'), [randn(*s) for s in shapes])
    _, bottom, top = build(layer(f'type: "Concat" {param}'), [randn(*s) for s in shapes], 1)
    assert top[0].shape == out


def test_concat_values():
    a, b = randn(2, 3, 2), randn(2, 1, 2)
    lay, bottom, top = build(layer('type: "Concat"'), [a, b], 1)
    lay.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, np.concatenate([a, b], axis=1))


def test_concat_mismatch():
    with pytest.raises(Exception, match="does not match"):
        build(layer('type: "Concat" concat_param { axis: 1 }'), [randn(2, 3), randn(3, 3)], 1)


@pytest.mark.parametrize("param,shape,ntop,sizes", [
    ("slice_param { axis: 1 slice_point: 1 slice_point: 3 }", (2, 5, 2), 3, [1, 2, 2]),
    ("slice_param { axis: 2 }", (2, 3, 4), 2, [2, 2]),
    ("slice_param { axis: -1 slice_point: 2 }", (2, 3), 2, [2, 1]),
    ("slice_param { axis: 0 }", (3, 2), 3, [1, 1, 1]),
    ("slice_param { slice_dim: 2 slice_point: 1 }", (2, 2, 3), 2, [1, 2]),
    ("", (2, 4), 2, [2, 2]),
    ("", (2, 4), 1, [4]),
])
def test_slice_gradient_and_shape(param, shape, ntop, sizes):
    check_gradients(layer(f'type: "Slice" {param}'), [randn(*shape)], num_tops=ntop)
    lay, bottom, top = build(layer(f'type: "Slice" {param}'), [randn(*shape)], ntop)
    assert [t.shape[lay._axis_index] for t in top] == sizes
    lay.forward(bottom, top)
    np.testing.assert_array_equal(np.concatenate([t.data for t in top], axis=lay._axis_index), bottom[0].data)


def test_slice_uneven_is_an_error():
    with pytest.raises(Exception, match="evenly"):
        build(layer('type: "Slice" slice_param { axis: 1 }'), [randn(2, 3)], 2)


# ------------------------------------------------------------------------------------ Split
def test_split_shares_data_and_sums_diffs():
    x = randn(2, 3)
    d0, d1, d2 = randn(2, 3), randn(2, 3), randn(2, 3)
    lay, bottom, top = forward_backward('type: "Split"', [x], 3, [d0, d1, d2])
    for t in top:
        assert np.shares_memory(t.data, bottom[0].data)
        np.testing.assert_array_equal(t.data, x)
    np.testing.assert_allclose(bottom[0].diff, d0 + d1 + d2)
    # the top diffs stay separate
    np.testing.assert_array_equal(top[0].diff, d0)
    assert not np.shares_memory(top[0].diff, top[1].diff)


def test_split_follows_a_replaced_bottom_array():
    lay, bottom, top = build(layer('type: "Split"'), [randn(2, 2)], 2)
    bottom[0].data = np.ones((2, 2))
    lay.forward(bottom, top)
    np.testing.assert_array_equal(top[1].data, np.ones((2, 2)))


def test_split_gradient():
    check_gradients(layer('type: "Split"'), [randn(2, 3)], num_tops=2)


# ------------------------------------------------------------------------------------ Flatten / Reshape
@pytest.mark.parametrize("param,out", [
    ("", (2, 24)),
    ("flatten_param { axis: 2 }", (2, 3, 8)),
    ("flatten_param { axis: 1 end_axis: 2 }", (2, 12, 2)),
    ("flatten_param { axis: 0 end_axis: -2 }", (24, 2)),
    ("flatten_param { axis: -1 }", (2, 3, 4, 2)),
])
def test_flatten(param, out):
    x = randn(2, 3, 4, 2)
    check_gradients(layer(f'type: "Flatten" {param}'), [x])
    lay, bottom, top = build(layer(f'type: "Flatten" {param}'), [x], 1)
    lay.forward(bottom, top)
    assert top[0].shape == out
    assert np.shares_memory(top[0].data, bottom[0].data)
    np.testing.assert_array_equal(top[0].data, x.reshape(out))


@pytest.mark.parametrize("param,out", [
    ("reshape_param { shape { dim: 0 dim: -1 dim: 3 } }", (2, 8, 3)),
    ("reshape_param { shape { dim: -1 } axis: 1 num_axes: 2 }", (2, 12, 2)),
    ("reshape_param { shape { dim: 6 dim: 8 } }", (6, 8)),
    ("reshape_param { shape { dim: 1 dim: 1 } axis: 1 num_axes: 0 }", (2, 1, 1, 3, 4, 2)),
    ("reshape_param { shape { dim: 2 dim: -1 } axis: -2 }", (2, 3, 4, 2, 1)),
    ("reshape_param { shape { dim: 0 dim: 0 dim: -1 } }", (2, 3, 8)),
    ("reshape_param { shape { } axis: 1 num_axes: 0 }", (2, 3, 4, 2)),
])
def test_reshape(param, out):
    x = randn(2, 3, 4, 2)
    check_gradients(layer(f'type: "Reshape" {param}'), [x])
    lay, bottom, top = build(layer(f'type: "Reshape" {param}'), [x], 1)
    lay.forward(bottom, top)
    assert top[0].shape == out
    assert np.shares_memory(top[0].data, bottom[0].data)
    np.testing.assert_array_equal(top[0].data.reshape(-1), x.reshape(-1))


@pytest.mark.parametrize("param,match", [
    ("reshape_param { shape { dim: -1 dim: -1 } }", "-1"),
    ("reshape_param { shape { dim: 5 dim: -1 } }", "infer"),
    ("reshape_param { shape { dim: 7 } }", "elements"),
])
def test_reshape_errors(param, match):
    with pytest.raises(Exception, match=match):
        build(layer(f'type: "Reshape" {param}'), [randn(2, 3, 4)], 1)


# ------------------------------------------------------------------------------------ Crop
@pytest.mark.parametrize("param,ref,window", [
    ("crop_param { axis: 2 offset: 1 }", (2, 3, 2, 3), (slice(None), slice(None), slice(1, 3), slice(1, 4))),
    ("crop_param { axis: 1 offset: 1 offset: 2 offset: 0 }", (5, 2, 2, 3),
     (slice(None), slice(1, 3), slice(2, 4), slice(0, 3))),
    ("crop_param { axis: -1 offset: 2 }", (1, 1, 1, 2), (slice(None), slice(None), slice(None), slice(2, 4))),
    ("", (9, 9, 4, 5), (slice(None), slice(None), slice(0, 4), slice(0, 5))),
])
def test_crop(param, ref, window):
    x = randn(2, 3, 4, 5)
    text = f'type: "Crop" {param}'
    check_gradients(layer(text), [x, randn(*ref)], check_bottoms=[0])
    lay, bottom, top = forward_backward(text, [x, randn(*ref)], 1, [np.ones(x[window].shape)], [True, False])
    np.testing.assert_array_equal(top[0].data, x[window])
    expect = np.zeros_like(x)
    expect[window] = 1
    np.testing.assert_array_equal(bottom[0].diff, expect)
    assert lay.allow_force_backward(0) and not lay.allow_force_backward(1)


def test_crop_too_large_is_an_error():
    with pytest.raises(Exception, match="exceeds"):
        build(layer('type: "Crop" crop_param { axis: 2 offset: 2 }'), [randn(1, 1, 4, 4), randn(1, 1, 3, 3)], 1)


# ------------------------------------------------------------------------------------ Silence
def test_silence_writes_zero_diffs():
    lay, bottom, top = build(layer('type: "Silence"'), [randn(2, 3), randn(4)], 0)
    lay.forward(bottom, top)
    bottom[0].diff = np.ones((2, 3))
    bottom[1].diff = np.ones(4)
    lay.backward([], [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0)
    np.testing.assert_array_equal(bottom[1].diff, 1)


# ------------------------------------------------------------------------------------ Tile
@pytest.mark.parametrize("param,shape", [
    ("tile_param { axis: 1 tiles: 2 }", (2, 3, 2)),
    ("tile_param { axis: 0 tiles: 3 }", (2, 3)),
    ("tile_param { axis: -1 tiles: 2 }", (2, 2, 3)),
])
def test_tile(param, shape):
    x = randn(*shape)
    check_gradients(layer(f'type: "Tile" {param}'), [x])
    lay, bottom, top = build(layer(f'type: "Tile" {param}'), [x], 1)
    lay.forward(bottom, top)
    axis = lay.layer_param.tile_param.axis % len(shape)
    tiles = lay.layer_param.tile_param.tiles
    reps = [1] * len(shape)
    reps[axis] = tiles
    # Caffe repeats the whole block of trailing axes, which is np.tile along `axis`.
    np.testing.assert_array_equal(top[0].data, np.tile(x, reps))


# ------------------------------------------------------------------------------------ Reduction
@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_reduction(op, axis):
    x = randn(2, 3, 4)
    text = f'type: "Reduction" reduction_param {{ operation: {op} axis: {axis} coeff: 1.5 }}'
    check_gradients(layer(text), [x])
    lay, bottom, top = build(layer(text), [x], 1)
    lay.forward(bottom, top)
    a = axis % 3
    flat = x.reshape(int(np.prod(x.shape[:a])), -1)
    expect = {"SUM": flat.sum(1), "ASUM": np.abs(flat).sum(1), "SUMSQ": (flat ** 2).sum(1),
              "MEAN": flat.mean(1)}[op] * 1.5
    assert top[0].shape == x.shape[:a]
    np.testing.assert_allclose(top[0].data.reshape(-1), expect, rtol=1e-12)


# ------------------------------------------------------------------------------------ Filter
def test_filter_gradient_and_values():
    x0, x1 = randn(5, 2, 2), randn(5, 3)
    sel = np.array([1.0, 0.0, 2.0, 0.0, -1.0])
    check_gradients(layer('type: "Filter"'), [x0, x1, sel], num_tops=2, check_bottoms=[0, 1])
    dy0, dy1 = randn(3, 2, 2), randn(3, 3)
    lay, bottom, top = forward_backward('type: "Filter"', [x0, x1, sel], 2, [dy0, dy1], [True, True, False])
    np.testing.assert_array_equal(top[0].data, x0[[0, 2, 4]])
    np.testing.assert_array_equal(top[1].data, x1[[0, 2, 4]])
    expect = np.zeros_like(x0)
    expect[[0, 2, 4]] = dy0
    np.testing.assert_array_equal(bottom[0].diff, expect)
    assert not lay.allow_force_backward(2) and lay.allow_force_backward(0)


def test_filter_tops_resize_at_forward():
    lay, bottom, top = build(layer('type: "Filter"'), [randn(4, 2), np.zeros((4, 1))], 1)
    assert top[0].shape == (4, 2)  # before any data is seen, as Caffe
    bottom[1].data[...] = [[0], [1], [0], [0]]
    lay.forward(bottom, top)
    assert top[0].shape == (1, 2)
    bottom[1].data[...] = [[1], [1], [1], [0]]
    lay.forward(bottom, top)
    assert top[0].shape == (3, 2)
    np.testing.assert_array_equal(top[0].data, bottom[0].data[:3])


def test_filter_refuses_selector_gradient():
    lay, bottom, top = build(layer('type: "Filter"'), [randn(2, 2), np.ones(2)], 1)
    lay.forward(bottom, top)
    with pytest.raises(Exception, match="selector"):
        lay.backward(top, [True, True], bottom)


# ------------------------------------------------------------------------------------ BatchReindex
def test_batch_reindex_gradient_and_values():
    x = randn(4, 3, 2)
    idx = np.array([2.0, 0.0, 3.0, 3.0, 2.0])
    check_gradients(layer('type: "BatchReindex"'), [x, idx], check_bottoms=[0])
    dy = randn(5, 3, 2)
    lay, bottom, top = forward_backward('type: "BatchReindex"', [x, idx], 1, [dy], [True, False])
    np.testing.assert_array_equal(top[0].data, x[[2, 0, 3, 3, 2]])
    expect = np.zeros_like(x)
    expect[0] = dy[1]
    expect[2] = dy[0] + dy[4]
    expect[3] = dy[2] + dy[3]
    np.testing.assert_allclose(bottom[0].diff, expect)
    assert not lay.allow_force_backward(1)


def test_batch_reindex_out_of_range():
    lay, bottom, top = build(layer('type: "BatchReindex"'), [randn(2, 2), np.array([0.0, 2.0])], 1)
    with pytest.raises(Exception, match="indices"):
        lay.forward(bottom, top)


# ------------------------------------------------------------------------------------ oracles
PREFIXES = ("eltwise_", "concat_", "slice_", "split", "flatten", "reshape", "crop_", "tile_", "reduction_",
            "filter", "batch_reindex")


@pytest.mark.parametrize("name", layer_case_names(PREFIXES))
def test_caffe_oracle(name):
    run_caffe_case(name)


def test_caffe_oracles_present():
    shared_path("fixtures", "caffe-ref", "layers")
    names = set(layer_case_names(PREFIXES))
    assert {"eltwise_max", "concat_axis2", "slice_even", "split", "flatten", "reshape_0_-1", "crop_axis1_offsets",
            "tile_axis0", "reduction_sum_default", "filter_2data", "batch_reindex"} <= names
