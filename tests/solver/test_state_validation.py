"""Every field read from a solver state is checked before it is used (issue 11, fault 4): crafted
``.solverstate`` / ``.solverstate.h5`` files fail with one error naming the file and the field, through
the Python API and the command line, instead of looping, dividing by zero or quoting a parser."""
from __future__ import annotations

import base64
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from netdef import backend
from netdef.proto import netdef_pb2 as pb
from netdef.solver import get_solver
from netdef.solver.snapshot import SnapshotError
from tests.comm.fixtures import REPO, write_case

DATA_STATE_HEADER = b"netdef-data-state 1\n"


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A solver over an LMDB with a snapshot at iteration 2 (binary) and its HDF5 twin."""
    folder = tmp_path_factory.mktemp("state")
    solver_path = write_case(folder, "run", 4, 2, records=16, snapshot=2)
    hdf5_path = write_case(folder, "h5", 4, 2, records=16, snapshot=2, extra="snapshot_format: HDF5\n")
    for path in (solver_path, hdf5_path):
        with get_solver(str(path)) as solver:
            solver.solve()
    return folder, solver_path, hdf5_path


def _crafted(case, tmp_path, edit) -> str:
    folder, _, _ = case
    state = pb.SolverState.FromString((folder / "run_iter_2.solverstate").read_bytes())
    edit(state)
    path = tmp_path / "crafted.solverstate"
    path.write_bytes(state.SerializeToString())
    return str(path)


def _edit_cursor(edit):
    def apply(state):
        cursor = state.netdef_state.data_cursor[0]
        doc = json.loads(cursor.state[len(DATA_STATE_HEADER):])
        edit(doc)
        cursor.state = DATA_STATE_HEADER + json.dumps(doc).encode()
    return apply


def _set(field, value):
    return lambda state: setattr(state, field, value)


def _rng(data: bytes):
    return lambda state: setattr(state.netdef_state, "rng_state", data)


BINARY_CASES = [
    pytest.param(_set("iter", -1), r"field iter is -1", id="negative-iter"),
    pytest.param(_set("current_step", -3), r"field current_step is -3", id="negative-current_step"),
    pytest.param(_edit_cursor(lambda d: d.update(shard=[5, 2])), r"data_cursor 'data'.*rank 5 of 2", id="shard-rank"),
    pytest.param(_edit_cursor(lambda d: d.update(shard=[0, 0])), r"data_cursor 'data'.*rank 0 of 0", id="shard-count-0"),
    pytest.param(_edit_cursor(lambda d: d.update(shard="x")), r"data_cursor 'data'.*shard must be", id="shard-type"),
    pytest.param(_edit_cursor(lambda d: d["pos"].update(index=10**9)), r"data_cursor 'data'.*'index'",
                 id="cursor-index"),
    pytest.param(_edit_cursor(lambda d: d.update(rng={"bit_generator": "PCG64", "state": 3})),
                 r"data_cursor 'data'.*random state", id="cursor-rng"),
    pytest.param(_edit_cursor(lambda d: d["rng"]["state"].update(state=2**200)),
                 r"data_cursor 'data'.*random state.*too large", id="cursor-rng-overflow"),
    pytest.param(_edit_cursor(lambda d: d["pos"].update(key={"__bytes__": base64.b64encode(b"0P06").decode()})),
                 r"data_cursor 'data'.*'key' names record b'0P06', which .*lmdb does not hold", id="cursor-key"),
    pytest.param(_edit_cursor(lambda d: d["pos"].update(key={"__bytes__": ""})),
                 r"data_cursor 'data'.*'key': LMDB .*BadValsizeError", id="cursor-key-empty"),
    pytest.param(_rng(b"numpy-bitgen-json:{not json"), r"field rng_state: not a readable", id="rng-json"),
    pytest.param(_rng(b'numpy-bitgen-json:{"bit_generator": "PCG64", "state": {"state": %d, "inc": 1}, '
                      b'"has_uint32": 0, "uinteger": 0}' % 2**200),
                 r"field rng_state: not a valid PCG64 state \(Python int too large", id="rng-overflow"),
    pytest.param(_rng(b'numpy-bitgen-json:{"bit_generator": "PCG64", "state": {"state": "x"}}'),
                 r"field rng_state: not a valid PCG64 state", id="rng-state"),
    pytest.param(_rng(b'numpy-bitgen-json:[1, 2]'), r"field rng_state: .*mapping", id="rng-not-a-mapping"),
    pytest.param(lambda s: s.history[0].data.__setitem__(0, float("nan")), r"history blob 0 .*not finite",
                 id="history-nan"),
    pytest.param(lambda s: s.history.pop(), r"Incorrect length of history blobs", id="history-count"),
    pytest.param(lambda s: setattr(s.netdef_state, "loss_window_start", 99), r"loss_window_start is 99",
                 id="loss-window-start"),
    pytest.param(lambda s: setattr(s.netdef_state, "smoothed_loss", float("inf")), r"smoothed_loss is inf",
                 id="smoothed-loss"),
]


@pytest.mark.parametrize("edit, message", BINARY_CASES)
def test_a_crafted_field_is_named_with_the_file(case, tmp_path, edit, message):
    path = _crafted(case, tmp_path, edit)
    with get_solver(str(case[1])) as solver:
        with pytest.raises(SnapshotError, match=message) as info:
            solver.restore(path)
    assert str(info.value).startswith(path)


def test_a_learned_net_that_is_not_utf8_is_named(case, tmp_path):
    """protobuf hands such a string field over as bytes (which os.path.join then refused)."""
    path = _crafted(case, tmp_path, lambda state: None)
    with open(path, "ab") as handle:
        handle.write(b"\x12\x03a\xff\xfe")  # learned_net again (the last one counts): 'a', then not UTF-8
    with get_solver(str(case[1])) as solver:
        with pytest.raises(SnapshotError, match=rf"^{path}: field learned_net \(3 bytes\) is not UTF-8 text$"):
            solver.restore(path)


def test_a_refused_random_state_leaves_the_generator_as_it_was():
    generator = np.random.default_rng(5)
    before = generator.bit_generator.state
    bad = {**before, "state": {"state": 2**200, "inc": 1}}
    with pytest.raises(ValueError, match="too large"):
        backend.set_generator_state(generator, bad)
    assert generator.bit_generator.state == before


def test_the_untouched_state_restores(case, tmp_path):
    path = _crafted(case, tmp_path, lambda state: None)
    with get_solver(str(case[1])) as solver:
        solver.restore(path)
        assert solver.iter == 2


def test_adam_at_iteration_minus_one_is_refused(case, tmp_path):
    """Adam's correction divides by 1 - beta^iter: zero at iteration 0 after the step's +1 from -1."""
    folder = case[0]
    solver_path = write_case(folder, "adam", 4, 2, records=16, snapshot=2, extra='type: "Adam"\n')
    with get_solver(str(solver_path)) as solver:
        solver.solve()
    state = pb.SolverState.FromString((folder / "adam_iter_2.solverstate").read_bytes())
    state.iter = -1
    path = tmp_path / "adam.solverstate"
    path.write_bytes(state.SerializeToString())
    with get_solver(str(solver_path)) as solver:
        with pytest.raises(SnapshotError, match=r"field iter is -1"):
            solver.restore(str(path))


def _crafted_hdf5(case, tmp_path, edit) -> str:
    folder = case[0]
    path = tmp_path / "crafted.solverstate.h5"
    path.write_bytes((folder / "h5_iter_2.solverstate.h5").read_bytes())
    with h5py.File(path, "r+") as handle:
        edit(handle)
    return str(path)


def _replace(name, value):
    def edit(handle):
        del handle[name]
        handle[name] = value
    return edit


HDF5_CASES = [
    pytest.param(_replace("iter", np.array([-4], dtype=np.int32)), r"field iter is -4", id="negative-iter"),
    pytest.param(_replace("iter", np.array([1.5])), r"field iter must be one integer", id="float-iter"),
    pytest.param(lambda h: h.__delitem__("iter"), r"field iter: no such dataset", id="missing-iter"),
    pytest.param(_replace("current_step", np.array([-1], dtype=np.int32)), r"field current_step is -1",
                 id="negative-current_step"),
    pytest.param(_replace("netdef_state", np.void(b"\xff\xff\xff")), r"field netdef_state", id="netdef-state"),
    pytest.param(_replace("history/0", np.array([b"text"])), r"history blob 0 holds", id="history-text"),
]


@pytest.mark.parametrize("edit, message", HDF5_CASES)
def test_a_crafted_hdf5_field_is_named_with_the_file(case, tmp_path, edit, message):
    path = _crafted_hdf5(case, tmp_path, edit)
    with get_solver(str(case[2])) as solver:
        with pytest.raises(SnapshotError, match=message) as info:
            solver.restore(path)
    assert str(info.value).startswith(path)


def test_the_command_line_says_one_line(case, tmp_path):
    path = _crafted(case, tmp_path, _edit_cursor(lambda d: d.update(shard=[3, 2])))
    run = subprocess.run([sys.executable, "-m", "netdef.cli", "train", str(case[1]), f"--snapshot={path}"],
                         capture_output=True, text=True, timeout=120, cwd=str(case[0]),
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"netdef: error: {path}: field data_cursor 'data'") and "rank 3 of 2" in last, run.stderr
    assert "Traceback" not in run.stderr


def test_a_lowered_average_loss_restarts_the_displayed_average(case, tmp_path):
    """Not an error: the user may change average_loss between runs (Caffe always restarts it)."""
    path = _crafted(case, tmp_path, lambda s: s.netdef_state.loss_window.extend([1.0] * 50))
    with get_solver(str(case[1])) as solver:
        solver.restore(path)
        assert solver.iter == 2 and solver.loss_window.resumed is None


def test_an_hdf5_history_declaring_terabytes_is_refused_before_reading(case, tmp_path):
    """Issue 32, class 1: a history data set that declares 4 TiB and holds nothing."""
    from netdef.memory import BlobTooLargeError

    def declare_huge_history(handle):
        del handle["history/0"]
        handle.create_dataset("history/0", shape=(2**40,), dtype=np.float32, chunks=(1024,))

    path = _crafted_hdf5(case, tmp_path, declare_huge_history)
    with get_solver(str(case[2])) as solver:
        with pytest.raises(BlobTooLargeError, match=rf"^HDF5 file {path}: data set '/history/0' of shape "
                                                    rf"\({2**40},\) needs {4 * 2**40} bytes"):
            solver.restore(path)
