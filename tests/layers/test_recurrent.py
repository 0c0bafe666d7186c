"""RNN, LSTM and LSTMUnit."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.blob import Blob
from netdef.layers import recurrent as recurrent_module  # noqa: F401  (registers the types)
from netdef.layers.base import LayerError
from tests import helpers
from tests.helpers import build, check_gradients, default_dtype, layer_case_names, make_layer, parse_layer, run_caffe_case

CASES = layer_case_names(("rnn", "lstm"))
T, N, I, D = 3, 2, 3, 2




def rng(seed):
    return np.random.default_rng(seed)


def sig(x):
    return 1 / (1 + np.exp(-x))


def text(kind, expose=False, filler=""):
    return (f'type: "{kind}" recurrent_param {{ num_output: {D} {filler} '
            f'{"expose_hidden: true" if expose else ""} }}')


CONT = np.array([[0, 0], [1, 1], [1, 0.0]])  # T x N; every stream starts a sequence at t = 0


def params_for(kind, static=False, seed=5):
    r = rng(seed)
    if kind == "RNN":
        shapes = [(D, I), (D,)] + ([(D, 4)] if static else []) + [(D, D), (D, D), (D,)]
    else:
        shapes = [(4 * D, I), (4 * D,)] + ([(4 * D, 4)] if static else []) + [(4 * D, D)]
    return [0.7 * r.standard_normal(s) for s in shapes]


# ------------------------------------------------------------------------------------------- references
def reference_rnn(x, cont, params, static=None, h0=None):
    """Per-stream, per-step loops (independent of the layer's batched code)."""
    if static is None:
        wxh, bh, whh, who, bo = params
    else:
        wxh, bh, ws, whh, who, bo = params
    out = np.zeros((x.shape[0], x.shape[1], D))
    h_last = np.zeros((x.shape[1], D))
    for n in range(x.shape[1]):
        h = np.zeros(D) if h0 is None else h0[0, n]
        for t in range(x.shape[0]):
            a = whh @ (cont[t, n] * h) + wxh @ x[t, n].ravel() + bh
            if static is not None:
                a = a + ws @ static[n].ravel()
            h = np.tanh(a)
            out[t, n] = np.tanh(who @ h + bo)
        h_last[n] = h
    return out, h_last


def reference_lstm(x, cont, params, static=None, h0=None, c0=None):
    if static is None:
        wxc, bc, whc = params
    else:
        wxc, bc, ws, whc = params
    out = np.zeros((x.shape[0], x.shape[1], D))
    h_last, c_last = np.zeros((x.shape[1], D)), np.zeros((x.shape[1], D))
    for n in range(x.shape[1]):
        h = np.zeros(D) if h0 is None else h0[0, n]
        c = np.zeros(D) if c0 is None else c0[0, n]
        for t in range(x.shape[0]):
            a = wxc @ x[t, n].ravel() + bc + whc @ (cont[t, n] * h)
            if static is not None:
                a = a + ws @ static[n].ravel()
            i, f, o, g = sig(a[:D]), cont[t, n] * sig(a[D:2 * D]), sig(a[2 * D:3 * D]), np.tanh(a[3 * D:])
            c = f * c + i * g
            h = o * np.tanh(c)
            out[t, n] = h
        h_last[n], c_last[n] = h, c
    return out, h_last, c_last


# ------------------------------------------------------------------------------------------- oracles
def test_oracle_cases_available():
    helpers.shared_path("fixtures", "caffe-ref", "layers")
    assert set(CASES) == {"rnn", "lstm", "lstm_unit"}


@pytest.mark.parametrize("name", CASES)
def test_caffe_oracle(name):
    run_caffe_case(name)


# ------------------------------------------------------------------------------------------- values
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_matches_reference(kind, static):
    x = rng(1).standard_normal((T, N, I))
    cont = np.array([[0, 0], [1, 0], [0.5, 1]])  # fractional cont scales the previous state
    bottoms = [x, cont]
    xs = None
    if static:
        xs = rng(2).standard_normal((N, 2, 2))
        bottoms.append(xs)
    params = params_for(kind, static)
    layer, bottom, top = build(parse_layer(text(kind)), bottoms, 1, params=params)
    layer.forward(bottom, top)
    ref = reference_rnn(x, cont, params, xs) if kind == "RNN" else reference_lstm(x, cont, params, xs)
    np.testing.assert_allclose(top[0].data, ref[0], rtol=1e-12, atol=1e-14)
    assert top[0].shape == (T, N, D)


def test_blob_layout_and_fillers():
    filler = 'weight_filler { type: "constant" value: 0.5 } bias_filler { type: "constant" value: -1 }'
    x, cont, xs = np.zeros((T, N, 2, 3)), CONT, np.zeros((N, 5))
    layer, _, _ = build(parse_layer(text("RNN", filler=filler)), [x, cont, xs], 1)
    assert [b.shape for b in layer.blobs] == [(D, 6), (D,), (D, 5), (D, D), (D, D), (D,)]
    assert [float(b.data.ravel()[0]) for b in layer.blobs] == [0.5, -1, 0.5, 0.5, 0.5, -1]
    layer, _, _ = build(parse_layer(text("LSTM", filler=filler)), [x, cont], 1)
    assert [b.shape for b in layer.blobs] == [(4 * D, 6), (4 * D,), (4 * D, D)]
    layer, _, _ = build(parse_layer(text("LSTM")), [x, cont, xs], 1)
    assert [b.shape for b in layer.blobs] == [(4 * D, 6), (4 * D,), (4 * D, 5), (4 * D, D)]


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_state_carries_across_forward_passes(kind):
    """Without expose_hidden, a pass continues from the state the previous pass ended with (Caffe)."""
    x = rng(3).standard_normal((2 * T, N, I))
    cont = np.ones((2 * T, N))
    cont[0] = 0
    params = params_for(kind)
    whole, _, _ = (reference_rnn(x, cont, params) + (None,)) if kind == "RNN" else reference_lstm(x, cont, params)
    layer, bottom, top = build(parse_layer(text(kind)), [x[:T], cont[:T]], 1, params=params)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, whole[:T], rtol=1e-12)
    bottom[0].data = x[T:]
    bottom[1].data = cont[T:]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, whole[T:], rtol=1e-12, atol=1e-14)
    layer.reset()
    layer.forward(bottom, top)
    fresh = reference_rnn(x[T:], cont[T:], params)[0] if kind == "RNN" else reference_lstm(x[T:], cont[T:], params)[0]
    np.testing.assert_allclose(top[0].data, fresh, rtol=1e-12, atol=1e-14)


