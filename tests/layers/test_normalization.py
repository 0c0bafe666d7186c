"""BatchNorm, Scale, Bias, MVN: numerical gradients, in-place use, hand-computed values and the
Caffe oracles."""
from __future__ import annotations

import numpy as np
import pytest

import tests.helpers as helpers
from netdef.blob import Blob
from netdef.layers import normalization
from netdef.layers.base import TEST, TRAIN
from tests.helpers import build, check_gradients, layer_case_names, parse_layer, run_caffe_case, shared_path

RNG = np.random.default_rng(1234)


def randn(*shape):
    return RNG.standard_normal(shape)




def run_in_place(text, bottoms, top_diff, params=None, phase=TRAIN):
    """Forward + backward with top[0] the same Blob as bottom[0]; returns (y, dx, param diffs)."""
    layer_param = parse_layer(text, phase)
    with helpers.default_dtype(np.float64):
        layer = helpers.make_layer(layer_param)
        bottom = helpers.blobs_from(bottoms, np.float64)
        top = [bottom[0]]
        layer.setup_layer(bottom, top)
        if params is not None:
            for blob, value in zip(layer.blobs, params):
                blob.data[...] = value
    layer.forward(bottom, top)
    y = np.array(top[0].data)
    top[0].diff = np.asarray(top_diff, dtype=np.float64).copy()
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward(top, [True] + [False] * (len(bottom) - 1), bottom)
    return y, np.array(bottom[0].diff), [np.array(p.diff) for p in layer.blobs]


def run_out_of_place(text, bottoms, top_diff, params=None, phase=TRAIN):
    layer, bottom, top = build(parse_layer(text, phase), bottoms, 1, np.float64, params)
    layer.forward(bottom, top)
    top[0].diff = np.asarray(top_diff, dtype=np.float64).copy()
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward(top, [True] + [False] * (len(bottom) - 1), bottom)
    return np.array(top[0].data), np.array(bottom[0].diff), [np.array(p.diff) for p in layer.blobs]


# ------------------------------------------------------------------------------------ BatchNorm
BN_TRAIN = 'type: "BatchNorm" batch_norm_param { use_global_stats: false }'
BN_GLOBAL = 'type: "BatchNorm" batch_norm_param { use_global_stats: true }'


def bn_stored(c, factor=0.7):
    return [RNG.standard_normal(c), RNG.uniform(0.5, 1.5, c), np.array([factor])]


@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (5, 3), (4, 2, 5)])
def test_batchnorm_train_gradient(shape):
    layer = check_gradients(parse_layer(BN_TRAIN), [randn(*shape)], check_params=False)
    # The stored statistics never get a gradient.
    assert layer.param_propagate_down == [False, False, False]
    for p in layer.blobs:
        assert not np.any(p.diff)


def test_batchnorm_train_gradient_with_eps():
    text = 'type: "BatchNorm" batch_norm_param { use_global_stats: false eps: 0.5 }'
    check_gradients(parse_layer(text), [0.3 * randn(3, 2, 2, 2)], check_params=False)


@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (5, 3)])
def test_batchnorm_global_gradient(shape):
    params = bn_stored(shape[1])
    layer = check_gradients(parse_layer(BN_GLOBAL), [randn(*shape)], params=params, check_params=False)
    for p in layer.blobs:
        assert not np.any(p.diff)


def test_batchnorm_train_values_and_update():
    x = randn(4, 3, 2, 2)
    stored = bn_stored(3, factor=2.0)
    text = 'type: "BatchNorm" batch_norm_param { use_global_stats: false moving_average_fraction: 0.9 eps: 0.01 }'
    layer, bottom, top = build(parse_layer(text), [x], 1, np.float64, [a.copy() for a in stored])
    layer.forward(bottom, top)
    eps, maf = float(np.float32(0.01)), float(np.float32(0.9))  # the schema's fields are float32
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    expect = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + eps)
    np.testing.assert_allclose(top[0].data, expect, rtol=1e-10)
    m = 4 * 2 * 2
    np.testing.assert_allclose(layer.blobs[0].data, maf * stored[0] + mean, rtol=1e-10)
    np.testing.assert_allclose(layer.blobs[1].data, maf * stored[1] + m / (m - 1) * var, rtol=1e-10)
    np.testing.assert_allclose(layer.blobs[2].data, [maf * 2.0 + 1], rtol=1e-10)


