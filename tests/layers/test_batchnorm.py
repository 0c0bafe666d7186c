"""BatchNorm's arithmetic (layers/batchnorm.py): the compiled kernels (layers/jit/batchnorm.py) against
their array-module twins and against float64 truth, their independence of the thread count, and the
layer with and without them: the same results, the ResNet pattern (BatchNorm, Scale and ReLU all in
place on one blob), a later layer writing into the top's array, numerical gradients."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.blob import Blob
from netdef.layers import batchnorm, jit
from netdef.layers.base import TEST, TRAIN
from netdef.layers.reused import ReusedArrays
from tests.helpers import assert_same_on_one_thread, check_gradients, default_dtype, make_layer, parse_layer

RNG = np.random.default_rng(20261126)
DTYPES = [np.float32, np.float64]
# (N, C, M): odd sizes, one value per channel, one sample, a long channel
SHAPES = [(2, 3, 5), (5, 7, 143), (1, 4, 9), (6, 2, 1), (3, 1, 40001), (1, 1, 2)]
EPS = 1e-5


def data(shape, dtype, offset=0.0):
    """Per-channel offsets and spreads, so that a wrong channel shows."""
    c = shape[1]
    center = offset + RNG.uniform(-2, 2, (1, c, 1))
    spread = RNG.uniform(0.5, 3, (1, c, 1))
    return (center + spread * RNG.standard_normal(shape)).astype(dtype)


def exact_forward(x):
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=(0, 2))
    var = ((x64 - mean[None, :, None]) ** 2).mean(axis=(0, 2))
    return mean, var


def exact_backward(x, dy, eps):
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    mean, var = exact_forward(x)
    std = np.sqrt(var + eps)[None, :, None]
    y = (x64 - mean[None, :, None]) / std
    return (dy64 - dy64.mean(axis=(0, 2), keepdims=True) - y * (y * dy64).mean(axis=(0, 2), keepdims=True)) / std


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_batch_kernel(shape, dtype):
    x = data(shape, dtype)
    y = np.empty_like(x)
    mean, var, std = batchnorm.forward_batch(x, EPS, y)
    assert mean.dtype == var.dtype == std.dtype == dtype
    y_ref = np.empty_like(x)
    mean_ref, var_ref, std_ref = batchnorm.forward_batch_reference(x, EPS, y_ref)
    true_mean, true_var = exact_forward(x)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    # Sums in float64: the statistics are float64's, rounded once to the dtype.
    np.testing.assert_allclose(mean, true_mean.astype(dtype), rtol=tol, atol=tol)
    np.testing.assert_allclose(var, true_var.astype(dtype), rtol=tol, atol=tol)
    np.testing.assert_allclose(mean, mean_ref, rtol=10 * tol, atol=10 * tol)
    np.testing.assert_allclose(var, var_ref, rtol=10 * tol, atol=10 * tol)
    np.testing.assert_allclose(std, std_ref, rtol=10 * tol)
    np.testing.assert_allclose(y, y_ref, rtol=10 * tol, atol=10 * tol)
    # Given the same statistics, the output is the twin's to the bit.
    np.testing.assert_array_equal(y, batchnorm.forward_global_reference(x, mean, std, np.empty_like(x)))


def test_forward_batch_kernel_accuracy_on_a_large_offset():
    # float32 data around 1000 with a spread of 0.01: summed in float32, the variance loses digits.
    x = data((8, 3, 3001), np.float32, offset=1000.0)
    x = (1000 + (x - 1000) * 0.01).astype(np.float32)
    mean, var, _ = batchnorm.forward_batch(x, EPS, np.empty_like(x))
    true_mean, true_var = exact_forward(x)
    np.testing.assert_allclose(var, true_var, rtol=1e-5)
    np.testing.assert_allclose(mean, true_mean, rtol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_global_kernel_matches_reference_exactly(shape, dtype):
    x = data(shape, dtype)
    mean = RNG.standard_normal(shape[1]).astype(dtype)
    std = RNG.uniform(0.5, 2, shape[1]).astype(dtype)
    np.testing.assert_array_equal(batchnorm.forward_global(x, mean, std, np.empty_like(x)),
                                  batchnorm.forward_global_reference(x, mean, std, np.empty_like(x)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_backward_batch_kernel(shape, dtype):
    x, dy = data(shape, dtype), data(shape, dtype)
    mean, _, std = batchnorm.forward_batch(x, EPS, y := np.empty_like(x))
    dx = batchnorm.backward_batch(y, dy, std, np.empty_like(x))
    dx_ref = batchnorm.backward_batch_reference(y, dy, std, np.empty_like(x))
    scale = np.abs(dx_ref).max() + 1
    tol = 1e-5 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(dx, dx_ref, rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(dx, exact_backward(x, dy, EPS), rtol=tol, atol=tol * scale)


def test_a_zero_std_gives_what_numpy_gives():
    # eps 0 and a constant channel: 0 / 0 and x / 0, which numba's default error model would raise on.
    x = data((2, 3, 4), np.float32)
    x[:, 1] = 5.0
    with np.errstate(divide="ignore", invalid="ignore"):
        mean, var, std = batchnorm.forward_batch(x, 0.0, y := np.empty_like(x))
        assert std[1] == 0 and np.isnan(y[:, 1]).all() and np.isfinite(y[:, [0, 2]]).all()
        x[0, 1, 0] = 6.0
        expected = batchnorm.forward_global_reference(x, mean, std, np.empty_like(x))
        np.testing.assert_array_equal(batchnorm.forward_global(x, mean, std, np.empty_like(x)), expected)
        assert np.isinf(expected[0, 1, 0])


def test_backward_global_is_dy_over_std():
    dy = data((2, 3, 4), np.float32)
    std = np.array([0.5, 2.0, 4.0], np.float32)
    np.testing.assert_allclose(batchnorm.backward_global(dy, std, np.empty_like(dy)), dy / std[None, :, None],
                               rtol=1e-7)


def test_results_do_not_depend_on_the_thread_count():
    x, dy = data((4, 6, 2001), np.float32), data((4, 6, 2001), np.float32)

    def run():
        y = np.empty_like(x)
        stats = batchnorm.forward_batch(x, EPS, y)
        return [y, *stats, batchnorm.backward_batch(y, dy, stats[2], np.empty_like(x))]

    assert_same_on_one_thread(run)


# ------------------------------------------------------------------------------------- the layer
BN_TRAIN = 'type: "BatchNorm" batch_norm_param { use_global_stats: false }'
BN_GLOBAL = 'type: "BatchNorm" batch_norm_param { use_global_stats: true }'


def run_bn(text, x, dy, stored, phase=TRAIN, in_place=False, dtype=np.float64):
    with default_dtype(dtype):
        layer = make_layer(parse_layer(text, phase))
        bottom = Blob(x.shape, dtype=dtype)
        bottom.data[...] = x
        top = bottom if in_place else Blob(dtype=dtype)
        layer.setup_layer([bottom], [top])
        for blob, value in zip(layer.blobs, stored):
            blob.data[...] = value
    layer.forward([bottom], [top])
    y = np.array(top.data)
    top.diff = dy.copy()
    layer.backward([top], [True], [bottom])
    return y, np.array(bottom.diff), [np.array(b.data) for b in layer.blobs]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("text", [BN_TRAIN, BN_GLOBAL], ids=["batch", "global"])
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (5, 7)])
def test_layer_matches_with_and_without_kernels(monkeypatch, text, shape, dtype):
    x, dy = RNG.standard_normal(shape).astype(dtype), RNG.standard_normal(shape).astype(dtype)
    c = shape[1]
    stored = [RNG.standard_normal(c), RNG.uniform(0.5, 1.5, c), np.array([0.8])]
    monkeypatch.setattr(jit, "ENABLED", True)
    compiled = run_bn(text, x, dy, stored, dtype=dtype)
    monkeypatch.setattr(jit, "ENABLED", False)
    reference = run_bn(text, x, dy, stored, dtype=dtype)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(compiled[0], reference[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(compiled[1], reference[1], rtol=tol, atol=tol)
    for got, expected in zip(compiled[2], reference[2]):  # the moving averages
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)
    if text == BN_TRAIN:
        assert compiled[2][2][0] == pytest.approx(0.8 * 0.999 + 1)


@pytest.mark.parametrize("kernels_on", [True, False], ids=["compiled", "reference"])
@pytest.mark.parametrize("text", [BN_TRAIN, BN_GLOBAL], ids=["batch", "global"])
def test_layer_gradients(monkeypatch, kernels_on, text):
    monkeypatch.setattr(jit, "ENABLED", kernels_on)
    phase = TEST if text == BN_GLOBAL else TRAIN
    layer = check_gradients(parse_layer(text, phase), [RNG.standard_normal((3, 2, 2, 3)) * 2 + 1],
                            check_params=False)
    assert layer.use_global_stats == (text == BN_GLOBAL)


RESNET_CHAIN = """
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 4 dim: 3 dim: 5 dim: 5 } } }
layer { name: "bn" type: "BatchNorm" bottom: "x" top: "%(bn)s" }
layer { name: "scale" type: "Scale" bottom: "%(bn)s" top: "%(scale)s" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "%(scale)s" top: "%(relu)s" }
layer { name: "loss" type: "EuclideanLoss" bottom: "%(relu)s" bottom: "target" top: "loss" }
layer { name: "t" type: "Input" top: "target" input_param { shape { dim: 4 dim: 3 dim: 5 dim: 5 } } }
"""


@pytest.mark.parametrize("kernels_on", [True, False], ids=["compiled", "reference"])
def test_resnet_pattern_in_place_matches_out_of_place(monkeypatch, kernels_on):
    """BatchNorm, Scale and ReLU in place on one blob, as ResNet's definition has them, over two
    iterations (the second writes into the first's arrays again)."""
    import netdef
    from netdef.proto import netdef_pb2 as pb
    from google.protobuf import text_format

    monkeypatch.setattr(jit, "ENABLED", kernels_on)
    monkeypatch.setattr(ReusedArrays, "KEEP_FROM_BYTES", 0)  # keep arrays of every size
    x, target = RNG.standard_normal((4, 3, 5, 5)), RNG.standard_normal((4, 3, 5, 5))
    results = []
    for names in ({"bn": "x", "scale": "x", "relu": "x"}, {"bn": "b", "scale": "s", "relu": "r"}):
        text = RESNET_CHAIN % names
        # Input layers must come first.
        param = text_format.Parse(text, pb.NetParameter())
        param.layer.insert(1, param.layer.pop())
        param.force_backward = True
        with default_dtype(np.float64):
            net = netdef.Net(param, netdef.TRAIN)
        net.params["scale"][0].data[...] = [1.5, -0.5, 2.0]
        net.params["scale"][1].data[...] = [0.1, 0.2, -0.3]
        runs = []
        for it in range(2):
            net.clear_param_diffs()
            net.forward(x=x * (it + 1), target=target)
            net.backward()
            runs.append([np.array(net.blobs["x"].diff), np.array(net.params["scale"][0].diff),
                         np.array(net.params["scale"][1].diff), np.array(net.params["bn"][0].data)])
        results.append(runs)
    for in_place, out_of_place in zip(*results):
        for a, b in zip(in_place, out_of_place):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert np.abs(results[0][1][0]).max() > 0
