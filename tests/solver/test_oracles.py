"""The Caffe solver oracles (../shared/fixtures/caffe-ref/solvers): trajectories of every update rule
and lr policy, Caffe-written snapshots, resuming from them, and LeNet's real solverstate."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from netdef.proto import netdef_pb2 as pb
from netdef.solver import LRPolicyError, get_solver, learning_rate
from netdef.weights import proto_values
from tests.helpers import CAFFE_REF, shared_path

from .common import close_to_oracle, load_case, oracle_case_names, oracle_solver

CASES = oracle_case_names()


def test_oracles_present():
    shared_path("fixtures", "caffe-ref", "solvers", "sgd.npz")
    assert len(CASES) == 17


@pytest.mark.parametrize("name", CASES)
def test_trajectory(name, tmp_path, monkeypatch):
    """Params after each of 6 steps, the rate and the loss of each step, against Caffe.

    Achieved: rates equal Caffe's float32 rates bit for bit; params within 6e-7 of each blob's
    largest magnitude (per element: rtol 1e-6 plus that floor; AdaDelta and clipping bit for bit);
    losses within 2e-7 relative."""
    case = load_case(name)
    monkeypatch.chdir(tmp_path.parent)  # the net file is found beside the solver file, not in the cwd
    solver, feeder = oracle_solver(case, tmp_path)
    rates, losses = [], []
    for k in range(1, 7):
        feeder.start(k)
        rates.append(solver.lr)  # pycaffe's lr: the rate of the iteration the step runs
        solver.step(1)
        assert feeder.j == feeder.iter_size
        assert solver.iter == k
        losses.append(solver.smoothed_loss)
        close_to_oracle(solver.net.params["ip"][0].data, case[f"w/{k}"])
        close_to_oracle(solver.net.params["ip"][1].data, case[f"b/{k}"])
    np.testing.assert_array_equal(np.array(rates, np.float32), case["lr"])
    np.testing.assert_allclose(np.array(losses, np.float32), case["loss"], rtol=5e-7)


def test_sigmoid_with_negative_gamma_is_rejected_as_in_caffe(tmp_path):
    case = load_case("lr_sigmoid_gamma1")
    text = str(case["solver_prototxt"]).replace("gamma: 1", "gamma: -1")
    with pytest.raises(LRPolicyError, match="gamma >= 0"):
        oracle_solver(case, tmp_path, text)


def test_multistep_advances_one_step_per_iteration():
    param = pb.SolverParameter(base_lr=1, lr_policy="multistep", gamma=0.5, stepvalue=[0, 0, 5])
    step, rates = 0, []
    for it in range(7):
        rate, step = learning_rate(param, it, step)
        rates.append(float(rate))
    # stepvalues 0 and 0 are both passed at iteration 0, but Caffe moves one step per iteration.
    assert rates == [0.5, 0.25, 0.25, 0.25, 0.25, 0.125, 0.125]
    assert step == 3


def test_step_policy_sets_current_step():
    param = pb.SolverParameter(base_lr=1, lr_policy="step", gamma=0.1, stepsize=3)
    rate, step = learning_rate(param, 7, 0)
    # Caffe: std::pow(float gamma, int) in double, then stored as float.
    assert step == 2 and rate == np.float32(float(np.float32(0.1)) ** 2)


SNAPSHOTS = [(c, f) for c in ("sgd", "adam") for f in ("binaryproto", "hdf5")]


def _caffe_snapshot_dir(case_name, fmt, tmp_path):
    folder = shared_path("fixtures", "caffe-ref", "solvers")
    for path in folder.glob(f"snap_{case_name}_{fmt}_iter_3.*"):
        shutil.copy(path, tmp_path)
    return tmp_path


@pytest.mark.parametrize("case_name,fmt", SNAPSHOTS)
def test_restore_caffe_snapshot(case_name, fmt, tmp_path, monkeypatch):
    """Caffe's four snapshot pairs read back as snapshot_expected.npz says, and steps 4..6 from
    there reproduce the uninterrupted Caffe run."""
    expected = np.load(shared_path("fixtures", "caffe-ref", "solvers", "snapshot_expected.npz"))
    key = f"snap_{case_name}_{fmt}"
    case = load_case(case_name)
    _caffe_snapshot_dir(case_name, fmt, tmp_path)
    monkeypatch.chdir(tmp_path)  # learned_net is a bare file name, relative to the working directory
    solver, feeder = oracle_solver(case, tmp_path)
    state = f"{key}_iter_3.solverstate" + (".h5" if fmt == "hdf5" else "")
    solver.restore(state)
    assert solver.iter == int(expected[f"{key}/iter"]) == 3
    assert solver.current_step == int(expected[f"{key}/current_step"])
    np.testing.assert_array_equal(solver.net.params["ip"][0].data, expected[f"{key}/w"])
    np.testing.assert_array_equal(solver.net.params["ip"][1].data, expected[f"{key}/b"])
    n_hist = len([k for k in expected.files if k.startswith(f"{key}/history/")])
    assert len(solver.history) == n_hist == (4 if case_name == "adam" else 2)
    for i, blob in enumerate(solver.history):
        np.testing.assert_array_equal(blob.data, expected[f"{key}/history/{i}"])
    for k in (4, 5, 6):
        feeder.start(k)
        solver.step(1)
        close_to_oracle(solver.net.params["ip"][0].data, case[f"w/{k}"])
        close_to_oracle(solver.net.params["ip"][1].data, case[f"b/{k}"])


def test_restore_finds_learned_net_beside_the_state(tmp_path, monkeypatch):
    """learned_net is relative to the working directory in Caffe; netdef falls back to the state
    file's folder."""
    case = load_case("sgd")
    (tmp_path / "snaps").mkdir()
    snaps = _caffe_snapshot_dir("sgd", "binaryproto", tmp_path / "snaps")
    monkeypatch.chdir(tmp_path)
    solver, _ = oracle_solver(case, tmp_path)
    solver.restore(snaps / "snap_sgd_binaryproto_iter_3.solverstate")
    np.testing.assert_array_equal(solver.net.params["ip"][0].data, case["w/3"])


