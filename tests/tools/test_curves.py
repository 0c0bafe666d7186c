"""`netdef parse-log` and `netdef plot` on a Caffe log excerpt (glog lines as Caffe's solver.cpp writes
them) and on the log of a real netdef training run."""
import csv
import math

import pytest

from netdef.tools.curves import parse_log, table_csv
from tests.test_cli import write_tiny_model
from tests.tools.run import run_netdef

CAFFE_LOG = """\
Log file created at: 2015/12/31 23:59:58
I1231 23:59:58.100000  4242 caffe.cpp:185] Using GPUs 0
I1231 23:59:59.000000  4242 solver.cpp:280] Solving LeNet
I1231 23:59:59.000100  4242 solver.cpp:281] Learning Rate Policy: inv
I1231 23:59:59.100000  4242 solver.cpp:338] Iteration 0, Testing net (#0)
I1231 23:59:59.900000  4242 solver.cpp:406]     Test net output #0: accuracy = 0.0856
I1231 23:59:59.900100  4242 solver.cpp:406]     Test net output #1: loss = 2.35003 (* 1 = 2.35003 loss)
I1231 23:59:59.950000  4242 solver.cpp:229] Iteration 0, loss = 2.33875
I1231 23:59:59.950100  4242 solver.cpp:245]     Train net output #0: loss = 2.33875 (* 1 = 2.33875 loss)
I1231 23:59:59.950200  4242 sgd_solver.cpp:106] Iteration 0, lr = 0.01
I0101 00:00:01.000000  4242 solver.cpp:229] Iteration 100, loss = 0.214566
I0101 00:00:01.000100  4242 solver.cpp:245]     Train net output #0: loss = 0.214566 (* 1 = 0.214566 loss)
I0101 00:00:01.000200  4242 sgd_solver.cpp:106] Iteration 100, lr = 0.00992565
I0101 00:00:02.500000  4242 solver.cpp:338] Iteration 200, Testing net (#0)
I0101 00:00:03.000000  4242 solver.cpp:406]     Test net output #0: accuracy = 0.9716
I0101 00:00:03.000100  4242 solver.cpp:406]     Test net output #1: loss = 0.0876 (* 1 = 0.0876 loss)
I0101 00:00:03.100000  4242 solver.cpp:229] Iteration 200, loss = 0.126302
I0101 00:00:03.100100  4242 solver.cpp:245]     Train net output #0: loss = 0.126302 (* 1 = 0.126302 loss)
I0101 00:00:03.100200  4242 sgd_solver.cpp:106] Iteration 200, lr = 0.00985258
I0101 00:00:03.200000  4242 solver.cpp:317] Optimization Done.
"""


def test_caffe_log_gives_parse_logs_tables(tmp_path):
    (tmp_path / "caffe.INFO").write_text(CAFFE_LOG)
    curves = parse_log(tmp_path / "caffe.INFO")
    assert curves.train.columns == ["NumIters", "Seconds", "LearningRate", "loss"]
    assert curves.test.columns == ["NumIters", "Seconds", "LearningRate", "accuracy", "loss"]
    assert [r["NumIters"] for r in curves.train.rows] == [0, 100, 200]
    assert curves.train.column("loss") == [2.33875, 0.214566, 0.126302]
    # A row takes the last rate logged before it (Caffe logs an iteration's rate after its outputs), and
    # the first row, before any "lr =" line, the second row's: as parse_log.py does.
    assert curves.train.column("LearningRate") == [0.01, 0.01, 0.00992565]
    # Seconds of the output line since the "Solving" line, across the new year.
    assert curves.train.column("Seconds") == pytest.approx([0.9501, 2.0001, 4.1001])
    assert curves.test.column("accuracy") == [0.0856, 0.9716]
    assert curves.test.column("loss") == [2.35003, 0.0876]
    assert curves.test.column("LearningRate") == [0.00992565, 0.00992565]
    assert [(r["NumIters"], r["LearningRate"]) for r in curves.rates.rows] == [(0, 0.01), (100, 0.00992565),
                                                                               (200, 0.00985258)]
    assert table_csv(curves.test).splitlines()[:2] == ["NumIters,Seconds,LearningRate,accuracy,loss",
                                                       "0.0,0.9,0.00992565,0.0856,2.35003"]


