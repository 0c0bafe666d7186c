"""The asynchronous exchange rules (easgd, gossip, hybrid) on real MPI (``mpiexec``, oversubscribed):
their arithmetic (``async_rules_script.py``), snapshots and exact resume, hybrid's groups, and a
raising rank ending the job. Every run has a timeout, so a hang fails the test."""
from __future__ import annotations

import pathlib
import re
import time

import numpy as np
import pytest

from netdef.comm.agreement import distributed_facts, first_difference
from netdef.comm.distributed import options_from
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from netdef.weights import proto_values
from tests.comm.fixtures import mpi_available, run_netdef, run_python, write_case

AVAILABLE, WHY_NOT = mpi_available()
needs_mpi = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)

BATCH = 4
HERE = pathlib.Path(__file__).resolve().parent


def state(path) -> pb.SolverState:
    return proto_io.read_binary(str(path), pb.SolverState)


def model_values(path) -> list[np.ndarray]:
    net = proto_io.read_binary(str(path), pb.NetParameter)
    return [proto_values(blob) for layer in net.layer for blob in layer.blobs]


def own_weights(rank_state: pb.NetdefRankState) -> np.ndarray:
    return np.concatenate([proto_values(p) for p in rank_state.param])


def train(tmp_path, name, ranks, flags, max_iter, **kwargs):
    solver = write_case(tmp_path, name, BATCH, max_iter, records=24, **kwargs)
    run = run_netdef(["train", str(solver), *flags], ranks, tmp_path, timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stderr + run.stdout


@needs_mpi
def test_elastic_and_gossip_arithmetic_under_mpi(tmp_path):
    run = run_python([str(HERE / "async_rules_script.py")], 3, tmp_path, timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(re.findall(r"rank (\d) ok", run.stdout)) == ["0", "1", "2"]


@needs_mpi
def test_easgd_snapshot_and_exact_resume(tmp_path):
    # tau 4: elastic steps after iterations 3 and 7; the snapshot at 4 follows the first, and the
    # resumed iterations 4..6 take no step, so they are deterministic and must match bit for bit.
    flags = ["--exchange", "easgd", "--tau", "4"]
    tests = {"test_iter": 2, "test_records": 24, "test_interval": 4}
    log = train(tmp_path, "full", 2, flags, 7, snapshot=4, **tests)
    assert "Gradient exchange: easgd (each rank trains on its own gradients; tau 4, alpha 0.45 (beta 0.9 / 2 " \
           "ranks)" in log
    assert log.count("tests and the snapshots' model files use the centre variable") == 1
    saved = state(tmp_path / "full_iter_4.solverstate").netdef_state
    assert len(saved.rank_state) == 2
    rank0, rank1 = (own_weights(r) for r in saved.rank_state)
    centre_ip1 = model_values(tmp_path / "full_iter_4.caffemodel")[0]  # ip1's weights, the first parameter
    assert not np.allclose(rank0, rank1) and not np.allclose(rank0[:centre_ip1.size], centre_ip1)
    assert all(len(r.history) == len(r.param) == 7 for r in saved.rank_state)  # ip1, ip2 (shared), scale, ip3

    # Resumed to the end: every rank's state (weights, history, data position, random state) and the
    # centre as in the uninterrupted run.
    resumed_log = train(tmp_path, "resumed", 2, flags + ["--snapshot", str(tmp_path / "full_iter_4.solverstate")], 7,
                        **tests)
    assert "written by" not in resumed_log
    full = state(tmp_path / "full_iter_7.solverstate").netdef_state.rank_state
    resumed = state(tmp_path / "resumed_iter_7.solverstate").netdef_state.rank_state
    assert len(full) == len(resumed) == 2
    for a, b in zip(full, resumed):
        assert np.array_equal(own_weights(a), own_weights(b))
        assert a.SerializeToString() == b.SerializeToString()
    assert not np.array_equal(own_weights(full[0]), rank0)  # it trained after the resume
    for a, b in zip(model_values(tmp_path / "resumed_iter_7.caffemodel"), model_values(tmp_path / "full_iter_7.caffemodel")):
        assert np.array_equal(a, b)


@needs_mpi
def test_gossip_snapshot_round_trip(tmp_path):
    flags = ["--exchange", "gossip", "--gossip_probability", "0.6"]
    tests = {"test_iter": 2, "test_records": 24, "test_interval": 6}
    log = train(tmp_path, "full", 2, flags, 6, snapshot=6, **tests)
    assert "with probability 0.6" in log and "model files use rank 0's weights" in log
    saved = state(tmp_path / "full_iter_6.solverstate").netdef_state
    weights = [r.gossip.mixing_weight for r in saved.rank_state]
    assert abs(sum(weights) - 1) < 1e-12 and len(set(weights)) > 1  # settled, and they did gossip
    assert len({r.gossip.rng_state for r in saved.rank_state}) == 2
    ip1 = model_values(tmp_path / "full_iter_6.caffemodel")[0]
    assert np.array_equal(ip1, own_weights(saved.rank_state[0])[:ip1.size])
    assert not np.array_equal(ip1, own_weights(saved.rank_state[1])[:ip1.size])
    again = train(tmp_path, "again", 2, flags + ["--snapshot", str(tmp_path / "full_iter_6.solverstate")], 6, **tests)
    assert "written by" not in again
    written = state(tmp_path / "again_iter_6.solverstate").netdef_state
    assert [r.SerializeToString() for r in written.rank_state] == [r.SerializeToString() for r in saved.rank_state]


@needs_mpi
def test_hybrid_groups_train_alike_inside_and_apart_between(tmp_path):
    # Chunk sizes given: no link measurement (it only slows the test down).
    log = train(tmp_path, "hybrid", 4, ["--exchange", "hybrid", "--group_size", "2", "--tau", "3", "--chunk_bytes",
                                         "4096", "--credit_bytes", "8192"], 5,
                snapshot=5, test_iter=2, test_records=24, test_interval=5)
    assert "hybrid (2 group(s) of 2 consecutive ranks; inside a group allreduce" in log
    assert "alpha 0.45 (beta 0.9 / 2 groups)" in log
    assert re.search(r"Test net output #\d+: accuracy = ", log)
    ranks = [own_weights(r) for r in state(tmp_path / "hybrid_iter_5.solverstate").netdef_state.rank_state]
    assert np.array_equal(ranks[0], ranks[1]) and np.array_equal(ranks[2], ranks[3])
    assert not np.allclose(ranks[0], ranks[2])


@needs_mpi
@pytest.mark.parametrize("rule", ["easgd", "gossip"])
def test_a_raising_rank_ends_the_job(tmp_path, rule):
    solver = write_case(tmp_path, "fail", BATCH, 200, records=24, param_str="fail_rank=1 fail_iter=3 mode=raise")
    start = time.monotonic()
    run = run_netdef(["train", str(solver), "--exchange", rule, "--tau", "1", "--gossip_probability", "1"], 2,
                     tmp_path, timeout=60)
    assert run.returncode != 0
    assert time.monotonic() - start < 30
    assert "rank 1 of 2 failed: RuntimeError" in run.stderr


def test_the_rules_settings_come_from_the_file_and_flags_and_must_agree():
    param = pb.SolverParameter()
    param.netdef_distributed.exchange = "easgd"
    param.netdef_distributed.tau = 4
    options = options_from(param, alpha=0.25, group_size=3)
    assert (options.tau, options.alpha, options.beta, options.group_size) == (4, 0.25, pytest.approx(0.9), 3)
    assert options.gossip_probability == pytest.approx(0.1)  # the schema's default
    other = options_from(param, tau=5, alpha=0.25, group_size=3)
    assert first_difference("distributed", [distributed_facts(options), distributed_facts(other)]) == \
        "ranks disagree on distributed tau: rank 0 has 4, rank 1 has 5"
    for bad, field in [({"tau": 0}, "tau"), ({"alpha": 1.5}, "alpha"), ({"gossip_probability": 2}, "gossip_probability"),
                       ({"group_size": 0}, "group_size")]:
        with pytest.raises(ValueError, match=f"netdef_distributed.{field} must"):
            options_from(param, **bad)