def test_expose_hidden_values():
    x = rng(4).standard_normal((T, N, I))
    cont = np.ones((T, N))
    h0, c0 = rng(5).standard_normal((1, N, D)), rng(6).standard_normal((1, N, D))
    params = params_for("LSTM")
    layer, bottom, top = build(parse_layer(text("LSTM", expose=True)), [x, cont, h0, c0], 3, params=params)
    layer.forward(bottom, top)
    out, h_last, c_last = reference_lstm(x, cont, params, h0=h0, c0=c0)
    np.testing.assert_allclose(top[0].data, out, rtol=1e-12)
    np.testing.assert_allclose(top[1].data, h_last[None], rtol=1e-12)
    np.testing.assert_allclose(top[2].data, c_last[None], rtol=1e-12)
    params = params_for("RNN")
    layer, bottom, top = build(parse_layer(text("RNN", expose=True)), [x, cont, h0], 2, params=params)
    layer.forward(bottom, top)
    out, h_last = reference_rnn(x, cont, params, h0=h0)
    np.testing.assert_allclose(top[0].data, out, rtol=1e-12)
    np.testing.assert_allclose(top[1].data, h_last[None], rtol=1e-12)


# ------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_gradient(kind, static):
    x = rng(7).standard_normal((T, N, I))
    bottoms = [x, CONT]
    check = [0]
    if static:
        bottoms.append(rng(8).standard_normal((N, 4)))
        check.append(2)
    check_gradients(parse_layer(text(kind)), bottoms, params=params_for(kind, static), check_bottoms=check)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_gradient_expose_hidden(kind):
    x = rng(9).standard_normal((T, N, I))
    cont = np.array([[1, 0], [1, 1], [0, 1.0]])
    states = [rng(10 + j).standard_normal((1, N, D)) for j in range(1 if kind == "RNN" else 2)]
    bottoms = [x, cont, rng(12).standard_normal((N, 4))] + states
    check_gradients(parse_layer(text(kind, expose=True)), bottoms, num_tops=1 + len(states),
                    params=params_for(kind, static=True), check_bottoms=[0, 2] + [3 + j for j in range(len(states))])


