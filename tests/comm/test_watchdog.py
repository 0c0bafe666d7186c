"""The stall watchdog (netdef/comm/watchdog.py, issue 32 class 3): a rank that waits too long for the
others names the ranks that have not come, then ends the job with one line.

First in one process, with watchdogs that talk over an in-process network (``Loopback``); then real
MPICH jobs in which one rank sleeps in a Python layer or stops itself (SIGSTOP): each asserts the
warning, the one ending line, the exit status and time, and that nothing is left behind (no process,
no shared-memory file, no temporary file, the snapshot prefix free) and the last snapshot restores."""
from __future__ import annotations

import fcntl
import io
import os
import pathlib
import re
import threading
import time

import pytest

import netdef
from netdef.comm.communicator import Communicator
from netdef.comm.watchdog import (ALLREDUCE, BARRIER, GRADIENT_EXCHANGE, NO_WATCHDOG, Answer, Watchdog, abort_line,
                                  missing, speaks_first, stall_report, tick_for)
from tests.comm.fixtures import mpi_available, run_netdef, write_case

AVAILABLE, WHY_NOT = mpi_available()
needs_mpi = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)


# ============================================================================================ messages
def test_the_report_names_the_ranks_outside_any_exchange_and_those_that_do_not_answer():
    answers = [Answer(1, iteration=12, wait=None, seconds=63.4), Answer(2, answered=False),
               Answer(3, iteration=12, wait=ALLREDUCE, seconds=58)]
    assert [a.rank for a in missing(answers)] == [1, 2]
    assert stall_report(0, GRADIENT_EXCHANGE, 12, 61.2, answers, 3) == (
        "rank 0 has waited 61 s in the gradient exchange of iteration 12 for ranks that have not reached it: "
        "rank 1 (in iteration 12, outside any exchange for 63 s), "
        "rank 2 (no answer within 3 s: stopped, or not running Python)")


def test_when_every_rank_waits_the_report_says_where_each_is():
    answers = [Answer(1, iteration=None, wait=BARRIER, seconds=70)]
    assert stall_report(0, ALLREDUCE, None, 71, answers, 3) == (
        "rank 0 has waited 71 s in an allreduce at start-up, and every other rank waits too: rank 1 (waiting in "
        "a barrier at start-up for 70 s); the ranks may be in different collectives")


def test_the_ending_line_names_the_missing_ranks():
    one = [Answer(1, iteration=3, wait=None, seconds=604)]
    assert abort_line(0, 2, ALLREDUCE, 3, 600.4, one, 3) == (
        "netdef: error: rank 1 has not reached an allreduce of iteration 3 in 600 s (in iteration 3, outside any "
        "exchange for 604 s); aborting all 2 ranks")
    two = [Answer(1, answered=False), Answer(2, iteration=3, wait=GRADIENT_EXCHANGE, seconds=599),
           Answer(3, iteration=2, wait=None, seconds=700)]
    assert abort_line(0, 4, GRADIENT_EXCHANGE, 3, 600, two, 3) == (
        "netdef: error: ranks 1, 3 have not reached the gradient exchange of iteration 3 in 600 s (rank 1 (no answer "
        "within 3 s: stopped, or not running Python); rank 3 (in iteration 2, outside any exchange for 700 s)); "
        "aborting all 4 ranks")


def test_a_long_list_is_cut():
    answers = [Answer(r, answered=False) for r in range(1, 40)]
    line = abort_line(0, 40, BARRIER, 1, 600, answers, 3)
    assert line.startswith("netdef: error: ranks 1, 2, 3, 4, 5, 6, 7, 8 and more have not reached")
    assert "and 31 more); aborting all 40 ranks" in line and len(line) < 800


def test_the_lowest_of_the_ranks_that_waited_as_long_speaks():
    waiting = [Answer(0, iteration=3, wait=ALLREDUCE, seconds=9.9), Answer(1, answered=False)]
    assert not speaks_first(2, 10.0, waiting, tick_s=0.5)
    assert speaks_first(2, 10.0, [Answer(0, iteration=3, wait=ALLREDUCE, seconds=2.0)], tick_s=0.5)
    assert speaks_first(0, 10.0, [Answer(2, iteration=3, wait=ALLREDUCE, seconds=10.0)], tick_s=0.5)


def test_the_tick_is_an_eighth_of_the_shorter_time_within_bounds():
    assert tick_for(60, 600) == 1.0
    assert tick_for(2, 0) == 0.25
    assert tick_for(0, 0.1) == 0.05
    assert tick_for(0, 0) == 1.0


# ============================================================================================ in one process
class Loopback:
    """Messages between watchdogs of one process: (source, dest, tag) -> payloads, in order."""

    def __init__(self, size: int):
        self.size = size
        self.lock = threading.Lock()
        self.queues: dict[tuple, list] = {}

    def endpoint(self, rank: int) -> "LoopbackRank":
        return LoopbackRank(self, rank)


