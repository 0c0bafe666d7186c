"""The model zoo in models/: every definition builds with the architecture's published shapes and
parameter count, train_val matches deploy, every solver is a valid Caffe recipe, the committed files
are what models/tools/generate.py writes, and cifar10_quick trains for a step.

Deploy nets are built with a batch of 1 (the Input shape is edited in the test); train_val nets with
their Data layers replaced by Input layers of the crop size (a Data layer needs its LMDB). Each net is
built once per model (module-scoped fixtures grouped by model), because filling VGG-16's 138M
parameters takes seconds.

"Learnable parameters" are the blobs the solver updates (lr_mult != 0): convolution and fully connected
weights and biases, and the Scale layers' multiplier and bias after each BatchNorm. BatchNorm's own
blobs (running mean, variance and the moving-average factor) are statistics, not parameters, and are not
counted; they are what torchvision/Keras call non-trainable.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math

import numpy as np
import pytest

import netdef
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from netdef.solver import lr_policy
from netdef.upgrade import upgrade_solver
from tests.helpers import REPO, SHARED

MODELS = REPO / "models"
BVLC = SHARED / "fixtures" / "zoo" / "bvlc" / "models"

IMAGENET_EXTRA_TRAIN = ["loss"]
IMAGENET_EXTRA_TEST = ["accuracy", "accuracy_top5", "loss"]


def _googlenet_aux(i: int, test: bool) -> list[str]:
    names = [f"loss{i}/{n}" for n in ("ave_pool", "conv", "relu_conv", "fc", "relu_fc", "drop_fc", "classifier",
                                      "loss")]
    return names + ([f"loss{i}/top-1", f"loss{i}/top-5"] if test else [])


@dataclasses.dataclass
class Spec:
    classes: int
    input: tuple                      # C, H, W of one image (the crop)
    params: int                       # learnable parameters of deploy.prototxt
    shapes: dict                      # blob: shape (batch 1) in the deploy net
    batch: int                        # images per update: batch_size x iter_size
    val_images: int                   # test_iter x TEST batch_size
    mean_file: bool                   # transform_param reads mean.binaryproto
    extra_train: list = dataclasses.field(default_factory=lambda: list(IMAGENET_EXTRA_TRAIN))
    extra_test: list = dataclasses.field(default_factory=lambda: list(IMAGENET_EXTRA_TEST))
    train_params: int | None = None   # learnable parameters of train_val when it differs from deploy
    bvlc: str | None = None           # the BVLC definition whose parameters (names, shapes) ours must have


def _s(*dims):
    return (1,) + dims


ALEXNET_SHAPES = {"conv1": _s(96, 55, 55), "pool1": _s(96, 27, 27), "conv2": _s(256, 27, 27),
                  "pool2": _s(256, 13, 13), "conv3": _s(384, 13, 13), "conv4": _s(384, 13, 13),
                  "conv5": _s(256, 13, 13), "pool5": _s(256, 6, 6), "fc6": _s(4096), "fc7": _s(4096),
                  "fc8": _s(1000)}

SPECS = {
    "cifar10_quick": Spec(10, (3, 32, 32), 145_578,
                          {"conv1": _s(32, 32, 32), "pool1": _s(32, 16, 16), "conv2": _s(32, 16, 16),
                           "pool2": _s(32, 8, 8), "conv3": _s(64, 8, 8), "pool3": _s(64, 4, 4), "ip1": _s(64),
                           "ip2": _s(10)},
                          batch=100, val_images=10_000, mean_file=True,
                          extra_train=["loss"], extra_test=["accuracy", "loss"]),
    "cifar10_full": Spec(10, (3, 32, 32), 89_578,
                         {"pool1": _s(32, 16, 16), "norm1": _s(32, 16, 16), "pool2": _s(32, 8, 8),
                          "norm2": _s(32, 8, 8), "pool3": _s(64, 4, 4), "ip1": _s(10)},
                         batch=100, val_images=10_000, mean_file=True,
                         extra_train=["loss"], extra_test=["accuracy", "loss"]),
    "alexnet": Spec(1000, (3, 227, 227), 60_965_224, dict(ALEXNET_SHAPES, norm1=_s(96, 55, 55)),
                    batch=256, val_images=50_000, mean_file=True, bvlc="bvlc_alexnet"),
    "caffenet": Spec(1000, (3, 227, 227), 60_965_224, dict(ALEXNET_SHAPES, norm1=_s(96, 27, 27)),
                     batch=256, val_images=50_000, mean_file=True, bvlc="bvlc_reference_caffenet"),
    "vgg16": Spec(1000, (3, 224, 224), 138_357_544,
                  {"conv1_2": _s(64, 224, 224), "pool1": _s(64, 112, 112), "pool2": _s(128, 56, 56),
                   "pool3": _s(256, 28, 28), "pool4": _s(512, 14, 14), "conv5_3": _s(512, 14, 14),
                   "pool5": _s(512, 7, 7), "fc6": _s(4096), "fc7": _s(4096), "fc8": _s(1000)},
                  batch=256, val_images=50_000, mean_file=False),
    "googlenet": Spec(1000, (3, 224, 224), 6_998_552,
                      {"conv1/7x7_s2": _s(64, 112, 112), "pool1/3x3_s2": _s(64, 56, 56), "conv2/3x3": _s(192, 56, 56),
                       "pool2/3x3_s2": _s(192, 28, 28), "inception_3a/output": _s(256, 28, 28),
                       "inception_3b/output": _s(480, 28, 28), "pool3/3x3_s2": _s(480, 14, 14),
                       "inception_4a/output": _s(512, 14, 14), "inception_4d/output": _s(528, 14, 14),
                       "inception_4e/output": _s(832, 14, 14), "pool4/3x3_s2": _s(832, 7, 7),
                       "inception_5a/output": _s(832, 7, 7), "inception_5b/output": _s(1024, 7, 7),
                       "pool5/7x7_s1": _s(1024, 1, 1), "loss3/classifier": _s(1000)},
                      batch=32, val_images=50_000, mean_file=False,
                      extra_train=_googlenet_aux(1, False) + _googlenet_aux(2, False) + ["loss3/loss3"],
                      extra_test=_googlenet_aux(1, True) + _googlenet_aux(2, True)
                      + ["loss3/top-1", "loss3/top-5", "loss3/loss3"],
                      train_params=13_378_280, bvlc="bvlc_googlenet"),
    "resnet50": Spec(1000, (3, 224, 224), 25_557_032,
                     {"conv1": _s(64, 112, 112), "pool1": _s(64, 56, 56), "res2c": _s(256, 56, 56),
                      "res3a_branch2a": _s(128, 28, 28), "res3d": _s(512, 28, 28), "res4f": _s(1024, 14, 14),
                      "res5a_branch1": _s(2048, 7, 7), "res5c": _s(2048, 7, 7), "pool5": _s(2048, 1, 1),
                      "fc1000": _s(1000)},
                     batch=256, val_images=50_000, mean_file=True),
    "resnet101": Spec(1000, (3, 224, 224), 44_549_160,
                      {"conv1": _s(64, 112, 112), "res2c": _s(256, 56, 56), "res3b3": _s(512, 28, 28),
                       "res4b22": _s(1024, 14, 14), "res5c": _s(2048, 7, 7), "pool5": _s(2048, 1, 1),
                       "fc1000": _s(1000)},
                      batch=256, val_images=50_000, mean_file=True),
    "resnet152": Spec(1000, (3, 224, 224), 60_192_808,
                      {"conv1": _s(64, 112, 112), "res2c": _s(256, 56, 56), "res3b7": _s(512, 28, 28),
                       "res4b35": _s(1024, 14, 14), "res5c": _s(2048, 7, 7), "pool5": _s(2048, 1, 1),
                       "fc1000": _s(1000)},
                      batch=256, val_images=50_000, mean_file=True),
    # 227 x 227 input, as DeepScale's definition: conv10 is 14 x 14 (13 x 13 at 224, see below).
    "squeezenet": Spec(1000, (3, 227, 227), 1_235_496,
                       {"conv1": _s(64, 113, 113), "pool1": _s(64, 56, 56), "fire2/concat": _s(128, 56, 56),
                        "fire3/concat": _s(128, 56, 56), "pool3": _s(128, 28, 28), "fire5/concat": _s(256, 28, 28),
                        "pool5": _s(256, 14, 14), "fire9/concat": _s(512, 14, 14), "conv10": _s(1000, 14, 14),
                        "pool10": _s(1000, 1, 1), "flatten": _s(1000)},
                       batch=512, val_images=50_000, mean_file=False),
    # DeepScale's v1.0 release pads conv10 (a 1x1 convolution) by 1: 15 x 15 at 227.
    "squeezenet_v1_0": Spec(1000, (3, 227, 227), 1_248_424,
                            {"conv1": _s(96, 111, 111), "pool1": _s(96, 55, 55), "fire2/concat": _s(128, 55, 55),
                             "fire4/concat": _s(256, 55, 55), "pool4": _s(256, 27, 27),
                             "fire8/concat": _s(512, 27, 27), "pool8": _s(512, 13, 13),
                             "fire9/concat": _s(512, 13, 13), "conv10": _s(1000, 15, 15), "pool10": _s(1000, 1, 1),
                             "flatten": _s(1000)},
                            batch=512, val_images=50_000, mean_file=False),
    "mobilenet": Spec(1000, (3, 224, 224), 4_231_976,
                      {"conv1": _s(32, 112, 112), "conv2_1/dw": _s(32, 112, 112), "conv2_1/sep": _s(64, 112, 112),
                       "conv2_2/dw": _s(64, 56, 56), "conv3_2/sep": _s(256, 28, 28), "conv4_2/sep": _s(512, 14, 14),
                       "conv5_5/sep": _s(512, 14, 14), "conv5_6/dw": _s(512, 7, 7), "conv6/sep": _s(1024, 7, 7),
                       "pool6": _s(1024, 1, 1), "fc7": _s(1000)},
                      batch=256, val_images=50_000, mean_file=False),
    "mobilenet_v2": Spec(1000, (3, 224, 224), 3_504_872,
                         {"conv1": _s(32, 112, 112), "conv2_1/dwise": _s(32, 112, 112), "conv2_1/linear": _s(16, 112, 112),
                          "conv2_2/expand": _s(96, 112, 112), "conv2_2/dwise": _s(96, 56, 56), "block_3_1": _s(24, 56, 56),
                          "conv3_2/linear": _s(32, 28, 28), "block_4_2": _s(32, 28, 28), "block_4_6": _s(64, 14, 14),
                          "conv4_7/linear": _s(96, 14, 14), "block_5_2": _s(96, 14, 14), "block_6_2": _s(160, 7, 7),
                          "conv6_3/linear": _s(320, 7, 7), "conv6_4": _s(1280, 7, 7), "pool6": _s(1280, 1, 1),
                          "fc7": _s(1000)},
                         batch=256, val_images=50_000, mean_file=False),
}
NAMES = list(SPECS)


# ------------------------------------------------------------------------------------------ helpers
def read_net(path) -> pb.NetParameter:
    return proto_io.read_text(path, pb.NetParameter)


def deploy_param(model: str, batch: int = 1, size: int | None = None) -> pb.NetParameter:
    param = read_net(MODELS / model / "deploy.prototxt")
    first = param.layer[0]
    assert first.type == "Input" and first.top == ["data"], f"{model}: deploy must start with the Input 'data'"
    dims = first.input_param.shape[0].dim
    dims[0] = batch
    if size is not None:
        dims[2] = dims[3] = size
    return param


def with_input_layers(param: pb.NetParameter, batch: int) -> pb.NetParameter:
    """train_val with each Data layer replaced by an Input of its batch shape (data: N x 3 x crop x crop,
    label: N), keeping the layer's name and phase rule."""
    out = pb.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for layer in param.layer:
        if layer.type != "Data":
            out.layer.add().CopyFrom(layer)
            continue
        crop = layer.transform_param.crop_size or 32
        repl = out.layer.add(name=layer.name, type="Input", top=layer.top, include=layer.include)
        repl.input_param.shape.add(dim=[batch, 3, crop, crop])
        repl.input_param.shape.add(dim=[batch])
    return out


