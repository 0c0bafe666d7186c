"""The test helpers' launcher (tests/comm/fixtures.py ``_run``): a run interrupted while a test waits
for it (pytest-timeout's signal, Ctrl-C) ends with every process it started, rather than going on
into whatever runs next: on a GPU machine, the benchmarks after the tests."""
from __future__ import annotations

import pathlib
import signal
import sys
import time

import pytest

from tests.comm import fixtures

CHILD = ("import subprocess, sys, time; "
         "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
         "open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(60)")


def test_an_interrupted_run_ends_with_the_processes_it_started(tmp_path):
    def interrupt(*_):
        raise KeyboardInterrupt

    pid_file = tmp_path / "child"
    before = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.alarm(5)  # time for both interpreters to start, even on a busy machine
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            fixtures._run([sys.executable, "-c", CHILD, str(pid_file)], tmp_path, 30, None)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert time.monotonic() - started < 20
    time.sleep(0.5)
    status = pathlib.Path(f"/proc/{int(pid_file.read_text())}/status")  # gone, or a zombie no one reaped yet
    assert not status.exists() or "State:\tZ" in status.read_text()
