"""`netdef train --tensorboard DIR`: the scalars read back with TensorBoard's own event reader, against
the numbers the same run logged; and in a 2-rank MPI run, the exchange's measurements from rank 0."""
import pytest

from netdef.tools.curves import parse_log
from tests.comm.fixtures import mpi_available, write_case
from tests.comm.fixtures import run_netdef as run_mpi
from tests.test_cli import write_tiny_model
from tests.tools.run import run_netdef

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="reading the event files needs tensorboard (in the [test] extra)")
pytest.importorskip("tensorboardX", reason="--tensorboard needs tensorboardX (the [tensorboard] extra)")


def read_scalars(folder) -> dict[str, dict[int, float]]:
    accumulator = event_accumulator.EventAccumulator(str(folder))
    accumulator.Reload()
    return {tag: {event.step: event.value for event in accumulator.Scalars(tag)}
            for tag in accumulator.Tags()["scalars"]}


def test_scalars_are_the_logged_numbers_at_their_iterations(tmp_path):
    write_tiny_model(tmp_path, train_images=64)
    for split in ("train", "test"):
        assert run_netdef("convert-mnist", f"{split}-images.idx.gz", f"{split}-labels.idx.gz", f"{split}_lmdb",
                          cwd=tmp_path)[0] == 0
    status, log = run_netdef("train", "solver.prototxt", "--tensorboard", "runs/tiny", cwd=tmp_path)
    assert status == 0, log
    (tmp_path / "train.log").write_text(log)
    logged = parse_log(tmp_path / "train.log")
    scalars = read_scalars(tmp_path / "runs" / "tiny")
    assert {"train/loss", "train/iter_per_s", "train/lr", "test0/accuracy", "test0/loss"} <= set(scalars)
    train_loss = {row["NumIters"]: row["loss"] for row in logged.train.rows}
    assert set(scalars["train/loss"]) == set(train_loss) == {0, 10, 20, 30}
    for step, value in train_loss.items():  # the log prints 6 significant digits
        assert scalars["train/loss"][step] == pytest.approx(value, rel=1e-5)
    assert scalars["train/lr"] == {0: pytest.approx(0.1), 10: pytest.approx(0.1), 20: pytest.approx(0.1),
                                   30: pytest.approx(0.1)}
    accuracy = {row["NumIters"]: row["accuracy"] for row in logged.test.rows}
    assert set(scalars["test0/accuracy"]) == set(accuracy) == {0, 20, 40}
    for step, value in accuracy.items():
        assert scalars["test0/accuracy"][step] == pytest.approx(value, rel=1e-5)
    speeds = scalars["train/iter_per_s"]
    assert speeds[0] == 0 and all(speeds[step] > 0 for step in (10, 20, 30))  # none done yet at iteration 0
    assert not any(tag.startswith("exchange/") for tag in scalars)  # one process exchanges nothing


@pytest.mark.skipif(not mpi_available()[0], reason=mpi_available()[1])
def test_two_ranks_write_one_event_file_with_the_exchange_measurements(tmp_path):
    solver = write_case(tmp_path, "tb", batch=4, max_iter=6)
    run = run_mpi(["train", str(solver), "--tensorboard", "tb_runs"], 2, tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(list((tmp_path / "tb_runs").glob("events.out.tfevents.*"))) == 1  # rank 0 alone writes
    scalars = read_scalars(tmp_path / "tb_runs")
    # display: 1; the first display comes before any iteration has finished.
    assert set(scalars["exchange/wait_s"]) == {1, 2, 3, 4, 5}
    assert all(value >= 0 for value in scalars["exchange/wait_s"].values())
    assert set(scalars["exchange/hidden_fraction"]) <= {1, 2, 3, 4, 5} and scalars["exchange/hidden_fraction"]
    assert all(0 <= value <= 1 for value in scalars["exchange/hidden_fraction"].values())
    assert set(scalars["train/loss"]) == set(range(6))
