"""The training loop: display and test log lines, callbacks, signals, non-finite losses, solver
file handling and Caffe's configuration checks."""
from __future__ import annotations

import logging
import os
import pathlib
import re
import signal

import numpy as np
import pytest

from netdef.proto import netdef_pb2 as pb
from netdef.solver import (AdamSolver, NonFiniteLossError, SGDSolver, SolverCallback, SolverConfigError,
                           get_solver, install_signal_handlers)

from .common import load_case, oracle_solver, params_of, write_case_files

LOG = "netdef"


def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOG]


# -------------------------------------------------------------------------------------------- display
def test_display_lines_and_average_loss(tmp_path, caplog):
    case = load_case("sgd")
    text = str(case["solver_prototxt"]).replace("display: 1", "display: 2\naverage_loss: 3")
    solver, feeder = oracle_solver(case, tmp_path, text)
    caplog.set_level(logging.INFO, logger=LOG)
    for k in (1, 2):
        feeder.start(k)
        solver.step(1)
    # One step() call over the remaining 4 iterations so the loss window spans them.
    calls = iter(range(3, 7))
    solver.add_callback(on_start=lambda: feeder.start(next(calls)))
    caplog.clear()
    solver.step(4)
    lines = _messages(caplog)
    loss = case["loss"]
    heads = [l for l in lines if re.match(r"Iteration \d+ \(", l)]
    assert len(heads) == 2  # iterations 2 and 4 (display: 2)
    pattern = r"Iteration (\d+) \(([-\d.e+]+|inf) iter/s, ([\d.e+-]+)s/2 iters\), loss = ([-\d.e+]+)$"
    (it2, _, _, shown2), (it4, rate4, _, shown4) = [re.match(pattern, h).groups() for h in heads]
    assert (it2, it4) == ("2", "4")
    # Smoothing restarts with each step() call (Caffe's Step clears its window): at 2 the window holds
    # the loss of iteration 2 only; at 4 the losses of iterations 2, 3, 4.
    assert float(shown2) == pytest.approx(float(loss[2]), rel=1e-5)
    assert float(shown4) == pytest.approx(float(loss[2:5].mean()), rel=1e-5)
    assert float(rate4) > 0
    i = lines.index(heads[1])
    assert lines[i + 1] == "    Train net output #0: loss = %g (* 1 = %g loss)" % (loss[4], loss[4])
    assert lines[i + 2] == "Iteration 4, lr = 0.1"
    assert "Iteration 3, lr = 0.1" not in lines


def test_smoothed_loss_window_is_caffes(tmp_path):
    case = load_case("sgd")
    text = str(case["solver_prototxt"]).replace("display: 1", "display: 1\naverage_loss: 2")
    solver, feeder = oracle_solver(case, tmp_path, text)
    calls = iter(range(1, 7))
    solver.add_callback(on_start=lambda: feeder.start(next(calls)))
    smoothed = []
    solver.add_callback(on_gradients_ready=lambda: smoothed.append(float(solver.smoothed_loss)))
    solver.step(6)
    loss = case["loss"].astype(np.float64)
    expected = [loss[0]] + [(loss[k - 1] + loss[k]) / 2 for k in range(1, 6)]
    np.testing.assert_allclose(smoothed, expected, rtol=1e-6)


# -------------------------------------------------------------------------------------------- testing
TEST_NET = """
name: "const_net"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 }
                     data_filler { type: "constant" value: 1 } data_filler { type: "constant" value: 0 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "constant" value: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
layer { name: "total" type: "Reduction" bottom: "ip" top: "a_sum" include { phase: TEST } }
"""

TEST_SOLVER = """
net: "const_net.prototxt"
base_lr: 0
lr_policy: "fixed"
max_iter: 2
test_iter: 2
test_iter: 1
test_interval: 2
test_compute_loss: true
display: 2
snapshot_after_train: false
solver_mode: CPU
"""


