"""CUDA graphs of a net's passes (netdef/net_graphs.py), what the CPU can check: which stretches of a
net would be replayed and which run eagerly, that a one-process solver leaves its net free of hooks
and a distributed one's hooks run at the stretches' edges (cut where its buckets close), that a hook of
every layer keeps the net eager, and that asking for graphs where they cannot apply trains exactly as
without them and says why, once. The recordings and replays themselves run
on a GPU: tests/test_gpu_graphs.py."""
from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import types

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


def test_a_one_process_solver_leaves_its_net_without_hooks_and_an_exchange_adds_them_at_run_edges():
    solver = netdef.get_solver(SOLVER)
    assert not solver.net.has_hooks()
    solver.updates.connect(GradientExchange())
    assert solver.net.has_hooks()  # a distributed exchange hands gradients over between layers ...
    assert not solver.net.hooks.need_every_layer()  # ... and may do so between replayed stretches


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


def test_train_and_test_take_the_cuda_graphs_flag(tmp_path):
    (tmp_path / "solver.prototxt").write_text(SOLVER.replace("max_iter: 6", "max_iter: 6 snapshot_prefix: \"snap\""))
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "train", "solver.prototxt", "--cuda_graphs"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CUDA graphs not used: they need a GPU" in done.stderr
    (tmp_path / "net.prototxt").write_text(NET)
    scored = subprocess.run([sys.executable, "-m", "netdef.cli", "test", "--model", "net.prototxt", "--weights",
                             "snap_iter_6.caffemodel", "--iterations", "2", "--cuda_graphs"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert "CUDA graphs not used: they need a GPU" in scored.stderr


# ------------------------------------------------------------------ recordings, through a stand-in
class StandInCupy:
    """The few CuPy calls a recording makes, for a test of the bookkeeping on the CPU. Its capture
    either refuses to start (``refusal``), as CUDA does for work it cannot capture, or records nothing
    while the pass's NumPy work runs as usual; a graph's launch is only counted. No values come from
    it: the recordings themselves run on a GPU (tests/test_gpu_graphs.py)."""

    def __init__(self, refusal: str | None = None, events: list | None = None, refuse_from: int = 0):
        self.refusal = refusal
        self.refuse_from = refuse_from  # how many captures succeed before ``refusal`` applies
        self.capture_attempts = 0
        self.events = events  # where each launch is noted, in order with what else a test notes there
        self.captures = 0
        self.launches = 0
        self.cached_blocks_released = 0
        stand_in = self

        class Pool:
            def malloc(self, size):
                raise AssertionError("NumPy arrays are not allocated from a CuPy pool")

            def total_bytes(self):
                return 0

            def free_all_blocks(self):
                stand_in.cached_blocks_released += 1

        class Graph:
            def launch(self, stream):
                stand_in.launches += 1
                if stand_in.events is not None:
                    stand_in.events.append(("launch",))

        class Stream:
            def __init__(self, non_blocking=False):
                assert non_blocking, "the legacy stream cannot be captured"

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def begin_capture(self):
                stand_in.capture_attempts += 1
                if stand_in.refusal and stand_in.capture_attempts > stand_in.refuse_from:
                    raise RuntimeError(stand_in.refusal)

            def end_capture(self):
                stand_in.captures += 1
                return Graph()

        self.cuda = types.SimpleNamespace(MemoryPool=Pool, Stream=Stream, get_current_stream=lambda: None,
                                          using_allocator=lambda malloc: contextlib.nullcontext())
        self.get_default_memory_pool = Pool


def _solver_with_stand_in(stand_in, text=SOLVER):
    solver = netdef.get_solver(text)
    solver.net.cuda_graphs = net_graphs.PassGraphs(solver.net, cupy=stand_in)
    return solver


def test_a_recording_cuda_refuses_leaves_each_run_eager_for_good_and_says_why_once(caplog):
    without = _trained(False)
    stand_in = StandInCupy(refusal="operation not permitted when stream is capturing")
    solver = _solver_with_stand_in(stand_in)
    with caplog.at_level(logging.WARNING, logger="netdef"):
        solver.step(6)
    said = [r.getMessage() for r in caplog.records if "without a CUDA graph" in r.getMessage()]
    # Each replayable run tried once, at its third pass, then ran eagerly.
    why = ": recording them failed (RuntimeError: operation not permitted when stream is capturing)"
    # The backward of a stretch whose forward ran eagerly runs eagerly too (nothing recorded may read
    # what an eager forward kept for backward): it is never tried.
    assert said == [f"Net graphs: layers conv..pool run forward without a CUDA graph{why}",
                    f"Net graphs: layers ip1..ip2 run forward without a CUDA graph{why}"], said
    assert stand_in.launches == 0 and solver.net.cuda_graphs.replayed() == []
    assert [refusal[:3] for refusal in solver.net.cuda_graphs.refused()] == [
        ("forward", "conv", "pool"), ("forward", "ip1", "ip2")]
    for name, blobs in solver.net.params.items():  # every blob restored before the eager pass
        for i, blob in enumerate(blobs):
            np.testing.assert_array_equal(blob.data, without[f"{name}/{i}"], err_msg=f"{name}/{i}")
    # Forward recorded, backward refused: each said once, and the forward of those layers goes eager
    # too (their backward reads what their forward keeps, which a replay writes into the recording's
    # arrays, not those the layers last held, where a run has several recordings).
    caplog.clear()
    stand_in = StandInCupy(refusal="operation not permitted when stream is capturing", refuse_from=2)
    solver = _solver_with_stand_in(stand_in)
    with caplog.at_level(logging.WARNING, logger="netdef"):
        solver.step(6)
    said = [r.getMessage() for r in caplog.records if "without a CUDA graph" in r.getMessage()]
    assert said == [f"Net graphs: layers ip2..ip1 run backward without a CUDA graph{why}",
                    "Net graphs: layers ip1..ip2 run forward without a CUDA graph from now on: the backward stretch "
                    "ip2..ip1 runs eagerly",
                    f"Net graphs: layers pool..data run backward without a CUDA graph{why}",
                    "Net graphs: layers conv..pool run forward without a CUDA graph from now on: the backward stretch "
                    "pool..data runs eagerly"], said
    assert solver.net.cuda_graphs.replayed() == []
    for name, blobs in solver.net.params.items():  # and it trains as without graphs
        for i, blob in enumerate(blobs):
            np.testing.assert_array_equal(blob.data, without[f"{name}/{i}"], err_msg=f"{name}/{i}")


def test_runs_are_recorded_at_the_third_pass_of_a_kind_and_replayed_after(caplog):
    stand_in = StandInCupy()
    solver = _solver_with_stand_in(stand_in)
    net = solver.net
    # The first iteration is a kind of its own: its gradients are made then (none to clear before).
    solver.step(3)
    assert stand_in.captures == 0 and net.cuda_graphs.replayed() == []
    conv_before = net.blobs["conv"].data
    with caplog.at_level(logging.INFO, logger="netdef"):
        solver.step(1)
    said = [r.getMessage() for r in caplog.records if "recorded as CUDA graphs" in r.getMessage()]
    assert said == [f"Net graphs: 2 stretch(es) of layers recorded as CUDA graphs ({direction}); 2 replay from now "
                    f"on, 0 replayable stretch(es) run eagerly" for direction in ("forward", "backward")]
    assert stand_in.captures == 4 and stand_in.launches == 4  # recorded, then launched: that pass
    # What the forward recordings let go is given back at the start of backward (never while
    # recording, when an exchange may be in flight); the backward recordings' at the next backward.
    assert stand_in.cached_blocks_released == 1
    assert net.cuda_graphs.replayed() == [("backward", "ip2", "ip1"), ("backward", "pool", "data"),
                                          ("forward", "conv", "pool"), ("forward", "ip1", "ip2")]
    # What a run makes is let go before its recording, which allocates its own.
    assert net.blobs["conv"].data is not conv_before
    recorded_data = net.blobs["data"].data
    solver.step(3)
    assert stand_in.captures == 4 and stand_in.launches == 4 + 3 * 4 and stand_in.cached_blocks_released == 2
    # The data layer refills its top eagerly each pass; before a launch its values go into the array
    # the recording reads, which the blob holds again afterwards.
    assert net.blobs["data"].data is recorded_data


def test_passes_of_iter_size_get_a_recording_each_and_new_shapes_forget_them_all():
    stand_in = StandInCupy()
    solver = _solver_with_stand_in(stand_in, SOLVER.replace("max_iter: 6", "max_iter: 6 iter_size: 2"))
    net = solver.net
    solver.step(4)  # each kind of pass (the first of an iteration, the second) four times, as above
    assert stand_in.captures == 8  # four runs, twice
    launched = stand_in.launches
    solver.step(1)
    assert stand_in.captures == 8 and stand_in.launches == launched + 8  # two passes of four runs, replayed
    net.layers[0].layer_param.dummy_data_param.shape[0].dim[0] = 6  # a larger batch from now on
    net.layers[0].layer_param.dummy_data_param.shape[1].dim[0] = 6
    net.layers[0].setup(net._bottom_vecs[0], net._top_vecs[0])
    launched = stand_in.launches
    solver.step(1)
    assert net.blobs["data"].shape[0] == 6
    assert stand_in.captures == 8 and stand_in.launches == launched and net.cuda_graphs.replayed() == []
    # Three passes of each kind (the first pass of the new shapes is one of its own for the forward
    # runs, whose key is taken before their layers reshape their tops): each recorded anew, once.
    solver.step(3)
    assert stand_in.captures == 16 and len(net.cuda_graphs.replayed()) == 4


def test_a_scratch_buffer_replaced_after_a_recording_is_never_read_by_it_again():
    """A recording reads the net's shared scratch buffers where they were when it was made; one replaced
    since (freed, its memory handed to others) forgets every recording, and the runs warm up anew."""
    stand_in = StandInCupy()
    solver = _solver_with_stand_in(stand_in)
    net = solver.net
    solver.step(4)
    assert len(net.cuda_graphs.replayed()) == 4
    net._scratch.get("a layer's temporary", (1 << 16,), np.float32, np)  # as an eager layer might ask
    launched = stand_in.launches
    solver.step(1)
    assert stand_in.launches == launched and net.cuda_graphs.replayed() == []
    solver.step(2)
    assert len(net.cuda_graphs.replayed()) == 4 and stand_in.captures == 8



def test_cudnns_workspace_replaced_after_a_recording_forgets_every_recording(monkeypatch):
    """The recordings run their cuDNN plans in the device's shared workspace where it was; a plan
    needing more (a new layer shape, another net's) frees it for a larger one, so every recording
    goes, and the runs warm up anew."""
    from netdef.cudnn import plans

    device = types.SimpleNamespace(generation=0)  # what plans.workspace_generation() counts
    monkeypatch.setattr(plans, "_devices", {0: device})
    stand_in = StandInCupy()
    solver = _solver_with_stand_in(stand_in)
    net = solver.net
    solver.step(4)
    assert len(net.cuda_graphs.replayed()) == 4
    device.generation += 1  # as _Device.workspace does when it grows
    launched = stand_in.launches
    solver.step(1)
    assert stand_in.launches == launched and net.cuda_graphs.replayed() == []
    solver.step(2)
    assert len(net.cuda_graphs.replayed()) == 4 and stand_in.captures == 8


def test_a_backward_stretch_replays_only_after_its_layers_forward_replayed():
    """A layer keeps arrays from forward for backward (a max pooling's mask, LRN's scale); a backward
    graph reads them where its recording found them, which only the forward recordings it was made
    after write again. ip2's top counts in the loss, so its forward runs eagerly every pass, into
    fresh arrays: the backward stretch holding ip2 runs eagerly too, the others replay."""
    net_text = (NET.replace('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }\n',
                            "")
                .replace('top: "ip2" inner_product_param', 'top: "ip2" loss_weight: 1 inner_product_param'))
    stand_in = StandInCupy()
    solver = _solver_with_stand_in(stand_in, SOLVER.replace(NET, net_text))
    graphs = solver.net.cuda_graphs
    last = len(solver.net.layers) - 1
    assert named_runs(solver.net, graphs.forward_runs(0, last))[-1] == ("ip2", "ip2", False)
    assert named_runs(solver.net, graphs.backward_runs(last, 0))[0] == ("ip2", "ip1", True)
    solver.step(6)
    assert graphs.replayed() == [("backward", "pool", "data"), ("forward", "conv", "pool"), ("forward", "ip1", "relu1")]
    assert stand_in.captures == 3

# ------------------------------------------------------------------ hooks at the edges of replayed stretches
def test_hooks_at_run_edges_run_around_each_replayed_stretch_and_hooks_of_every_layer_keep_graphs_off(caplog):
    stand_in = StandInCupy()
    solver = _solver_with_stand_in(stand_in)
    net = solver.net
    calls = []
    net.register_layer_hooks(before_forward=lambda li: calls.append(("before", li)),
                             after_forward=lambda li: calls.append(("after", li)),
                             after_backward=lambda li: calls.append(("after backward", li)), at_run_edges=True)
    net.register_backward_hook(lambda li, ids: calls.append(("final", li, tuple(ids))), at_run_edges=True)
    solver.step(3)  # eager passes: the hooks layer by layer
    eager = list(calls)
    calls.clear()
    solver.step(2)  # recorded, then replayed
    assert stand_in.captures == 4 and stand_in.launches == 8
    one_iteration = calls[:len(calls) // 2]
    assert one_iteration == calls[len(calls) // 2:]
    forward = [c for c in one_iteration if c[0] in ("before", "after")]
    # data, then conv..pool replayed as one (every "before" before its launch, every "after" after it),
    # Dropout, ip1..ip2 as one, the loss.
    assert forward == ([("before", 0), ("after", 0)] + [("before", li) for li in (1, 2, 3)] +
                       [("after", li) for li in (1, 2, 3)] + [("before", 4), ("after", 4)] +
                       [("before", li) for li in (5, 6, 7)] + [("after", li) for li in (5, 6, 7)] +
                       [("before", 8), ("after", 8)])
    # Backward: each layer's "after" hook, then its gradients' hooks, in backward order, as eagerly.
    backward = [c for c in one_iteration if c[0] in ("after backward", "final")]
    assert backward == [c for c in eager[:len(eager) // 3] if c[0] in ("after backward", "final")]
    assert [c[1] for c in backward if c[0] == "final"] == [7, 5, 1]
    # A hook that must see every layer run: the net runs eagerly, and says why once.
    net.register_layer_hooks(after_forward=lambda li: None)
    with caplog.at_level(logging.INFO, logger="netdef"):
        solver.step(1)
    assert stand_in.launches == 8
    assert [r.getMessage() for r in caplog.records if "CUDA graphs not used" in r.getMessage()] == [
        "Net graphs: CUDA graphs not used: hooks run host code between every two layers (netdef time, a timeline), "
        "which a replay would skip"]


def test_stretches_end_at_the_hooks_boundaries_and_new_boundaries_forget_the_old_stretches():
    stand_in = StandInCupy()
    solver = _solver_with_stand_in(stand_in)
    net = solver.net
    graphs = net.cuda_graphs
    last = len(net.layers) - 1
    net.hooks.split_runs_at({net.layer_index("ip2"), net.layer_index("pool")})
    assert named_runs(net, graphs.forward_runs(0, last)) == [
        ("data", "data", False), ("conv", "relu", True), ("pool", "pool", True), ("drop", "drop", False),
        ("ip1", "relu1", True), ("ip2", "ip2", True), ("loss", "loss", False)]
    assert named_runs(net, graphs.backward_runs(last, 0)) == [
        ("loss", "loss", False), ("ip2", "ip2", True), ("relu1", "ip1", True), ("drop", "drop", False),
        ("pool", "pool", True), ("relu", "data", True)]
    solver.step(4)
    assert stand_in.captures == 8 and len(graphs.replayed()) == 8
    net.hooks.split_runs_at(set())
    solver.step(1)  # the old stretches' recordings are gone; the new ones warm up
    assert graphs.replayed() == [] and stand_in.launches == 8
    solver.step(2)
    assert len(graphs.replayed()) == 4 and stand_in.captures == 12


def test_an_exchange_hands_over_each_replayed_stretchs_gradients_before_the_next_stretch_launches():
    """The allreduce rule's hooks at the edges of the train net's stretches (as DataParallel registers
    them), which end where about a bucket's worth of gradients is final: a bucket starts between two
    launches of backward, and every gradient reaches the exchange in the order of the first iteration."""
    from netdef.comm.exchange import AllreduceExchange, ExchangeOptions
    from tests.comm.test_exchange import ScriptedComm, assert_averaged, reference_gradients, run_iteration

    # The same batch every pass and no Dropout: every pass makes the same gradients. ip2 is big enough
    # to close a stretch of its own.
    text = (NET.replace("num_output: 3 weight_filler", "num_output: 30 weight_filler")
            .replace('data_filler { type: "gaussian" }', 'data_filler { type: "constant" value: 0.5 }'))
    text = "\n".join(line for line in text.splitlines() if '"Dropout"' not in line)
    netdef.set_random_seed(3)
    net = netdef.Net(text, netdef.TRAIN)
    expected = reference_gradients(net)
    events = []
    stand_in = StandInCupy(events=events)
    net.cuda_graphs = net_graphs.PassGraphs(net, cupy=stand_in)
    options = ExchangeOptions(schedule="fifo", bucket_bytes=64, progress="POLL")
    rule = AllreduceExchange(ScriptedComm(size=4, events=events), net, options)
    assert rule.run_boundaries() == {net.layer_index("ip2"), net.layer_index("ip1")}
    net.hooks.split_runs_at(rule.run_boundaries())
    net.register_layer_hooks(**rule.layer_hooks(), at_run_edges=True)  # as DataParallel registers them
    net.register_backward_hook(lambda li, ids: rule.gradients_ready(ids), at_run_edges=True)
    for iteration in range(5):
        events.clear()
        run_iteration(net, rule, iteration, events)
        if iteration < 2:
            assert_averaged(net, expected)  # eager: the stand-in computes what it runs
    # The replayed iteration: ip2's stretch, its bucket(s) started, then the stretch below it.
    backward = events[[i for i, e in enumerate(events) if e == ("launch",)][3]:]  # after conv..pool, ip1..relu1, ip2
    kinds = [e[0] for e in backward]
    assert kinds[0] == "launch" and kinds.index("start") < kinds.index("launch", 1), kinds
    assert kinds.count("launch") == 3 and kinds.count("start") == 6, kinds  # 6 blobs, a bucket each
