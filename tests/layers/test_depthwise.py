"""Depthwise convolution (group == channels) and the other convolution algorithms chosen at reshape.

The compiled kernels (layers/jit/depthwise.py) and their array-module twins (layers/depthwise.py)
against a naive direct convolution, numerical gradient checks of both, and the kernels against the
twins in float32 on shapes like MobileNet's."""
from __future__ import annotations

import numpy as np
import pytest

from netdef import backend
from netdef.layers import depthwise, direct, jit
from netdef.layers.im2col import Geometry
from tests.helpers import build, check_gradients, parse_layer
from tests.layers.test_vision import conv_text, naive_conv

RNG = np.random.default_rng(20261123)

# (text fields, channels)
DEPTHWISE_CONFIGS = [
    (dict(num_output=4, kernel_size=3, pad=1, group=4), 4),
    (dict(num_output=3, kernel_size=3, stride=2, pad=1, group=3, bias_term=False), 3),
    (dict(num_output=6, kernel_size=3, pad=1, group=3), 3),                       # channel multiplier 2
    (dict(num_output=2, kernel_h=3, kernel_w=2, stride_h=2, stride_w=1, pad_h=0, pad_w=1, group=2), 2),
    (dict(num_output=2, kernel_size=3, dilation=2, pad=2, stride=2, group=2), 2),
    (dict(num_output=2, kernel_size=5, pad=1, group=2), 2),                        # windows past the input
    (dict(num_output=2, kernel_size=3, dilation=2, pad=1, group=2), 2),            # stride 1, dilated
    (dict(num_output=4, kernel_size=2, pad=2, group=2), 2),                        # pad > extent - 1
]
IDS = [",".join(f"{k}={v}" for k, v in f.items()) for f, _ in DEPTHWISE_CONFIGS]


@pytest.fixture(autouse=True)
def _seed():
    backend.set_random_seed(1234)


