"""Element-wise layers (netdef/layers/activation.py): gradients, in-place use, Caffe's oracles."""
from __future__ import annotations

import numpy as np
import pytest

from netdef import backend
from netdef.blob import Blob
from netdef.layers.base import TEST, TRAIN, LayerError
from tests import helpers
from tests.helpers import build, check_gradients, default_dtype, layer_case_names, make_layer, parse_layer, run_caffe_case

PREFIXES = ("relu", "prelu", "elu", "sigmoid", "tanh", "absval", "power", "exp", "log", "bnll", "dropout",
            "threshold", "swish", "clip")
CASES = [n for n in layer_case_names(PREFIXES) if not n.startswith("sigmoid_ce")]




def rand(shape, seed=0, away=None, margin=0.05):
    """Standard normal values, pushed at least ``margin`` away from each point in ``away`` (kinks)."""
    x = np.random.default_rng(seed).standard_normal(shape)
    for point in away or ():
        near = np.abs(x - point) < margin
        x[near] = point + np.where(x[near] >= point, margin, -margin) * 2
    return x


# ------------------------------------------------------------------------------------------- oracles
def test_oracle_cases_available():
    folder = helpers.shared_path("fixtures", "caffe-ref", "layers")
    assert folder.is_dir()
    assert len(CASES) >= 24, CASES
    assert "sigmoid_ce_loss" not in CASES


@pytest.mark.parametrize("name", CASES)
def test_caffe_oracle(name):
    run_caffe_case(name)


# ------------------------------------------------------------------------------------------- gradients
SHAPE = (2, 3, 2, 3)

GRADIENT_CASES = [
    ('type: "ReLU"', rand(SHAPE, 1, away=[0])),
    ('type: "ReLU" relu_param { negative_slope: 0.1 }', rand(SHAPE, 2, away=[0])),
    ('type: "ReLU" relu_param { negative_slope: -0.3 }', rand(SHAPE, 3, away=[0])),
    ('type: "ELU"', rand(SHAPE, 4, away=[0])),
    ('type: "ELU" elu_param { alpha: 0.5 }', rand(SHAPE, 5, away=[0])),
    ('type: "Sigmoid"', 2 * rand(SHAPE, 6)),
    ('type: "TanH"', rand(SHAPE, 7)),
    ('type: "AbsVal"', rand(SHAPE, 8, away=[0])),
    ('type: "Power"', rand(SHAPE, 9)),
    ('type: "Power" power_param { power: 2 scale: 0.5 shift: 1 }', rand(SHAPE, 10)),
    ('type: "Power" power_param { power: 0.5 scale: 1.5 shift: 0.2 }', np.abs(rand(SHAPE, 11)) + 0.1),
    ('type: "Power" power_param { power: 3 scale: -0.7 shift: 0.3 }', rand(SHAPE, 12)),
    ('type: "Power" power_param { power: -1.5 scale: 1 shift: 2 }', np.abs(rand(SHAPE, 13)) + 0.1),
    ('type: "Power" power_param { power: 0 scale: 2 shift: 1 }', rand(SHAPE, 14)),
    ('type: "Power" power_param { power: 2 scale: 0 shift: 1.5 }', rand(SHAPE, 15)),
    ('type: "Exp"', rand(SHAPE, 16)),
    ('type: "Exp" exp_param { base: 2 scale: 0.5 shift: 0.1 }', rand(SHAPE, 17)),
    ('type: "Exp" exp_param { base: 0.5 scale: -1 shift: 0.3 }', rand(SHAPE, 18)),
    ('type: "Log"', np.abs(rand(SHAPE, 19)) + 0.1),
    ('type: "Log" log_param { base: 10 scale: 2 shift: 3 }', np.abs(rand(SHAPE, 20)) + 0.1),
    ('type: "Log" log_param { base: 2 scale: -1 shift: 4 }', rand(SHAPE, 21)),
    ('type: "BNLL"', 4 * rand(SHAPE, 22)),
    ('type: "Dropout" dropout_param { dropout_ratio: 0.3 }', rand(SHAPE, 23)),  # TEST phase below
    ('type: "Swish"', 2 * rand(SHAPE, 24)),
    ('type: "Swish" swish_param { beta: 1.5 }', 2 * rand(SHAPE, 25)),
    ('type: "Swish" swish_param { beta: -0.5 }', 2 * rand(SHAPE, 26)),
    ('type: "Clip" clip_param { min: -0.5 max: 0.5 }', rand(SHAPE, 27, away=[-0.5, 0.5])),
    ('type: "Clip" clip_param { min: 0 max: 2 }', 2 * rand(SHAPE, 28, away=[0, 1])),
]


