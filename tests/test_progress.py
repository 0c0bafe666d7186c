"""Progress bars (tqdm) on a terminal, and none when stderr is not one: real `netdef` processes, the
terminal being a pseudo-terminal from Python's pty module."""
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from tests.test_cli import write_tiny_model

NETDEF = [sys.executable, "-m", "netdef.cli"]
# tqdm's line: "train:  50%|#####     | 15/30 [00:01<00:01, 12.3iter/s]" (the bar in any glyphs).
TRAIN_BAR = re.compile(r"train: +\d+%\|.*\| *\d+/30 \[[\d:]+<[\d:?]+, +[\d.?]+ ?(iter/s|s/iter)\]")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    write_tiny_model(root, train_images=64)
    return root


def on_terminal(args, cwd, env=None) -> tuple[int, str]:
    """Run ``netdef ARGS`` with stdin/stdout/stderr on a pseudo-terminal; (exit status, screen text)."""
    leader, follower = pty.openpty()
    # A terminal of 40 rows x 120 columns (a new pseudo-terminal has 0 x 0, where tqdm draws nothing).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(NETDEF + args, cwd=cwd, stdin=follower, stdout=follower, stderr=follower,
                            env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(leader)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


def test_converters_and_train_draw_bars_on_a_terminal_and_keep_the_log(workdir):
    status, screen = on_terminal(["convert-mnist", "train-images.idx.gz", "train-labels.idx.gz", "train_lmdb"],
                                 workdir)
    assert status == 0, screen
    assert re.search(r"convert-mnist: +\d+%\|.*\| *\d+/64 ", screen)
    assert re.search(r"\] Processed 64 files\.", screen)
    status, screen = on_terminal(["compute-image-mean", "train_lmdb", "mean.binaryproto"], workdir)
    assert status == 0 and re.search(r"compute-image-mean: \d+record", screen), screen
    subprocess.run(NETDEF + ["convert-mnist", "test-images.idx.gz", "test-labels.idx.gz", "test_lmdb"], cwd=workdir,
                   check=True, capture_output=True)
    status, screen = on_terminal(["train", "solver.prototxt", "--iterations=30"], workdir)
    assert status == 0, screen
    assert TRAIN_BAR.search(screen), screen[-2000:]
    # The bar appears after the first iteration (which compiles and warms up), its clock started then.
    assert not re.search(r"\| *0/30 ", screen), screen[-2000:]
    # The log lines are whole lines, the bar erased before each and redrawn after it.
    assert re.search(r"(^|\r|\n)I\d{4} [\d:.]+ +\d+ solver\.py:\d+\] Iteration 30, loss = ", screen)
    assert "Optimization Done." in screen


def test_no_bar_when_stderr_is_not_a_terminal(workdir):
    done = subprocess.run(NETDEF + ["train", "solver.prototxt", "--iterations=30"], cwd=workdir, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Optimization Done." in done.stderr
    assert "%|" not in done.stderr and "\r" not in done.stderr and "iter/s]" not in done.stderr
    timing = subprocess.run(NETDEF + ["time", "--model=net.prototxt", "--iterations=3"], cwd=workdir,
                            capture_output=True, text=True, timeout=120)
    assert timing.returncode == 0 and "%|" not in timing.stderr and "Average Forward-Backward" in timing.stderr


def test_no_bar_under_a_notebook_on_its_pseudo_terminal(workdir):
    """`!netdef train` in Jupyter: a pseudo-terminal, but the kernel's environment (JPY_PARENT_PID);
    the notebook shows carriage returns as new lines, so only the log lines are written."""
    status, screen = on_terminal(["train", "solver.prototxt", "--iterations=30"], workdir,
                                 env={**os.environ, "JPY_PARENT_PID": "1234"})
    assert status == 0, screen
    assert "Optimization Done." in screen
    assert "%|" not in screen and "iter/s]" not in screen and "\r\r" not in screen


def test_a_bar_after_the_first_step_starts_there():
    from netdef.progress import BarAfterFirstStep

    with BarAfterFirstStep("train", total=30, unit="iter") as steps:
        assert steps.bar is None
        steps.update_to(1)
        first = steps.bar
        assert (first.n, first.total) == (1, 30)
        steps.update_to(7)  # (a bar off the terminal, as here, counts nothing: the terminal test draws one)
        assert steps.bar is first
