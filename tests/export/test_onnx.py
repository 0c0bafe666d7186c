"""ONNX export: each converter on a tiny net and five zoo nets, run in onnxruntime and compared with
netdef's own forward pass; what is refused, and the command line."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import netdef
from netdef.fillers import fill
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from tests.helpers import REPO

onnx = pytest.importorskip("onnx", reason="the onnx package (the test extra) is not installed")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime (the test extra) is not installed")

from netdef.export.onnx import OPSET, OnnxExportError, export_onnx, to_onnx  # noqa: E402

MODELS = REPO / "models"


# ---------------------------------------------------------------------------------------------- helpers
def randomize_parameters(net, rng) -> None:
    """Weights a deploy prototxt leaves without filler (all 0) drawn by netdef's msra filler;
    BatchNorm's running sums with a scale factor other than 1 and positive variances; random
    Scale, Bias, PReLU and bias blobs: parameters left at 0 or 1 would let a converter drop them
    and still pass."""
    for layer in net.layers:
        blobs = layer.blobs
        if layer.type == "BatchNorm":
            factor = rng.uniform(0.5, 2.0)
            channels = blobs[0].shape
            blobs[0].data[...] = rng.normal(0, 0.5, channels) * factor
            blobs[1].data[...] = rng.uniform(0.5, 2.0, channels) * factor
            blobs[2].data[...] = factor
        elif layer.type in ("Scale", "Bias", "PReLU"):
            for blob in blobs:
                blob.data[...] = rng.uniform(0.5, 1.5, blob.shape)
        elif layer.type in ("Convolution", "Deconvolution", "InnerProduct"):
            if not np.any(netdef.backend.to_host(blobs[0].data)):
                fill(blobs[0], pb.FillerParameter(type="msra"))
            if len(blobs) > 1:
                blobs[1].data[...] = rng.normal(0, 0.1, blobs[1].shape)


def calibrate(net, feeds, rng) -> None:
    """Scale each Convolution's and InnerProduct's weights and bias so that its output has unit
    standard deviation on ``feeds`` (LSUV's idea), and give each BatchNorm the statistics of its own
    input there, perturbed, so that a deep net of random weights neither fades into its last bias nor
    blows up into a one-hot softmax: either would hide errors in the layers before. One forward pass."""
    for name, value in feeds.items():
        net.blobs[name].data[...] = value
    for index, layer in enumerate(net.layers):
        if layer.type == "BatchNorm":
            x = netdef.backend.to_host(net.blobs[layer.layer_param.bottom[0]].data)
            axes = (0,) + tuple(range(2, x.ndim))
            factor = float(layer.blobs[2].data[0])
            layer.blobs[0].data[...] = x.mean(axis=axes) * rng.uniform(0.8, 1.2, x.shape[1]) * factor
            layer.blobs[1].data[...] = x.var(axis=axes) * rng.uniform(0.5, 2.0, x.shape[1]) * factor
        net.forward_range(index, index)
        if layer.type in ("Convolution", "InnerProduct"):
            spread = float(np.std(netdef.backend.to_host(net.blobs[layer.layer_param.top[0]].data)))
            for blob in layer.blobs:
                blob.data[...] /= spread
            net.forward_range(index, index)


def relative_error(got, expected) -> float:
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(float(np.abs(expected).max()), 1e-30)
    return float(np.abs(np.asarray(got, dtype=np.float64) - expected).max()) / scale


def run_both(net, feeds, outputs=None, model=None):
    """{output: (onnxruntime's, netdef's)} for the same inputs."""
    if model is None:
        model, _ = to_onnx(net, outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(None, feeds)))
    netdef_out = net.forward(blobs=outputs, **feeds)
    # Copies: netdef reuses its arrays from one forward pass to the next.
    return {name: (got[name], np.array(netdef.backend.to_host(netdef_out[name]))) for name in names}


def assert_matches(net, feeds, outputs=None, tolerance=1e-5, model=None):
    pairs = run_both(net, feeds, outputs, model)
    assert pairs, "the graph has no outputs"
    for name, (got, expected) in pairs.items():
        assert got.shape == expected.shape, f"{name}: ONNX shape {got.shape}, netdef {expected.shape}"
        error = relative_error(got, expected)
        assert error <= tolerance, f"{name}: relative error {error:.3g} > {tolerance}"
    return pairs


def tiny_net(text: str, seed: int = 0):
    netdef.set_random_seed(seed)
    net = netdef.Net(text, netdef.TEST)
    randomize_parameters(net, np.random.default_rng(seed))
    return net


def feeds_for(net, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(net.blobs[name].shape) * scale).astype(np.float32) for name in net.inputs}


def check_layer(text: str, seed: int = 0, tolerance=1e-5, scale=1.0):
    net = tiny_net(text, seed)
    return assert_matches(net, feeds_for(net, seed, scale), tolerance=tolerance)


def op_types(model) -> list[str]:
    return [node.op_type for node in model.graph.node]


INPUT = 'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 4 dim: %d dim: %d } } }\n'


def on_input(layer: str, height: int = 7, width: int = 7) -> str:
    return INPUT % (height, width) + layer


# ---------------------------------------------------------------------------------------------- vision
@pytest.mark.parametrize("conv", [
    "num_output: 6 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0 group: 2",
    "num_output: 4 kernel_size: 3 dilation: 2 pad: 2 bias_term: false",
    "num_output: 8 kernel_size: 3 group: 4 pad: 1 stride: 2",   # depthwise, channel multiplier 2
], ids=["grouped-asymmetric", "dilated", "depthwise"])
def test_convolution(conv):
    check_layer(on_input(f'layer {{ name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param {{ {conv} '
                         f'weight_filler {{ type: "gaussian" std: 0.3 }} }} }}'))


def test_deconvolution_with_groups_stride_and_padding():
    check_layer(on_input('layer { name: "d" type: "Deconvolution" bottom: "x" top: "y" convolution_param { '
                         'num_output: 6 kernel_size: 4 stride: 2 pad: 1 group: 2 '
                         'weight_filler { type: "gaussian" std: 0.3 } } }', 5, 6))


POOLS = {
    # ceil mode: ceil((6 - 3) / 2) + 1 = 3 windows, the last one clipped to the input (floor gives 2)
    "max-ceil-clipped": ("MAX", "kernel_size: 3 stride: 2", 6, 6, (3, 3)),
    "ave-ceil-clipped": ("AVE", "kernel_size: 3 stride: 2", 6, 6, (3, 3)),
    # padding: the last window [5, 8) is clipped to the padded extent [-1, 7), so its divisor is 2 x 3
    "ave-padded": ("AVE", "kernel_size: 3 stride: 2 pad: 1", 6, 7, (4, 4)),
    "max-padded": ("MAX", "kernel_size: 3 stride: 2 pad: 1", 6, 7, (4, 4)),
    # Caffe drops the ceil-rounded last window that would start inside the right padding (3 -> 2)
    "ave-dropped-window": ("AVE", "kernel_size: 2 stride: 3 pad: 1", 5, 5, (2, 2)),
    "max-dropped-window": ("MAX", "kernel_size: 2 stride: 3 pad: 1", 5, 5, (2, 2)),
    "ave-asymmetric": ("AVE", "kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 1", 8, 7, (5, 3)),
    "max-floor": ("MAX", "kernel_size: 3 stride: 2 round_mode: FLOOR", 6, 6, (2, 2)),
    "ave-global": ("AVE", "global_pooling: true", 5, 6, (1, 1)),
    "max-global": ("MAX", "global_pooling: true", 5, 6, (1, 1)),
}


@pytest.mark.parametrize("case", list(POOLS))
def test_pooling_matches_caffe_output_size_and_divisor(case):
    method, settings, height, width, out = POOLS[case]
    pairs = check_layer(on_input(f'layer {{ name: "p" type: "Pooling" bottom: "x" top: "y" '
                                 f'pooling_param {{ pool: {method} {settings} }} }}', height, width))
    assert pairs["y"][1].shape[2:] == out, "the case no longer pins the intended Caffe output size"


def test_stochastic_pooling_at_test_is_the_value_weighted_average():
    net = tiny_net(on_input('layer { name: "p" type: "Pooling" bottom: "x" top: "y" '
                            'pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 } }', 6, 6))
    feeds = feeds_for(net)
    feeds["x"] = np.abs(feeds["x"])
    feeds["x"][0, 0] = -1.0  # windows whose sum is not positive give 0
    assert_matches(net, feeds)


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn(region):
    check_layer(on_input(f'layer {{ name: "n" type: "LRN" bottom: "x" top: "y" lrn_param {{ local_size: 3 '
                         f'alpha: 0.5 beta: 0.75 k: 2 norm_region: {region} }} }}'), scale=3.0)


# ---------------------------------------------------------------------------------------------- dense
@pytest.mark.parametrize("settings", ["", "axis: 2 transpose: true", "axis: 0 bias_term: false"])
def test_inner_product(settings):
    check_layer(on_input(f'layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param {{ '
                         f'num_output: 5 {settings} weight_filler {{ type: "gaussian" std: 0.3 }} }} }}', 3, 2))


# ---------------------------------------------------------------------------------------------- neurons
NEURONS = {
    "relu": 'type: "ReLU"',
    "leaky-relu": 'type: "ReLU" relu_param { negative_slope: 0.1 }',
    "prelu": 'type: "PReLU"',
    "prelu-shared": 'type: "PReLU" prelu_param { channel_shared: true }',
    "elu": 'type: "ELU" elu_param { alpha: 0.7 }',
    "sigmoid": 'type: "Sigmoid"',
    "tanh": 'type: "TanH"',
    "absval": 'type: "AbsVal"',
    "power": 'type: "Power" power_param { power: 2 scale: 0.5 shift: 1 }',
    "power-root": 'type: "Power" power_param { power: 0.5 scale: 0.5 shift: 10 }',
    "power-constant": 'type: "Power" power_param { power: 3 scale: 0 shift: 2 }',
    "exp": 'type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1 }',
    "log": 'type: "Log" log_param { base: 10 scale: 0.5 shift: 10 }',
    "bnll": 'type: "BNLL"',
    "threshold": 'type: "Threshold" threshold_param { threshold: 0.3 }',
    "swish": 'type: "Swish" swish_param { beta: 1.5 }',
    "clip": 'type: "Clip" clip_param { min: -0.5 max: 1 }',
    "dropout": 'type: "Dropout" dropout_param { dropout_ratio: 0.3 }',
}


@pytest.mark.parametrize("case", list(NEURONS))
def test_neuron(case):
    # Large inputs (up to ~15) check that BNLL, ELU and Exp stay finite and exact where netdef does.
    check_layer(on_input(f'layer {{ name: "n" {NEURONS[case]} bottom: "x" top: "y" }}', 3, 3), scale=5.0)


# ---------------------------------------------------------------------------------------------- normalization
BATCH_NORM = 'layer { name: "bn" type: "BatchNorm" bottom: "x" top: "n" batch_norm_param { eps: 0.001 } }\n'


def test_batch_norm_without_scale_uses_the_stored_scale_factor():
    net = tiny_net(on_input(BATCH_NORM))
    assert float(net.layers[1].blobs[2].data[0]) != 1.0
    model, _ = to_onnx(net)
    assert op_types(model) == ["BatchNormalization"]
    assert_matches(net, feeds_for(net), model=model)


def test_batch_norm_and_its_scale_become_one_batch_normalization():
    net = tiny_net(on_input(BATCH_NORM + 'layer { name: "s" type: "Scale" bottom: "n" top: "n" '
                                         'scale_param { bias_term: true } }\n'
                                         'layer { name: "r" type: "ReLU" bottom: "n" top: "n" }'))
    model, _ = to_onnx(net)
    assert op_types(model) == ["BatchNormalization", "Relu"]
    assert_matches(net, feeds_for(net), model=model)


def test_scale_is_not_folded_when_another_layer_reads_the_normalized_blob():
    net = tiny_net(on_input('layer { name: "bn" type: "BatchNorm" bottom: "x" top: "n" }\n'
                            'layer { name: "s" type: "Scale" bottom: "n" top: "s" }\n'
                            'layer { name: "sum" type: "Eltwise" bottom: "n" bottom: "s" top: "y" }'))
    model, _ = to_onnx(net)
    assert "Mul" in op_types(model)
    assert_matches(net, feeds_for(net), model=model)


@pytest.mark.parametrize("settings", [
    "axis: 1 num_axes: 2 bias_term: true",     # a (4 x 5) scale over the channel and height axes
    "axis: -1 num_axes: 1",                     # one per column
    "axis: 0 num_axes: -1",                     # one per element
    "num_axes: 0 bias_term: true",              # a scalar
])
def test_scale_broadcasts_like_caffe(settings):
    check_layer(on_input(f'layer {{ name: "s" type: "Scale" bottom: "x" top: "y" scale_param {{ {settings} }} }}', 5, 3))


def test_scale_and_bias_by_a_second_bottom():
    check_layer('layer { name: "in" type: "Input" top: "x" top: "s" top: "b" input_param { '
                'shape { dim: 2 dim: 4 dim: 3 dim: 3 } shape { dim: 4 dim: 3 } shape { dim: 3 } } }\n'
                'layer { name: "scale" type: "Scale" bottom: "x" bottom: "s" top: "y" scale_param { axis: 1 } }\n'
                'layer { name: "bias" type: "Bias" bottom: "y" bottom: "b" top: "z" bias_param { axis: 2 } }')


def test_bias_with_a_learned_blob():
    check_layer(on_input('layer { name: "b" type: "Bias" bottom: "x" top: "y" bias_param { axis: 1 num_axes: 1 } }'))


# ---------------------------------------------------------------------------------------------- combining
@pytest.mark.parametrize("operation", ["SUM coeff: 0.5 coeff: -2 coeff: 1", "PROD", "MAX", "SUM"])
def test_eltwise(operation):
    check_layer(on_input('layer { name: "a" type: "TanH" bottom: "x" top: "a" }\n'
                         'layer { name: "b" type: "Sigmoid" bottom: "x" top: "b" }\n'
                         f'layer {{ name: "e" type: "Eltwise" bottom: "x" bottom: "a" bottom: "b" top: "y" '
                         f'eltwise_param {{ operation: {operation} }} }}'))


def test_concat_slice_and_split():
    """x feeds three layers (netdef inserts a Split), sliced at points on one axis and evenly on
    another, and concatenated back in another order."""
    pairs = check_layer(on_input(
        'layer { name: "s1" type: "Slice" bottom: "x" top: "a" top: "b" top: "c" '
        'slice_param { axis: 1 slice_point: 1 slice_point: 3 } }\n'
        'layer { name: "s2" type: "Slice" bottom: "x" top: "h1" top: "h2" slice_param { slice_dim: 2 } }\n'
        'layer { name: "t" type: "TanH" bottom: "x" top: "t" }\n'
        'layer { name: "cat" type: "Concat" bottom: "c" bottom: "a" bottom: "t" bottom: "b" top: "y" }\n'
        'layer { name: "cat2" type: "Concat" bottom: "h2" bottom: "h1" top: "z" concat_param { axis: -2 } }', 6, 5))
    assert set(pairs) == {"y", "z"}


@pytest.mark.parametrize("reshape", [
    "shape { dim: 0 dim: -1 dim: 7 }",
    "axis: 1 num_axes: 2 shape { dim: -1 }",
    "axis: -2 shape { dim: 0 dim: 1 }",
    "axis: 2 num_axes: 0 shape { dim: 1 }",
], ids=["copy-and-infer", "axis-num_axes", "negative-axis", "insert-axis"])
def test_reshape(reshape):
    check_layer(on_input(f'layer {{ name: "r" type: "Reshape" bottom: "x" top: "y" reshape_param {{ {reshape} }} }}'))


@pytest.mark.parametrize("settings", ["", "axis: 2 end_axis: 3", "axis: 0 end_axis: 1"])
def test_flatten(settings):
    check_layer(on_input(f'layer {{ name: "f" type: "Flatten" bottom: "x" top: "y" flatten_param {{ {settings} }} }}'))


# ---------------------------------------------------------------------------------------------- scores
@pytest.mark.parametrize("axis", [1, 2, -1])
def test_softmax(axis):
    check_layer(on_input(f'layer {{ name: "s" type: "Softmax" bottom: "x" top: "y" softmax_param {{ axis: {axis} }} }}'))


@pytest.mark.parametrize("settings", ["top_k: 3", "top_k: 2 out_max_val: true", "axis: 1 top_k: 2",
                                      "axis: 3 out_max_val: true top_k: 2"])
def test_argmax_orders_ties_as_caffe(settings):
    net = tiny_net(on_input(f'layer {{ name: "a" type: "ArgMax" bottom: "x" top: "y" argmax_param {{ {settings} }} }}',
                            3, 3))
    feeds = feeds_for(net)
    feeds["x"] = np.round(feeds["x"])  # many equal values: Caffe puts the larger index first
    assert_matches(net, feeds, tolerance=0)


# ---------------------------------------------------------------------------------------------- what goes in
SCORING_NET = """
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } shape { dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
layer { name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" }
"""


def test_metrics_and_labels_are_left_out_of_a_scoring_net():
    net = tiny_net(SCORING_NET)
    model, plan = to_onnx(net)
    assert [i.name for i in model.graph.input] == ["data"]
    assert [o.name for o in model.graph.output] == ["prob"]
    assert [layer.name for layer in plan.left_out] == ["accuracy"]
    feeds = feeds_for(net)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (prob,) = session.run(None, {"data": feeds["data"]})
    netdef_prob = net.forward(data=feeds["data"], label=np.zeros(2, np.float32))["prob"]
    assert relative_error(prob, netdef_prob) <= 1e-5


def test_a_net_of_losses_and_metrics_only_is_refused_unless_outputs_are_named():
    net = tiny_net(SCORING_NET.replace('layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }',
                                       'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" '
                                       'top: "loss" }'))
    with pytest.raises(OnnxExportError, match=r"every output of the TEST net \(accuracy, loss\) is a loss or a metric"):
        to_onnx(net)
    model, _ = to_onnx(net, outputs=["ip"])
    assert [o.name for o in model.graph.output] == ["ip"]


def test_a_layer_without_onnx_counterpart_is_named():
    net = tiny_net(on_input('layer { name: "t" type: "TanH" bottom: "x" top: "t" }\n'
                            'layer { name: "sum_up" type: "Reduction" bottom: "t" top: "y" }'))
    with pytest.raises(OnnxExportError, match=r"no ONNX counterpart for layer 'sum_up' \(Reduction\)"):
        to_onnx(net)


def test_an_argmax_mask_top_is_refused_by_name():
    net = tiny_net(on_input('layer { name: "p" type: "Pooling" bottom: "x" top: "y" top: "mask" '
                            'pooling_param { pool: MAX kernel_size: 2 stride: 2 } }'))
    with pytest.raises(OnnxExportError, match=r"layer 'p' \(Pooling\): the second top"):
        to_onnx(net)


def test_in_place_versions_get_their_own_names_and_the_last_keeps_the_blob_name():
    net = tiny_net(on_input('layer { name: "c" type: "Convolution" bottom: "x" top: "c" '
                            'convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }\n'
                            'layer { name: "p" type: "Power" bottom: "c" top: "c" power_param { scale: 2 } }\n'
                            'layer { name: "r" type: "ReLU" bottom: "c" top: "c" }'))
    model, _ = to_onnx(net)
    assert [node.output[0] for node in model.graph.node] == ["c/c", "c/p", "c"]
    assert_matches(net, feeds_for(net), model=model)


def test_the_model_declares_the_opset_and_passes_the_checker():
    model, _ = to_onnx(tiny_net(on_input('layer { name: "r" type: "ReLU" bottom: "x" top: "y" }')))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    onnx.checker.check_model(model, full_check=True)


# ---------------------------------------------------------------------------------------------- zoo nets
def deploy_param(model: str) -> pb.NetParameter:
    """The zoo model's deploy net with batch 1."""
    param = proto_io.read_text(MODELS / model / "deploy.prototxt", pb.NetParameter)
    param.layer[0].input_param.shape[0].dim[0] = 1
    return param


ZOO = {
    "resnet50": lambda: deploy_param("resnet50"),
    "squeezenet": lambda: deploy_param("squeezenet"),
    "mobilenet_v2": lambda: deploy_param("mobilenet_v2"),
    "googlenet": lambda: deploy_param("googlenet"),
    "alexnet": lambda: deploy_param("alexnet"),
}


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_net_runs_in_onnxruntime_as_in_netdef(name):
    netdef.set_random_seed(3)
    net = netdef.Net(ZOO[name](), netdef.TEST)
    randomize_parameters(net, np.random.default_rng(3))
    # The scores before the final Softmax too: a saturated softmax would hide differences.
    last = net.layers[-1]
    assert last.type == "Softmax"
    outputs = net.outputs + list(last.layer_param.bottom)
    feeds = feeds_for(net, seed=3)
    calibrate(net, feeds, np.random.default_rng(3))
    pairs = assert_matches(net, feeds, outputs=outputs, tolerance=1e-4)
    # The scores must depend on the input (by far more than the tolerance), or the comparison would
    # only have checked what every input gives, such as the last layer's bias.
    scores = last.layer_param.bottom[0]
    other = netdef.backend.to_host(net.forward(blobs=[scores], **feeds_for(net, seed=4))[scores])
    assert relative_error(other, pairs[scores][1]) > 1e-3, "the scores hardly depend on the input"


# ---------------------------------------------------------------------------------------------- command line
CLI_NET = """name: "cli"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


def cli(*args, cwd, extra_code=""):
    code = f"{extra_code}import sys; from netdef.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_command_writes_the_model_with_the_given_weights(tmp_path):
    (tmp_path / "net.prototxt").write_text(CLI_NET)
    trained = tiny_net(CLI_NET, seed=5)
    trained.save(tmp_path / "trained.caffemodel")
    done = cli("export-onnx", "-model", "net.prototxt", "--weights=trained.caffemodel", "net.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    model = onnx.load(tmp_path / "net.onnx")
    # The file holds the saved weights, not the fillers': it reproduces the trained net's forward.
    assert_matches(trained, feeds_for(trained), model=model)
    assert "BatchNormalization" in op_types(model)


def test_command_refuses_to_overwrite_and_names_what_it_cannot_export(tmp_path):
    (tmp_path / "net.prototxt").write_text(CLI_NET)
    (tmp_path / "net.onnx").write_text("keep me")
    done = cli("export-onnx", "--model", "net.prototxt", "net.onnx", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "net.onnx exists" in done.stderr and "--overwrite" in done.stderr
    assert (tmp_path / "net.onnx").read_text() == "keep me"
    assert cli("export-onnx", "--model", "net.prototxt", "--overwrite", "net.onnx", cwd=tmp_path).returncode == 0
    onnx.checker.check_model(onnx.load(tmp_path / "net.onnx"))

    (tmp_path / "odd.prototxt").write_text(CLI_NET.replace('type: "Softmax"', 'type: "Reduction"'))
    done = cli("export-onnx", "--model", "odd.prototxt", "odd.onnx", cwd=tmp_path)
    assert done.returncode == 1
    assert "no ONNX counterpart for layer 'prob' (Reduction)" in done.stderr
    assert not (tmp_path / "odd.onnx").exists()


def test_command_names_the_extra_when_onnx_is_missing(tmp_path):
    (tmp_path / "net.prototxt").write_text(CLI_NET)
    # A None entry in sys.modules makes `import onnx` fail as it does where onnx is not installed.
    done = cli("export-onnx", "--model", "net.prototxt", "net.onnx", cwd=tmp_path,
               extra_code="import sys; sys.modules['onnx'] = None; ")
    assert done.returncode == 1
    assert "pip install 'netdef-trainer[onnx]'" in done.stderr
