"""netdef.summary and `netdef summary`: parameters, multiply-adds and activation memory, checked against
figures worked out by hand for small nets and against the architectures' published totals."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import netdef
from netdef import summary
from netdef.data.convert import convert_mnist, write_idx
from tests.helpers import REPO

MODELS = REPO / "models"
FLOAT = 4  # bytes


def _rows(net_summary) -> dict:
    return {layer.name: layer for layer in net_summary.layers}


SMALL = """
name: "small"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 stride: 2 group: 2 } }
layer { name: "pool" type: "Pooling" bottom: "conv2" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


def test_small_net_by_hand():
    s = summary.summarize(netdef.Net(SMALL, netdef.TEST))
    rows = _rows(s)
    # conv1: 2x4x8x8 tops, each 3 channels x 3x3 products; 4x3x3x3 weights + 4 biases.
    assert (rows["conv1"].macs, rows["conv1"].params) == (512 * 27, 112)
    # conv2 in 2 groups: 2x6x4x4 tops, each (4 / 2) channels x 3x3; 6x2x3x3 weights + 6 biases.
    assert (rows["conv2"].macs, rows["conv2"].params) == (192 * 18, 114)
    # ip: 2 images x 24 inputs x 10 outputs; 10x24 weights + 10 biases.
    assert (rows["ip"].macs, rows["ip"].params) == (480, 250)
    assert rows["pool"].tops == (("pool", (2, 6, 2, 2)),)
    for name in ("data", "relu1", "pool", "prob"):
        assert rows[name].macs == 0 and rows[name].params == 0, name
    # The in-place ReLU adds no memory; every other top is new.
    assert rows["relu1"].activation_bytes == 0
    assert rows["conv1"].activation_bytes == 512 * FLOAT
    assert s.activation_bytes == (384 + 512 + 192 + 48 + 20 + 20) * FLOAT
    assert (s.params, s.learnable_params, s.param_bytes) == (476, 476, 476 * FLOAT)
    assert (s.batch, s.macs, s.macs_per_image) == (2, 13_824 + 3_456 + 480, 8_880)


def test_deconvolution_view_layers_batchnorm_and_shared_weights():
    text = """
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 4 dim: 4 dim: 4 } } }
    layer { name: "up" type: "Deconvolution" bottom: "data" top: "up"
            convolution_param { num_output: 2 kernel_size: 2 stride: 2 group: 2 bias_term: false } }
    layer { name: "bn" type: "BatchNorm" bottom: "up" top: "up" }
    layer { name: "scale" type: "Scale" bottom: "up" top: "up" scale_param { bias_term: true } }
    layer { name: "flat" type: "Flatten" bottom: "up" top: "flat" }
    layer { name: "a" type: "InnerProduct" bottom: "flat" top: "a" param { name: "w" } param { name: "b" }
            inner_product_param { num_output: 5 } }
    layer { name: "b" type: "InnerProduct" bottom: "flat" top: "b" param { name: "w" } param { name: "b" }
            inner_product_param { num_output: 5 } }
    """
    s = summary.summarize(netdef.Net(text, netdef.TEST))
    rows = _rows(s)
    # Each of the 2x4x4x4 inputs spreads over (2 / 2) output channels x 2x2 taps; weights 4x1x2x2.
    assert (rows["up"].macs, rows["up"].params) == (128 * 4, 16)
    assert rows["up"].tops == (("up", (2, 2, 8, 8)),)
    # BatchNorm's mean, variance and factor are stored but not learned; Scale's multiplier and shift are.
    assert (rows["bn"].params, rows["bn"].learnable_params) == (2 + 2 + 1, 0)
    assert (rows["scale"].params, rows["scale"].learnable_params) == (4, 4)
    # Flatten and the inserted Split are views of their bottom's data.
    assert rows["flat"].activation_bytes == 0
    assert all(layer.activation_bytes == 0 for layer in s.layers if layer.type == "Split")
    # The shared weights (5 x 128 + 5) count once, at their first layer; both layers do the products.
    assert (rows["a"].params, rows["b"].params) == (645, 0)
    assert rows["a"].macs == rows["b"].macs == 2 * 128 * 5
    assert (s.params, s.learnable_params) == (16 + 5 + 4 + 645, 16 + 4 + 645)
    assert s.activation_bytes == (128 + 256 + 10 + 10) * FLOAT


def _deploy(model: str) -> netdef.Net:
    """The zoo model's deploy net with a batch of one image."""
    from tests.test_models import deploy_param

    netdef.set_random_seed(0)
    return netdef.Net(deploy_param(model), netdef.TEST)


def test_alexnet_published_totals():
    s = summary.summarize(_deploy("alexnet"))
    # (top height = width, top channels, input channels per group, kernel) of each convolution, then
    # the inner products' (inputs, outputs).
    convs = [(55, 96, 3, 11), (27, 256, 48, 5), (13, 384, 256, 3), (13, 384, 192, 3), (13, 256, 192, 3)]
    fcs = [(256 * 6 * 6, 4096), (4096, 4096), (4096, 1000)]
    expected = sum(hw * hw * c * cin * k * k for hw, c, cin, k in convs) + sum(i * o for i, o in fcs)
    assert s.macs == expected == 724_406_816           # "724M multiply-adds"
    assert s.params == s.learnable_params == 60_965_224  # BVLC's AlexNet


def test_resnet50_published_totals():
    s = summary.summarize(_deploy("resnet50"))
    expected = 112 * 112 * 64 * 3 * 7 * 7               # conv1
    channels, size = 64, 56
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        size = size // 2 if stage else size             # stages 3-5 subsample in their first block
        for block in range(blocks):
            area = size * size
            if block == 0:
                expected += area * 4 * width * channels  # the projection shortcut
            expected += area * width * channels + area * width * width * 9 + area * 4 * width * width
            channels = 4 * width
    expected += 2048 * 1000
    assert s.macs == expected
    assert s.macs == pytest.approx(3.86e9, rel=0.01)    # "3.8 x 10^9 FLOPs" (multiply-adds) in the paper
    assert s.learnable_params == 25_557_032
    # BatchNorm's statistics: mean and variance of every convolution's channels and a factor per layer.
    assert s.params - s.learnable_params == 2 * 26_560 + 53


def test_mobilenet_v2_depthwise_totals():
    s = summary.summarize(_deploy("mobilenet_v2"))
    assert s.learnable_params == 3_504_872
    assert s.macs == pytest.approx(300e6, rel=0.01)     # the paper's 300M multiply-adds


def _netdef(*args, cwd):
    return subprocess.run([sys.executable, "-m", "netdef.cli", "summary", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_command_without_data_and_with_data_shape(tmp_path):
    train_val = str(MODELS / "cifar10_quick" / "train_val.prototxt")
    missing = _netdef(train_val, "--phase", "TRAIN", cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "train_lmdb" in missing.stderr and "--data_shape" in missing.stderr
    done = _netdef(train_val, "--phase", "TRAIN", "--data_shape", "3,32,32", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "parameters:        145,578 (145,578 learnable)" in out
    assert "batch 100" in out and "100x32x32x32" in out    # the TRAIN Data layer's batch_size
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("loss")] == [["loss", "SoftmaxWithLoss"]]
    bad = _netdef(train_val, "--data_shape", "3,32", cwd=tmp_path)
    assert bad.returncode == 1 and "C,H,W or N,C,H,W" in bad.stderr


# Line 2: the data layer; line 4: conv1, whose kernel is larger than the 6x6 images.
TOO_LARGE_KERNEL = """name: "too_large_kernel"
layer { name: "data" type: "Data" top: "data" top: "label"
        data_param { source: "images_lmdb" batch_size: 4 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 2 kernel_size: 7 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "conv1" bottom: "label" top: "loss" }
"""


def _error_line(done) -> str:
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr.strip()


def test_errors_name_the_file_and_line_and_hint_data_shape_only_for_the_data(tmp_path):
    (tmp_path / "net.prototxt").write_text(TOO_LARGE_KERNEL)
    no_data = _error_line(_netdef("net.prototxt", cwd=tmp_path))
    assert no_data.startswith("netdef: error: net.prototxt:2: layer 'data' (Data)") and "no such DB" in no_data
    assert "give --data_shape C,H,W" in no_data

    # With --data_shape the net is built from a rewritten definition: still the file's name and line.
    shaped = _error_line(_netdef("net.prototxt", "--data_shape=1,6,6", cwd=tmp_path))
    assert shaped.startswith("netdef: error: net.prototxt:4: layer 'conv1' (Convolution)"), shaped
    assert "<NetParameter>" not in shaped and "--data_shape" not in shaped

    # The data is there: the fault is conv1's alone, and --data_shape would not help.
    write_idx(tmp_path / "images.gz", np.zeros((4, 6, 6), np.uint8))
    write_idx(tmp_path / "labels.gz", np.zeros(4, np.uint8))
    convert_mnist(tmp_path / "images.gz", tmp_path / "labels.gz", tmp_path / "images_lmdb")
    with_data = _error_line(_netdef("net.prototxt", cwd=tmp_path))
    assert with_data.startswith("netdef: error: net.prototxt:4: layer 'conv1' (Convolution)"), with_data
    assert "--data_shape" not in with_data


def test_a_deploy_net_with_input_fields_names_its_layers_lines(tmp_path):
    """Caffe's old input: fields become an Input layer in front; the lines of the layers after it stay theirs."""
    (tmp_path / "deploy.prototxt").write_text(
        'name: "old_inputs"\ninput: "data"\ninput_shape { dim: 1 dim: 1 dim: 4 dim: 4 }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }\n'
        'layer { name: "relu" type: "Relu" bottom: "ip" top: "ip" }\n')
    line = _error_line(_netdef("deploy.prototxt", cwd=tmp_path))
    assert line.startswith("netdef: error: deploy.prototxt:5: layer 'relu': unknown layer type 'Relu'"), line
    shaped = _error_line(_netdef("deploy.prototxt", "--data_shape=1,4,4", cwd=tmp_path))   # rebuilt, same lines
    assert shaped.startswith("netdef: error: deploy.prototxt:5: layer 'relu': unknown layer type 'Relu'"), shaped
