"""netdef/comm/shared_sum.py: the allreduce of ranks on one machine through memory they all map.

Real MPI processes (``mpiexec``): every rank's sums equal the sum of every rank's values in rank
order, bit for bit, with reductions started in one order and tested in another, buffers reused over
iterations while one rank lags, and pieces of buckets summed as the priority schedule's chunks are;
a rank that falls behind after starting a sum has its part summed by the ranks that wait; and a
2-rank training run gives the same weights, bit for bit, as MPI's allreduce."""
from __future__ import annotations

import numpy as np
import pytest

import netdef
from netdef.comm.communicator import Communicator
from netdef.comm.shared_sum import SharedSum, part_bounds
from tests.comm.fixtures import mpi_available, run_netdef, run_python, write_case

AVAILABLE, WHY_NOT = mpi_available()


@pytest.mark.parametrize("count, parts", [(0, 2), (1, 3), (10, 3), (1001, 4), (7, 7)])
def test_parts_cover_every_element_once(count, parts):
    bounds = [part_bounds(count, parts, p) for p in range(parts)]
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert max(stop - start for start, stop in bounds) - min(stop - start for start, stop in bounds) <= 1


def test_one_process_sums_its_own_values():
    reduction = SharedSum(Communicator())
    first, second = reduction.buffers([(5, np.float32), (3, np.float64)])
    first[:] = np.arange(5)
    second[:] = [1.5, 2.5, 3.5]
    operations = [reduction.start(first[1:4]), reduction.start(second)]
    assert all(op.test() for op in operations)
    np.testing.assert_array_equal(first, np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(second, [1.5, 2.5, 3.5])
    with pytest.raises(ValueError, match="only the buffers it gave out"):
        reduction.start(np.zeros(3, np.float32))
    reduction.release()


JOB = r"""
import time
import numpy as np
from netdef.comm.communicator import create_communicator
from netdef.comm.shared_sum import SharedSum

comm = create_communicator()
rank, size = comm.rank, comm.size
reduction = SharedSum(comm)
layout = [(1000, np.float32), (3, np.float32), (257, np.float64), (1, np.float32)]
buffers = reduction.buffers(layout)
for iteration in range(4):
    if rank == size - 1 and iteration % 2:
        time.sleep(0.05)  # a rank behind the others: the buffers must not be written too early
    rng = np.random.default_rng(100 * iteration + rank)
    values = [rng.standard_normal(count).astype(dtype) for count, dtype in layout]
    for buffer, mine in zip(buffers, values):
        buffer[:] = mine
    # The big buffer in three pieces (as chunks), started in one order on every rank.
    pieces = [buffers[0][:300], buffers[0][300:700], buffers[0][700:], buffers[1], buffers[2], buffers[3]]
    operations = [reduction.start(piece) for piece in pieces]
    for operation in reversed(operations[3:]):  # tested out of order: completion still comes in order
        operation.test()
    for operation in operations[::-1]:
        operation.wait()
    everyone = [np.frombuffer(b, dtype=np.float64) for b in comm.allgather_bytes(
        b"".join(v.astype(np.float64).tobytes() for v in values))]
    for index, (count, dtype) in enumerate(layout):
        offset = sum(c for c, _ in layout[:index])
        expected = everyone[0][offset:offset + count].astype(dtype)
        for other in everyone[1:]:
            expected = expected + other[offset:offset + count].astype(dtype)  # rank order, in dtype
        assert buffers[index].tobytes() == expected.tobytes(), (rank, iteration, index)
print("sums ok", rank, flush=True)
comm.barrier()
reduction.release()
"""


@pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_rank_holds_the_rank_ordered_sum(tmp_path, ranks):
    assert _run_job(tmp_path, JOB, ranks).count("sums ok") == ranks


def _run_job(tmp_path, job: str, ranks: int) -> str:
    """The standard output of ``job`` run on ``ranks`` real MPI ranks, which must succeed."""
    (tmp_path / "job.py").write_text(job)
    run = run_python(["job.py"], ranks, tmp_path, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-2000:]
    return run.stdout


LATE_RANK_JOB = r"""
import pathlib
import time
import numpy as np
from netdef.comm.communicator import create_communicator
from netdef.comm.shared_sum import SharedSum

comm = create_communicator()
rank, size = comm.rank, comm.size
late = size - 1
reduction = SharedSum(comm)
(buffer,) = reduction.buffers([(1001, np.float32)])
buffer[:] = np.arange(1001, dtype=np.float32) * (rank + 1)
operation = reduction.start(buffer)
if rank == late:
    # Started, then busy elsewhere: no test, no wait, no MPI call until every other rank is done.
    deadline = time.monotonic() + 30
    others = [pathlib.Path(f"done_{r}") for r in range(size) if r != late]
    while not all(p.exists() for p in others) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(p.exists() for p in others), "the other ranks waited for the late rank's part"
    assert operation.test()  # its part was summed for it
else:
    operation.wait()
    pathlib.Path(f"done_{rank}").write_text("")
expected = np.arange(1001, dtype=np.float32)
total = expected.copy()
for r in range(1, size):
    total = total + expected * np.float32(r + 1)  # rank order, in float32
assert buffer.tobytes() == total.tobytes(), rank
print("late ok", rank, flush=True)
comm.barrier()
reduction.release()
"""


@pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_that_wait_sum_the_part_of_a_rank_that_fell_behind(tmp_path, ranks):
    """A rank that has started a reduction and then does nothing more (another process took its core)
    holds up no one: the waiting ranks claim and sum its part, as MPI's allreduce needs only its data."""
    assert _run_job(tmp_path, LATE_RANK_JOB, ranks).count("late ok") == ranks


COUNTING_JOB = r"""
from netdef.comm.communicator import create_communicator

comm = create_communicator()
memory = comm.shared_memory(64)
memory.segments[comm.rank][:] = 0
memory.fence()
comm.barrier()
for _ in range(20000):  # every rank adds 1 to rank 0's word, each addition a compare-and-swap
    seen = int(memory.segments[0][8:16].view("int64")[0])
    while (before := memory.compare_and_swap(0, 8, seen, seen + 1)) != seen:
        seen = before
comm.barrier()
count = int(memory.segments[0][8:16].view("int64")[0])
assert count == 20000 * comm.size, (comm.rank, count)  # every rank sees every addition
if comm.rank == 0:
    print("count", count, flush=True)  # one rank prints: the ranks' lines could interleave
comm.barrier()
memory.free()
"""


@pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
def test_compare_and_swap_loses_no_update_between_processes(tmp_path):
    """Ranks that add to one word of shared memory at once, each addition a compare-and-swap: none is
    lost (a read, an add and a store would lose some)."""
    out = _run_job(tmp_path, COUNTING_JOB, 3)
    assert out.count("count 60000") == 1, out


def test_one_process_s_compare_and_swap_changes_the_word_only_where_expected():
    memory = Communicator().shared_memory(64)
    assert memory.compare_and_swap(0, 8, 0, 1) == 0
    assert memory.compare_and_swap(0, 8, 0, 5) == 1  # not what was expected: unchanged
    assert memory.segments[0][8:16].view(np.int64)[0] == 1


def _trained(tmp_path, name, via):
    solver = write_case(tmp_path, name, 4, 4, records=24)
    run = run_netdef(["train", str(solver), "--bucket_bytes", "256", "--exchange_via", via], 2, tmp_path,
                     timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    net = netdef.Net(str(tmp_path / f"{name}_net.prototxt"), netdef.TRAIN,
                     weights=str(tmp_path / f"{name}_iter_4.caffemodel"))
    out = {layer: [blob.data.copy() for blob in blobs] for layer, blobs in net.params.items()}
    for layer in net.data_sources():
        layer.close()
    return out, run.stderr + run.stdout


@pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
def test_training_gives_mpi_s_weights_bit_for_bit(tmp_path):
    shared, log = _trained(tmp_path, "shared", "shared_memory")
    assert "summed in memory shared by the 2 ranks of this machine" in log
    assert "progress POLL" in log
    through_mpi, log = _trained(tmp_path, "mpi", "mpi")
    assert "progress DEFERRED" in log
    assert shared.keys() == through_mpi.keys()
    for layer in shared:
        for a, b in zip(shared[layer], through_mpi[layer]):
            assert a.tobytes() == b.tobytes(), layer


@pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
def test_shared_memory_is_refused_where_the_ranks_do_not_share_it(tmp_path):
    solver = write_case(tmp_path, "apart", 4, 2, records=24)
    run = run_netdef(["train", str(solver), "--exchange_via", "shared_memory"], 2, tmp_path, timeout=60,
                     env={"MPIR_CVAR_NOLOCAL": "1", "OMPI_MCA_btl": "tcp,self"})
    assert run.returncode != 0
    assert "exchange_via is shared_memory, but the ranks do not all share this machine's memory" in run.stderr
