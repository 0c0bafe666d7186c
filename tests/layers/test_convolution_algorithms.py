"""Convolution's algorithms as strategies (layers/convolution/): one planned per input shape, each
behind the same interface, the planner's choice and its log line, and a refused algorithm giving way
to netdef's own path. What each algorithm computes is test_vision.py's, test_direct.py's and
test_depthwise.py's."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from netdef.blob import Blob
from netdef.layers import fusion
from netdef.layers.convolution import algorithm, planner
from netdef.layers.convolution.algorithm import AlgorithmRefused, ConvolutionAlgorithm
from tests.helpers import build, parse_layer
from tests.layers.test_vision import conv_text

RNG = np.random.default_rng(31)


def conv(name="L", shape=(2, 8, 9, 9), dtype=np.float32, **fields):
    text = parse_layer(conv_text(**fields).replace('name: "L"', f'name: "{name}"'))
    return build(text, [RNG.standard_normal(shape).astype(dtype)], 1, dtype=dtype)


@pytest.mark.parametrize("fields,shape,name", [
    (dict(num_output=4, kernel_size=1), (2, 8, 9, 9), "pointwise"),
    (dict(num_output=8, kernel_size=3, group=8, pad=1), (2, 8, 9, 9), "depthwise"),
    (dict(num_output=4, kernel_size=3, pad=1), (2, 3, 2, 9, 9), "columns"),   # 3-D: the column path
])
def test_the_layer_runs_the_algorithm_the_planner_chose(fields, shape, name):
    layer, bottom, top = conv(shape=shape, **fields)
    assert isinstance(layer.strategy, ConvolutionAlgorithm)
    assert layer.algorithm == layer.strategy.name == name
    assert layer.algorithm_summary() == layer.strategy.summary()
    assert layer.strategy.shape.x_shape == (shape[0], shape[1]) + shape[2:]


def test_planned_once_per_input_shape():
    layer, bottom, top = conv(num_output=4, kernel_size=3, pad=1)
    planned = layer.strategy
    layer.reshape(bottom, top)
    assert layer.strategy is planned  # the same shape: nothing planned again
    bottom[0].reshape(3, 8, 9, 9)
    layer.reshape(bottom, top)
    assert layer.strategy is not planned and layer.strategy.shape.num == 3
    assert top[0].shape == (3, 4, 9, 9)


def test_kept_memory_is_the_algorithms_own():
    layer, bottom, top = conv(num_output=4, kernel_size=3, pad=1, shape=(2, 3, 2, 9, 9))
    assert layer.algorithm == "columns" and layer.strategy.kept_bytes() == 0
    layer.forward(bottom, top)
    assert layer.strategy.kept_bytes() > 0  # the last chunk's columns, kept for backward
    pointwise, bottom, top = conv(num_output=4, kernel_size=1)
    pointwise.forward(bottom, top)
    assert pointwise.strategy.kept_bytes() == 0  # its temporaries are the net's scratch


class RefusingOnce(ConvolutionAlgorithm):
    """An algorithm that refuses its shapes at the first call, as cuDNN does without a plan."""

    name = "cudnn"

    def forward(self, layer, bottom, top):
        raise AlgorithmRefused(self.name, "cuDNN has no plan: none for these shapes")

    def forward_mapped(self, layer, bottom, top, channel_map):
        raise AlgorithmRefused(self.name, "cuDNN has no plan: none for these shapes")

    def backward(self, layer, top, propagate_down, bottom):
        raise AlgorithmRefused(self.name, "cuDNN has no plan: none for these shapes")


@pytest.mark.parametrize("call", ["forward", "forward_mapped", "backward"])
def test_a_refused_algorithm_gives_way_and_the_call_is_repeated(call):
    layer, bottom, top = conv(num_output=4, kernel_size=3, pad=1)
    expected, _, expected_top = conv(num_output=4, kernel_size=3, pad=1)
    for mine, theirs in zip(layer.blobs, expected.blobs):
        mine.data[...] = theirs.data
    bottom[0].data[...] = 1.5
    expected_bottom = [Blob(bottom[0].shape, dtype=np.float32)]
    expected_bottom[0].data[...] = 1.5
    expected.forward(expected_bottom, expected_top)
    if call == "backward":
        layer.forward(bottom, top)
        top[0].diff[...] = expected_top[0].diff[...] = 0.5
        expected.backward(expected_top, [True], expected_bottom)
    planned = layer.strategy.name
    layer.strategy = RefusingOnce(layer.shape)
    if call == "forward":
        layer.forward(bottom, top)
        np.testing.assert_array_equal(top[0].data, expected_top[0].data)
    elif call == "forward_mapped":  # the relu chain's call in training
        assert layer.forward_mapped(bottom, top, fusion.ChannelMap(negative_slope=0.0))
        np.testing.assert_array_equal(top[0].data, np.maximum(expected_top[0].data, 0))
    else:
        layer.backward(top, [True], bottom)
        np.testing.assert_array_equal(bottom[0].diff, expected_bottom[0].diff)
        np.testing.assert_array_equal(layer.blobs[0].diff, expected.blobs[0].diff)  # added once
    assert layer.refused == {"cudnn": "cuDNN has no plan: none for these shapes"}
    assert layer.algorithm == planned


def test_cudnn_refusals_and_the_fallback_said_once(caplog):
    layer, _, _ = conv(name="caffe_engine", num_output=4, kernel_size=3, pad=1, engine="CAFFE")
    assert planner.cudnn_refusal(layer, np.float32) == "engine: CAFFE asks for Caffe's own path"
    not_numpy = object()  # another array module: netdef's GPU path, where cuDNN is refused
    with caplog.at_level(logging.INFO, logger="netdef"):
        chosen = planner.plan(layer, not_numpy, np.float32)
        planner.plan(layer, not_numpy, np.float32)
    assert chosen.name == "columns"
    said = [r.getMessage() for r in caplog.records if "caffe_engine" in r.getMessage()]
    assert said == ["Layer caffe_engine runs netdef's columns path on the GPU: engine: CAFFE asks for Caffe's own path"]
    refused, _, _ = conv(name="no_plan", num_output=4, kernel_size=3, pad=1)
    refused.refused["cudnn"] = "cuDNN has no plan: none for these shapes"
    assert planner.cudnn_refusal(refused, np.float32) == "cuDNN has no plan: none for these shapes"


def test_the_algorithms_bias_pass_is_the_layers():
    """The pointwise and depthwise products leave the bias to the layer (BiasAfterProducts)."""
    layer, bottom, top = conv(num_output=4, kernel_size=1)
    assert isinstance(layer.strategy, algorithm.BiasAfterProducts)
    layer.forward(bottom, top)
    products = np.empty_like(top[0].data)
    saved = top[0].data
    top[0].data = products
    layer.strategy.products(layer, bottom, top)
    top[0].data = saved
    np.testing.assert_array_equal(products + layer.blobs[1].data.reshape(1, -1, 1, 1), top[0].data)
