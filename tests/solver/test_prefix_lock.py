"""One run per snapshot prefix, with a lock that a dead process does not keep (issue 32, class 8)."""
import os
import signal
import subprocess
import sys

import pytest

from netdef.solver.prefix_lock import SnapshotPrefixInUseError, SnapshotPrefixLock, lock_path
from tests.helpers import dummy_data_solver

SOLVER = dummy_data_solver(3)

# Another run of the same prefix, as a separate process holding the lock until its stdin closes.
HOLDER = """
import sys
from netdef.solver.prefix_lock import SnapshotPrefixLock
lock = SnapshotPrefixLock.acquire("snaps/run")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def run_folder(tmp_path):
    (tmp_path / "snaps").mkdir()
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    return tmp_path


@pytest.fixture
def holder(run_folder):
    process = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=run_folder, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "held\n"
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


def train(folder):
    return subprocess.run([sys.executable, "-m", "netdef.cli", "train", "solver.prototxt"], cwd=folder,
                          capture_output=True, text=True, timeout=120)


def test_second_run_is_refused_naming_the_prefix_and_the_holder(run_folder, holder):
    done = train(run_folder)
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last == (f"netdef: error: snapshot_prefix snaps/run is in use by another run (process {holder.pid} on "
                    f"host {os.uname().nodename}; lock snaps/.run.netdef-lock): two runs would overwrite each "
                    f"other's snapshots; give this run another snapshot_prefix or stop the other")
    # Nothing written, and the holder's lock file is untouched.
    assert sorted(p.name for p in (run_folder / "snaps").iterdir()) == [".run.netdef-lock"]
    assert (run_folder / "snaps" / ".run.netdef-lock").read_text().startswith(f"process {holder.pid} ")


def test_a_killed_holder_keeps_nothing(run_folder, holder):
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    done = train(run_folder)
    assert done.returncode == 0, done.stderr
    # The run ended and let the prefix go: its lock file is gone, its snapshot is there.
    assert sorted(p.name for p in (run_folder / "snaps").iterdir()) == ["run_iter_2.caffemodel",
                                                                        "run_iter_2.solverstate"]


def test_released_lock_can_be_taken_again_and_is_refused_while_held(tmp_path):
    prefix = str(tmp_path / "run")
    first = SnapshotPrefixLock.acquire(prefix)
    with pytest.raises(SnapshotPrefixInUseError, match=f"process {os.getpid()} "):
        SnapshotPrefixLock.acquire(prefix)
    first.release()
    assert not os.path.exists(lock_path(prefix))
    SnapshotPrefixLock.acquire(prefix).release()


def test_no_lock_when_the_snapshot_folder_does_not_exist(tmp_path):
    assert SnapshotPrefixLock.acquire(str(tmp_path / "missing" / "run")) is None
    assert list(tmp_path.iterdir()) == []