class _Sent:
    pass


class _Receive:
    def __init__(self, array, source, tag):
        self.array, self.source, self.tag = array, source, tag


class LoopbackRank(Communicator):
    """The point-to-point calls the watchdog makes, over a Loopback."""

    def __init__(self, network: Loopback, rank: int):
        self.network, self.rank, self.size = network, rank, network.size

    def isend(self, array, dest, tag):
        with self.network.lock:
            self.network.queues.setdefault((self.rank, dest, tag), []).append(array.copy())
        return _Sent()

    def irecv(self, array, source, tag):
        return _Receive(array, source, tag)

    def test_some(self, requests):
        done = []
        with self.network.lock:
            for i, request in enumerate(requests):
                if isinstance(request, _Sent):
                    done.append(i)
                elif isinstance(request, _Receive):
                    sources = range(self.size) if request.source is None else [request.source]
                    for source in sources:
                        queue = self.network.queues.get((source, self.rank, request.tag))
                        if queue:
                            request.array[...] = queue.pop(0)
                            done.append(i)
                            break
        for i in done:
            requests[i] = None
        return done


class Ender:
    """Records the abort instead of ending the process."""

    def __init__(self):
        self.codes = []
        self.ended = threading.Event()

    def abort(self, code: int = 1) -> None:
        self.codes.append(code)
        self.ended.set()


def _watchdogs(size: int, warn: float, abort: float, present=None):
    """Watchdogs of ``size`` ranks over a Loopback (only the ranks in ``present``: the others never answer);
    returns (watchdogs by rank or None, enders, streams)."""
    network = Loopback(size)
    present = range(size) if present is None else present
    enders = [Ender() for _ in range(size)]
    streams = [io.StringIO() for _ in range(size)]
    dogs = [Watchdog(network.endpoint(r), enders[r], warn, abort, stream=streams[r]) if r in present else None
            for r in range(size)]
    return dogs, enders, streams


def test_a_rank_outside_the_exchange_is_named_then_the_job_ends(caplog):
    dogs, enders, streams = _watchdogs(2, warn=0.2, abort=2.5)
    try:
        dogs[1].at_iteration(7)
        dogs[0].at_iteration(7)
        with caplog.at_level("WARNING", logger="netdef"), dogs[0].waiting(GRADIENT_EXCHANGE):
            assert enders[0].ended.wait(10)
    finally:
        for dog in dogs:
            dog.close()
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Stalled")]
    assert warnings and re.match(r"Stalled: rank 0 has waited \d+ s in the gradient exchange of iteration 7 for "
                                 r"ranks that have not reached it: rank 1 \(in iteration 7, outside any exchange "
                                 r"for \d+ s\); the job ends after 2.5 s of waiting", warnings[0]), warnings
    assert re.fullmatch(r"netdef: error: rank 1 has not reached the gradient exchange of iteration 7 in \d+ s \(in "
                        r"iteration 7, outside any exchange for \d+ s\); aborting all 2 ranks\n", streams[0].getvalue())
    assert enders[0].codes == [1] and not enders[1].codes and streams[1].getvalue() == ""


def test_a_rank_that_does_not_answer_is_named():
    dogs, enders, streams = _watchdogs(3, warn=0, abort=0.4, present=(0, 2))
    try:
        with dogs[0].waiting(BARRIER), dogs[2].waiting(BARRIER):
            assert enders[0].ended.wait(10)
            time.sleep(0.3)  # rank 2 defers to rank 0, which waited as long (until the job would have ended)
            assert not enders[2].codes
    finally:
        for dog in (dogs[0], dogs[2]):
            dog.close()
    assert streams[0].getvalue().startswith("netdef: error: rank 1 has not reached a barrier at start-up in 2 s "
                                            "(no answer within 1 s: stopped, or not running Python)")
    assert not enders[2].codes and streams[2].getvalue() == ""


def test_waits_nest_and_the_outermost_names_the_wait():
    dogs, enders, _ = _watchdogs(2, warn=0, abort=0)
    try:
        dog = dogs[0]
        with dog.waiting(GRADIENT_EXCHANGE):
            with dog.waiting(ALLREDUCE):
                assert dog._state()[0] == 0
            assert dog._state()[0] == 0
        assert dog._state()[0] == -1
    finally:
        for dog in dogs:
            dog.close()
    assert not any(e.codes for e in enders)


def test_the_single_process_watchdog_watches_nothing():
    assert Communicator().watchdog is NO_WATCHDOG
    with NO_WATCHDOG.waiting(ALLREDUCE):
        pass


