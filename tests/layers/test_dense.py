"""InnerProduct and Embed (netdef/layers/dense.py): gradients, shapes, Caffe's oracles."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.blob import Blob
from netdef.layers.base import LayerError
from tests import helpers
from tests.helpers import build, check_gradients, default_dtype, layer_case_names, make_layer, parse_layer, run_caffe_case

CASES = layer_case_names(("ip_", "embed"))




def rng(seed):
    return np.random.default_rng(seed)


# ------------------------------------------------------------------------------------------- oracles
def test_oracle_cases_available():
    helpers.shared_path("fixtures", "caffe-ref", "layers")
    assert {"ip_axis1", "ip_axis2", "ip_transpose", "ip_nobias", "embed", "embed_nobias"} <= set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_caffe_oracle(name):
    run_caffe_case(name)


# ------------------------------------------------------------------------------------------- InnerProduct
IP_GRADIENT_CASES = [
    ("num_output: 3", (2, 3, 2, 2)),
    ("num_output: 2 axis: 2", (2, 3, 2, 2)),
    ("num_output: 2 axis: -1", (2, 2, 3)),
    ("num_output: 3 transpose: true", (2, 3, 2)),
    ("num_output: 3 axis: 2 transpose: true", (2, 2, 3)),
    ("num_output: 4 bias_term: false", (3, 5)),
    ("num_output: 2 bias_term: false transpose: true", (3, 4)),
    ("num_output: 2 axis: 0", (3, 2)),
]


@pytest.mark.parametrize("ip_param,shape", IP_GRADIENT_CASES)
def test_inner_product_gradient(ip_param, shape):
    x = rng(1).standard_normal(shape)
    param = parse_layer(f'type: "InnerProduct" inner_product_param {{ {ip_param} weight_filler {{ type: "gaussian" }} '
                        f'bias_filler {{ type: "gaussian" }} }}')
    check_gradients(param, [x])


def ip(ip_param, x, params=None, dtype=np.float64):
    text = f'type: "InnerProduct" inner_product_param {{ {ip_param} }}'
    return build(parse_layer(text), [x], 1, dtype=dtype, params=params)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_inner_product_values_and_shapes(transpose, bias):
    x = rng(2).standard_normal((2, 3, 4, 5))
    w = rng(3).standard_normal((60, 4) if transpose else (4, 60))
    b = rng(4).standard_normal(4)
    params = [w, b] if bias else [w]
    ip_param = f"num_output: 4 transpose: {str(transpose).lower()} bias_term: {str(bias).lower()}"
    layer, bottom, top = ip(ip_param, x, params)
    assert [p.shape for p in layer.blobs] == ([(60, 4), (4,)] if transpose else [(4, 60), (4,)])[: 1 + bias]
    layer.forward(bottom, top)
    expected = x.reshape(2, 60) @ (w if transpose else w.T) + (b if bias else 0)
    assert top[0].shape == (2, 4)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)


def test_inner_product_axis_shape():
    x = rng(5).standard_normal((2, 3, 4, 5))
    layer, bottom, top = ip("num_output: 6 axis: 2", x)
    assert layer.blobs[0].shape == (6, 20)
    assert top[0].shape == (2, 3, 6)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, (x.reshape(6, 20) @ w.T + b).reshape(2, 3, 6), rtol=1e-12)
    layer, bottom, top = ip("num_output: 6 axis: -1", x)
    assert layer.blobs[0].shape == (6, 5) and top[0].shape == (2, 3, 4, 6)


def test_inner_product_fillers():
    x = np.ones((2, 3))
    layer, _, _ = ip('num_output: 4 weight_filler { type: "constant" value: 0.5 } '
                     'bias_filler { type: "constant" value: -2 }', x)
    np.testing.assert_array_equal(layer.blobs[0].data, np.full((4, 3), 0.5))
    np.testing.assert_array_equal(layer.blobs[1].data, np.full(4, -2.0))
    layer, _, _ = ip("num_output: 4", x)  # schema defaults: constant 0 for both
    np.testing.assert_array_equal(layer.blobs[0].data, 0)
    np.testing.assert_array_equal(layer.blobs[1].data, 0)
    layer, _, _ = ip('num_output: 50 weight_filler { type: "gaussian" std: 0.1 }', np.ones((2, 40)))
    assert 0.07 < layer.blobs[0].data.std() < 0.13


def test_inner_product_reshape_batch_and_wrong_k():
    layer, bottom, top = ip("num_output: 3", rng(6).standard_normal((2, 4)))
    bottom[0].reshape(5, 4)
    layer.reshape(bottom, top)
    assert top[0].shape == (5, 3)
    bottom[0].reshape(5, 2, 2)
    layer.reshape(bottom, top)  # same K = 4: fine
    bottom[0].reshape(5, 5)
    with pytest.raises(LayerError, match="incompatible"):
        layer.reshape(bottom, top)


def test_inner_product_needs_num_output():
    with pytest.raises(LayerError, match="num_output"):
        ip("bias_term: false", np.ones((2, 3)))


def test_inner_product_keeps_loaded_weights_and_checks_shapes():
    with default_dtype(np.float64):
        layer = make_layer(parse_layer('type: "InnerProduct" inner_product_param { num_output: 2 }'))
        w, b = Blob((2, 3), dtype=np.float64), Blob((2,), dtype=np.float64)
        w.data[...] = 7.0
        layer.blobs = [w, b]
        layer.setup_layer([Blob((4, 3), dtype=np.float64)], [Blob(dtype=np.float64)])
        assert layer.blobs[0] is w and np.all(w.data == 7.0)
        layer = make_layer(parse_layer('type: "InnerProduct" inner_product_param { num_output: 2 transpose: true }'))
        layer.blobs = [Blob((2, 3), dtype=np.float64), Blob((2,), dtype=np.float64)]
        with pytest.raises(LayerError, match="shape"):
            layer.setup_layer([Blob((4, 3), dtype=np.float64)], [Blob(dtype=np.float64)])


def test_inner_product_param_gradients_accumulate_and_respect_propagate_down():
    x = rng(7).standard_normal((3, 4))
    dy = rng(8).standard_normal((3, 2))
    layer, bottom, top = ip('num_output: 2 weight_filler { type: "gaussian" }', x)
    layer.forward(bottom, top)
    top[0].diff = dy
    layer.backward(top, [False], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, dy.T @ x, rtol=1e-12)
    np.testing.assert_allclose(layer.blobs[1].diff, dy.sum(0), rtol=1e-12)
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * dy.T @ x, rtol=1e-12)
    np.testing.assert_allclose(layer.blobs[1].diff, 2 * dy.sum(0), rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, dy @ layer.blobs[0].data, rtol=1e-12)
    layer.param_propagate_down = [False, True]
    layer.backward(top, [False], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * dy.T @ x, rtol=1e-12)  # unchanged
    np.testing.assert_allclose(layer.blobs[1].diff, 3 * dy.sum(0), rtol=1e-12)


@pytest.mark.parametrize("transpose,num_output,k", [(False, 300, 20000), (False, 20000, 300), (True, 300, 20000),
                                                   (True, 20000, 300)])
def test_inner_product_large_weight_gradient_is_blocked_exactly(transpose, num_output, k):
    """A weight gradient larger than the block (24 MB here) is summed into the diff in blocks: the same
    float32 values as one product, and no temporary as large as the weights (VGG-16's fc6: 392 MiB)."""
    import tracemalloc

    x = rng(11).standard_normal((3, k)).astype(np.float32)
    dy = rng(12).standard_normal((3, num_output)).astype(np.float32)
    layer, bottom, top = ip(f"num_output: {num_output} transpose: {str(transpose).lower()}", x, dtype=np.float32)
    start = rng(13).standard_normal(layer.blobs[0].shape).astype(np.float32)
    layer.blobs[0].diff = start.copy()
    layer.forward(bottom, top)
    top[0].diff = dy
    tracemalloc.start()
    try:
        layer.backward(top, [False], bottom)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expected = start + ((x.T @ dy) if transpose else (dy.T @ x))
    np.testing.assert_array_equal(layer.blobs[0].diff, expected)
    assert peak < 0.8 * start.nbytes  # the 16 MiB block buffer, not a 24 MB product


def test_inner_product_float32():
    layer, bottom, top = ip('num_output: 3 weight_filler { type: "xavier" }', np.ones((2, 5)), dtype=np.float32)
    assert layer.blobs[0].data.dtype == np.float32
    layer.forward(bottom, top)
    assert top[0].data.dtype == np.float32


# ------------------------------------------------------------------------------------------- Embed
def embed(embed_param, indices, params=None, dtype=np.float64):
    text = f'type: "Embed" embed_param {{ {embed_param} }}'
    return build(parse_layer(text), [np.asarray(indices, dtype=float)], 1, dtype=dtype, params=params)


@pytest.mark.parametrize("bias", [True, False])
def test_embed_gradient(bias):
    idx = np.array([[0.0, 3.0, 4.0], [3.0, 3.0, 1.0]])  # 3 repeats, 2 is never used
    param = parse_layer(f'type: "Embed" embed_param {{ input_dim: 5 num_output: 3 bias_term: {str(bias).lower()} '
                        f'weight_filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }}')
    check_gradients(param, [idx], check_bottoms=[])


def test_embed_values_and_repeated_indices_add():
    idx = np.array([[0.0, 3.0], [3.0, 1.0], [3.0, 0.0]])
    w = rng(9).standard_normal((4, 2))
    b = rng(10).standard_normal(2)
    layer, bottom, top = embed("input_dim: 4 num_output: 2", idx, params=[w, b])
    assert top[0].shape == (3, 2, 2)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, w[idx.astype(int)] + b, rtol=1e-12)
    dy = rng(11).standard_normal((3, 2, 2))
    top[0].diff = dy
    layer.backward(top, [False], bottom)
    gw = layer.blobs[0].diff
    np.testing.assert_allclose(gw[3], dy[0, 1] + dy[1, 0] + dy[2, 0], rtol=1e-12)
    np.testing.assert_allclose(gw[0], dy[0, 0] + dy[2, 1], rtol=1e-12)
    np.testing.assert_allclose(gw[1], dy[1, 1], rtol=1e-12)
    np.testing.assert_array_equal(gw[2], 0)
    np.testing.assert_allclose(layer.blobs[1].diff, dy.reshape(-1, 2).sum(0), rtol=1e-12)
    layer.backward(top, [False], bottom)  # parameter gradients add up over passes
    np.testing.assert_allclose(layer.blobs[0].diff[1], 2 * dy[1, 1], rtol=1e-12)


