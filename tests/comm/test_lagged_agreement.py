"""Stop and snapshot requests agreed over the ranks one iteration late (lagged_agreement.py): in one
process, and with real ranks (mpiexec) where one rank alone asks for a stop."""
from __future__ import annotations

import pathlib
import re

import pytest

from netdef.comm.communicator import Communicator
from netdef.comm.lagged_agreement import LaggedAgreement
from tests.comm.fixtures import mpi_available, run_python, write_case

HAVE_MPI, WHY_NOT = mpi_available()
HERE = pathlib.Path(__file__).resolve().parent


def test_collect_returns_what_the_last_start_carried_and_nothing_before():
    agreement = LaggedAgreement(Communicator(), 2)
    assert agreement.collect() == (False, False)
    agreement.start((True, False))
    assert agreement.collect() == (True, False)
    assert agreement.collect() == (False, False)  # collected once


def test_an_agreement_never_collected_is_passed_on_with_the_next():
    agreement = LaggedAgreement(Communicator(), 2)
    agreement.start((False, True))
    agreement.start((True, False))  # the iteration in between raised before collecting
    assert agreement.collect() == (True, True)


@pytest.mark.skipif(not HAVE_MPI, reason=WHY_NOT)
def test_a_stop_asked_on_one_rank_stops_every_rank_at_the_next_iteration(tmp_path):
    solver = write_case(tmp_path, "stop", batch=4, max_iter=20)
    result = run_python([str(HERE / "lagged_agreement_script.py"), str(solver)], 2, tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    stops = sorted(re.findall(r"rank (\d) stopped at (\d+) early (\w+)", result.stdout))
    # Asked at the end of iteration 1 (the callback sees solver.iter 2), which a blocking agreement
    # would have stopped after; agreed during iteration 2, so every rank stops after it.
    assert stops == [("0", "3", "True"), ("1", "3", "True")], result.stdout


def test_pending_until_collected():
    agreement = LaggedAgreement(Communicator(), 2)
    assert not agreement.pending
    agreement.start((False, False))
    assert agreement.pending
    agreement.collect()
    assert not agreement.pending