def test_test_phase_outputs(tmp_path, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "const_net.prototxt").write_text(TEST_NET)
    (tmp_path / "solver.prototxt").write_text(TEST_SOLVER)
    solver = get_solver("solver.prototxt")
    assert len(solver.test_nets) == 2 and solver.test_nets[0].phase == pb.TEST
    assert solver.net.outputs == ["loss"]
    # Test nets use the train net's parameter blobs.
    assert solver.test_nets[1].params["ip"][0] is solver.net.params["ip"][0]
    caplog.set_level(logging.INFO, logger=LOG)
    solver.solve()
    lines = _messages(caplog)
    block = ["Test loss: 2.25",
             "    Test net output #0: a_sum = 12",  # outputs in Caffe's (sorted) order
             "    Test net output #1: loss = 2.25 (* 1 = 2.25 loss)"]
    for it in (0, 2):  # test_initialization at 0; after training Solve tests again at max_iter
        for net_id in (0, 1):
            i = lines.index(f"Iteration {it}, Testing net (#{net_id})")
            assert lines[i + 1:i + 4] == block
    assert lines.count("Iteration 0, Testing net (#0)") == 1
    assert "Iteration 2, loss = 2.25" in lines  # Solve's last display pass
    assert lines[-1] == "Optimization Done."
    assert solver.test_scores == {"a_sum": [12.0], "loss": [2.25]}


ITEMS_NET = """
layer { name: "data" type: "DummyData" top: "data" top: "target" include { phase: TRAIN }
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" include { phase: TRAIN }
  inner_product_param { num_output: 2 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" include { phase: TRAIN } }
layer { name: "items" type: "Data" top: "item" top: "label" include { phase: TEST }
  data_param { source: "items_lmdb" batch_size: 2 backend: LMDB } }
layer { name: "labels" type: "Reduction" bottom: "label" top: "label_sum" include { phase: TEST } }
layer { name: "pixels" type: "Reduction" bottom: "item" top: "pixel_sum" include { phase: TEST } }
"""


def test_each_test_pass_counts_its_own_outputs(tmp_path, monkeypatch):
    """A pass's outputs are read once the next pass is queued (the solver's test loop): each pass's
    own, though the next overwrites the blobs. Labels 0, 1, 2, 3, 0, 1, ... in batches of 2 sum to
    1, 5, 1, 5: the mean is 3 (the last pass's outputs read four times would say 5)."""
    from tests.comm.fixtures import random_lmdb

    monkeypatch.chdir(tmp_path)
    random_lmdb(tmp_path / "items_lmdb", 8)
    (tmp_path / "net.prototxt").write_text(ITEMS_NET)
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0 lr_policy: "fixed" max_iter: 1 '
                                              'test_iter: 4 test_interval: 1 snapshot_after_train: false')
    solver = get_solver("solver.prototxt")
    solver.test(0)
    assert solver.test_scores["label_sum"] == [3.0]
    solver.close()


def test_test_initialization_false_and_interval(tmp_path, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "const_net.prototxt").write_text(TEST_NET)
    (tmp_path / "solver.prototxt").write_text(TEST_SOLVER + "test_initialization: false\n")
    solver = get_solver("solver.prototxt")
    caplog.set_level(logging.INFO, logger=LOG)
    solver.step(5)
    tested = [l for l in _messages(caplog) if "Testing net (#0)" in l]
    assert tested == ["Iteration 2, Testing net (#0)", "Iteration 4, Testing net (#0)"]


# -------------------------------------------------------------------------------------------- callbacks
def test_callback_order(tmp_path):
    case = load_case("sgd")
    solver, _ = oracle_solver(case, tmp_path)
    events = []

    class Recorder(SolverCallback):  # after_update is inherited: it does nothing
        def on_start(self):
            events.append(("start", solver.iter))

        def on_gradients_ready(self):
            # gradients are there, the parameters are not updated yet
            assert np.abs(solver.net.params["ip"][0].diff).sum() > 0
            np.testing.assert_array_equal(solver.net.params["ip"][0].data, case["w/0"])
            events.append(("gradients", solver.iter))

    solver.add_callback(Recorder())
    solver.add_callback(after_update=lambda: events.append(("updated", solver.iter)))
    solver.step(1)
    assert events == [("start", 0), ("gradients", 0), ("updated", 1)]