def test_batchnorm_global_values():
    x = randn(2, 3, 2, 2)
    stored = bn_stored(3, factor=0.5)
    layer, bottom, top = build(parse_layer(BN_GLOBAL), [x], 1, np.float64, [a.copy() for a in stored])
    layer.forward(bottom, top)
    mean, var = stored[0] / 0.5, stored[1] / 0.5
    eps = float(np.float32(1e-5))
    expect = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + eps)
    np.testing.assert_allclose(top[0].data, expect, rtol=1e-10)
    for a, b in zip(layer.blobs, stored):  # global stats are read, not updated
        np.testing.assert_array_equal(a.data, b)


def test_batchnorm_global_zero_factor_means_zero_stats():
    x = randn(2, 3)
    layer, bottom, top = build(parse_layer(BN_GLOBAL), [x], 1, np.float64)
    for p in layer.blobs:  # created zero-filled
        assert not np.any(p.data)
    assert [p.shape for p in layer.blobs] == [(3,), (3,), (1,)]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, x / np.sqrt(float(np.float32(1e-5))), rtol=1e-10)


@pytest.mark.parametrize("factor", [0.0, 1.0, 0.37, 999.9841, 3e-38, 1.1754944e-38])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_moving_average_factors_inverse_on_the_device_has_the_hosts_bits(factor, dtype):
    """On a GPU the inverse of BatchNorm's stored factor is taken on the device (no host read, so that
    a pass can be recorded as a CUDA graph): the same values multiplied in as the host's Python float."""
    stored = np.array([factor], dtype=dtype)
    values = np.random.default_rng(7).standard_normal(64).astype(dtype)
    as_array = normalization.inverse_factor_as_array(stored)
    assert as_array.dtype == dtype and as_array.shape == (1,)
    np.testing.assert_array_equal(values * as_array, values * normalization.inverse_factor(stored))


@pytest.mark.parametrize("phase,expect_global", [(TRAIN, False), (TEST, True)])
def test_batchnorm_global_stats_default_follows_phase(phase, expect_global):
    x = randn(3, 2) + 5.0
    layer, bottom, top = build(parse_layer('type: "BatchNorm"', phase), [x], 1, np.float64)
    layer.forward(bottom, top)
    assert layer.use_global_stats is expect_global
    if expect_global:  # zero stats: y = x / sqrt(eps), blobs untouched
        np.testing.assert_allclose(top[0].data, x / np.sqrt(1e-5))
        assert layer.blobs[2].data[0] == 0
    else:
        np.testing.assert_allclose(top[0].data.mean(axis=0), 0, atol=1e-10)
        assert layer.blobs[2].data[0] == 1


def test_batchnorm_keeps_existing_blobs():
    layer_param = parse_layer(BN_GLOBAL)
    with helpers.default_dtype(np.float64):
        layer = helpers.make_layer(layer_param)
        layer.blobs = [Blob((2,), dtype=np.float64) for _ in range(2)] + [Blob((1,), dtype=np.float64)]
        layer.blobs[2].data[...] = 3.0
        kept = list(layer.blobs)
        bottom, top = helpers.blobs_from([randn(2, 2)], np.float64), [Blob(dtype=np.float64)]
        layer.setup_layer(bottom, top)
    assert all(a is b for a, b in zip(layer.blobs, kept))
    assert layer.blobs[2].data[0] == 3.0


@pytest.mark.parametrize("text,phase", [(BN_TRAIN, TRAIN), (BN_GLOBAL, TEST)])
def test_batchnorm_in_place(text, phase):
    x, dy = randn(3, 2, 2, 2), randn(3, 2, 2, 2)
    stored = bn_stored(2)
    a = run_out_of_place(text, [x], dy, [s.copy() for s in stored], phase)
    b = run_in_place(text, [x], dy, [s.copy() for s in stored], phase)
    np.testing.assert_allclose(b[0], a[0], rtol=1e-12)
    np.testing.assert_allclose(b[1], a[1], rtol=1e-12)


