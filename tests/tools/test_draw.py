"""`netdef draw`: the DOT text of a net, its rendering by the real Graphviz, and the message when Graphviz's
dot program is missing."""
import os
import shutil
import subprocess
import sys

import pytest

import netdef
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from netdef.tools.draw import DOT_MISSING, net_to_dot
from tests.helpers import REPO
from tests.tools.run import run_netdef

NET = """
name: "small"
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        data_param { source: "nowhere_lmdb" batch_size: 8 } }
layer { name: "input" type: "Input" top: "data" top: "label" include { phase: TEST }
        input_param { shape { dim: 1 dim: 3 dim: 32 dim: 32 } shape { dim: 1 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 16 kernel_size: 5 stride: 2 pad: 1 } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool1" top: "ip" inner_product_param { num_output: 10 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot program is not installed (apt-get install graphviz)")


def small_net() -> pb.NetParameter:
    return proto_io.parse_text(NET, pb.NetParameter())


def node_labels(dot: str) -> list[str]:
    return [line.split('label="', 1)[1].rsplit('"', 1)[0] for line in dot.splitlines() if 'label="' in line]


def test_layers_are_boxes_with_their_parameters_and_in_place_layers_join_their_producer():
    dot = net_to_dot(small_net(), rankdir="TB")
    assert "rankdir=TB;" in dot
    labels = node_labels(dot)
    assert r"conv1\n(Convolution)\n5x5 stride 2 pad 1\n16 outputs\n+ bn1 (BatchNorm)\n+ relu1 (ReLU)" in labels
    assert r"pool1\n(Pooling)\nAVE 3x3 stride 2" in labels
    assert r"ip\n(InnerProduct)\n10 outputs" in labels
    # One octagon per blob: conv1's in-place layers add no node and no edge back to the blob.
    assert sorted(label for label in labels if "(" not in label) == ["conv1", "data", "ip", "label", "loss", "pool1"]
    assert dot.count("shape=octagon") == 6 and dot.count("shape=box") == 6
    assert dot.count("->") == 2 + 2 + 2 + 2 + 2 + 3  # data, input, conv1, pool1, ip, loss


def test_phase_keeps_the_layers_of_that_phase():
    test_labels = node_labels(net_to_dot(small_net(), phase=netdef.TEST))
    assert r"input\n(Input)" in test_labels and not any(label.startswith(r"data\n(Data)") for label in test_labels)
    all_labels = node_labels(net_to_dot(small_net()))
    assert r"input\n(Input)" in all_labels and r"data\n(Data)" in all_labels


@needs_dot
def test_draw_renders_png_svg_and_pdf_with_graphviz(tmp_path):
    (tmp_path / "small.prototxt").write_text(NET)
    for name, magic in (("small.png", b"\x89PNG\r\n\x1a\n"), ("small.pdf", b"%PDF-"), ("small.svg", b"<?xml")):
        status, stderr = run_netdef("draw", "small.prototxt", name, "--phase=TEST", cwd=tmp_path)
        assert status == 0, stderr
        assert (tmp_path / name).read_bytes().startswith(magic)
    svg = (tmp_path / "small.svg").read_text()
    assert ">5x5 stride 2 pad 1</text>" in svg and ">+ relu1 (ReLU)</text>" in svg and ">input</text>" in svg
    assert "nowhere_lmdb" not in svg and ">data</text>" in svg


@needs_dot
def test_draw_googlenet_from_the_zoo(tmp_path):
    status, stderr = run_netdef("draw", REPO / "models" / "googlenet" / "train_val.prototxt", "googlenet.svg",
                                "--rankdir=TB", cwd=tmp_path)
    assert status == 0, stderr
    svg = (tmp_path / "googlenet.svg").read_text()
    assert svg.count("inception_5b/output") >= 2 and ">7x7 stride 2 pad 3</text>" in svg


def test_existing_output_and_unknown_format_are_refused(tmp_path):
    (tmp_path / "small.prototxt").write_text(NET)
    (tmp_path / "mine.png").write_bytes(b"precious")
    status, stderr = run_netdef("draw", "small.prototxt", "mine.png", cwd=tmp_path)
    assert status == 1 and stderr.strip() == ("netdef: error: mine.png exists; not replacing it "
                                              "(pass --overwrite to replace it)")
    assert (tmp_path / "mine.png").read_bytes() == b"precious"
    status, stderr = run_netdef("draw", "small.prototxt", "net.gif", cwd=tmp_path)
    assert status == 1 and "net.gif: the file name must end in one of .png, .svg, .pdf, .dot" in stderr
    status, stderr = run_netdef("draw", "small.prototxt", "net.dot", cwd=tmp_path)
    assert status == 0 and (tmp_path / "net.dot").read_text().startswith('digraph "small" {')


def test_missing_dot_is_one_line_naming_graphviz(tmp_path):
    (tmp_path / "small.prototxt").write_text(NET)
    empty = tmp_path / "bin"
    empty.mkdir()
    env = dict(os.environ, PATH=str(empty), PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "draw", "small.prototxt", "small.png"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip() == f"netdef: error: {DOT_MISSING}"
    assert "graphviz" in DOT_MISSING and not (tmp_path / "small.png").exists()