def test_callback_refuses_an_object_that_is_neither_a_function_nor_a_solver_callback(tmp_path):
    solver, _ = oracle_solver(load_case("sgd"), tmp_path)

    class Duck:  # methods of the right names, but no declared SolverCallback
        def on_start(self):
            pass

    with pytest.raises(TypeError, match="on_start must be a function.*SolverCallback"):
        solver.add_callback(Duck())
    with pytest.raises(TypeError, match="comes alone"):
        solver.add_callback(SolverCallback(), after_update=lambda: None)


# -------------------------------------------------------------------------------------------- signals
SIGNAL_SOLVER = """
net: "solver_net.prototxt"
base_lr: 0.01
lr_policy: "fixed"
max_iter: 10
snapshot_prefix: "sig"
solver_mode: CPU
"""


def _signal_solver(tmp_path, text=SIGNAL_SOLVER):
    case = load_case("sgd")
    solver = get_solver(str(write_case_files(case, tmp_path, text)))
    solver.net.layers[0].forward = lambda bottom, top: None
    return solver


def _kill_at(solver, iteration, signum, seen):
    def after():
        if solver.iter == iteration:
            os.kill(os.getpid(), signum)
            seen.append(solver.iter)  # the handler only set a flag: we are still here

    solver.add_callback(after_update=after)