@pytest.fixture(params=[True, False], ids=["compiled", "reference"])
def compiled(request, monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", request.param)
    return request.param


def _stride_pad_dilation(fields):
    def pair(name, default):
        if f"{name}_h" in fields:
            return fields[f"{name}_h"], fields[f"{name}_w"]
        return (fields.get(name, default),) * 2

    return pair("stride", 1), pair("pad", 0), pair("dilation", 1)


@pytest.mark.parametrize("fields,channels", DEPTHWISE_CONFIGS, ids=IDS)
def test_depthwise_matches_naive_reference(compiled, fields, channels):
    x = RNG.standard_normal((2, channels, 7, 8))
    kh = fields.get("kernel_h", fields.get("kernel_size"))
    kw = fields.get("kernel_w", fields.get("kernel_size"))
    w = RNG.standard_normal((fields["num_output"], 1, kh, kw))
    b = RNG.standard_normal(fields["num_output"])
    params = [w, b] if fields.get("bias_term", True) else [w]
    layer, bottom, top = build(parse_layer(conv_text(**fields)), [x], 1, params=params)
    assert layer.algorithm == "depthwise"
    layer.forward(bottom, top)
    stride, pad, dil = _stride_pad_dilation(fields)
    expected = naive_conv(x, w, b if len(params) == 2 else np.zeros_like(b), stride, pad, dil, channels)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fields,channels", DEPTHWISE_CONFIGS, ids=IDS)
def test_depthwise_gradients(compiled, fields, channels):
    layer = check_gradients(parse_layer(conv_text(**fields)), [RNG.standard_normal((2, channels, 6, 7))])
    assert layer.algorithm == "depthwise"


@pytest.mark.parametrize("geom", [Geometry((3, 3), (1, 1), (1, 1), (1, 1)), Geometry((3, 3), (2, 2), (1, 1), (1, 1))],
                         ids=["s1", "s2"])
def test_depthwise_kernels_match_reference_float32(geom):
    x = RNG.standard_normal((3, 24, 19, 17)).astype(np.float32)
    w = RNG.standard_normal((24, 1, 3, 3)).astype(np.float32)
    out = geom.conv_out(x.shape[2:])
    dy = RNG.standard_normal((3, 24) + out).astype(np.float32)
    y = np.empty_like(dy)
    from netdef.layers.jit import depthwise as kernels

    kernels.forward(x, w, y, *geom.stride, *geom.pad, *geom.dilation)
    np.testing.assert_allclose(y, depthwise.forward_reference(x, w, geom, np.empty_like(dy)), rtol=1e-5, atol=1e-5)
    dx = np.empty_like(x)
    kernels.backward_data(dy, w, dx, *geom.stride, *geom.pad, *geom.dilation)
    np.testing.assert_allclose(dx, depthwise.backward_data_reference(dy, w, geom, np.empty_like(x)),
                               rtol=1e-5, atol=1e-5)
    dw = np.ones_like(w)  # the weight gradient is added
    kernels.backward_weights(x, dy, dw, *geom.stride, *geom.pad, *geom.dilation)
    np.testing.assert_allclose(dw, depthwise.backward_weights_reference(x, dy, geom, np.ones_like(w)),
                               rtol=1e-4, atol=1e-3)


# (channels, plane, kernel, stride, pad, dilation): whole and partial blocks of channels (16 floats or
# 8 doubles a block on AVX-512), planes of fewer cells than a block's square tile and with cells past
# the last whole tile, strides (the input gradient by stride phases), dilation, a window past the
# input, a 5x5 kernel.
BLOCKED_CASES = [
    (32, (7, 7), 3, 1, 1, 1), (17, (14, 14), 3, 2, 1, 1), (20, (9, 11), 5, 1, 2, 1), (3, (4, 3), 3, 1, 1, 1),
    (16, (12, 13), 3, 2, 2, 2), (24, (8, 8), 3, 1, 1, 2), (8, (6, 7), 5, 1, 1, 1),
    (8, (9, 10), 2, 3, 0, 1),   # input rows and columns no tap reads: their gradient is zero
    (8, (6, 7), 2, 1, 2, 1),    # pad > extent - 1: outputs that read only padding
    (16, (7, 7), 1, 2, 0, 1),   # 1 x 1 at stride 2
]


@pytest.mark.skipif(not direct.compiles(np.dtype(np.float32)), reason="the microkernels do not compile on this CPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels,plane,kernel,stride,pad,dilation", BLOCKED_CASES)
def test_channel_blocked_kernels_give_the_phase_kernels_bits(monkeypatch, dtype, channels, plane, kernel, stride,
                                                              pad, dilation):
    """The blocked path (depthwise.forward and backward_data with m = 1) adds each output's taps in the
    phase kernels' order with the same fused multiply-adds: equal bits."""
    from netdef.layers.jit import depthwise as kernels

    geom = Geometry((kernel, kernel), (stride, stride), (pad, pad), (dilation, dilation))
    x = RNG.standard_normal((2, channels) + plane).astype(dtype)
    w = RNG.standard_normal((channels, 1, kernel, kernel)).astype(dtype)
    out = geom.conv_out(plane)
    dy = RNG.standard_normal((2, channels) + out).astype(dtype)
    y_phases, dx_phases = np.empty_like(dy), np.empty_like(x)
    kernels.forward(x, w, y_phases, *geom.stride, *geom.pad, *geom.dilation)
    kernels.backward_data(dy, w, dx_phases, *geom.stride, *geom.pad, *geom.dilation)

    def phase_kernel(*args):
        raise AssertionError("the phase kernel ran where the blocked one should")

    monkeypatch.setattr(kernels, "forward", phase_kernel)
    y = np.full_like(dy, np.nan)
    depthwise.forward(x, w, geom, y)
    np.testing.assert_array_equal(y, y_phases)
    np.testing.assert_allclose(y, depthwise.forward_reference(x, w, geom, np.empty_like(dy)), rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(kernels, "backward_data", phase_kernel)
    dx = np.full_like(x, np.nan)
    depthwise.backward_data(dy, w, geom, dx)
    np.testing.assert_array_equal(dx, dx_phases)


@pytest.mark.skipif(not direct.compiles(np.dtype(np.float32)), reason="the microkernels do not compile on this CPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels,plane,kernel,stride,pad,dilation", BLOCKED_CASES)
def test_channel_blocked_weight_gradient(monkeypatch, dtype, channels, plane, kernel, stride, pad, dilation):
    """The blocked weight gradient (each image's pixels summed in the element type, the images in
    float64) against the twin, added to what dw held; the same bits on 1 and 2 threads."""
    import numba

    from netdef.layers.jit import depthwise as kernels

    geom = Geometry((kernel, kernel), (stride, stride), (pad, pad), (dilation, dilation))
    x = RNG.standard_normal((3, channels) + plane).astype(dtype)
    dy = RNG.standard_normal((3, channels) + geom.conv_out(plane)).astype(dtype)
    start = RNG.standard_normal((channels, 1, kernel, kernel)).astype(dtype)
    expected = depthwise.backward_weights_reference(x.astype(np.float64), dy.astype(np.float64), geom,
                                                    start.astype(np.float64))

    def phase_kernel(*args):
        raise AssertionError("the phase kernel ran where the blocked one should")

    monkeypatch.setattr(kernels, "backward_weights", phase_kernel)
    results = []
    for threads in (1, 2):
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        try:
            dw = start.copy()
            depthwise.backward_weights(x, dy, geom, dw)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        results.append(dw)
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(results[0], expected, rtol=tolerance, atol=tolerance)
    np.testing.assert_array_equal(results[0], results[1])


def _channel_maps(batch, channels, cells, dtype):
    """Maps with each of the stages a TEST-phase chain composes onto a depthwise convolution: a
    bias, BatchNorm, Scale with and without its bias, ReLU (slope 0 and leaky); per-channel values
    over the output's channels."""
    from netdef.layers.fusion import ChannelMap

    dims = (batch, channels, cells)
    v = lambda: RNG.standard_normal(channels).astype(dtype)  # noqa: E731
    std = np.abs(v()) + dtype(0.5)
    return {
        "bias+batchnorm+scale+relu": ChannelMap(dims, v(), v(), std, v(), v(), 0.0),
        "batchnorm+scale": ChannelMap(dims, mean=v(), std=std, scale=v(), bias=v()),
        "scale(no bias)+leaky": ChannelMap(dims, scale=v(), negative_slope=0.1),
        "relu": ChannelMap(negative_slope=0.0),
    }


@pytest.mark.skipif(not direct.compiles(np.dtype(np.float32)), reason="the microkernels do not compile on this CPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels,plane,kernel,stride,pad,dilation", BLOCKED_CASES[:4])
def test_channel_map_applied_as_blocks_are_written_gives_the_map_after_the_convolution(
        dtype, channels, plane, kernel, stride, pad, dilation):
    """depthwise.forward_mapped (the map applied to each block of channels as the blocked kernel
    writes it) against the convolution and then fusion.apply: the same bits, with whole and partial
    blocks, for every combination of stages; inputs with NaN, infinities and signed zeros."""
    from netdef.layers import fusion

    geom = Geometry((kernel, kernel), (stride, stride), (pad, pad), (dilation, dilation))
    x = RNG.standard_normal((2, channels) + plane).astype(dtype)
    x.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    w = RNG.standard_normal((channels, 1, kernel, kernel)).astype(dtype)
    out = (2, channels) + geom.conv_out(plane)
    for name, m in _channel_maps(2, channels, int(np.prod(out[2:])), dtype).items():
        expected = fusion.apply(m, depthwise.forward(x, w, geom, np.empty(out, dtype)), np.empty(out, dtype))
        y = np.full(out, 7.0, dtype)
        assert depthwise.forward_mapped(x, w, geom, y, m), name
        assert np.array_equal(y, expected, equal_nan=True), name
        assert np.array_equal(np.signbit(y), np.signbit(expected)), name


@pytest.mark.skipif(not direct.compiles(np.dtype(np.float32)), reason="the microkernels do not compile on this CPU")
def test_maps_of_any_stages_run_in_one_compiled_blocked_kernel():
    """The blocked kernel takes every map with the same argument types (the stages reach a small
    compiled mapper by its address, jit/fusion.rows_mapper): a chain with other stages compiles a
    mapper in a fraction of a second, not the whole kernel again (5-9 s each, 14 times in the
    suite when the stages were None-or-array arguments)."""
    from netdef.layers.jit import depthwise as kernels

    geom = Geometry((3, 3), (1, 1), (1, 1), (1, 1))
    x = RNG.standard_normal((2, 16, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((16, 1, 3, 3)).astype(np.float32)
    y = np.empty_like(x)
    depthwise.forward(x, w, geom, y)
    compiled = len(kernels.blocked_taps.signatures)
    for name, m in _channel_maps(2, 16, 36, np.float32).items():
        assert depthwise.forward_mapped(x, w, geom, y, m), name
        assert len(kernels.blocked_taps.signatures) == compiled, name


def test_channel_map_over_other_channels_is_left_to_the_caller():
    """A map whose per-channel values are not over the output's channels (or a convolution the
    blocked kernels do not compute: channel multiplier 2) is refused and nothing is written."""
    from netdef.layers.fusion import ChannelMap

    geom = Geometry((3, 3), (1, 1), (1, 1), (1, 1))
    x = RNG.standard_normal((2, 8, 5, 5)).astype(np.float32)
    y = np.full((2, 8, 5, 5), 7.0, np.float32)
    other = ChannelMap((2, 4, 50), scale=np.ones(4, np.float32))
    assert not depthwise.forward_mapped(x, RNG.standard_normal((8, 1, 3, 3)).astype(np.float32), geom, y, other)
    doubled = np.full((2, 16, 5, 5), 7.0, np.float32)
    relu = ChannelMap(negative_slope=0.0)
    assert not depthwise.forward_mapped(x, RNG.standard_normal((16, 1, 3, 3)).astype(np.float32), geom, doubled,
                                        relu)
    assert (y == 7.0).all() and (doubled == 7.0).all()


def test_convolution_algorithm_choice(monkeypatch):
    def algorithm(channels, **fields):
        layer, _, _ = build(parse_layer(conv_text(**fields)), [np.zeros((1, channels, 9, 9))], 1)
        return layer.algorithm

    assert algorithm(8, num_output=8, kernel_size=3, pad=1, group=8) == "depthwise"
    assert algorithm(8, num_output=16, kernel_size=3, stride=2, group=8) == "depthwise"
    assert algorithm(8, num_output=8, kernel_size=3, group=4) != "depthwise"
    assert algorithm(8, num_output=4, kernel_size=1) == "pointwise"
    assert algorithm(8, num_output=4, kernel_size=1, stride=2) == "pointwise"  # on the pixels it picks
    assert algorithm(8, num_output=4, kernel_size=1, stride=2, pad=1) != "pointwise"
    assert algorithm(8, num_output=4, kernel_size=1, group=2) != "pointwise"
    assert algorithm(64, num_output=8, kernel_size=3, pad=1) == "direct"
    assert algorithm(12, num_output=6, kernel_size=3, stride=2, group=3) == "direct"  # 36 taps per group
    monkeypatch.setattr(direct, "ENABLED", False)  # the paths before it
    assert algorithm(64, num_output=8, kernel_size=3, pad=1) == "rows"
    assert algorithm(3, num_output=8, kernel_size=3, pad=1) == "columns"


@pytest.mark.parametrize("shape, stacked", [((3, 4, 5, 6), True), ((2, 3, 12, 11), False), ((1, 4, 5, 6), False)],
                         ids=["small-planes-one-product", "per-image", "one-image"])
@pytest.mark.parametrize("fields", [dict(num_output=5, kernel_size=1), dict(num_output=2, kernel_size=1, bias_term=False)],
                         ids=["bias", "no-bias"])
def test_pointwise_matches_naive_reference_and_gradients(fields, shape, stacked):
    x = RNG.standard_normal(shape)
    layer = check_gradients(parse_layer(conv_text(**fields)), [x])
    assert layer.algorithm == "pointwise"
    assert layer.strategy.stacked == stacked
    w = layer.blobs[0].data
    b = layer.blobs[1].data if len(layer.blobs) > 1 else np.zeros(fields["num_output"])
    layer2, bottom, top = build(parse_layer(conv_text(**fields)), [x], 1, params=[p.data for p in layer.blobs])
    layer2.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, naive_conv(x, w, b, (1, 1), (0, 0), (1, 1), 1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape", [(3, 4, 9, 10), (2, 3, 12, 11), (1, 4, 7, 7)],
                         ids=["small-planes-one-product", "per-image", "one-image"])
@pytest.mark.parametrize("strides", [dict(stride=2), dict(stride_h=2, stride_w=3)], ids=["2", "2x3"])
def test_strided_pointwise_matches_naive_reference_and_gradients(shape, strides):
    """A 1x1 convolution with strides (ResNet's projections) multiplies the pixels its strides pick;
    its input gradient is 0 at the others."""
    fields = dict(num_output=5, kernel_size=1, **strides)
    x = RNG.standard_normal(shape)
    layer = check_gradients(parse_layer(conv_text(**fields)), [x])
    assert layer.algorithm == "pointwise"
    stride = (strides.get("stride_h", strides.get("stride")), strides.get("stride_w", strides.get("stride")))
    w, b = layer.blobs[0].data, layer.blobs[1].data
    layer2, bottom, top = build(parse_layer(conv_text(**fields)), [x], 1, params=[p.data for p in layer.blobs])
    layer2.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, naive_conv(x, w, b, stride, (0, 0), (1, 1), 1), rtol=1e-10, atol=1e-10)
    top[0].diff = RNG.standard_normal(top[0].shape)
    layer2.backward(top, [True], bottom)
    picked = (slice(None), slice(None), slice(None, None, stride[0]), slice(None, None, stride[1]))
    untouched = np.ones(shape, bool)
    untouched[picked] = False
    assert not bottom[0].diff[untouched].any() and bottom[0].diff[picked].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_pointwise_kernels_equal_their_numpy_twins(monkeypatch, dtype):
    """The compiled pick and spread (jit/layout.py) give the bits of im2col's NumPy lines."""
    x = RNG.standard_normal((2, 3, 11, 10)).astype(dtype)
    dy = RNG.standard_normal((2, 4, 6, 4)).astype(dtype)

    def run():
        layer, bottom, top = build(parse_layer(conv_text(num_output=4, kernel_size=1, stride_h=2, stride_w=3)), [x], 1,
                                   dtype=dtype, params=[np.full((4, 3, 1, 1), 0.5), np.zeros(4)])
        layer.forward(bottom, top)
        top[0].diff = dy.copy()
        layer.backward(top, [True], bottom)
        return top[0].data.copy(), bottom[0].diff.copy()

    compiled = run()
    monkeypatch.setattr(jit, "ENABLED", False)
    for a, b in zip(compiled, run()):
        np.testing.assert_array_equal(a, b)
