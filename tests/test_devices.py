"""--gpu under MPI: each rank of a machine takes the next listed GPU (netdef/devices.py)."""
import re

import pytest

from netdef.backend import gpu_count
from netdef.devices import GpuChoice, GpuRequestError, choose_gpu, describe_assignment, parse_gpu_request

from .comm.fixtures import mpi_available, run_netdef, write_case

needs_mpi = pytest.mark.skipif(not mpi_available()[0], reason=mpi_available()[1])


@pytest.mark.parametrize("text, ids", [("0", [0]), ("0,1", [0, 1]), (" 2, 3 ", [2, 3]), ("all", None), ("ALL", None)])
def test_what_gpu_reads(text, ids):
    assert parse_gpu_request(text) == ids


@pytest.mark.parametrize("text, message", [("x", "takes GPU ids"), ("0,,1", "takes GPU ids"), ("-1", "0 or more"),
                                           ("1,1", "lists a GPU twice")])
def test_what_gpu_refuses(text, message):
    with pytest.raises(GpuRequestError, match=message):
        parse_gpu_request(text)


def test_one_rank_per_gpu():
    assert [choose_gpu(None, 4, r, 4) for r in range(4)] == [GpuChoice(r, 1) for r in range(4)]
    assert [choose_gpu([2, 0], 4, r, 2).device_id for r in range(2)] == [2, 0]


def test_more_ranks_than_gpus_share_them_in_turn():
    # Two ranks on a one-GPU machine (how the GPU tests run), three ranks on two GPUs.
    assert [choose_gpu(None, 1, r, 2) for r in range(2)] == [GpuChoice(0, 2)] * 2
    assert [choose_gpu([0, 1], 2, r, 3) for r in range(3)] == [GpuChoice(0, 2), GpuChoice(1, 1), GpuChoice(0, 2)]


def test_a_gpu_the_machine_lacks_is_refused():
    with pytest.raises(GpuRequestError, match=r"--gpu 0,3: there is no GPU 3 \(2 found\)"):
        choose_gpu([0, 3], 2, 0, 2)
    with pytest.raises(GpuRequestError, match="shows no GPU"):
        choose_gpu(None, 0, 0, 2)


def test_the_log_line_names_every_rank_its_gpu_and_who_shares_it():
    line = describe_assignment([(0, "a", 0), (1, "a", 0), (2, "b", 0)])
    assert line == ("GPUs: rank 0 -> GPU 0 on a (shared with rank(s) 1); rank 1 -> GPU 0 on a (shared with rank(s) 0); "
                    "rank 2 -> GPU 0 on b")


@needs_mpi
@pytest.mark.skipif(gpu_count()[1] is None, reason="this machine has a usable GPU: the refusal is tested where there is none")
def test_a_rank_without_its_gpu_ends_the_job_in_one_line(tmp_path):
    solver = write_case(tmp_path, "gpu", 4, 2)
    run = run_netdef(["train", str(solver), "--gpu", "all"], 2, tmp_path, timeout=60)
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if "netdef: error:" in line]
    assert errors, run.stderr
    assert all(re.search(r"rank \d of 2 failed: CommandLineError: --gpu all: rank \d \(local rank \d of 2 on .+\) has no "
                         r"usable GPU: ", line) for line in errors), errors