def test_sigint_stops_and_snapshots_as_caffe(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    solver = _signal_solver(tmp_path)
    seen = []
    _kill_at(solver, 3, signal.SIGINT, seen)
    caplog.set_level(logging.INFO, logger=LOG)
    with install_signal_handlers(solver, sigint_effect="stop", sighup_effect="snapshot"):
        solver.solve()
    assert seen == [3] and solver.iter == 3
    assert sorted(f for f in os.listdir() if f.startswith("sig")) == ["sig_iter_3.caffemodel", "sig_iter_3.solverstate"]
    lines = _messages(caplog)
    assert "Optimization stopped early." in lines and "Optimization Done." not in lines
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_sighup_snapshots_and_continues(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver = _signal_solver(tmp_path)
    seen = []
    _kill_at(solver, 2, signal.SIGHUP, seen)
    handlers = install_signal_handlers(solver)
    try:
        solver.step(5)
    finally:
        handlers.restore()
    assert solver.iter == 5 and seen == [2]
    assert sorted(f for f in os.listdir() if f.startswith("sig")) == ["sig_iter_2.caffemodel", "sig_iter_2.solverstate"]
    assert pb.SolverState.FromString(pathlib.Path("sig_iter_2.solverstate").read_bytes()).iter == 2


def test_signal_effect_none_ignores_the_signal(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver = _signal_solver(tmp_path)
    seen = []
    _kill_at(solver, 1, signal.SIGINT, seen)
    with install_signal_handlers(solver, sigint_effect="none"):
        solver.step(3)
    assert solver.iter == 3 and seen == [1]
    assert not [f for f in os.listdir() if f.startswith("sig")]
    with pytest.raises(ValueError, match="sigint_effect"):
        install_signal_handlers(solver, sigint_effect="quit")


def test_stop_requested_during_test_interrupts_it(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    solver = _signal_solver(tmp_path, SIGNAL_SOLVER + "test_iter: 3\ntest_interval: 5\n")
    caplog.set_level(logging.INFO, logger=LOG)
    solver.request_stop()
    solver.step(4)
    assert solver.iter == 0 and solver.requested_early_exit
    assert "Test interrupted." in _messages(caplog)


# -------------------------------------------------------------------------------------------- non-finite
NAN_NET = """
name: "nan_net"
layer { name: "input" type: "Input" top: "data" top: "target"
  input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "constant" value: 0.2 }
                        bias_filler { type: "constant" value: 1 } } }
layer { name: "log" type: "Log" bottom: "ip" top: "log" }
layer { name: "loss" type: "EuclideanLoss" bottom: "log" bottom: "target" top: "loss" }
"""

NAN_SOLVER = """
net: "nan_net.prototxt"
base_lr: 0.001
lr_policy: "fixed"
max_iter: 10
snapshot: 1
snapshot_prefix: "nan"
solver_mode: CPU
"""


def test_non_finite_loss_stops_and_keeps_the_last_good_snapshot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nan_net.prototxt").write_text(NAN_NET)
    (tmp_path / "solver.prototxt").write_text(NAN_SOLVER)
    solver = get_solver("solver.prototxt")
    batches = iter([1.0, 1.0, 1.0, -100.0])

    def forward(bottom, top):
        top[0].data = np.full((4, 3), next(batches), np.float32)
        top[1].data = np.zeros((4, 2), np.float32)

    solver.net.layers[0].forward = forward
    with np.errstate(invalid="ignore", divide="ignore"), pytest.raises(NonFiniteLossError) as info:
        solver.solve()
    err = info.value
    assert err.iteration == 3 and err.layer == "log"
    assert "Iteration 3" in str(err) and "'log'" in str(err)
    assert solver.iter == 3
    assert sorted(os.listdir()) == sorted(["nan_net.prototxt", "solver.prototxt"] +
                                          [f"nan_iter_{i}.{e}" for i in (1, 2, 3) for e in ("caffemodel", "solverstate")])
    good = params_of(solver.net)  # not updated by the bad iteration
    assert all(np.isfinite(p).all() for p in good)
    check = get_solver("solver.prototxt")
    check.restore("nan_iter_3.solverstate")
    for a, b in zip(params_of(check.net), good):
        np.testing.assert_array_equal(a, b)


# -------------------------------------------------------------------------------------------- solver files
def test_net_path_is_relative_to_the_working_directory_first(tmp_path, monkeypatch):
    case = load_case("sgd")
    (tmp_path / "a").mkdir()
    solver_file = write_case_files(case, tmp_path / "a")
    (tmp_path / "solver_net.prototxt").write_text(str(case["net_prototxt"]).replace('"solver_net"', '"cwd_net"'))
    monkeypatch.chdir(tmp_path)
    assert get_solver(str(solver_file)).net.name == "cwd_net"
    (tmp_path / "solver_net.prototxt").unlink()
    assert get_solver(str(solver_file)).net.name == "solver_net"  # beside the solver file
    (tmp_path / "a" / "solver_net.prototxt").unlink()
    with pytest.raises(FileNotFoundError, match="solver_net.prototxt"):
        get_solver(str(solver_file))


def test_default_snapshot_prefix_is_the_solver_path(tmp_path):
    case = load_case("sgd")
    solver = get_solver(str(write_case_files(case, tmp_path)))
    assert solver.param.snapshot_prefix == str(tmp_path / "solver")
    (tmp_path / "out").mkdir()
    solver = get_solver(str(write_case_files(case, tmp_path, f'{case["solver_prototxt"]}snapshot_prefix: "{tmp_path / "out"}"\n')))
    assert solver.param.snapshot_prefix == str(tmp_path / "out" / "solver")


def test_solver_classes_and_legacy_type(tmp_path):
    case = load_case("sgd")
    path = write_case_files(case, tmp_path, str(case["solver_prototxt"]).replace('type: "SGD"', "solver_type: ADAM"))
    solver = get_solver(str(path))
    assert isinstance(solver, AdamSolver) and solver.type == "Adam" and len(solver.history) == 4
    assert type(SGDSolver(str(path)).update_rule).__name__ == "SGDUpdate"  # pycaffe: the class decides
    both = str(case["solver_prototxt"]) + "solver_type: ADAM\n"
    with pytest.raises(SolverConfigError, match="cannot be both specified"):
        get_solver(str(write_case_files(case, tmp_path, both)))


BASE = """
base_lr: 0.1
momentum: 0.9
display: 1
solver_mode: CPU
"""

BAD = [
    ('type: "AdaGrad"', "Momentum cannot be used with AdaGrad"),
    ('type: "RMSProp"', "Momentum cannot be used with RMSProp"),
    ('type: "Nope"', "Unknown solver type"),
    ('lr_policy: "cosine"', "Unknown learning rate policy"),
    ('lr_policy: "step"\nstepsize: 0', "stepsize > 0"),
    ('lr_policy: "sigmoid"\nstepsize: 3\ngamma: -1', "gamma >= 0"),
    ('lr_policy: "poly"\nmax_iter: 0', "max_iter > 0"),
    ('average_loss: 0', "average_loss"),
    ('weight_decay: 0.1\nregularization_type: "L3"', "Unknown regularization type"),
    ('snapshot: 10', "snapshot_prefix is not"),
    ('snapshot: 10\nsnapshot_prefix: "/no/such/folder/x"', "Cannot write to snapshot prefix"),
    ('test_iter: 5', "test_interval"),
    ('test_iter: 1\ntest_interval: 1\ntest_state { stage: "a" }\ntest_state { stage: "b" }', "test_state"),
]


@pytest.mark.parametrize("extra,message", BAD)
def test_caffes_checks(extra, message, tmp_path):
    from google.protobuf import text_format

    case = load_case("sgd")
    param = text_format.Parse(BASE + extra + "\n", pb.SolverParameter())
    if not param.HasField("lr_policy"):
        param.lr_policy = "fixed"
    param.net = str(write_case_files(case, tmp_path).parent / "solver_net.prototxt")
    with pytest.raises(ValueError, match=message):
        get_solver(param)


def test_rmsprop_decay_range_and_train_net_fields(tmp_path):
    case = load_case("rmsprop")
    text = str(case["solver_prototxt"]).replace("rms_decay: 0.98", "rms_decay: 1.5")
    with pytest.raises(SolverConfigError, match="rms_decay"):
        get_solver(str(write_case_files(case, tmp_path, text)))
    with pytest.raises(SolverConfigError, match="no net to train"):
        get_solver(pb.SolverParameter(base_lr=0.1, lr_policy="fixed"))
    text = str(case["solver_prototxt"]) + 'train_net: "solver_net.prototxt"\n'
    with pytest.raises(SolverConfigError, match="more than one"):
        get_solver(str(write_case_files(case, tmp_path, text)))


def test_train_state_and_net_param(tmp_path):
    case = load_case("sgd")
    param = pb.SolverParameter(base_lr=0.1, lr_policy="fixed", solver_mode=pb.SolverParameter.CPU)
    from google.protobuf import text_format
    text_format.Parse(str(case["net_prototxt"]), param.net_param)
    param.train_state.stage.append("train-stage")
    param.test_iter.append(1)
    param.test_interval = 10
    solver = get_solver(param)
    assert list(solver.net.state.stage) == ["train-stage"] and solver.net.phase == pb.TRAIN
    assert solver.test_nets[0].phase == pb.TEST and not solver.test_nets[0].state.stage


def test_iter_size_accumulates_and_normalizes(tmp_path):
    """iter_size 2 over the same batch twice is iter_size 1 over it: g + g = 2g and 2g * 0.5 = g are
    exact in float32, so the params agree bit for bit; the logged loss is the mean of the passes."""
    case = load_case("sgd")
    results = []
    for iter_size in (1, 2):
        folder = tmp_path / str(iter_size)
        folder.mkdir()
        solver, _ = oracle_solver(case, folder, str(case["solver_prototxt"]) + f"iter_size: {iter_size}\n")
        passes = []

        def forward(bottom, top, passes=passes):
            top[0].data = case["data/1"]
            top[1].data = case["target/1"]
            passes.append(1)

        solver.net.layers[0].forward = forward
        solver.step(2)
        assert len(passes) == 2 * iter_size
        results.append((params_of(solver.net), solver.smoothed_loss))
    for a, b in zip(results[0][0], results[1][0]):
        np.testing.assert_array_equal(a, b)
    assert results[0][1] == results[1][1]


def test_weights_field_loads_into_train_and_test_nets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    case = load_case("sgd")
    donor, _ = oracle_solver(case, tmp_path)
    donor.net.params["ip"][0].data[...] = 7
    donor.net.save(str(tmp_path / "seven.caffemodel"))
    text = str(case["solver_prototxt"]) + 'weights: "seven.caffemodel"\ntest_iter: 1\ntest_interval: 5\n'
    solver = get_solver(str(write_case_files(case, tmp_path, text)))
    assert (solver.net.params["ip"][0].data == 7).all()
    assert (solver.test_nets[0].params["ip"][0].data == 7).all()