# ============================================================================================ real MPI jobs
def _job_processes(folder: pathlib.Path) -> list[str]:
    """Processes whose command line names ``folder`` (the job's ranks, had any been left behind)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(folder) in command:
                found.append(command)
    return found


def _gone_soon(folder: pathlib.Path, seconds: float = 10) -> list[str]:
    """The job's processes still there after ``seconds``: the launcher may return before the ranks it
    killed have finished exiting (a stopped one, on a loaded machine)."""
    deadline = time.monotonic() + seconds
    while _job_processes(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _job_processes(folder)


def _free_soon(lock: pathlib.Path, seconds: float = 10) -> bool:
    """Whether the snapshot prefix's lock can be taken within ``seconds``: the kernel drops an aborted
    run's lock when its process has exited, which may finish after the launcher has returned."""
    deadline = time.monotonic() + seconds
    with open(lock) as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)


def _assert_nothing_left_and_snapshot_restores(folder: pathlib.Path, solver_path, stdout: str):
    assert not _gone_soon(folder)
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    segments = set(re.findall(r"/dev/shm/\S+", stdout))  # the job's own, printed by its ranks' Python layer
    assert not [s for s in segments if os.path.exists(s)], f"left behind: {segments}"
    lock = folder / ".stall.netdef-lock"
    if lock.exists():
        assert _free_soon(lock)
    solver = netdef.get_solver(str(solver_path))
    try:
        solver.restore(str(folder / "stall_iter_2.solverstate"))
        assert solver.iter == 2
    finally:
        solver.close()


def _stalled_case(tmp_path, mode: str, extra: str = ""):
    return write_case(tmp_path, "stall", 4, 50, records=32, snapshot=2, extra=extra,
                      param_str=f"fail_rank=1 fail_iter=3 mode={mode} show_segments=1")


@needs_mpi
def test_a_rank_asleep_in_a_layer_is_named_and_the_job_ends(tmp_path):
    solver = _stalled_case(tmp_path, "sleep")
    start = time.monotonic()
    run = run_netdef(["train", str(solver), "--stall_warning=1", "--stall_abort=4"], 2, tmp_path, timeout=90)
    elapsed = time.monotonic() - start
    assert run.returncode != 0, run.stderr[-3000:]
    assert re.search(r"Stalled: rank 0 has waited \d+ s in .* of iteration 3 for ranks that have not reached it: "
                     r"rank 1 \(in iteration 3, outside any exchange for \d+ s\)", run.stderr), run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("netdef: error:")]
    assert len(errors) == 1 and re.fullmatch(
        r"netdef: error: rank 1 has not reached .* of iteration 3 in \d+ s \(in iteration 3, outside any exchange "
        r"for \d+ s\); aborting all 2 ranks", errors[0]), run.stderr[-3000:]
    assert elapsed < 60
    assert not (tmp_path / "stall_iter_4.caffemodel").exists()
    _assert_nothing_left_and_snapshot_restores(tmp_path, solver, run.stdout)


@needs_mpi
def test_a_stopped_rank_is_named_once_by_the_solver_files_times(tmp_path):
    # Three ranks: ranks 0 and 2 both wait for rank 1, and one line ends the job.
    solver = _stalled_case(tmp_path, "stop",
                           extra="netdef_distributed { stall_warning_seconds: 1 stall_abort_seconds: 4 }\n")
    start = time.monotonic()
    run = run_netdef(["train", str(solver)], 3, tmp_path, timeout=90)
    elapsed = time.monotonic() - start
    assert run.returncode != 0, run.stderr[-3000:]
    assert re.search(r"Stalled: rank [02] has waited \d+ s in .* of iteration 3 for ranks that have not reached "
                     r"it: rank 1 \(no answer within \d+ s: stopped, or not running Python\)", run.stderr), \
        run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("netdef: error:")]
    assert len(errors) == 1 and re.fullmatch(
        r"netdef: error: rank 1 has not reached .* of iteration 3 in \d+ s \(no answer within \d+ s: stopped, or "
        r"not running Python\); aborting all 3 ranks", errors[0]), run.stderr[-3000:]
    assert elapsed < 60
    _assert_nothing_left_and_snapshot_restores(tmp_path, solver, run.stdout)


@needs_mpi
def test_with_the_limit_off_a_slow_rank_is_reported_and_training_goes_on(tmp_path):
    solver = write_case(tmp_path, "slow", 4, 6, records=32, param_str="fail_rank=1 fail_iter=3 mode=sleep sleep=3")
    run = run_netdef(["train", str(solver), "--stall_warning=1", "--stall_abort=0"], 2, tmp_path, timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    # Rank 0 waits at the first point that needs rank 1: iteration 3's exchange, which the next forward
    # may be the one to wait for (then labelled iteration 4).
    assert re.search(r"Stalled: rank 0 has waited \d+ s in .* of iteration [34] for ranks that have not reached "
                     r"it: rank 1 \(in iteration 3, outside any exchange for \d+ s\); the job is not ended "
                     r"\(stall_abort_seconds is 0\)", run.stderr), run.stderr[-3000:]
    assert "netdef: error" not in run.stderr
    assert (tmp_path / "slow_iter_6.caffemodel").exists()