@pytest.mark.parametrize("text,x", GRADIENT_CASES, ids=[t for t, _ in GRADIENT_CASES])
def test_gradient(text, x):
    phase = TEST if "Dropout" in text else TRAIN
    check_gradients(parse_layer(text, phase), [x])


PRELU_CASES = [
    ('type: "PReLU"', rand((2, 3, 2, 2), 30, away=[0]), [np.array([0.25, -0.4, 1.3])]),
    ('type: "PReLU" prelu_param { channel_shared: true }', rand((2, 3, 2, 2), 31, away=[0]), [np.array(-0.6)]),
    ('type: "PReLU"', rand((4, 5), 32, away=[0]), [rand((5,), 33)]),
    ('type: "PReLU" prelu_param { channel_shared: true }', rand((3, 2, 4), 34, away=[0]), [np.array(0.3)]),
]


@pytest.mark.parametrize("text,x,params", PRELU_CASES)
def test_prelu_gradient(text, x, params):
    check_gradients(parse_layer(text), [x], params=params)


# ------------------------------------------------------------------------------------------- in place
def run_once(text, x, top_diff, in_place, phase=TRAIN, params=None, state=None):
    """Forward and backward through one layer on float64 blobs, the top being the bottom itself
    when ``in_place``; ``state`` (from an earlier call) reuses that layer and its blobs.
    Returns (y, dx, param diffs, state)."""
    with default_dtype(np.float64):
        if state is None:
            layer = make_layer(parse_layer(text, phase))
            blob = Blob(x.shape, dtype=np.float64)
            blob.data[...] = x
            top = blob if in_place else Blob(dtype=np.float64)
            layer.setup_layer([blob], [top])
            for p, v in zip(layer.blobs, params or []):
                p.data[...] = v
        else:
            layer, blob, top = state
            blob.data = x.copy()
        layer.forward([blob], [top])
        y = np.array(top.data)
        top.diff = top_diff.copy()
        for p in layer.blobs:
            p.diff[...] = 0
        layer.backward([top], [True], [blob])
        return y, np.array(blob.diff), [np.array(p.diff) for p in layer.blobs], (layer, blob, top)


IN_PLACE_CASES = [(t, x) for t, x in GRADIENT_CASES] + [
    # exact kinks: the in-place result must follow the same convention as the out-of-place one
    ('type: "ReLU" relu_param { negative_slope: 0.1 }', np.array([[-1.0, 0.0, 1.0, -0.0, 2.5, -3.0]])),
    ('type: "ReLU" relu_param { negative_slope: -0.3 }', np.array([[-1.0, 0.0, 1.0, -2.0]])),
    ('type: "ELU" elu_param { alpha: -0.5 }', np.array([[-1.0, 0.0, 1.0, -2.0]])),
    ('type: "AbsVal"', np.array([[-1.0, 0.0, 1.0, -2.0]])),
    ('type: "Clip" clip_param { min: -0.5 max: 0.5 }', np.array([[-0.5, 0.5, -0.6, 0.6, 0.0]])),
    ('type: "Threshold" threshold_param { threshold: 0.3 }', np.array([[0.3, 0.31, -1.0, 2.0]])),
]


