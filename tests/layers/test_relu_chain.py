"""A convolution or inner product and the ReLU in place on its output, trained as one step
(layers/relu_chain.py): nets that train these chains fused against the same nets run layer by layer,
bit for bit in every blob's values and gradients and every parameter's, over two iterations, for each
convolution algorithm (direct, row products, columns, pointwise and depthwise, whose bias the map
adds), an inner product, a leaky slope and float64; where chains form; and a numerical gradient check
through them."""
from __future__ import annotations

import numpy as np
import pytest

import netdef
from netdef.layers import direct
from tests.helpers import default_dtype, train_twice

RNG = np.random.default_rng(20261127)

NET = """
name: "rectified"
layer { name: "data" type: "Input" top: "data" top: "target"
        input_param { shape { dim: 2 dim: 4 dim: 10 dim: 10 } shape { dim: 2 dim: 3 } } }
layer { name: "direct" type: "Convolution" bottom: "data" top: "a"
        convolution_param { num_output: 40 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu_a" type: "ReLU" bottom: "a" top: "a" RELU_PARAM }
layer { name: "pw" type: "Convolution" bottom: "a" top: "b"
        convolution_param { num_output: 8 kernel_size: 1 weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu_b" type: "ReLU" bottom: "b" top: "b" RELU_PARAM }
layer { name: "dw" type: "Convolution" bottom: "b" top: "c"
        convolution_param { num_output: 8 group: 8 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu_c" type: "ReLU" bottom: "c" top: "c" RELU_PARAM }
layer { name: "strided" type: "Convolution" bottom: "c" top: "d"
        convolution_param { num_output: 6 kernel_size: 2 stride: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu_d" type: "ReLU" bottom: "d" top: "d" RELU_PARAM }
layer { name: "fc" type: "InnerProduct" bottom: "d" top: "fc"
        inner_product_param { num_output: 12 weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu_fc" type: "ReLU" bottom: "fc" top: "fc" RELU_PARAM }
layer { name: "out" type: "InnerProduct" bottom: "fc" top: "out"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "target" top: "loss" }
"""
CHAINS = [["direct", "relu_a"], ["pw", "relu_b"], ["dw", "relu_c"], ["strided", "relu_d"], ["fc", "relu_fc"]]


def trained(text, fused: bool, values=None):
    state, steps, values, net = train_twice(text, fused, RNG, values)
    algorithms = {name: net.layer_dict[name].algorithm for name in ("direct", "pw", "dw", "strided")}
    return state, steps, values, algorithms


@pytest.mark.parametrize("slope, dtype, direct_on", [(None, np.float32, True), (0.1, np.float32, True),
                                                     (None, np.float64, True), (None, np.float32, False)],
                         ids=["relu", "leaky", "float64", "without-the-direct-path"])
def test_rectified_products_trained_as_one_step_give_the_bits_of_their_layers(monkeypatch, slope, dtype, direct_on):
    monkeypatch.setattr(direct, "ENABLED", direct_on)
    text = NET.replace("RELU_PARAM", "" if slope is None else f"relu_param {{ negative_slope: {slope} }}")
    with default_dtype(dtype):
        fused, steps, values, algorithms = trained(text, True)
        layered, layered_steps, _, _ = trained(text, False, values)
    assert algorithms["pw"] == "pointwise" and algorithms["dw"] == "depthwise"
    assert (algorithms["direct"] == "direct") == direct_on
    for chain in CHAINS:
        assert chain in steps
    assert all(len(step) == 1 for step in layered_steps)
    for key in layered:
        for part, a, b in zip(("values", "gradient"), fused[key], layered[key]):
            assert a.dtype == b.dtype and np.array_equal(a, b) and np.array_equal(np.signbit(a), np.signbit(b)), \
                f"{key} {part}"
    for blob in ("a", "b", "c", "d", "fc"):
        rectified = fused[f"blob {blob}"][0] < 0 if slope else fused[f"blob {blob}"][0] == 0
        assert rectified.any() and (fused[f"blob {blob}"][1] != 0).any(), blob


def test_no_chain_where_the_products_output_can_be_read_or_the_slope_is_negative():
    readable = NET.replace("RELU_PARAM", "").replace('"relu_fc" type: "ReLU" bottom: "fc" top: "fc"',
                                                     '"relu_fc" type: "ReLU" bottom: "fc" top: "fc_r"') \
                  .replace('"out" type: "InnerProduct" bottom: "fc"', '"out" type: "InnerProduct" bottom: "fc_r"')
    steps = trained(readable, True)[1]
    assert ["fc", "relu_fc"] not in steps and ["direct", "relu_a"] in steps
    negative = NET.replace("RELU_PARAM", "relu_param { negative_slope: -0.5 }")
    assert not any(len(step) > 1 for step in trained(negative, True)[1])


def test_gradients_through_fused_chains_match_central_differences():
    text = NET.replace("RELU_PARAM", "")
    with default_dtype(np.float64):
        netdef.set_random_seed(0)
        net = netdef.Net(text, netdef.TRAIN)
        net.blobs["data"].data[...] = RNG.standard_normal(net.blobs["data"].shape)
        net.blobs["target"].data[...] = RNG.standard_normal(net.blobs["target"].shape)
        assert ["pw", "relu_b"] in [[net.layers[i].name for i in range(f, l + 1)] for f, l in net.forward_steps()]
        net.clear_param_diffs()
        net.forward_backward()
        checked = 0
        for layer in ("direct", "pw", "dw", "fc"):
            for j, param in enumerate(net.params[layer]):
                analytic = param.diff.copy().reshape(-1)
                for index in RNG.choice(param.count, 3, replace=False):
                    flat = param.data.reshape(-1)
                    keep = flat[index]
                    # A small step in float64: a ReLU input within it of 0 (a kink) is unlikely.
                    flat[index] = keep + 1e-7
                    up = net.forward()["loss"].item()
                    flat[index] = keep - 1e-7
                    down = net.forward()["loss"].item()
                    flat[index] = keep
                    np.testing.assert_allclose(analytic[index], (up - down) / 2e-7, rtol=1e-4, atol=1e-7,
                                               err_msg=f"{layer}.{j}[{index}]")
                    checked += 1
        assert checked == 24