# ------------------------------------------------------------------------------------ Scale
SCALE_ONE_BOTTOM = [
    ("scale_param { axis: 1 }", (2, 3, 2, 2), (3,)),
    ("scale_param { axis: 1 bias_term: true }", (2, 3, 2, 2), (3,)),
    ("scale_param { axis: 0 num_axes: -1 }", (2, 3, 2), (2, 3, 2)),
    ("scale_param { axis: 1 num_axes: 2 bias_term: true }", (2, 3, 2, 2), (3, 2)),
    ("scale_param { axis: -1 }", (2, 3, 4), (4,)),
    ("scale_param { num_axes: 0 bias_term: true }", (2, 3, 2), ()),
    ("scale_param { axis: 2 num_axes: 0 }", (2, 3, 2), ()),
]


@pytest.mark.parametrize("param,shape,blob_shape", SCALE_ONE_BOTTOM)
def test_scale_gradient_one_bottom(param, shape, blob_shape):
    text = f'type: "Scale" {param}'
    n_blobs = 2 if "bias_term" in param else 1
    params = [randn(*blob_shape) for _ in range(n_blobs)]
    layer = check_gradients(parse_layer(text), [randn(*shape)], params=params)
    assert [b.shape for b in layer.blobs] == [blob_shape] * n_blobs


SCALE_TWO_BOTTOMS = [
    ("scale_param { axis: 1 }", (2, 3, 2, 2), (3,)),
    ("scale_param { axis: 1 bias_term: true }", (2, 3, 2, 2), (3,)),
    ("scale_param { axis: 0 }", (2, 3, 2, 2), (2, 3)),
    ("scale_param { axis: -2 }", (2, 3, 2, 2), (2, 2)),
    ("scale_param { axis: 1 bias_term: true }", (2, 3, 2), ()),
]


@pytest.mark.parametrize("param,shape,scale_shape", SCALE_TWO_BOTTOMS)
def test_scale_gradient_two_bottoms(param, shape, scale_shape):
    text = f'type: "Scale" {param}'
    params = [randn(*scale_shape)] if "bias_term" in param else None
    layer = check_gradients(parse_layer(text), [randn(*shape), randn(*scale_shape)], params=params)
    assert len(layer.blobs) == (1 if params else 0)


def test_scale_values_and_default_fillers():
    x = randn(2, 3, 2)
    layer, bottom, top = build(parse_layer('type: "Scale" scale_param { bias_term: true }'), [x], 1)
    np.testing.assert_array_equal(layer.blobs[0].data, np.ones(3))   # default scale filler: 1
    np.testing.assert_array_equal(layer.blobs[1].data, np.zeros(3))  # default bias filler: 0
    layer.blobs[0].data[...] = [1.0, 2.0, -3.0]
    layer.blobs[1].data[...] = [0.5, 0.0, 1.0]
    layer.forward(bottom, top)
    expect = x * np.array([1.0, 2.0, -3.0])[None, :, None] + np.array([0.5, 0.0, 1.0])[None, :, None]
    np.testing.assert_allclose(top[0].data, expect, rtol=1e-12)


def test_scale_filler_param_is_used():
    text = 'type: "Scale" scale_param { filler { type: "constant" value: 2.5 } bias_term: true bias_filler { type: "constant" value: -1 } }'
    layer, _, _ = build(parse_layer(text), [randn(2, 3)], 1)
    np.testing.assert_array_equal(layer.blobs[0].data, np.full(3, 2.5))
    np.testing.assert_array_equal(layer.blobs[1].data, np.full(3, -1.0))


def test_scale_shape_mismatch_is_an_error():
    with pytest.raises(Exception, match="does not match"):
        build(parse_layer('type: "Scale" scale_param { axis: 1 }'), [randn(2, 3, 4), randn(4)], 1)


@pytest.mark.parametrize("text,bottoms", [
    ('type: "Scale" scale_param { axis: 1 bias_term: true }', [(2, 3, 2, 2)]),
    ('type: "Scale" scale_param { axis: 1 }', [(2, 3, 2, 2), (3,)]),
    ('type: "Bias" bias_param { axis: 1 }', [(2, 3, 2, 2)]),
])
def test_scale_bias_in_place(text, bottoms):
    xs = [randn(*s) for s in bottoms]
    dy = randn(*bottoms[0])
    n_blobs = 2 if "bias_term" in text else (1 if len(bottoms) == 1 else 0)
    params = [randn(3) for _ in range(n_blobs)]
    a = run_out_of_place(text, xs, dy, params)
    b = run_in_place(text, xs, dy, params)
    np.testing.assert_allclose(b[0], a[0], rtol=1e-12)
    np.testing.assert_allclose(b[1], a[1], rtol=1e-12)
    for pa, pb_ in zip(a[2], b[2]):
        np.testing.assert_allclose(pb_, pa, rtol=1e-12)
        assert np.any(pa)