@pytest.mark.parametrize("text,x", IN_PLACE_CASES, ids=[t for t, _ in IN_PLACE_CASES])
def test_in_place_matches(text, x):
    phase = TEST if "Dropout" in text else TRAIN
    dy = np.random.default_rng(40).standard_normal(x.shape)
    if "Threshold" in text:
        for in_place in (False, True):
            with default_dtype(np.float64):
                layer = make_layer(parse_layer(text))
                blob = Blob(x.shape, dtype=np.float64)
                blob.data[...] = x
                top = blob if in_place else Blob(dtype=np.float64)
                layer.setup_layer([blob], [top])
                layer.forward([blob], [top])
                np.testing.assert_array_equal(top.data, (x > 0.3).astype(float))
        return
    y, dx, _, _ = run_once(text, x, dy, False, phase)
    y2, dx2, _, state = run_once(text, x, dy, True, phase)
    np.testing.assert_allclose(y2, y, rtol=1e-12, atol=0)
    np.testing.assert_allclose(dx2, dx, rtol=1e-12, atol=0)
    # A second pass in place must use the new input, not a copy left from the first pass.
    x_new = x[..., ::-1].copy() * 0.7
    y_ref, dx_ref, _, _ = run_once(text, x_new, dy, False, phase)
    y3, dx3, _, _ = run_once(text, x_new, dy, True, phase, state=state)
    np.testing.assert_allclose(y3, y_ref, rtol=1e-12, atol=0)
    np.testing.assert_allclose(dx3, dx_ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("text,x,params", PRELU_CASES)
def test_prelu_in_place_matches(text, x, params):
    dy = np.random.default_rng(41).standard_normal(x.shape)
    y, dx, dp, _ = run_once(text, x, dy, False, params=params)
    y2, dx2, dp2, _ = run_once(text, x, dy, True, params=params)
    np.testing.assert_allclose(y2, y, rtol=1e-12)
    np.testing.assert_allclose(dx2, dx, rtol=1e-12)
    np.testing.assert_allclose(dp2[0], dp[0], rtol=1e-12)
    # the in-place slope gradient needs the input, not the output: check it against the formula
    a = params[0] if params[0].ndim == 0 else params[0].reshape((1, -1) + (1,) * (x.ndim - 2))
    contrib = dy * x * (x <= 0)
    expected = contrib.sum() if params[0].ndim == 0 else contrib.sum(axis=(0,) + tuple(range(2, x.ndim)))
    np.testing.assert_allclose(dp2[0], expected, rtol=1e-12)
    np.testing.assert_allclose(y2, np.where(x > 0, x, a * x), rtol=1e-12)


# ------------------------------------------------------------------------------------------- hand values
def forward_backward(text, x, dy=None, phase=TRAIN):
    layer, bottom, top = build(parse_layer(text, phase), [np.asarray(x, dtype=np.float64)], 1)
    layer.forward(bottom, top)
    if dy is None:
        return np.array(top[0].data), None
    top[0].diff = np.asarray(dy, dtype=np.float64)
    layer.backward(top, [True], bottom)
    return np.array(top[0].data), np.array(bottom[0].diff)


def test_relu_kink_uses_negative_slope():
    y, dx = forward_backward('type: "ReLU" relu_param { negative_slope: 0.1 }', [[-2.0, 0.0, 3.0]], [[1.0, 1.0, 1.0]])
    np.testing.assert_allclose(y, [[-0.2, 0.0, 3.0]])
    np.testing.assert_allclose(dx, [[0.1, 0.1, 1.0]])
    _, dx = forward_backward('type: "ReLU"', [[-2.0, 0.0, 3.0]], [[5.0, 5.0, 5.0]])
    np.testing.assert_array_equal(dx, [[0.0, 0.0, 5.0]])


def test_absval_sign_of_zero_is_zero():
    y, dx = forward_backward('type: "AbsVal"', [[-1.5, 0.0, 2.0]], [[3.0, 3.0, 3.0]])
    np.testing.assert_array_equal(y, [[1.5, 0.0, 2.0]])
    np.testing.assert_array_equal(dx, [[-3.0, 0.0, 3.0]])


def test_clip_gradient_passes_at_bounds():
    y, dx = forward_backward('type: "Clip" clip_param { min: -0.5 max: 0.5 }', [[-0.5, 0.5, -0.6, 0.6, 0.1]],
                             [[1.0, 2.0, 3.0, 4.0, 5.0]])
    np.testing.assert_allclose(y, [[-0.5, 0.5, -0.5, 0.5, 0.1]])
    np.testing.assert_array_equal(dx, [[1.0, 2.0, 0.0, 0.0, 5.0]])


def test_clip_needs_both_bounds():
    with pytest.raises(LayerError, match="min and max"):
        build(parse_layer('type: "Clip" clip_param { min: 0 }'), [np.zeros((2, 2))], 1)


def test_threshold_is_strict_and_has_no_backward():
    layer, bottom, top = build(parse_layer('type: "Threshold" threshold_param { threshold: 0.3 }'),
                               [np.array([[0.3, 0.3000001, -1.0, 0.0]])], 1)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, [[0.0, 1.0, 0.0, 0.0]])
    layer.backward(top, [False], bottom)  # nothing asked: fine
    with pytest.raises(LayerError, match="no backward"):
        layer.backward(top, [True], bottom)
    y, _ = forward_backward('type: "Threshold"', [[0.0, 1e-9, -1e-9]])
    np.testing.assert_array_equal(y, [[0.0, 1.0, 0.0]])