def test_embed_shapes_and_fillers():
    layer, bottom, top = embed('input_dim: 7 num_output: 4 weight_filler { type: "constant" value: 3 }', [1.0, 2.0])
    assert [p.shape for p in layer.blobs] == [(7, 4), (4,)]
    assert top[0].shape == (2, 4)
    np.testing.assert_array_equal(layer.blobs[0].data, 3.0)
    layer, bottom, top = embed("input_dim: 7 num_output: 4 bias_term: false", np.zeros((2, 3, 1)))
    assert [p.shape for p in layer.blobs] == [(7, 4)]
    assert top[0].shape == (2, 3, 1, 4)


def test_embed_index_bottom_gets_no_gradient():
    layer, bottom, top = embed("input_dim: 4 num_output: 2", [1.0, 2.0])
    assert layer.allow_force_backward(0) is False
    layer.forward(bottom, top)
    top[0].diff = np.ones((2, 2))
    with pytest.raises(LayerError, match="indices"):
        layer.backward(top, [True], bottom)


@pytest.mark.parametrize("bad", [[4.0], [-1.0], [1.5]])
def test_embed_rejects_bad_indices(bad):
    layer, bottom, top = embed("input_dim: 4 num_output: 2", bad)
    with pytest.raises(LayerError, match="index"):
        layer.forward(bottom, top)


def test_embed_needs_sizes():
    with pytest.raises(LayerError, match="input_dim"):
        embed("num_output: 2", [0.0])
    with pytest.raises(LayerError, match="num_output"):
        embed("input_dim: 2", [0.0])


def test_embed_float32():
    layer, bottom, top = embed('input_dim: 3 num_output: 2 weight_filler { type: "uniform" }', [0.0, 2.0, 2.0],
                               dtype=np.float32)
    layer.forward(bottom, top)
    assert top[0].data.dtype == np.float32
    top[0].diff = np.ones((3, 2), dtype=np.float32)
    layer.backward(top, [False], bottom)
    assert layer.blobs[0].diff.dtype == np.float32
    np.testing.assert_array_equal(layer.blobs[0].diff, [[1, 1], [0, 0], [2, 2]])
