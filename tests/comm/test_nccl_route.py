"""Which way a GPU run's gradients go (netdef/comm/nccl.py): NCCL for the allreduce rule when every
rank drives a GPU of its own and has NCCL, else pinned host buffers and MPI, said with the reason;
``exchange_via: nccl`` refuses instead. The NCCL exchange itself runs only on GPUs (tests/test_gpu_ranks.py)."""
import numpy as np
import pytest

from tests.comm.fixtures import mpi_available, run_python

import netdef
from netdef.comm.communicator import Communicator
from netdef.comm.exchange import ExchangeOptions
from netdef.comm.nccl import NcclUnavailable, _multi_rank_refusal, nccl_choice, route_for
from netdef.comm.nccl_sum import id_bytes, version_text

TWO_GPUS = [("a", "0000:01:00.0", None), ("a", "0000:02:00.0", None)]
ONE_GPU = [("a", "0000:01:00.0", None), ("a", "0000:01:00.0", None)]
# Why ranks may not share a GPU where NCCL_MULTI_RANK_GPU_ENABLE is not set (``_multi_rank_refusal``).
NOT_ALLOWED = "NCCL refuses (NCCL 2.30 and later allow two ranks per GPU with NCCL_MULTI_RANK_GPU_ENABLE=1)"


def test_nccl_when_every_rank_has_its_own_gpu():
    assert route_for(TWO_GPUS, "allreduce", "auto", NOT_ALLOWED) == (True, "NCCL")
    assert route_for(TWO_GPUS, "allreduce", "nccl", NOT_ALLOWED) == (True, "NCCL")
    # The same bus id on two machines is two GPUs.
    assert route_for([("a", "0000:01:00.0", None), ("b", "0000:01:00.0", None)], "allreduce", "auto", NOT_ALLOWED)[0]


def test_ranks_sharing_a_gpu_go_through_the_host_unless_nccl_is_told_to_allow_it(monkeypatch):
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    assert _multi_rank_refusal(None) == NOT_ALLOWED
    use, route = route_for(ONE_GPU, "allreduce", "auto", NOT_ALLOWED)
    assert not use and route.startswith("pinned host buffers and MPI (ranks share a GPU")
    assert route_for(ONE_GPU, "allreduce", "auto", None) == (True, "NCCL")


def test_other_rules_and_missing_nccl_go_through_the_host():
    assert route_for(TWO_GPUS, "easgd", "auto", NOT_ALLOWED) == (False, "pinned host buffers and MPI (the easgd rule "
                                                                  "exchanges through MPI)")
    facts = [TWO_GPUS[0], ("a", "0000:02:00.0", "CuPy has no NCCL here")]
    assert route_for(facts, "allreduce", "auto", NOT_ALLOWED) == (False, "pinned host buffers and MPI (rank 1: CuPy has "
                                                                   "no NCCL here)")


def test_exchange_via_nccl_refuses_what_cannot_use_it():
    with pytest.raises(NcclUnavailable, match="exchange_via is nccl, but ranks share a GPU"):
        route_for(ONE_GPU, "allreduce", "nccl", NOT_ALLOWED)


def test_the_cpu_always_uses_mpi():
    netdef.set_random_seed(0)
    net = netdef.Net('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\n'
                     'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 2 } }',
                     netdef.TRAIN)
    assert {b.array_module for b in net.learnable_params} == {np}
    assert nccl_choice(Communicator(), net.learnable_params, ExchangeOptions(exchange_via="nccl")) == (False, "MPI")


def test_a_shared_gpu_says_which_nccl_refuses_it():
    use, route = route_for(ONE_GPU, "allreduce", "auto", "NCCL 2.28.9 refuses (NCCL_MULTI_RANK_GPU_ENABLE=1 "
                                                                  "takes NCCL 2.30 or later)")
    assert not use and route == ("pinned host buffers and MPI (ranks share a GPU, which NCCL 2.28.9 refuses "
                                 "(NCCL_MULTI_RANK_GPU_ENABLE=1 takes NCCL 2.30 or later))")
    assert version_text(22809) == "2.28.9" and version_text(23000) == "2.30.0"


def test_the_nccl_unique_id_travels_as_its_raw_bytes_whatever_cupy_returns():
    raw = bytes(range(256))[:128]
    assert id_bytes(raw) == raw  # CuPy 14: bytes
    signed = tuple(int(v) for v in np.frombuffer(raw, dtype=np.int8))  # earlier CuPy: signed chars
    assert id_bytes(signed) == raw
    with pytest.raises(ValueError, match="127 bytes"):
        id_bytes(raw[:127])


def test_without_nccl_a_cuda_aware_mpi_sums_the_allreduce_family_on_device_memory():
    """Where every rank's MPI library takes GPU memory (``Communicator.device_buffers``), the plain
    sums go through it on the device instead of the staged path; without NCCL the tree rules stay on
    the host."""
    use, route = route_for(ONE_GPU, "allreduce", "auto", NOT_ALLOWED, device_buffers=True)
    assert not use and route == ("the MPI library's allreduce on device memory (CUDA-aware MPI; ranks share a GPU, "
                                 "which " + NOT_ALLOWED + ")")
    for trees in ("multicolor", "fp16"):
        assert route_for(ONE_GPU, trees, "auto", NOT_ALLOWED, device_buffers=True) == (
            False, "pinned host buffers and MPI (ranks share a GPU, which " + NOT_ALLOWED + ")")
        assert route_for(TWO_GPUS, trees, "auto", None, device_buffers=True) == (True, "NCCL")
    assert route_for(TWO_GPUS, "allreduce", "auto", None, device_buffers=True) == (True, "NCCL")  # NCCL first


MPI_OK, MPI_WHY_NOT = mpi_available()
DEVICE_MEMORY_SCRIPT = """
import ctypes
from mpi4py import MPI
from netdef.comm.communicator import CommunicatorError, create_communicator, library_takes_device_buffers
comm = create_communicator()
query = ctypes.CDLL(MPI.__file__).MPIX_Query_cuda_support  # the wheel's MPICH has the call
try:
    comm.iallreduce_on_device(None)
except CommunicatorError as exc:
    refused = str(exc)
print(f"rank {comm.rank}: query {query()} takes {library_takes_device_buffers(MPI)} "
      f"device_buffers {comm.device_buffers} refused {refused!r}", flush=True)
"""


@pytest.mark.skipif(not MPI_OK, reason=MPI_WHY_NOT)
def test_the_mpi_library_is_asked_whether_it_takes_device_memory(tmp_path):
    """The pip wheel's MPICH is built without CUDA: it answers 0, and every rank then stages GPU
    gradients through the host (the device path needs a CUDA-aware build, which no machine here has)."""
    script = tmp_path / "query.py"
    script.write_text(DEVICE_MEMORY_SCRIPT)
    run = run_python([str(script)], 2, tmp_path, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    for rank in (0, 1):
        assert f"rank {rank}: query 0 takes False device_buffers False refused " in run.stdout, run.stdout
    assert "takes no GPU memory (device_buffers is False)" in run.stdout