def test_exp_log_power_formulas():
    x = np.array([[0.2, 1.0, 1.7]])
    y, _ = forward_backward('type: "Exp"', x)
    np.testing.assert_allclose(y, np.exp(x))
    y, _ = forward_backward('type: "Exp" exp_param { base: 3 scale: 2 shift: -1 }', x)
    np.testing.assert_allclose(y, 3.0 ** (2 * x - 1))
    y, _ = forward_backward('type: "Log"', x)
    np.testing.assert_allclose(y, np.log(x))
    y, _ = forward_backward('type: "Log" log_param { base: 2 scale: 3 shift: 0.5 }', x)
    np.testing.assert_allclose(y, np.log2(3 * x + 0.5))
    y, dx = forward_backward('type: "Power"', x, np.ones_like(x))
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, np.ones_like(x))
    y, dx = forward_backward('type: "Power" power_param { power: 3 scale: 2 shift: 1 }', x, np.ones_like(x))
    np.testing.assert_allclose(y, (2 * x + 1) ** 3)
    np.testing.assert_allclose(dx, 3 * 2 * (2 * x + 1) ** 2)
    y, dx = forward_backward('type: "Power" power_param { power: 0 }', x, np.ones_like(x))
    np.testing.assert_array_equal(y, np.ones_like(x))
    np.testing.assert_array_equal(dx, np.zeros_like(x))
    y, _ = forward_backward('type: "Power" power_param { power: 2 scale: 0 shift: 3 }', x)
    np.testing.assert_array_equal(y, np.full_like(x, 9.0))


@pytest.mark.parametrize("text", ['type: "Exp" exp_param { base: -2 }', 'type: "Log" log_param { base: 0 }'])
def test_bad_base_is_an_error(text):
    with pytest.raises(LayerError, match="base"):
        build(parse_layer(text), [np.ones((2, 2))], 1)


def test_sigmoid_tanh_bnll_swish_elu_values():
    x = np.array([[-30.0, -1.0, 0.0, 0.5, 30.0, 800.0]])
    y, _ = forward_backward('type: "Sigmoid"', x)
    # Caffe's 0.5 tanh(x/2) + 0.5 loses relative (not absolute) precision far in the left tail
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-np.clip(x, -700, 700))), rtol=1e-12, atol=1e-15)
    y, _ = forward_backward('type: "TanH"', x)
    np.testing.assert_allclose(y, np.tanh(x))
    y, dx = forward_backward('type: "BNLL"', x, np.ones_like(x))
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(dx))  # no overflow at 800
    np.testing.assert_allclose(y[:, :5], np.log1p(np.exp(x[:, :5])), rtol=1e-12)
    np.testing.assert_allclose(y[0, 5], 800.0)
    np.testing.assert_allclose(dx[0, :5], 1 / (1 + np.exp(-x[0, :5])), rtol=1e-12)
    y, _ = forward_backward('type: "Swish" swish_param { beta: 2 }', x[:, :5])
    np.testing.assert_allclose(y, x[:, :5] / (1 + np.exp(-2 * x[:, :5])), rtol=1e-12, atol=1e-15)
    y, _ = forward_backward('type: "ELU" elu_param { alpha: 2 }', x[:, :5])
    np.testing.assert_allclose(y, np.where(x[:, :5] > 0, x[:, :5], 2 * (np.exp(x[:, :5]) - 1)), rtol=1e-12)


def test_float32_stays_float32():
    for text in ['type: "ReLU"', 'type: "Sigmoid"', 'type: "Power" power_param { power: 2.5 shift: 3 }',
                 'type: "Exp" exp_param { base: 2 }', 'type: "Swish"', 'type: "PReLU"']:
        layer, bottom, top = build(parse_layer(text), [np.ones((2, 3))], 1, dtype=np.float32)
        layer.forward(bottom, top)
        assert top[0].data.dtype == np.float32, text


# ------------------------------------------------------------------------------------------- PReLU setup
def test_prelu_blob_shapes_and_default_filler():
    layer, _, _ = build(parse_layer('type: "PReLU"'), [np.ones((2, 4, 3))], 1)
    assert layer.blobs[0].shape == (4,)
    np.testing.assert_array_equal(layer.blobs[0].data, np.full(4, 0.25))
    layer, _, _ = build(parse_layer('type: "PReLU" prelu_param { channel_shared: true }'), [np.ones((2, 4))], 1)
    assert layer.blobs[0].shape == ()  # Caffe's shared slope is a 0-d blob
    assert float(layer.blobs[0].data) == 0.25
    layer, _, _ = build(parse_layer('type: "PReLU" prelu_param { filler { type: "constant" value: -0.5 } }'),
                        [np.ones((2, 3))], 1)
    np.testing.assert_array_equal(layer.blobs[0].data, [-0.5, -0.5, -0.5])


