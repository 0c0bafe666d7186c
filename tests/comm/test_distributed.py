"""The distributed solver in one process (it must train exactly like the plain solver), its
options, the train command's flags, and resuming with a different number of ranks."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from netdef.cli import build_parser
from netdef.comm import Communicator, DataParallel, ExchangeOptions, create_solver, options_from
from netdef.comm.agreement import distributed_facts
from netdef.comm.options import OPTIONS, flag_values
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from netdef.solver import get_solver
from netdef.solver.parallel import Parallel
from netdef.solver.solver import read_solver_param
from tests.comm.fixtures import run_netdef, write_case


def params_of(solver) -> dict:
    return {name: [b.data.copy() for b in blobs] for name, blobs in solver.net.params.items()}


def test_one_rank_trains_exactly_like_the_plain_solver(tmp_path):
    path = write_case(tmp_path, "one", 4, 5, records=24, test_records=24, test_iter=2, iter_size=2)
    plain = get_solver(str(path))
    plain.solve()
    dist = create_solver(str(path), comm=Communicator())
    assert type(dist).__name__ == "SGDSolver" and isinstance(dist.parallel, DataParallel)
    assert type(plain.parallel) is Parallel
    dist.solve()
    expected, got = params_of(plain), params_of(dist)
    for name in expected:
        for a, b in zip(got[name], expected[name]):
            np.testing.assert_array_equal(a, b)
    assert dist.test_scores == plain.test_scores
    records = list(dist.parallel.measurements.records)
    assert [r.iteration for r in records] == [0, 1, 2, 3, 4]
    assert all(r.forward_s > 0 and r.backward_s > 0 and r.bytes == 0 for r in records)
    # iter_size 2: the times of the last pass's backward, inside the iteration.
    assert all(r.start < r.backward_start_at < r.backward_end_at < r.end_at for r in records)
    assert all(r.backward_end_at - r.backward_start_at < r.backward_s for r in records)
    assert dist.parallel.measurements.summary()["iteration_s"] > 0


def test_options_from_the_solver_file_and_overrides():
    param, _ = read_solver_param('net: "x" netdef_distributed { overlap: false bucket_bytes: 1024 progress: THREAD '
                                 'timeline: "t.json" }')
    options = options_from(param)
    assert (options.exchange, options.overlap, options.bucket_bytes, options.progress, options.timeline) == \
        ("allreduce", False, 1024, "THREAD", "t.json")
    options = options_from(param, overlap=True, bucket_bytes=64, progress="mpi_async", timeline="")
    assert (options.overlap, options.bucket_bytes, options.progress, options.timeline) == (True, 64, "MPI_ASYNC", "")
    defaults = options_from(pb.SolverParameter())
    assert (defaults.overlap, defaults.bucket_bytes, defaults.progress) == (True, 4 << 20, "AUTO")
    with pytest.raises(ValueError, match="unknown exchange rule 'elastic'"):
        options_from(param, exchange="elastic")
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        options_from(param, bucket_bytes=0)


def test_multicolor_colors_from_the_solver_file_and_the_command_line():
    param, _ = read_solver_param('net: "x" netdef_distributed { exchange: "multicolor" multicolor_colors: 3 }')
    assert (options_from(param).exchange, options_from(param).multicolor_colors) == ("multicolor", 3)
    assert options_from(param, multicolor_colors=2).multicolor_colors == 2
    assert options_from(pb.SolverParameter()).multicolor_colors == 0  # chosen from the rank count
    with pytest.raises(ValueError, match="--colors must not be negative"):
        options_from(param, multicolor_colors=-1)
    args = build_parser().parse_args(["train", "s.prototxt", "--exchange", "fp16", "--colors", "2"])
    assert (args.exchange, args.colors) == ("fp16", 2)


def test_train_flags():
    parser = build_parser()
    args = parser.parse_args(["train", "s.prototxt", "--overlap=off", "--progress", "thread", "--bucket_bytes",
                              "1024", "--timeline", "x.json", "--exchange", "allreduce"])
    assert (args.overlap, args.progress, args.bucket_bytes, args.timeline, args.exchange) == \
        (False, "THREAD", 1024, "x.json", "allreduce")
    args = parser.parse_args(["train", "-solver", "s.prototxt", "-overlap", "on", "-progress", "mpi_async"])
    assert (args.solver, args.overlap, args.progress) == ("s.prototxt", True, "MPI_ASYNC")
    args = parser.parse_args(["train", "s.prototxt"])
    assert (args.overlap, args.progress, args.bucket_bytes, args.timeline, args.exchange) == (None,) * 5
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "s.prototxt", "--overlap=maybe"])


def test_every_distributed_option_is_declared_once():
    """Each NetdefDistributedParameter field is one ExchangeOptions field, with the schema's default, and
    netdef train's flag, the check and the ranks' agreement come from that declaration."""
    schema = pb.NetdefDistributedParameter.DESCRIPTOR
    assert sorted(option.name for option in OPTIONS) == sorted(schema.fields_by_name)
    assert options_from(pb.SolverParameter()) == ExchangeOptions()
    args = build_parser().parse_args(["train", "s.prototxt", "--tau", "4", "--colors", "3"])
    given = flag_values(args)
    assert set(given) == {option.name for option in OPTIONS}
    assert {name for name, value in given.items() if value is not None} == {"tau", "multicolor_colors"}
    per_rank = {option.name for option in OPTIONS if option.metadata["per_rank"]}
    assert per_rank == {"stall_warning_seconds", "stall_abort_seconds"}  # each rank's own watchdog times
    assert len(distributed_facts(ExchangeOptions())) == len(OPTIONS) - len(per_rank)
    for name, bad in (("tau", 0), ("bucket_bytes", -1), ("schedule", "lifo"), ("beta", 2.0),
                      ("stall_abort_seconds", float("nan")), ("stall_warning_seconds", -1.0)):
        with pytest.raises(ValueError, match=f"netdef_distributed.{name} must"):
            options_from(pb.SolverParameter(), **{name: bad})


def test_train_command_in_one_process_with_a_timeline(tmp_path):
    solver = write_case(tmp_path, "cli", 4, 3, records=24)
    run = run_netdef(["train", str(solver), "--timeline", "trace.json", "--iterations", "2"], 0, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "cli_iter_2.caffemodel").exists()
    state = proto_io.read_binary(str(tmp_path / "cli_iter_2.solverstate"), pb.SolverState)
    assert len(state.netdef_state.rank_state) == 0  # one rank: its state is the top-level fields
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"ip1 forward", "ip3 backward", "forward", "backward"} <= names
    assert not any(n.startswith("bucket") for n in names)


def test_resuming_with_another_number_of_ranks_restarts_the_data(tmp_path, caplog):
    path = write_case(tmp_path, "multi", 4, 2, records=24, snapshot=2)
    first = create_solver(str(path), comm=Communicator())
    first.solve()
    state_path = tmp_path / "multi_iter_2.solverstate"
    # What a 2-rank run writes: every rank's own state inside the state file.
    state = proto_io.read_binary(str(state_path), pb.SolverState)
    assert state.netdef_state.data_cursor  # the single process's position, which must not be applied
    for _ in range(2):
        state.netdef_state.rank_state.add().CopyFrom(pb.NetdefRankState(rng_state=state.netdef_state.rng_state))
    state_path.write_bytes(state.SerializeToString())
    second = create_solver(str(path), comm=Communicator())
    with caplog.at_level(logging.WARNING, logger="netdef"):
        second.restore(str(state_path))
    assert second.iter == 2
    assert "written by 2 rank(s) and this run has 1" in caplog.text
    data = second.net.layers[0]
    fresh = create_solver(str(path), comm=Communicator()).net.layers[0]
    assert data.data_state() == fresh.data_state()  # from the start of its (new) shard
    for solver in (first, second):
        solver.close()


def test_resuming_a_single_process_snapshot_restores_the_data_position(tmp_path):
    path = write_case(tmp_path, "single", 4, 2, records=24, snapshot=2)
    first = create_solver(str(path), comm=Communicator())
    first.step(2)  # snapshots at 2 (solve() would then run one more forward pass)
    saved = first.net.layers[0].data_state()
    assert b'"index":8' in saved
    second = create_solver(str(path), comm=Communicator())
    second.restore(str(tmp_path / "single_iter_2.solverstate"))
    assert second.net.layers[0].data_state() == saved
    for solver in (first, second):
        solver.close()
