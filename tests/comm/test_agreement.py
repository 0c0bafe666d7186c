"""Start-up agreement (netdef/comm/agreement.py): ranks whose settings differ end at once, on every
rank, with one line naming the field and both values, instead of hanging in different collectives.
Real MPI jobs whose ranks get different files or flags (the launcher's ``A : B`` form)."""
from __future__ import annotations

import re

import pytest

from netdef.comm.agreement import first_difference, solver_facts
from netdef.proto import netdef_pb2 as pb
from tests.comm.fixtures import mpi_available, run_netdef_per_rank, write_case

AVAILABLE, WHY_NOT = mpi_available()
needs_mpi = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)


def test_the_first_difference_is_named_with_both_values():
    by_rank = [{"max_iter": "300", "base_lr": "0.01"}, {"max_iter": "300", "base_lr": "0.01"},
               {"max_iter": "100", "base_lr": "0.1"}]
    assert first_difference("solver", by_rank) == "ranks disagree on solver max_iter: rank 0 has 300, rank 2 has 100"


def test_a_field_only_one_rank_has_is_a_difference():
    assert first_difference("net", [{"a": "1"}, {"a": "1", "b": "2"}]) == \
        "ranks disagree on net b: rank 0 has nothing, rank 1 has 2"


def test_solver_facts_leave_out_what_is_each_ranks_own():
    param = pb.SolverParameter(max_iter=5, device_id=3, net="here.prototxt", base_lr=0.01)
    facts = solver_facts(param)
    assert facts["max_iter"] == "5" and facts["base_lr"] == "0.01" and facts["solver_mode"] == "GPU"
    assert "device_id" not in facts and "net" not in facts and "netdef_distributed" not in facts


def _two_solvers(tmp_path, change_solver=None, change_net=None):
    """Solvers a (rank 0) and b (rank 1) of the same small case; ``change_*`` edits b's text."""
    paths = []
    for name in ("a", "b"):
        solver = write_case(tmp_path, name, 4, 6, records=16, test_records=8, test_iter=1, test_interval=2)
        if name == "b":
            # The same snapshot prefix (the prefix is compared too), and then b's own edit.
            solver.write_text(solver.read_text().replace(f'{tmp_path / "b"}"', f'{tmp_path / "a"}"'))
            if change_solver:
                solver.write_text(change_solver(solver.read_text()))
            if change_net:
                net = tmp_path / "b_net.prototxt"
                net.write_text(change_net(net.read_text()))
        paths.append(str(solver))
    return paths


CASES = [
    pytest.param(lambda s: s.replace("max_iter: 6", "max_iter: 2"), None, [],
                 "solver max_iter: rank 0 has 6, rank 1 has 2", id="max_iter"),
    pytest.param(lambda s: s.replace("test_interval: 2", "test_interval: 3"), None, [],
                 "solver test_interval: rank 0 has 2, rank 1 has 3", id="test_interval"),
    pytest.param(lambda s: s.replace("base_lr: 0.2", "base_lr: 0.02"), None, [],
                 "solver base_lr: rank 0 has 0.2, rank 1 has 0.02", id="base_lr"),
    pytest.param(None, lambda n: n.replace("num_output: 12", "num_output: 10"), [],
                 "net train net layer 'ip1' inner_product_param.num_output: rank 0 has 12, rank 1 has 10",
                 id="parameter-shape"),
    # Values alone (issue 32, class 6): the same shapes, a different model.
    pytest.param(None, lambda n: n.replace('top: "ip1" }', 'top: "ip1" relu_param { negative_slope: 0.1 } }'), [],
                 "net train net layer 'relu1' relu_param.negative_slope: rank 0 has nothing, rank 1 has 0.1",
                 id="relu-slope"),
    pytest.param(None, lambda n: n.replace("scale: 0.00390625", "scale: 0.5"), [],
                 "net train net layer 'data' transform_param.scale: rank 0 has 0.00390625, rank 1 has 0.5",
                 id="transform-scale"),
    pytest.param(None, lambda n: n.replace("batch_size: 4", "batch_size: 3"), [],
                 "net train net layer 'data' data_param.batch_size: rank 0 has 4, rank 1 has 3", id="batch-size"),
    pytest.param(None, None, ["--bucket_bytes=4096"],
                 "distributed bucket_bytes: rank 0 has 4194304, rank 1 has 4096", id="bucket_bytes"),
]


@needs_mpi
@pytest.mark.parametrize("change_solver, change_net, rank1_flags, expected", CASES)
def test_ranks_that_differ_end_at_once_with_one_line(tmp_path, change_solver, change_net, rank1_flags, expected):
    a, b = _two_solvers(tmp_path, change_solver, change_net)
    run = run_netdef_per_rank([["train", a], ["train", b, *rank1_flags]], tmp_path, timeout=120)
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("netdef: error")]
    assert errors == [f"netdef: error: ranks disagree on {expected}"], run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert not list(tmp_path.glob("a_iter_*")), "no rank trained"


@needs_mpi
def test_ranks_that_agree_train(tmp_path):
    a, b = _two_solvers(tmp_path)
    run = run_netdef_per_rank([["train", a], ["train", b]], tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"Iteration 6, loss", run.stderr + run.stdout)


@needs_mpi
def test_ranks_may_read_their_data_from_their_own_paths(tmp_path):
    """A data source is a path on each rank's node: it may differ (issue 32, class 6)."""
    import shutil

    a, b = _two_solvers(tmp_path)
    shutil.copytree(tmp_path / "train_lmdb", tmp_path / "train_lmdb_of_rank_1")
    net = tmp_path / "b_net.prototxt"
    net.write_text(net.read_text().replace(f'{tmp_path / "train_lmdb"}"', f'{tmp_path / "train_lmdb_of_rank_1"}"'))
    assert "train_lmdb_of_rank_1" in net.read_text()
    run = run_netdef_per_rank([["train", a], ["train", b]], tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"Iteration 6, loss", run.stderr + run.stdout)
