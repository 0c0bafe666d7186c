"""netdef's own snapshots: Caffe's file contents, atomic replacement, round trips, and exact
resumption (a run resumed at k continues bit for bit like the uninterrupted one)."""
from __future__ import annotations

import os
import pathlib

import h5py
import numpy as np
import pytest

from netdef.proto import netdef_pb2 as pb
from netdef.solver import NonFiniteParamsError, get_solver
from netdef.solver import snapshot as snapshot_module
from netdef.weights import WeightsError, proto_values

from .common import RANDOM_NET, load_case, oracle_solver, params_of

SGD_MULTISTEP = """
net: "solver_net.prototxt"
base_lr: 0.1
momentum: 0.9
weight_decay: 0.01
lr_policy: "multistep"
stepvalue: 1
stepvalue: 2
gamma: 0.5
max_iter: 100
snapshot_prefix: "snaps/run"
solver_mode: CPU
"""


def _run(case, tmp_path, text, steps):
    (tmp_path / "snaps").mkdir(exist_ok=True)
    solver, feeder = oracle_solver(case, tmp_path, text)
    for k in range(1, steps + 1):
        feeder.start(k)
        solver.step(1)
    return solver, feeder


def test_binaryproto_snapshot_is_caffes_format(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver, _ = _run(load_case("sgd"), tmp_path, SGD_MULTISTEP, 3)
    model, state_path = solver.snapshot()
    assert (model, state_path) == ("snaps/run_iter_3.caffemodel", "snaps/run_iter_3.solverstate")
    assert sorted(os.listdir("snaps")) == ["run_iter_3.caffemodel", "run_iter_3.solverstate"]  # no temp files
    state = pb.SolverState.FromString(pathlib.Path(state_path).read_bytes())
    assert state.iter == 3
    assert state.learned_net == "snaps/run_iter_3.caffemodel"
    assert state.current_step == 2  # multistep passed stepvalues 1 and 2
    assert len(state.history) == 2
    for proto, blob in zip(state.history, solver.history):
        assert tuple(proto.shape.dim) == blob.shape
        assert len(proto.data) == blob.count and not proto.diff and not proto.double_data
        np.testing.assert_array_equal(proto_values(proto).reshape(blob.shape), blob.data)
    assert state.netdef_state.rng_state
    # Caffe's reader sees only its own fields: the netdef extension is field 10000 alone.
    caffe_only = pb.SolverState()
    caffe_only.CopyFrom(state)
    caffe_only.ClearField("netdef_state")
    assert len(state.SerializeToString()) > len(caffe_only.SerializeToString())
    net = pb.NetParameter.FromString(pathlib.Path(model).read_bytes())
    assert [l.name for l in net.layer] == ["input", "ip", "loss"]
    ip = net.layer[1]
    assert [tuple(b.shape.dim) for b in ip.blobs] == [(2, 3), (2,)]
    np.testing.assert_array_equal(proto_values(ip.blobs[0]).reshape(2, 3), solver.net.params["ip"][0].data)
    assert not ip.blobs[0].diff  # snapshot_diff is off


def test_snapshot_diff_writes_diffs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver, _ = _run(load_case("sgd"), tmp_path, SGD_MULTISTEP + "snapshot_diff: true\n", 1)
    model, _ = solver.snapshot()
    ip = pb.NetParameter.FromString(pathlib.Path(model).read_bytes()).layer[1]
    np.testing.assert_array_equal(np.asarray(ip.blobs[0].diff).reshape(2, 3), solver.net.params["ip"][0].diff)


def test_hdf5_snapshot_is_caffes_layout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = SGD_MULTISTEP.replace('type: "SGD"', "") + 'type: "Adam"\nsnapshot_format: HDF5\n'
    solver, _ = _run(load_case("adam"), tmp_path, text, 2)
    model, state_path = solver.snapshot()
    assert (model, state_path) == ("snaps/run_iter_2.caffemodel.h5", "snaps/run_iter_2.solverstate.h5")
    assert sorted(os.listdir("snaps")) == ["run_iter_2.caffemodel.h5", "run_iter_2.solverstate.h5"]
    with h5py.File(model, "r") as m:
        assert sorted(m["data"].keys()) == ["input", "ip", "loss"]  # a group for every layer, as Caffe
        assert len(m["data/input"]) == 0 and len(m["data/loss"]) == 0
        assert m["data/ip/0"].dtype == np.float32
        np.testing.assert_array_equal(m["data/ip/0"][()], solver.net.params["ip"][0].data)
    with h5py.File(state_path, "r") as s:
        assert s["iter"].shape == (1,) and s["iter"].dtype == np.int32 and s["iter"][0] == 2
        assert s["current_step"][0] == 1  # iteration 1 passed stepvalue 1
        learned = s["learned_net"]
        assert learned.shape == () and learned.id.get_type().get_strpad() == h5py.h5t.STR_NULLTERM
        assert learned[()] == b"snaps/run_iter_2.caffemodel.h5"
        assert sorted(s["history"].keys(), key=int) == ["0", "1", "2", "3"]  # m_W, m_b, v_W, v_b
        for i, blob in enumerate(solver.history):
            np.testing.assert_array_equal(s[f"history/{i}"][()], blob.data)
        assert "netdef_state" in s
    other, _ = oracle_solver(load_case("adam"), tmp_path, text)
    other.restore(state_path)
    assert other.iter == 2 and other.current_step == 1
    for a, b in zip(params_of(other.net) + params_of_history(other), params_of(solver.net) + params_of_history(solver)):
        np.testing.assert_array_equal(a, b)


def params_of_history(solver):
    return [np.array(h.data) for h in solver.history]


@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
def test_failed_snapshot_leaves_previous_files_intact(fmt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver, _ = _run(load_case("sgd"), tmp_path, SGD_MULTISTEP + f"snapshot_format: {fmt}\n", 2)
    model, state = solver.snapshot()
    before = {p: pathlib.Path(p).read_bytes() for p in (model, state)}
    solver.net.params["ip"][0].data[...] += 1  # a different snapshot at the same iteration

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    # Fails while writing the state, after the model's temporary file is complete.
    monkeypatch.setattr(snapshot_module, "blob_to_proto" if fmt == "BINARYPROTO" else "_h5_string", disk_full)
    with pytest.raises(OSError, match="No space"):
        solver.snapshot()
    assert sorted(os.listdir("snaps")) == sorted(os.path.basename(p) for p in before)  # no temp file left
    for path, data in before.items():
        assert pathlib.Path(path).read_bytes() == data
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    solver.snapshot()
    assert pathlib.Path(model).read_bytes() != before[model]


@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
def test_both_temp_files_are_complete_before_the_model_then_the_state_is_renamed(fmt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver, _ = _run(load_case("sgd"), tmp_path, SGD_MULTISTEP + f"snapshot_format: {fmt}\n", 1)
    renames = []
    real_replace = snapshot_module.files.replace

    def recording_replace(tmp, path):
        contents = {name: (pathlib.Path("snaps") / name).read_bytes() for name in os.listdir("snaps")}
        renames.append((os.path.basename(path), contents))
        real_replace(tmp, path)

    monkeypatch.setattr(snapshot_module.files, "replace", recording_replace)
    model, state = solver.snapshot()
    model_name, state_name = os.path.basename(model), os.path.basename(state)
    assert [name for name, _ in renames] == [model_name, state_name]
    # At the first rename both temporary files hold what the final files hold: complete.
    at_first = renames[0][1]
    assert len(at_first) == 2 and all(name.endswith(".tmp") for name in at_first)
    final = {pathlib.Path(p).read_bytes() for p in (model, state)}
    assert set(at_first.values()) == final
    # The model is in place before the state that names it.
    assert model_name in renames[1][1]
    assert sorted(os.listdir("snaps")) == sorted([model_name, state_name])


def test_snapshot_into_a_missing_folder_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver, _ = _run(load_case("sgd"), tmp_path, SGD_MULTISTEP.replace('"snaps/run"', '"nowhere/run"'), 1)
    with pytest.raises(snapshot_module.SnapshotError, match="folder 'nowhere' does not exist.*snapshot_prefix"):
        solver.snapshot()


def test_restoring_weights_that_do_not_fit_names_the_state(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver, _ = _run(load_case("sgd"), tmp_path, SGD_MULTISTEP + "snapshot_format: HDF5\n", 1)
    model, state = solver.snapshot()
    with h5py.File(model, "r+") as handle:
        del handle["data/ip/0"]  # "ip" owns its weights: Caffe refuses the file
    other, _ = oracle_solver(load_case("sgd"), tmp_path, SGD_MULTISTEP + "snapshot_format: HDF5\n")
    with pytest.raises(snapshot_module.SnapshotError, match=r"solverstate\.h5: .*learned_net.*param 0 is missing") as info:
        other.restore(state)
    assert isinstance(info.value.__cause__, WeightsError)


def test_no_snapshot_of_non_finite_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver, _ = _run(load_case("sgd"), tmp_path, SGD_MULTISTEP, 1)
    solver.net.params["ip"][1].data[0] = np.nan
    with pytest.raises(NonFiniteParamsError, match=r"ip\[1\]"):
        solver.snapshot()
    assert os.listdir("snaps") == []


def test_restore_resolves_learned_net_beside_the_state(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver, _ = _run(load_case("sgd"), tmp_path, SGD_MULTISTEP, 2)
    _, state = solver.snapshot()
    monkeypatch.chdir(tmp_path / "snaps")  # "snaps/run_iter_2.caffemodel" does not exist from here
    other, _ = oracle_solver(load_case("sgd"), tmp_path, SGD_MULTISTEP)
    other.restore(tmp_path / state)
    for a, b in zip(params_of(other.net), params_of(solver.net)):
        np.testing.assert_array_equal(a, b)
    assert other.current_step == solver.current_step == 1


# -------------------------------------------------------------------------------------------- exact resumption
RANDOM_SOLVER = """
net: "random_net.prototxt"
type: "Adam"
base_lr: 0.05
momentum: 0.9
weight_decay: 0.001
lr_policy: "multistep"
stepvalue: 2
stepvalue: 4
gamma: 0.5
max_iter: 7
test_iter: 2
test_interval: 2
snapshot: 3
snapshot_prefix: "rnd"
snapshot_after_train: false
random_seed: {seed}
solver_mode: CPU
"""


def _random_solver(tmp_path, seed):
    (tmp_path / "random_net.prototxt").write_text(RANDOM_NET)
    (tmp_path / f"solver{seed}.prototxt").write_text(RANDOM_SOLVER.format(seed=seed))
    return get_solver(str(tmp_path / f"solver{seed}.prototxt"))


def _record(solver):
    trace = []
    solver.add_callback(after_update=lambda: trace.append((solver.iter, float(solver.net.blobs["loss"].data),
                                                           params_of(solver.net))))
    return trace


def _strip_netdef_state(path):
    state = pb.SolverState.FromString(pathlib.Path(path).read_bytes())
    state.ClearField("netdef_state")
    pathlib.Path(path).write_bytes(state.SerializeToString())


def test_exact_resumption_with_dropout_and_random_data(tmp_path, monkeypatch):
    """DummyData gaussian data and Dropout draw from netdef.backend.rng(); the test net draws too.
    Iterations 4..7 of a run resumed from the snapshot at 3 equal the uninterrupted run's bit for bit."""
    monkeypatch.chdir(tmp_path)
    full = _random_solver(tmp_path, 5)
    trace = _record(full)
    full.solve()
    assert [t[0] for t in trace] == list(range(1, 8))

    resumed = _random_solver(tmp_path, 99)  # another seed: the generator state comes from the snapshot
    again = _record(resumed)
    resumed.solve("rnd_iter_3.solverstate")
    assert [t[0] for t in again] == [4, 5, 6, 7]
    for (it, loss, params), (it2, loss2, params2) in zip(trace[3:], again):
        assert it == it2 and loss == loss2
        for a, b in zip(params, params2):
            np.testing.assert_array_equal(a, b)

    # Without netdef's state (a Caffe-style resume) the random draws differ: the check above can fail.
    _strip_netdef_state("rnd_iter_3.solverstate")
    caffe_like = _random_solver(tmp_path, 99)
    diverged = _record(caffe_like)
    caffe_like.solve("rnd_iter_3.solverstate")
    assert diverged[0][1] != trace[3][1]


def test_same_seed_same_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = []
    for seed in (5, 5, 6):
        solver = _random_solver(tmp_path, seed)
        solver.step(3)
        runs.append(params_of(solver.net))
    for a, b in zip(runs[0], runs[1]):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, c) for a, c in zip(runs[0], runs[2]))


MEMORY_NET = """
name: "memory_net"
layer { name: "data" type: "MemoryData" top: "data" top: "label"
  memory_data_param { batch_size: 4 channels: 3 height: 1 width: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

MEMORY_SOLVER = """
net: "memory_net.prototxt"
base_lr: 0.05
momentum: 0.9
lr_policy: "fixed"
snapshot: 2
snapshot_prefix: "mem"
random_seed: 1
solver_mode: CPU
"""


def test_exact_resumption_with_memory_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "memory_net.prototxt").write_text(MEMORY_NET)
    (tmp_path / "solver.prototxt").write_text(MEMORY_SOLVER)
    rng = np.random.default_rng(3)
    data = rng.standard_normal((12, 3, 1, 1)).astype(np.float32)
    labels = rng.standard_normal(12).astype(np.float32)

    full = get_solver("solver.prototxt")
    full.net.layers[0].set_input_arrays(data, labels)
    trace = _record(full)
    full.step(5)  # 5 batches of 4 from 12 items: the position wraps

    resumed = get_solver("solver.prototxt")
    resumed.net.layers[0].set_input_arrays(data, labels)  # the arrays first: setting them rewinds
    resumed.restore("mem_iter_2.solverstate")
    again = _record(resumed)
    resumed.step(3)
    for (it, loss, params), (it2, loss2, params2) in zip(trace[2:], again):
        assert it == it2 and loss == loss2
        for a, b in zip(params, params2):
            np.testing.assert_array_equal(a, b)
    state = pb.SolverState.FromString(pathlib.Path("mem_iter_2.solverstate").read_bytes())
    assert [c.layer for c in state.netdef_state.data_cursor] == ["data"]