def test_parse_log_writes_log_train_and_log_test_and_keeps_existing_tables(tmp_path):
    (tmp_path / "caffe.INFO").write_text(CAFFE_LOG)
    status, stderr = run_netdef("parse-log", "caffe.INFO", "tables", cwd=tmp_path)
    assert status == 0, stderr
    with open(tmp_path / "tables" / "caffe.INFO.train", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(float(r["NumIters"]), float(r["loss"])) for r in rows] == [(0, 2.33875), (100, 0.214566), (200, 0.126302)]
    with open(tmp_path / "tables" / "caffe.INFO.test", newline="") as handle:
        assert [float(r["accuracy"]) for r in csv.DictReader(handle)] == [0.0856, 0.9716]
    status, stderr = run_netdef("parse-log", "caffe.INFO", "tables", cwd=tmp_path)
    assert status == 1 and "--overwrite" in stderr and len(stderr.strip().splitlines()) == 1
    assert run_netdef("parse-log", "caffe.INFO", "tables", "--overwrite", "--delimiter=;", cwd=tmp_path)[0] == 0
    assert (tmp_path / "tables" / "caffe.INFO.test").read_text().startswith("NumIters;Seconds;LearningRate;")


def test_a_file_that_is_no_training_log_is_one_clear_line(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\nIteration 3 of my thoughts\n")
    status, stderr = run_netdef("parse-log", "notes.txt", "out", cwd=tmp_path)
    assert status == 1 and stderr.startswith("netdef: error: notes.txt: no 'Train net output'")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def netdef_log(tmp_path_factory):
    """The log of a real 40-iteration netdef run (display 10, test every 20)."""
    root = tmp_path_factory.mktemp("curves")
    write_tiny_model(root, train_images=64)
    for split in ("train", "test"):
        status, stderr = run_netdef("convert-mnist", f"{split}-images.idx.gz", f"{split}-labels.idx.gz",
                                    f"{split}_lmdb", cwd=root)
        assert status == 0, stderr
    status, stderr = run_netdef("train", "solver.prototxt", cwd=root)
    assert status == 0, stderr
    (root / "train.log").write_text(stderr)
    return root / "train.log"


def test_netdef_log_tables_match_its_lines(netdef_log):
    curves = parse_log(netdef_log)
    assert [r["NumIters"] for r in curves.train.rows] == [0, 10, 20, 30]  # the last display has no outputs
    assert [r["NumIters"] for r in curves.test.rows] == [0, 20, 40]
    assert curves.test.outputs == ["accuracy", "loss"]
    assert set(curves.train.column("LearningRate")) == {0.1}
    assert curves.test.column("accuracy")[-1] >= 0.9
    seconds = curves.train.column("Seconds")
    assert seconds == sorted(seconds) and seconds[0] >= 0 and not any(math.isnan(s) for s in seconds)


def test_plot_draws_a_png_of_several_logs(tmp_path, netdef_log):
    pytest.importorskip("matplotlib", reason="netdef plot needs matplotlib (the [plot] extra)")
    (tmp_path / "caffe.INFO").write_text(CAFFE_LOG)
    status, stderr = run_netdef("plot", netdef_log, "caffe.INFO", "curves.png", "--x=seconds", cwd=tmp_path)
    assert status == 0, stderr
    from PIL import Image

    with Image.open(tmp_path / "curves.png") as image:
        assert image.format == "PNG" and image.size[0] > 500 and image.size[1] > 500
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    # Both logs' lines are there: matplotlib's first two colours, C0 (31,119,180) and C1 (255,127,14).
    present = {rgb for _, rgb in colours}
    assert (31, 119, 180) in present and (255, 127, 14) in present
    status, stderr = run_netdef("plot", "caffe.INFO", "curves.png", cwd=tmp_path)
    assert status == 1 and "curves.png exists" in stderr
