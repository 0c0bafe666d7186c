"""CUDA graphs of a net's passes (netdef/net_graphs.py), what the CPU can check: which stretches of a
net would be replayed and which run eagerly, that a one-process solver leaves its net free of hooks
(so that graphs apply) and a distributed one does not, and that asking for graphs where they cannot
apply trains exactly as without them and says why, once. The recordings and replays themselves run
on a GPU: tests/test_gpu_graphs.py."""
from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np

import netdef
from netdef import net_graphs
from netdef.solver.arrival import GradientExchange

NET = """
name: "graphs"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 4 dim: 2 dim: 6 dim: 6 } shape { dim: 4 }
                           data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "drop" type: "Dropout" bottom: "pool" top: "pool" dropout_param { dropout_ratio: 0.5 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool" top: "ip1" inner_product_param { num_output: 6 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

SOLVER = ('base_lr: 0.1 momentum: 0.9 weight_decay: 0.0005 lr_policy: "fixed" max_iter: 6 display: 0 '
          'random_seed: 5 solver_mode: CPU net_param { ' + NET + " }")


def named_runs(net, runs) -> list[tuple[str, str, bool]]:
    return [(net.layers[a].name, net.layers[b].name, replayable) for a, b, replayable in runs]


def test_a_pass_splits_into_replayable_stretches_between_the_layers_that_are_not():
    net = netdef.Net(NET, netdef.TRAIN)
    graphs = net_graphs.PassGraphs(net)
    last = len(net.layers) - 1
    # The data layer refills its top from the host's generator, Dropout draws its mask, and the loss
    # is read on the host: each runs eagerly, the stretches between them replay.
    assert named_runs(net, graphs.forward_runs(0, last)) == [
        ("data", "data", False), ("conv", "pool", True), ("drop", "drop", False), ("ip1", "ip2", True),
        ("loss", "loss", False)]
    # Backward, the data layer has nothing to run and joins the stretch above it.
    assert named_runs(net, graphs.backward_runs(last, 0)) == [
        ("loss", "loss", False), ("ip2", "ip1", True), ("drop", "drop", False), ("pool", "data", True)]


def test_a_recording_lets_go_of_what_its_run_makes_and_keeps_what_it_is_given():
    net = netdef.Net(NET, netdef.TRAIN)
    graphs = net_graphs.PassGraphs(net)
    index = {layer.name: li for li, layer in enumerate(net.layers)}

    def made(direction, first, last):
        return sorted(blob.name for blob in graphs._written_first(direction, range(index[first], index[last] + 1)))

    # Forward, conv..pool reads the data layer's top and makes conv (ReLU works on it in place) and
    # pool; backward, it is given pool's gradient and makes conv's (the data gets none).
    assert made("forward", "conv", "pool") == ["conv", "pool"]
    assert made("backward", "conv", "pool") == ["conv"]
    # ip1..ip2 is given the dropout's output (pool, in place) and makes ip1 and ip2; backward it is
    # given ip2's gradient and makes ip1's and pool's.
    assert made("forward", "ip1", "ip2") == ["ip1", "ip2"]
    assert made("backward", "ip1", "ip2") == ["ip1", "pool"]


def test_a_top_weighted_into_the_loss_keeps_its_forward_eager():
    # ip1's top both feeds relu1 and counts in the loss: the Split that Caffe inserts holds the
    # weighted copy, and the loss it adds up is read on the host.
    weighted = (NET.replace('top: "ip1" inner_product_param', 'top: "ip1" loss_weight: 0.5 inner_product_param')
                .replace('bottom: "ip1" top: "ip1" }', 'bottom: "ip1" top: "r1" }').replace('bottom: "ip1" top: "ip2"',
                                                                                         'bottom: "r1" top: "ip2"'))
    net = netdef.Net(weighted, netdef.TRAIN)
    runs = named_runs(net, net_graphs.PassGraphs(net).forward_runs(0, len(net.layers) - 1))
    split = next(layer.name for layer in net.layers if layer.type == "Split")
    assert runs[2:] == [("drop", "drop", False), ("ip1", "ip1", True), (split, split, False),
                        ("relu1", "ip2", True), ("loss", "loss", False)]


def test_a_users_python_layer_is_never_replayed(tmp_path, monkeypatch):
    (tmp_path / "passthrough.py").write_text(
        "import netdef\n"
        "class Pass(netdef.Layer):\n"
        "    def setup(self, bottom, top): pass\n"
        "    def reshape(self, bottom, top): top[0].reshape(*bottom[0].shape)\n"
        "    def forward(self, bottom, top): top[0].data = bottom[0].data\n"
        "    def backward(self, top, propagate_down, bottom): bottom[0].diff = top[0].diff\n")
    text = NET.replace('layer { name: "relu1"', 'layer { name: "py" type: "Python" bottom: "ip1" top: "ip1" '
                       'python_param { module: "passthrough" layer: "Pass" } }\nlayer { name: "relu1"')
    net = netdef.Net(text, netdef.TRAIN, python_path=str(tmp_path))
    runs = named_runs(net, net_graphs.PassGraphs(net).forward_runs(0, len(net.layers) - 1))
    assert ("ip1", "ip1", True) in runs and ("py", "py", False) in runs and ("relu1", "ip2", True) in runs


def test_only_layers_whose_passes_read_nothing_back_are_replayable():
    net = netdef.Net(NET.replace('pool: MAX', 'pool: STOCHASTIC'), netdef.TRAIN)
    replayable = {layer.name: layer.replayable() for layer in net.layers}
    assert replayable == {"data": False, "conv": True, "relu": True, "pool": False, "drop": False,
                          "ip1": True, "relu1": True, "ip2": True, "loss": False}


def test_a_one_process_solver_leaves_its_net_without_hooks_and_an_exchange_adds_them():
    solver = netdef.get_solver(SOLVER)
    assert not solver.net.has_hooks()  # graphs can apply
    solver.updates.connect(GradientExchange())
    assert solver.net.has_hooks()  # a distributed exchange hands gradients over between layers


def _trained(cuda_graphs: bool) -> dict:
    solver = netdef.get_solver(SOLVER)
    solver.net.cuda_graphs = cuda_graphs
    assert bool(solver.net.cuda_graphs) == cuda_graphs
    solver.step(6)
    return {f"{name}/{i}": netdef.backend.to_host(blob.data).copy()
            for name, blobs in solver.net.params.items() for i, blob in enumerate(blobs)}


def test_graphs_asked_for_on_the_cpu_train_exactly_as_without_and_the_log_says_why_once(caplog):
    without = _trained(False)
    with caplog.at_level(logging.INFO, logger="netdef"):
        asked = _trained(True)
    for key, value in without.items():
        np.testing.assert_array_equal(asked[key], value, err_msg=key)
    said = [r.getMessage() for r in caplog.records if "CUDA graphs not used" in r.getMessage()]
    assert said == ["Net graphs: CUDA graphs not used: they need a GPU (the net runs on the CPU)"]


def test_train_takes_the_cuda_graphs_flag(tmp_path):
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "train", "solver.prototxt", "--cuda_graphs"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CUDA graphs not used: they need a GPU" in done.stderr