# ------------------------------------------------------------------------------------ Bias
BIAS_ONE_BOTTOM = [
    ("bias_param { axis: 1 }", (2, 3, 2, 2), (3,)),
    ("bias_param { axis: 0 num_axes: -1 }", (2, 3, 2), (2, 3, 2)),
    ("bias_param { axis: 1 num_axes: 2 }", (2, 3, 2, 2), (3, 2)),
    ("bias_param { num_axes: 0 }", (2, 3), ()),
    ("bias_param { axis: -1 }", (2, 3, 4), (4,)),
]


@pytest.mark.parametrize("param,shape,blob_shape", BIAS_ONE_BOTTOM)
def test_bias_gradient_one_bottom(param, shape, blob_shape):
    layer = check_gradients(parse_layer(f'type: "Bias" {param}'), [randn(*shape)], params=[randn(*blob_shape)])
    assert layer.blobs[0].shape == blob_shape


@pytest.mark.parametrize("param,shape,bias_shape", [
    ("bias_param { axis: 1 }", (2, 3, 2, 2), (3, 2)),
    ("bias_param { axis: 0 }", (2, 3, 2), (2,)),
    ("bias_param { axis: 1 }", (2, 3), ()),
])
def test_bias_gradient_two_bottoms(param, shape, bias_shape):
    check_gradients(parse_layer(f'type: "Bias" {param}'), [randn(*shape), randn(*bias_shape)])


def test_bias_values_and_default_filler():
    x = randn(2, 3, 2)
    layer, bottom, top = build(parse_layer('type: "Bias"'), [x], 1)
    np.testing.assert_array_equal(layer.blobs[0].data, np.zeros(3))
    layer.blobs[0].data[...] = [1.0, -2.0, 3.0]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, x + np.array([1.0, -2.0, 3.0])[None, :, None], rtol=1e-12)


# ------------------------------------------------------------------------------------ MVN
MVN_PARAMS = [
    "mvn_param { normalize_variance: true }",
    "mvn_param { normalize_variance: false }",
    "mvn_param { normalize_variance: true across_channels: true }",
    "mvn_param { normalize_variance: false across_channels: true }",
]


@pytest.mark.parametrize("param", MVN_PARAMS)
def test_mvn_gradient(param):
    check_gradients(parse_layer(f'type: "MVN" {param}'), [randn(2, 3, 2, 3)])


def test_mvn_eps_added_to_std():
    x = np.array([1.0, 3.0, 5.0, 9.0]).reshape(1, 2, 1, 2)
    layer, bottom, top = build(parse_layer('type: "MVN" mvn_param { eps: 0.5 }'), [x], 1)
    layer.forward(bottom, top)
    # each channel: mean 2 / 7, std 1 / 2 (biased), divided by std + eps
    np.testing.assert_allclose(top[0].data.reshape(-1), [-1 / 1.5, 1 / 1.5, -2 / 2.5, 2 / 2.5], rtol=1e-12)


def test_mvn_across_channels_values():
    x = randn(2, 3, 2, 2)
    layer, bottom, top = build(parse_layer('type: "MVN" mvn_param { across_channels: true }'), [x], 1)
    layer.forward(bottom, top)
    flat = x.reshape(2, -1)
    expect = (flat - flat.mean(1, keepdims=True)) / (flat.std(1, keepdims=True) + 1e-9)
    np.testing.assert_allclose(top[0].data.reshape(2, -1), expect, rtol=1e-10)


# ------------------------------------------------------------------------------------ oracles
PREFIXES = ("batchnorm", "scale_", "bias_", "mvn_")


@pytest.mark.parametrize("name", layer_case_names(PREFIXES))
def test_caffe_oracle(name):
    run_caffe_case(name)


def test_caffe_oracles_present():
    shared_path("fixtures", "caffe-ref", "layers")
    names = layer_case_names(PREFIXES)
    assert {"batchnorm_train", "batchnorm_test_global", "scale_numaxes0", "bias_2bottoms", "mvn_var"} <= set(names)