def test_prelu_keeps_loaded_slopes_and_checks_them():
    with default_dtype(np.float64):
        layer = make_layer(parse_layer('type: "PReLU"'))
        loaded = Blob((3,), dtype=np.float64)
        loaded.data[...] = [1.0, 2.0, 3.0]
        layer.blobs = [loaded]
        layer.setup_layer([Blob((2, 3, 2), dtype=np.float64)], [Blob(dtype=np.float64)])
        assert layer.blobs[0] is loaded
        np.testing.assert_array_equal(loaded.data, [1.0, 2.0, 3.0])
        layer = make_layer(parse_layer('type: "PReLU"'))
        layer.blobs = [Blob((5,), dtype=np.float64)]
        with pytest.raises(LayerError, match="slope"):
            layer.setup_layer([Blob((2, 3, 2), dtype=np.float64)], [Blob(dtype=np.float64)])


def test_prelu_param_gradient_accumulates_and_respects_propagate_down():
    x = rand((2, 3, 4), 50, away=[0])
    dy = rand((2, 3, 4), 51)
    layer, bottom, top = build(parse_layer('type: "PReLU"'), [x], 1)
    layer.forward(bottom, top)
    top[0].diff = dy
    layer.backward(top, [False], bottom)
    once = np.array(layer.blobs[0].diff)
    np.testing.assert_allclose(once, (dy * x * (x <= 0)).sum(axis=(0, 2)))
    layer.backward(top, [False], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * once)
    layer.param_propagate_down = [False]
    layer.blobs[0].diff[...] = 0
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(layer.blobs[0].diff, 0)


# ------------------------------------------------------------------------------------------- Dropout
def dropout_layer(ratio, shape, phase=TRAIN, in_place=False, x=None):
    with default_dtype(np.float64):
        layer = make_layer(parse_layer(f'type: "Dropout" dropout_param {{ dropout_ratio: {ratio} }}', phase))
        bottom = Blob(shape, dtype=np.float64)
        bottom.data[...] = np.ones(shape) if x is None else x
        top = bottom if in_place else Blob(dtype=np.float64)
        layer.setup_layer([bottom], [top])
    return layer, bottom, top


def test_dropout_train_statistics():
    backend.set_random_seed(123)
    p = 0.3
    layer, bottom, top = dropout_layer(p, (200, 500))
    layer.forward([bottom], [top])
    y = np.array(top.data)
    dropped = np.mean(y == 0)
    assert abs(dropped - p) < 0.01, dropped  # ~7 standard deviations for 1e5 draws
    np.testing.assert_allclose(y[y != 0], 1 / (1 - p))  # kept units are scaled up
    assert abs(y.mean() - 1.0) < 0.02  # the expectation is preserved
    first = y.copy()
    layer.forward([bottom], [top])
    assert not np.array_equal(top.data, first), "each forward pass draws a new mask"


def test_dropout_backward_uses_forward_mask():
    backend.set_random_seed(7)
    x = rand((4, 5, 6), 60, away=[0])
    dy = rand((4, 5, 6), 61)
    layer, bottom, top = dropout_layer(0.5, x.shape, x=x)
    layer.forward([bottom], [top])
    kept = np.array(top.data) != 0
    assert 0 < kept.sum() < kept.size
    top.diff = dy
    layer.backward([top], [True], [bottom])
    np.testing.assert_allclose(bottom.diff, dy * kept * 2.0)
    np.testing.assert_allclose(np.array(top.data), x * kept * 2.0)


def test_dropout_seed_reproducible_and_in_place_equal():
    x = rand((3, 4, 5), 62)
    dy = rand((3, 4, 5), 63)
    results = []
    for in_place in (False, True):
        backend.set_random_seed(99)
        layer, bottom, top = dropout_layer(0.4, x.shape, in_place=in_place, x=x)
        layer.forward([bottom], [top])
        y = np.array(top.data)
        top.diff = dy.copy()
        layer.backward([top], [True], [bottom])
        results.append((y, np.array(bottom.diff)))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("in_place", [False, True])
def test_dropout_test_phase_is_identity(in_place):
    x = rand((2, 3, 4), 64)
    dy = rand((2, 3, 4), 65)
    layer, bottom, top = dropout_layer(0.5, x.shape, phase=TEST, in_place=in_place, x=x)
    layer.forward([bottom], [top])
    np.testing.assert_array_equal(top.data, x)
    top.diff = dy.copy()
    layer.backward([top], [True], [bottom])
    np.testing.assert_array_equal(bottom.diff, dy)


def test_dropout_ratio_zero_keeps_everything_and_one_is_rejected():
    x = rand((3, 4), 66)
    layer, bottom, top = dropout_layer(0.0, x.shape, x=x)
    layer.forward([bottom], [top])
    np.testing.assert_array_equal(top.data, x)
    with pytest.raises(LayerError, match="dropout_ratio"):
        dropout_layer(1.0, (2, 2))