def learnable_count(net) -> int:
    return sum(b.count for b, lr in zip(net.learnable_params, net.params_lr) if lr != 0)


def layer_names(net) -> list[str]:
    return [name for name, layer in net.layer_dict.items() if layer.type != "Split"]


def param_shapes(net) -> dict:
    return {name: [b.shape for b in blobs] for name, blobs in net.params.items()}


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module", params=NAMES)
def model(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def deploy_net(model):
    netdef.set_random_seed(1)
    return netdef.Net(deploy_param(model), netdef.TEST)


@pytest.fixture(scope="module")
def train_val(model) -> pb.NetParameter:
    return read_net(MODELS / model / "train_val.prototxt")


@pytest.fixture(scope="module")
def train_nets(model, train_val):
    netdef.set_random_seed(1)
    param = with_input_layers(train_val, batch=1)
    return {phase: netdef.Net(param, phase) for phase in (netdef.TRAIN, netdef.TEST)}


# ------------------------------------------------------------------------------------------ files
def _generator():
    spec = importlib.util.spec_from_file_location("zoo_generate", MODELS / "tools" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_prototxts_are_what_the_generator_writes():
    generated = _generator().generate()
    assert sorted({rel.split("/")[0] for rel in generated}) == sorted(NAMES)
    stale = [rel for rel, text in generated.items() if (MODELS / rel).read_text() != text]
    assert not stale, f"run python models/tools/generate.py: {stale} differ from its output"


def test_every_model_folder_is_complete_and_indexed():
    index = (MODELS / "README.md").read_text()
    for model in NAMES + ["lenet", "digits"]:
        assert (MODELS / model / "README.md").is_file(), model
        assert f"]({model}/)" in index, f"models/README.md does not link {model}/"
    for model in NAMES:
        for name in ("train_val.prototxt", "deploy.prototxt", "solver.prototxt"):
            assert (MODELS / model / name).is_file(), f"{model}/{name}"


# ------------------------------------------------------------------------------------------ deploy
def test_deploy_outputs_class_probabilities(model, deploy_net):
    spec = SPECS[model]
    assert deploy_net.inputs == ["data"]
    assert deploy_net.blobs["data"].shape == (1,) + spec.input
    assert deploy_net.outputs == ["prob"]
    assert deploy_net.blobs["prob"].shape == (1, spec.classes)
    assert deploy_net.layer_dict["prob"].type == "Softmax"


def test_deploy_blob_shapes(model, deploy_net):
    for blob, shape in SPECS[model].shapes.items():
        assert deploy_net.blobs[blob].shape == shape, f"{model}: {blob}"


def test_deploy_learnable_parameter_count(model, deploy_net):
    assert learnable_count(deploy_net) == SPECS[model].params


def test_squeezenet_conv10_is_13x13_at_224():
    net = netdef.Net(deploy_param("squeezenet", size=224), netdef.TEST)
    assert net.blobs["conv10"].shape == (1, 1000, 13, 13)
    assert net.blobs["prob"].shape == (1, 1000)


def test_layers_the_architectures_are_known_for(model, deploy_net):
    layers = deploy_net.layer_dict
    if model.startswith("resnet"):
        blocks = {"resnet50": 16, "resnet101": 33, "resnet152": 50}[model]
        convs = [n for n, x in layers.items() if x.type == "Convolution"]
        assert len(convs) == 1 + 3 * blocks + 4  # conv1, the bottlenecks' three, 4 projection shortcuts
        for conv in convs:
            assert not layers[conv].layer_param.convolution_param.bias_term, conv
            after = list(layers)[list(layers).index(conv) + 1:list(layers).index(conv) + 3]
            assert [layers[a].type for a in after] == ["BatchNorm", "Scale"], conv
            assert layers[after[1]].layer_param.scale_param.bias_term, after[1]
        # The authors' Caffe model subsamples in the first 1x1 convolution of a stage, not in the 3x3.
        assert [layers[f"res3a_branch2{b}"].layer_param.convolution_param.stride for b in "abc"] == [[2], [], []]
        sums = [n for n, x in layers.items() if x.type == "Eltwise"]
        assert len(sums) == blocks
        assert all(layers[s].layer_param.eltwise_param.operation == pb.EltwiseParameter.SUM for s in sums)
    elif model in ("mobilenet", "mobilenet_v2"):
        dws = [n for n, x in layers.items() if x.type == "Convolution" and n.endswith(("/dw", "/dwise"))]
        assert len(dws) == (13 if model == "mobilenet" else 17)
        for dw in dws:
            channels = deploy_net.blobs[deploy_net.bottom_names[dw][0]].shape[1]
            cp = layers[dw].layer_param.convolution_param
            assert cp.group == channels == cp.num_output, dw
            assert deploy_net.params[dw][0].shape == (channels, 1, 3, 3)
        if model == "mobilenet_v2":
            # Linear bottlenecks: no ReLU after a projection; the input is added back in 10 blocks.
            relu_inputs = {deploy_net.bottom_names[n][0] for n, x in layers.items() if x.type == "ReLU"}
            assert not [n for n in layers if n.endswith("/linear") and n in relu_inputs]
            assert len([n for n, x in layers.items() if x.type == "Eltwise"]) == 10
    elif model.startswith("squeezenet"):
        first = (64, 3) if model == "squeezenet" else (96, 7)
        assert deploy_net.params["conv1"][0].shape[::2] == first
        fires = [n for n in layers if n.endswith("/concat")]
        assert len(fires) == 8
        for concat in fires:
            fire = concat.split("/")[0]
            assert layers[concat].type == "Concat"
            assert deploy_net.bottom_names[concat] == [f"{fire}/expand1x1", f"{fire}/expand3x3"]
            assert [deploy_net.params[f"{fire}/expand{k}"][0].shape[2] for k in ("1x1", "3x3")] == [1, 3]
    elif model == "googlenet":
        assert not [n for n in layers if n.startswith(("loss1", "loss2"))], "auxiliary classifiers belong in training"
        assert len([n for n, x in layers.items() if x.type == "Concat"]) == 9
    elif model in ("alexnet", "caffenet"):
        assert [layers[c].layer_param.convolution_param.group for c in ("conv1", "conv2", "conv3", "conv4", "conv5")] \
            == [1, 2, 1, 2, 2]
        order = list(layers)
        assert (order.index("pool1") < order.index("norm1")) == (model == "caffenet")
    elif model == "vgg16":
        convs = [x.layer_param.convolution_param for x in layers.values() if x.type == "Convolution"]
        assert len(convs) == 13
        assert all((c.kernel_size, c.pad, c.stride) == ([3], [1], []) for c in convs)
        pools = [x.layer_param.pooling_param for x in layers.values() if x.type == "Pooling"]
        assert [(q.pool, q.kernel_size, q.stride) for q in pools] == [(pb.PoolingParameter.MAX, 2, 2)] * 5
    elif model.startswith("cifar10"):
        pools = [layers[f"pool{i}"].layer_param.pooling_param.pool for i in (1, 2, 3)]
        assert pools == [pb.PoolingParameter.MAX, pb.PoolingParameter.AVE, pb.PoolingParameter.AVE]
        norms = [n for n, x in layers.items() if x.type == "LRN"]
        assert norms == ([] if model == "cifar10_quick" else ["norm1", "norm2"])
        assert all(layers[n].layer_param.lrn_param.norm_region == pb.LRNParameter.WITHIN_CHANNEL for n in norms)
    else:
        pytest.fail(f"no architecture check for {model}")


@pytest.mark.parametrize("model", [m for m in NAMES if SPECS[m].bvlc], indirect=True)
def test_parameters_match_the_bvlc_release(model, deploy_net):
    """Same layers, blobs and parameter shapes as the BVLC definition: its .caffemodel loads by name."""
    path = BVLC / SPECS[model].bvlc / "deploy.prototxt"
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared (BVLC model zoo fixtures) is not beside this checkout")
    reference = netdef.Net(str(path), netdef.TEST)
    assert param_shapes(deploy_net) == param_shapes(reference)
    assert layer_names(deploy_net) == layer_names(reference)
    assert list(deploy_net.blobs) == list(reference.blobs)


# ------------------------------------------------------------------------------------------ train_val
@pytest.mark.parametrize("phase", [netdef.TRAIN, netdef.TEST], ids=["TRAIN", "TEST"])
def test_train_val_layers_are_deploys_plus_loss_and_accuracy(model, deploy_net, train_nets, phase):
    spec = SPECS[model]
    net = train_nets[phase]
    body = [n for n in layer_names(deploy_net) if n not in ("data", "prob")]
    names = layer_names(net)
    assert names[0] == "data" and net.layer_dict["data"].type == "Input"
    assert [n for n in names[1:] if n in body] == body, "train_val's layers, in order, must be deploy's"
    extra = [n for n in names[1:] if n not in body]
    assert extra == (spec.extra_train if phase == netdef.TRAIN else spec.extra_test)
    accuracies = [n for n in names if net.layer_dict[n].type == "Accuracy"]
    assert bool(accuracies) == (phase == netdef.TEST)


@pytest.mark.parametrize("phase", [netdef.TRAIN, netdef.TEST], ids=["TRAIN", "TEST"])
def test_train_val_parameters_are_deploys(model, deploy_net, train_nets, phase):
    """Trained weights load into deploy.prototxt: every deploy layer has the same parameter shapes."""
    net = train_nets[phase]
    spec = SPECS[model]
    assert learnable_count(net) == (spec.train_params or spec.params)
    shapes = param_shapes(net)
    for name, deploy_shapes in param_shapes(deploy_net).items():
        assert shapes[name] == deploy_shapes, name
    assert net.outputs and all(net.blobs[o].shape == () for o in net.outputs)


def test_train_val_loss_weights(model, train_nets):
    weights = {k: v for k, v in train_nets[netdef.TRAIN].blob_loss_weights.items() if v}
    if model == "googlenet":
        assert weights == {"loss1/loss1": pytest.approx(0.3), "loss2/loss2": pytest.approx(0.3), "loss3/loss3": 1.0}
    else:
        assert weights == {"loss": 1.0}


def test_train_val_data_layers(model, train_val):
    spec = SPECS[model]
    data = [layer for layer in train_val.layer if layer.type == "Data"]
    assert [(d.include[0].phase, d.data_param.source) for d in data] == [(pb.TRAIN, "train_lmdb"),
                                                                        (pb.TEST, "val_lmdb")]
    for d in data:
        t = d.transform_param
        assert d.data_param.backend == pb.DataParameter.LMDB
        assert list(d.top) == ["data", "label"]
        assert t.mirror == (d.include[0].phase == pb.TRAIN and spec.classes == 1000)
        assert (t.crop_size or 32) == spec.input[1]
        assert (t.mean_file == "mean.binaryproto") == spec.mean_file
        assert spec.mean_file or len(t.mean_value) == 3


# Running the big nets (AlexNet, VGG-16, ResNet-50) would cost seconds each; their shapes are checked above.
@pytest.mark.parametrize("model", ["cifar10_quick", "cifar10_full", "googlenet", "squeezenet", "squeezenet_v1_0",
                                   "mobilenet", "mobilenet_v2"],
                         indirect=True)
def test_train_forward_runs(model, train_nets):
    """A TRAIN forward at batch 1 (BatchNorm on batch statistics, dropout on) gives finite losses."""
    spec = SPECS[model]
    net = train_nets[netdef.TRAIN]
    x = np.random.default_rng(0).normal(0, 50, (1,) + spec.input).astype(np.float32)
    out = net.forward(data=x, label=np.array([3], dtype=np.float32))
    assert set(out) == {n for n, w in net.blob_loss_weights.items() if w}
    for name, value in out.items():
        assert np.isfinite(value) and float(value) > 0, name
    # Fresh fillers score about uniformly: the final loss is near log(classes).
    final = "loss3/loss3" if model == "googlenet" else "loss"
    assert abs(float(out[final]) - math.log(spec.classes)) < 0.25 * math.log(spec.classes)


# ------------------------------------------------------------------------------------------ solvers
def test_solver(model, train_val):
    spec = SPECS[model]
    path = MODELS / model / "solver.prototxt"
    solver = upgrade_solver(proto_io.read_text(path, pb.SolverParameter))
    lr_policy.validate(solver)
    assert solver.net == "train_val.prototxt" and (path.parent / solver.net).is_file()
    assert solver.snapshot_prefix == model
    assert solver.solver_mode == pb.SolverParameter.CPU
    assert solver.type == "SGD" and 0 < solver.base_lr <= 0.1 + 1e-6 and solver.momentum == pytest.approx(0.9)
    assert solver.max_iter > 0 and all(0 < s < solver.max_iter for s in solver.stepvalue)
    assert list(solver.stepvalue) == sorted(solver.stepvalue)
    batches = {d.include[0].phase: d.data_param.batch_size for d in train_val.layer if d.type == "Data"}
    assert batches[pb.TRAIN] * solver.iter_size == spec.batch
    assert solver.test_iter[0] * batches[pb.TEST] == spec.val_images


# ------------------------------------------------------------------------------------------ training
def test_cifar10_quick_trains_a_step():
    """A real TRAIN forward and backward of cifar10_quick's train_val, then one SGD step lowers the loss."""
    netdef.set_random_seed(3)
    param = with_input_layers(read_net(MODELS / "cifar10_quick" / "train_val.prototxt"), batch=8)
    net = netdef.Net(param, netdef.TRAIN)
    rng = np.random.default_rng(0)
    x = rng.normal(0, 40, (8, 3, 32, 32)).astype(np.float32)   # mean-subtracted pixels
    y = np.arange(8, dtype=np.float32) % 10
    loss = float(net.forward(data=x, label=y)["loss"])
    assert abs(loss - math.log(10)) < 0.05   # tiny initial weights: near-uniform scores
    net.clear_param_diffs()
    net.backward()
    for name, blobs in net.params.items():
        for j, b in enumerate(blobs):
            assert np.isfinite(b.diff).all(), f"{name}[{j}]"
            assert np.abs(b.diff).max() > 0, f"{name}[{j}] got no gradient"
    for b in net.learnable_params:
        b.data[...] -= 0.01 * b.diff
    assert float(net.forward(data=x, label=y)["loss"]) < loss
