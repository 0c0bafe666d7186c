"""Every prototxt of BVLC Caffe's examples and model zoo parses; every net whose inputs are declared
builds in both phases with the blob shapes Caffe computes."""

import pytest

import netdef
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from netdef.upgrade import upgrade_net, upgrade_solver
from tests.helpers import SHARED

ZOO = SHARED / "fixtures" / "zoo" / "bvlc"
ALL = sorted(str(p.relative_to(ZOO)) for p in ZOO.rglob("*.prototxt")) if ZOO.exists() else []
DATA_SOURCES = {"Data", "ImageData", "HDF5Data", "WindowData"}


def _require_zoo():
    if not ZOO.exists():
        pytest.skip(f"{ZOO} is absent: ../shared (BVLC model zoo fixtures) is not beside this checkout")


def test_the_zoo_is_there():
    _require_zoo()
    assert len(ALL) >= 50


def _is_solver(text: str) -> bool:
    return any(key in text for key in ("base_lr", "max_iter", "lr_policy"))


@pytest.mark.parametrize("rel", ALL)
def test_every_prototxt_parses(rel):
    text = (ZOO / rel).read_text()
    if _is_solver(text):
        solver = upgrade_solver(proto_io.read_text(ZOO / rel, pb.SolverParameter))
        if solver.HasField("net_param"):
            upgrade_net(solver.net_param, rel)
            assert solver.net_param.layer
        return
    net = upgrade_net(proto_io.read_text(ZOO / rel, pb.NetParameter), rel)
    assert net.layer, f"{rel} has no layers"


def _declared_inputs(rel) -> bool:
    text = (ZOO / rel).read_text()
    if _is_solver(text):
        return False
    net = upgrade_net(proto_io.read_text(ZOO / rel, pb.NetParameter), rel)
    types = {layer.type for layer in net.layer}
    return not (types & DATA_SOURCES) and "Python" not in types


BUILDABLE = [rel for rel in ALL if _declared_inputs(rel)]


@pytest.mark.parametrize("rel", BUILDABLE)
@pytest.mark.parametrize("phase", [netdef.TRAIN, netdef.TEST])
def test_declared_input_nets_build_in_both_phases(rel, phase):
    net = netdef.Net(str(ZOO / rel), phase)
    assert net.layers
    for name, blob in net.blobs.items():
        assert all(d > 0 for d in blob.shape) or blob.shape == (), f"{rel}: blob {name} has shape {blob.shape}"


EXPECTED = {
    "models/bvlc_alexnet/deploy.prototxt": {
        "conv1": (10, 96, 55, 55), "pool1": (10, 96, 27, 27), "conv2": (10, 256, 27, 27), "pool2": (10, 256, 13, 13),
        "conv3": (10, 384, 13, 13), "conv5": (10, 256, 13, 13), "pool5": (10, 256, 6, 6), "fc6": (10, 4096),
        "fc8": (10, 1000), "prob": (10, 1000)},
    "models/bvlc_reference_caffenet/deploy.prototxt": {
        "conv1": (10, 96, 55, 55), "pool1": (10, 96, 27, 27), "norm1": (10, 96, 27, 27), "conv2": (10, 256, 27, 27),
        "pool5": (10, 256, 6, 6), "fc7": (10, 4096), "prob": (10, 1000)},
    "models/bvlc_googlenet/deploy.prototxt": {
        "conv1/7x7_s2": (10, 64, 112, 112), "pool1/3x3_s2": (10, 64, 56, 56), "conv2/3x3": (10, 192, 56, 56),
        "pool2/3x3_s2": (10, 192, 28, 28), "inception_3a/output": (10, 256, 28, 28),
        "inception_3b/output": (10, 480, 28, 28), "pool3/3x3_s2": (10, 480, 14, 14),
        "inception_4a/output": (10, 512, 14, 14), "inception_4b/output": (10, 512, 14, 14),
        "inception_4c/output": (10, 512, 14, 14), "inception_4d/output": (10, 528, 14, 14),
        "inception_4e/output": (10, 832, 14, 14), "pool4/3x3_s2": (10, 832, 7, 7),
        "inception_5a/output": (10, 832, 7, 7), "inception_5b/output": (10, 1024, 7, 7),
        "pool5/7x7_s1": (10, 1024, 1, 1), "loss3/classifier": (10, 1000), "prob": (10, 1000)},
    "examples/mnist/lenet.prototxt": {
        "conv1": (64, 20, 24, 24), "pool1": (64, 20, 12, 12), "conv2": (64, 50, 8, 8), "pool2": (64, 50, 4, 4),
        "ip1": (64, 500), "prob": (64, 10)},
    "examples/cifar10/cifar10_quick.prototxt": {
        "conv1": (1, 32, 32, 32), "pool1": (1, 32, 16, 16), "conv3": (1, 64, 8, 8), "pool3": (1, 64, 4, 4),
        "ip1": (1, 64), "prob": (1, 10)},
    "examples/net_surgery/bvlc_caffenet_full_conv.prototxt": {
        "pool5": (1, 256, 13, 13), "fc6-conv": (1, 4096, 8, 8), "fc8-conv": (1, 1000, 8, 8), "prob": (1, 1000, 8, 8)},
}


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_blob_shapes_are_the_ones_caffe_computes(rel):
    _require_zoo()
    net = netdef.Net(str(ZOO / rel), netdef.TEST)
    for name, shape in EXPECTED[rel].items():
        assert net.blobs[name].shape == shape, f"{rel}: {name}"