def test_restore_rejects_history_of_another_solver_type(tmp_path, monkeypatch):
    case = load_case("sgd")
    _caffe_snapshot_dir("adam", "binaryproto", tmp_path)
    monkeypatch.chdir(tmp_path)
    solver, _ = oracle_solver(case, tmp_path)
    with pytest.raises(ValueError, match="Incorrect length of history blobs"):
        solver.restore("snap_adam_binaryproto_iter_3.solverstate")
    assert solver.iter == 0  # nothing was half-restored


LENET_SOLVER = """
net: "{net}"
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 100
max_iter: 10000
solver_mode: CPU
"""


def test_lenet_solverstate_restores_at_10000(tmp_path):
    state_path = shared_path("fixtures", "caffe-models", "lenet_iter_10000.solverstate")
    net_path = CAFFE_REF / "lenet_train_test.prototxt"
    solver_file = tmp_path / "lenet_solver.prototxt"
    solver_file.write_text(LENET_SOLVER.format(net=net_path))
    solver = get_solver(str(solver_file))
    solver.restore(state_path)  # learned_net examples/mnist/... is found beside the state file
    assert solver.iter == 10000 and solver.current_step == 0
    state = pb.SolverState.FromString(state_path.read_bytes())
    assert len(solver.history) == len(state.history) == 8
    for blob, proto in zip(solver.history, state.history):
        assert blob.shape == tuple(proto.shape.dim)
        np.testing.assert_array_equal(blob.data.ravel(), proto_values(proto))
    model = pb.NetParameter.FromString((state_path.parent / "lenet_iter_10000.caffemodel").read_bytes())
    stored = {l.name: l.blobs for l in model.layer if l.blobs}
    for name in ("conv1", "conv2", "ip1", "ip2"):
        for blob, proto in zip(solver.net.params[name], stored[name]):
            np.testing.assert_array_equal(blob.data.ravel(), proto_values(proto))

    # One SGD step from there: w' = w - (0.9 h + r * lr_mult * (g + 0.0005 w)), r = inv(10000).
    rng = np.random.default_rng(1)
    solver.net.blobs["data"].data[...] = rng.random((64, 1, 28, 28), dtype=np.float32)
    solver.net.blobs["label"].data[...] = rng.integers(0, 10, 64)
    before = [(np.array(p.data), np.array(h.data)) for p, h in zip(solver.net.learnable_params, solver.history)]
    grads = []
    solver.add_callback(on_gradients_ready=lambda: grads.extend(np.array(p.diff) for p in solver.net.learnable_params))
    rate = np.float32(0.01) * np.power(np.float32(1) + np.float32(0.0001) * np.float32(10000), np.float32(-0.75))
    assert solver.lr == rate
    solver.step(1)
    for (w, h), g, p, mult in zip(before, grads, solver.net.learnable_params, solver.net.params_lr):
        expected = w - (0.9 * h.astype(np.float64) + float(rate) * mult * (g + 0.0005 * w.astype(np.float64)))
        np.testing.assert_allclose(p.data, expected, rtol=1e-5, atol=1e-7)
    assert solver.iter == 10001
