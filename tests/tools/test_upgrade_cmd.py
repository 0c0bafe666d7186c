"""`netdef upgrade IN OUT` on real legacy files: a V1 caffemodel trained by BVLC Caffe (../shared), and V0
and V1 prototxts written as Caffe's old releases wrote them."""
import subprocess

import numpy as np
import pytest

import netdef
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from tests.helpers import shared_path
from tests.tools.run import run_netdef

V1_NET = """
name: "v1net"
input: "data"
input_dim: 2 input_dim: 1 input_dim: 8 input_dim: 8
layers { name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1" blobs_lr: 1 blobs_lr: 2 weight_decay: 1
         weight_decay: 0 convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layers { name: "relu1" type: RELU bottom: "conv1" top: "conv1" }
layers { name: "pool1" type: POOLING bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "pool1" top: "ip" inner_product_param { num_output: 4 } }
layers { name: "prob" type: SOFTMAX bottom: "ip" top: "prob" }
"""

V0_NET = """
name: "v0net"
input: "data"
input_dim: 1 input_dim: 1 input_dim: 6 input_dim: 6
layers { layer { name: "pad1" type: "padding" pad: 1 } bottom: "data" top: "pad1" }
layers { layer { name: "conv1" type: "conv" num_output: 2 kernelsize: 3 stride: 1 blobs_lr: 1 blobs_lr: 2 }
         bottom: "pad1" top: "conv1" }
layers { layer { name: "pool1" type: "pool" pool: AVE kernelsize: 2 stride: 2 } bottom: "conv1" top: "pool1" }
"""


def upgrade(*args, cwd):
    status, stderr = run_netdef(*args, cwd=cwd)
    return subprocess.CompletedProcess(args, status, "", stderr)


def test_v1_prototxt_becomes_v2_text_with_the_same_meaning(tmp_path):
    (tmp_path / "old.prototxt").write_text(V1_NET)
    done = upgrade("upgrade", "old.prototxt", "new.prototxt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(text net): upgraded to new.prototxt" in done.stderr
    text = (tmp_path / "new.prototxt").read_text()
    assert "layers {" not in text and "input_dim" not in text
    net = proto_io.read_text(tmp_path / "new.prototxt", pb.NetParameter)
    assert [(layer.name, layer.type) for layer in net.layer] == [
        ("input", "Input"), ("conv1", "Convolution"), ("relu1", "ReLU"), ("pool1", "Pooling"),
        ("ip", "InnerProduct"), ("prob", "Softmax")]
    assert list(net.layer[0].input_param.shape[0].dim) == [2, 1, 8, 8]
    conv = net.layer[1]
    assert [(p.lr_mult, p.decay_mult) for p in conv.param] == [(1, 1), (2, 0)]
    old_net = netdef.Net(str(tmp_path / "old.prototxt"), netdef.TEST)
    new_net = netdef.Net(str(tmp_path / "new.prototxt"), netdef.TEST)
    assert {n: b.shape for n, b in old_net.blobs.items()} == {n: b.shape for n, b in new_net.blobs.items()}


def test_v0_prototxt_folds_the_padding_layer(tmp_path):
    (tmp_path / "v0.prototxt").write_text(V0_NET)
    done = upgrade("upgrade", "v0.prototxt", "v2.prototxt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    net = proto_io.read_text(tmp_path / "v2.prototxt", pb.NetParameter)
    assert [layer.type for layer in net.layer] == ["Input", "Convolution", "Pooling"]
    conv = net.layer[1]
    assert list(conv.bottom) == ["data"] and list(conv.convolution_param.pad) == [1]
    assert list(conv.convolution_param.kernel_size) == [3]
    assert net.layer[2].pooling_param.pool == pb.PoolingParameter.AVE
    assert netdef.Net(str(tmp_path / "v2.prototxt"), netdef.TEST).blobs["pool1"].shape == (1, 2, 3, 3)


def test_v1_caffemodel_from_caffe_becomes_v2_binary_with_the_same_weights(tmp_path):
    legacy = shared_path("fixtures", "caffe-models", "cifar10_quick_iter_5000.caffemodel")
    model = shared_path("fixtures", "zoo", "bvlc", "examples", "cifar10", "cifar10_quick.prototxt")
    done = upgrade("upgrade", legacy, "v2.caffemodel", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(binary net): upgraded" in done.stderr
    upgraded = proto_io.read_binary(tmp_path / "v2.caffemodel", pb.NetParameter)
    original = proto_io.read_binary(legacy, pb.NetParameter)
    assert len(original.layers) > 0 and len(original.layer) == 0
    assert len(upgraded.layers) == 0 and len(upgraded.layer) == len(original.layers)
    assert "Convolution" in {layer.type for layer in upgraded.layer}
    from_legacy = netdef.Net(str(model), netdef.TEST, weights=str(legacy))
    from_upgraded = netdef.Net(str(model), netdef.TEST, weights=str(tmp_path / "v2.caffemodel"))
    for name, blobs in from_legacy.params.items():
        for old, new in zip(blobs, from_upgraded.params[name]):
            np.testing.assert_array_equal(old.data, new.data)
    again = upgrade("upgrade", tmp_path / "v2.caffemodel", "v2again.caffemodel", cwd=tmp_path)
    assert again.returncode == 0 and "already in the current format" in again.stderr


def test_an_existing_output_is_kept_unless_overwrite(tmp_path):
    (tmp_path / "old.prototxt").write_text(V1_NET)
    (tmp_path / "mine.prototxt").write_text("precious")
    refused = upgrade("upgrade", "old.prototxt", "mine.prototxt", cwd=tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.strip() == ("netdef: error: mine.prototxt exists; not replacing it "
                                      "(pass --overwrite to replace it)")
    assert (tmp_path / "mine.prototxt").read_text() == "precious"
    forced = upgrade("upgrade", "old.prototxt", "mine.prototxt", "--overwrite", cwd=tmp_path)
    assert forced.returncode == 0 and "layer {" in (tmp_path / "mine.prototxt").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.prototxt", "old.prototxt"]  # no temporary left


@pytest.mark.parametrize("contents, expected", [
    ("layers { name: 'x' type: NO_SUCH_TYPE }", "bad.prototxt:1:"),
    (b"\x0a\x05LeNet\x12\xff\xff", "bad.prototxt: neither a prototxt nor a binary Caffe net"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, contents, expected):
    path = tmp_path / "bad.prototxt"
    path.write_bytes(contents if isinstance(contents, bytes) else contents.encode())
    done = upgrade("upgrade", "bad.prototxt", "out.prototxt", cwd=tmp_path)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert expected in done.stderr, done.stderr
    assert not (tmp_path / "out.prototxt").exists()


def test_legacy_solver_type_enum_becomes_the_type_string(tmp_path):
    (tmp_path / "solver.prototxt").write_text('net: "n.prototxt"\nbase_lr: 0.01\nsolver_type: NESTEROV\n')
    done = upgrade("upgrade", "solver.prototxt", "new_solver.prototxt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    solver = proto_io.read_text(tmp_path / "new_solver.prototxt", pb.SolverParameter)
    assert solver.type == "Nesterov" and not solver.HasField("solver_type")