def test_lstm_unit_gradient_and_values():
    c_prev = rng(13).standard_normal((1, 3, D))
    gates = rng(14).standard_normal((1, 3, 4 * D))
    cont = np.array([[1, 0, 1.0]])
    param = parse_layer('type: "LSTMUnit"')
    layer, bottom, top = build(param, [c_prev, gates, cont], 2)
    layer.forward(bottom, top)
    i, f, o, g = (sig(gates[..., :D]), cont[..., None] * sig(gates[..., D:2 * D]), sig(gates[..., 2 * D:3 * D]),
                  np.tanh(gates[..., 3 * D:]))
    c = f * c_prev + i * g
    np.testing.assert_allclose(top[0].data, c)
    np.testing.assert_allclose(top[1].data, o * np.tanh(c))
    check_gradients(param, [c_prev, gates, cont], num_tops=2, check_bottoms=[0, 1])
    assert not layer.allow_force_backward(2) and layer.allow_force_backward(0)


# ------------------------------------------------------------------------------------------- checks
def test_cont_takes_no_gradient():
    layer, bottom, top = build(parse_layer(text("RNN")), [np.zeros((T, N, I)), CONT], 1)
    assert not layer.allow_force_backward(1) and layer.allow_force_backward(0)
    layer.forward(bottom, top)
    top[0].diff = np.ones(top[0].shape)
    with pytest.raises(LayerError, match="sequence indicators"):
        layer.backward(top, [True, True], bottom)


@pytest.mark.parametrize("kind,bottoms,tops,message", [
    ("RNN", [(T, N, I), (T, N + 1)], 1, "cont"),
    ("RNN", [(T, N, I), (T, N)], 2, "top"),
    ("LSTM", [(T, N, I), (T, N), (N, 2), (1, N, D), (1, N, D), (1, N, D)], 1, "bottom"),
    ("LSTM", [(T,), (T, N)], 1, "at least 2 axes"),
])
def test_shape_checks(kind, bottoms, tops, message):
    with pytest.raises(LayerError, match=message):
        build(parse_layer(text(kind)), [np.zeros(s) for s in bottoms], tops)


def test_expose_hidden_state_shape_checked():
    with pytest.raises(LayerError, match="h_0"):
        build(parse_layer(text("RNN", expose=True)), [np.zeros((T, N, I)), CONT, np.zeros((1, N, D + 1))], 2)


def test_loaded_blobs_are_kept():
    with default_dtype(np.float64):
        layer = make_layer(parse_layer(text("LSTM")))
        loaded = [Blob(p.shape, dtype=np.float64) for p in params_for("LSTM")]
        layer.blobs = list(loaded)
        bottom = helpers.blobs_from([np.zeros((T, N, I)), CONT], np.float64)
        layer.setup_layer(bottom, [Blob(dtype=np.float64)])
        assert all(a is b for a, b in zip(layer.blobs, loaded))
