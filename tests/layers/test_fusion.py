"""TEST-phase fusion (layers/fusion.py, Net.forward_range): the fused kernels against the layers'
reference functions, bit for bit (special values, both dtypes, in place or not), how maps compose,
and nets run fused against the same nets run layer by layer: the same bits in every blob, chains
only where no one can read the values in between, none where backward may follow unless the net is
forward_only, and every layer's hooks called."""
from __future__ import annotations

import numpy as np
import pytest

import netdef
from netdef.layers import direct, fusion, jit
from netdef.layers import matmul as matmul_module
from netdef.layers.fusion import ChannelMap
from netdef.net import NetError

RNG = np.random.default_rng(20261125)


def same_bits(a, b) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
            and np.array_equal(np.signbit(a), np.signbit(b)))


def channel_values(c, dtype, positive=False):
    v = RNG.standard_normal(c).astype(dtype)
    return np.abs(v) + dtype(0.5) if positive else v


def special_input(shape, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    x.reshape(-1)[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]
    return x


def maps_for(dims, dtype):
    c = dims[1]
    mean, std = channel_values(c, dtype), channel_values(c, dtype, positive=True)
    scale, bias = channel_values(c, dtype), channel_values(c, dtype)
    # Each combination of stages is a kernel compiled of its own (seconds each): the nets below run
    # a few more (bias+batchnorm, bias+relu, relu in place).
    return {
        "bias+batchnorm+scale+relu": ChannelMap(dims, bias, mean, std, scale, bias, 0.0),
        "batchnorm+scale": ChannelMap(dims, mean=mean, std=std, scale=scale, bias=bias),
        "scale(no bias)+leaky": ChannelMap(dims, scale=scale, negative_slope=0.1),
        "relu": ChannelMap(negative_slope=0.0),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
def test_channel_map_kernel_gives_the_references_bits(dtype, in_place):
    dims = (2, 3, 1093)  # rows that end one element into a block, and rows shorter than one
    with np.errstate(invalid="ignore"):
        maps = maps_for(dims, dtype)
        if dtype is np.float64:  # each stage combination is compiled per dtype: one is enough here
            maps = {"bias+batchnorm+scale+relu": maps["bias+batchnorm+scale+relu"]}
        for name, m in maps.items():
            x = special_input(dims, dtype)
            expected = fusion.apply_reference(m, x.copy(), np.empty_like(x))
            out = x if in_place else np.empty_like(x)
            assert fusion.apply(m, x, out) is out
            assert same_bits(out, expected), name


def test_apply_without_kernels_is_the_reference(monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", False)
    m = maps_for((2, 3, 5), np.float32)["bias+batchnorm+scale+relu"]
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    m = ChannelMap(m.dims, shift=m.bias, mean=m.mean, std=m.std, scale=m.scale, bias=m.bias, negative_slope=0.0)
    expected = np.maximum(((x + m.shift[:, None]) - m.mean[:, None]) / m.std[:, None] * m.scale[:, None]
                          + m.bias[:, None], 0)
    assert same_bits(fusion.apply(m, x, np.empty_like(x)), expected.astype(np.float32))


def test_weighted_sum_rectified_gives_the_sum_then_relu():
    xs = [special_input((3, 5, 7), np.float32) for _ in range(3)]
    with np.errstate(invalid="ignore"):
        expected = np.maximum(xs[0] * np.float32(0.5) + xs[1] * np.float32(1) + xs[2] * np.float32(-2), 0)
        out = fusion.weighted_sum_mapped(xs, [0.5, 1.0, -2.0], ChannelMap(negative_slope=0.0), np.empty_like(xs[0]))
    assert same_bits(out, expected)


def test_maps_compose_only_in_stage_order_and_over_the_same_dims():
    m = maps_for((2, 3, 4), np.float32)
    normalize = ChannelMap((2, 3, 4), mean=m["batchnorm+scale"].mean, std=m["batchnorm+scale"].std)
    relu = ChannelMap(negative_slope=0.0)
    affine = ChannelMap((2, 3, 4), scale=m["batchnorm+scale"].scale)
    chain = fusion.compose_all([normalize, ChannelMap(), affine, relu])
    assert chain.stages == (fusion.NORMALIZE, fusion.AFFINE, fusion.RECTIFY) and chain.dims == (2, 3, 4)
    assert fusion.compose(relu, normalize) is None  # a ReLU before BatchNorm is not one map
    assert fusion.compose(affine, affine) is None  # two scales would need two multiplications
    assert fusion.compose(normalize, ChannelMap((6, 1, 4), scale=m["batchnorm+scale"].mean[:1])) is None
    assert fusion.compose_all([normalize, None]) is None


# ------------------------------------------------------------------------------------------- nets
NET = """
name: "fusable"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "bn2" type: "BatchNorm" bottom: "conv2" top: "bn2" }
layer { name: "scale2" type: "Scale" bottom: "bn2" top: "bn2" scale_param { bias_term: true } }
layer { name: "sum" type: "Eltwise" bottom: "conv1" bottom: "bn2" top: "sum" }
layer { name: "relu2" type: "ReLU" bottom: "sum" top: "sum" }
layer { name: "dw" type: "Convolution" bottom: "sum" top: "dw"
        convolution_param { num_output: 4 group: 4 kernel_size: 3 pad: 1 } }
layer { name: "bn3" type: "BatchNorm" bottom: "dw" top: "dw" }
layer { name: "pw" type: "Convolution" bottom: "dw" top: "pw" convolution_param { num_output: 3 kernel_size: 1 } }
layer { name: "relu4" type: "ReLU" bottom: "pw" top: "pw" }
layer { name: "fc" type: "InnerProduct" bottom: "pw" top: "fc" inner_product_param { num_output: 5 } }
layer { name: "relu3" type: "ReLU" bottom: "fc" top: "fc" relu_param { negative_slope: 0.2 } }
layer { name: "drop" type: "Dropout" bottom: "fc" top: "fc" }
"""
WITH_LOSS = NET.replace('name: "fusable"', 'name: "scored"') + """
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 2 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def random_net(text):
    net = netdef.Net(text, netdef.TEST)
    for layer in net.layers:
        for blob in layer.blobs:
            values = RNG.random(blob.shape) + 0.5 if layer.type == "BatchNorm" else RNG.standard_normal(blob.shape)
            blob.data[...] = values
    net.blobs["data"].data[...] = RNG.standard_normal(net.blobs["data"].shape)
    if "label" in net.blobs:
        net.blobs["label"].data[...] = [1, 3]
    return net


def run(net, fused: bool) -> dict:
    net.fuse_layers = fused
    net.forward()
    return {name: blob.data.copy() for name, blob in net.blobs.items()}


def names(net, steps):
    return [[layer.name for layer in net.layers[first:last + 1]] for first, last in steps]


def test_a_net_run_fused_gives_every_blob_the_bits_of_its_layers_one_by_one():
    net = random_net(NET)
    fused_steps = names(net, net.forward_steps())
    # conv1 and the three layers in place on its top; bn2 writes a blob of its own (readable), so
    # only scale2 follows it in place; the sum and its ReLU; the inner product, ReLU and Dropout.
    assert ["conv1", "bn1", "scale1", "relu1"] in fused_steps
    assert ["bn2", "scale2"] in fused_steps and ["conv2"] in fused_steps
    assert ["sum", "relu2"] in fused_steps and ["fc", "relu3", "drop"] in fused_steps
    # A depthwise and a pointwise convolution with a bias: the map adds it.
    assert ["dw", "bn3"] in fused_steps and ["pw", "relu4"] in fused_steps
    assert [net.layer_dict[name].algorithm for name in ("dw", "pw")] == ["depthwise", "pointwise"]
    unfused = run(net, fused=False)
    fused = run(net, fused=True)
    assert unfused.keys() == fused.keys()
    for name in unfused:
        assert same_bits(fused[name], unfused[name]), name
    assert (fused["conv1"] >= 0).all() and (fused["fc"] < 0).any()  # the maps did run
    net.fuse_layers = False
    assert len(net.forward_steps()) == len(net.layers)


LARGE_POINTWISE = """
name: "wide"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: BATCH dim: 64 dim: SIDE dim: SIDE } } }
layer { name: "pw" type: "Convolution" bottom: "data" top: "pw" convolution_param { num_output: 96 kernel_size: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "pw" top: "pw" }
layer { name: "scale" type: "Scale" bottom: "pw" top: "pw" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "pw" top: "pw" }
layer { name: "dw" type: "Convolution" bottom: "pw" top: "dw"
        convolution_param { num_output: 96 group: 96 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "dw_relu" type: "ReLU" bottom: "dw" top: "dw" }
"""


@pytest.mark.parametrize("batch,side", [(1, 20), (3, 8)], ids=["per image", "batch stacked"])
def test_pointwise_and_depthwise_chains_mapped_inside_their_kernels_give_the_layers_bits(monkeypatch, batch, side):
    """Products large enough for the kernels' pool (matmul_row_mapped: each panel mapped as it is
    computed; with a small plane, one product for the stacked batch) and the blocked depthwise
    kernel with the map applied as it writes: the bits of the layers one by one, and no pass of
    fusion.apply of their own."""
    net = random_net(LARGE_POINTWISE.replace("BATCH", str(batch)).replace("SIDE", str(side)))
    assert names(net, net.forward_steps()) == [["data"], ["pw", "bn", "scale", "relu"], ["dw", "dw_relu"]]
    unfused = run(net, fused=False)
    calls = []
    original_apply = fusion.apply
    monkeypatch.setattr(fusion, "apply", lambda *args: calls.append(args) or original_apply(*args))
    fused = run(net, fused=True)
    for name in unfused:
        assert same_bits(fused[name], unfused[name]), name
    assert (fused["pw"] >= 0).all() and (fused["pw"] > 0).any()
    if jit.usable(fused["pw"]) and matmul_module._blas() is not None and direct.compiles(fused["pw"].dtype):
        assert calls == []


def test_a_range_that_ends_inside_a_chain_runs_its_layers_one_by_one():
    net = random_net(NET)
    relu1 = net.layer_index("relu1")
    assert names(net, net.forward_steps(0, relu1 - 1))[-3:] == [["conv1"], ["bn1"], ["scale1"]]
    net.forward(end="scale1")
    assert (net.blobs["conv1"].data < 0).any()  # stopped before the ReLU


def test_chains_where_backward_may_follow_run_fused_only_in_a_forward_only_net():
    net = random_net(WITH_LOSS)
    # The loss needs every layer's backward: the convolutions' chains run layer by layer, and only
    # the chains that keep what their backward needs (layers/batchnorm_chain.py, sum_chain.py,
    # relu_chain.py) as one step.
    assert ["conv1", "bn1", "scale1", "relu1"] not in names(net, net.forward_steps())
    assert all(len(step) == 1 or step[0].startswith("bn") or step[0] == "sum" or step in (["pw", "relu4"], ["fc", "relu3"])
               for step in names(net, net.forward_steps()))
    expected = run(net, fused=True)
    net.forward_only = True
    assert ["conv1", "bn1", "scale1", "relu1"] in names(net, net.forward_steps())
    fused = run(net, fused=True)
    for name in expected:
        assert same_bits(fused[name], expected[name]), name
    with pytest.raises(NetError, match="forward_only"):
        net.backward()


def test_hooks_are_called_for_every_layer_of_a_fused_chain():
    net = random_net(NET)
    calls = []
    net.register_layer_hooks(before_forward=lambda li: calls.append(("before", li)),
                             after_forward=lambda li: calls.append(("after", li)))
    net.forward()
    first = net.layer_index("conv1")
    chain = list(range(first, first + 4))
    assert [c for c in calls if c[1] in chain] == [("before", li) for li in chain] + [("after", li) for li in chain]
    assert sorted({li for _, li in calls}) == list(range(len(net.layers)))
