"""Leftover temporary files (issue 11, fault 11): a snapshot writer killed outright leaves its hidden
temporary files; the next run with the same snapshot prefix removes those proved abandoned, and never
one that a live process may be writing, nor anyone else's file."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from netdef import files, tempnames
from netdef.proto import netdef_pb2 as pb
from netdef.solver import get_solver
from netdef.solver.snapshot import remove_stale_temps
from tests.comm.fixtures import write_case


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _touch(folder, name, age_s: float = 0) -> str:
    path = folder / name
    path.write_bytes(b"partial snapshot")
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return name


def test_a_temp_name_names_its_writer(tmp_path):
    tmp = files.temp_beside(tmp_path / "run_iter_5.caffemodel")
    name = os.path.basename(tmp)
    assert name.startswith(f".run_iter_5.caffemodel.{tempnames.writer_tag()}.{os.getpid()}.") and name.endswith(".tmp")


def test_only_abandoned_temps_of_this_prefix_are_removed(tmp_path):
    tag, day = tempnames.writer_tag(), tempnames.FOREIGN_AGE_S
    other_tag = "0" * 8 if tag != "0" * 8 else "1" * 8
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        try:
            removed = {
                _touch(tmp_path, f".run_iter_4.caffemodel.{tag}.{_dead_pid()}.0badc0de.tmp"),
                _touch(tmp_path, f".run_iter_4.solverstate.h5.{tag}.{_dead_pid()}.0badc0de.tmp"),
                _touch(tmp_path, f".run_iter_2.solverstate.{other_tag}.{live.pid}.12345678.tmp", age_s=day + 60),
                _touch(tmp_path, ".run_iter_2.caffemodel.deadbeef.tmp", age_s=day + 60),  # the earlier scheme
            }
            kept = {
                _touch(tmp_path, f".run_iter_6.caffemodel.{tag}.{live.pid}.0badc0de.tmp"),      # its writer lives
                _touch(tmp_path, f".run_iter_6.solverstate.{tag}.{os.getpid()}.0badc0de.tmp"),  # this process's
                _touch(tmp_path, f".run_iter_6.caffemodel.{other_tag}.{_dead_pid()}.0badc0de.tmp"),  # another host's, fresh
                _touch(tmp_path, ".run_iter_8.caffemodel.deadbeef.tmp"),                         # earlier scheme, fresh
                _touch(tmp_path, f".other_iter_4.caffemodel.{tag}.{_dead_pid()}.0badc0de.tmp"),  # another prefix
                _touch(tmp_path, f".run_iter_4.caffemodel.notes.{tag}.{_dead_pid()}.0badc0de.tmp"),  # not a snapshot
                _touch(tmp_path, ".run_iter_4.caffemodel.backup", age_s=day + 60),               # not a temp name
                _touch(tmp_path, "run_iter_4.caffemodel"),
            }
            param = pb.SolverParameter(snapshot_prefix=str(tmp_path / "run"))
            gone = remove_stale_temps(param)
        finally:
            live.kill()
    assert {os.path.basename(p) for p in gone} == removed
    assert set(os.listdir(tmp_path)) == kept


def test_a_new_run_removes_the_leftovers_of_a_killed_one(tmp_path):
    solver_path = write_case(tmp_path, "run", 4, 2, records=16, snapshot=2)
    leftover = tmp_path / f".run_iter_2.caffemodel.{tempnames.writer_tag()}.{_dead_pid()}.0badc0de.tmp"
    leftover.write_bytes(b"x" * 1000)
    with get_solver(str(solver_path)) as solver:
        assert not leftover.exists()
        solver.solve()
    assert not [n for n in os.listdir(tmp_path) if re.search(r"\.tmp$", n)]
