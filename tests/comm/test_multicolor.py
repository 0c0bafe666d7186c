"""The multicolour allreduce (multicolor.py): its trees, and, under a real ``mpiexec`` of 5 ranks
(binary trees of depth 2, relays included), its sums with both wire formats: equal to the sum of the
ranks' arrays, the same bytes on every rank, with several in flight at once."""
from __future__ import annotations

import re

import numpy as np
import pytest

from netdef.comm.communicator import Communicator
from netdef.comm.colour_trees import TreeLinks, colour_count, colour_roots, tree_parents
from netdef.comm.multicolor import TreeReduction
from tests.comm.fixtures import mpi_available, run_python


def _depth(parents, rank) -> int:
    """Steps from ``rank`` to the root; fails on a cycle (a tree that does not span the ranks)."""
    steps = 0
    while parents[rank] >= 0:
        rank = parents[rank]
        steps += 1
        assert steps <= len(parents), "a cycle: not a tree"
    return steps


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8, 13])
def test_every_colour_has_its_own_root_and_a_tree_spanning_every_rank(size):
    for colours in range(1, size + 1):
        roots = colour_roots(size, colours)
        assert len(set(roots)) == colours
        for root in roots:
            parents = tree_parents(size, root)
            assert [r for r in range(size) if parents[r] < 0] == [root]
            depths = [_depth(parents, r) for r in range(size)]
            assert max(depths) == (size).bit_length() - 1  # a binary heap: log2(size) levels below the root
            for rank in range(size):
                links = TreeLinks(size, root, rank)
                assert links.parent == parents[rank]
                assert sorted(links.children) == [r for r in range(size) if parents[r] == rank]
                assert len(links.children) <= 2


@pytest.mark.parametrize("size", range(2, 17))
def test_with_two_colours_a_rank_relays_in_one_tree_at_most(size):
    relays = []
    for root in colour_roots(size, 2):
        parents = tree_parents(size, root)
        relays.append({p for p in parents if p >= 0})
    assert not relays[0] & relays[1]


def test_colour_count_defaults_to_the_ranks_up_to_four_and_is_at_most_one_per_rank():
    assert [colour_count(n, 0) for n in (1, 2, 3, 4, 5, 64)] == [1, 2, 3, 4, 4, 4]
    assert colour_count(3, 8) == 3 and colour_count(16, 8) == 8 and colour_count(16, 1) == 1


class _Ranks(Communicator):
    size = 6
    max_tag = 32767


def test_tags_of_operations_in_flight_stay_below_the_bound():
    reduction = TreeReduction(_Ranks(), 3)
    assert reduction.colours == 3
    # 6 tags (3 colours x up/down) per operation: 5461 operations fit below 32767, then the tags repeat.
    assert reduction._tag_window == 5461
    tags = {reduction.start(np.zeros(0, np.float32)).tag_base + t for _ in range(5461) for t in range(6)}
    assert len(tags) == 5461 * 6 and max(tags) <= 32767
    assert reduction.start(np.zeros(0, np.float32)).tag_base == 0  # the first operation's again
    assert "3 colours, binary trees rooted at ranks 0, 2, 4, over MPI point-to-point" in reduction.describe()


class _ManyRanks(Communicator):
    size = 1000
    max_tag = 32767


def test_colours_that_leave_too_few_tags_are_refused():
    assert TreeReduction(_ManyRanks(), 256)._tag_window == 64
    with pytest.raises(ValueError, match="too many colours .* use at most 256"):
        TreeReduction(_ManyRanks(), 257)


AVAILABLE, WHY_NOT = mpi_available()

REDUCTION_SCRIPT = r'''
import hashlib
import numpy as np
from netdef.comm import create_communicator, run_guarded
from netdef.comm.fp16 import Float16Wire
from netdef.comm.multicolor import TreeReduction

comm = create_communicator()
rank, size = comm.rank, comm.size
SIZES = [0, 1, 3, 7, 1000, 100003]


def values(r, n, k):
    return np.random.default_rng([k, r]).standard_normal(n).astype(np.float32)


def same_everywhere(array):
    return len(set(comm.allgather_bytes(hashlib.sha1(array.tobytes()).digest()))) == 1


def main():
    for colours in sorted({1, 2, 0, size}):
        for wire, bound in ((None, 1e-6), (Float16Wire(), 2e-3)):
            reduction = TreeReduction(comm, colours, wire)
            arrays = [values(rank, n, k) for k, n in enumerate(SIZES)]
            started = [reduction.start(a) for a in arrays]   # all in flight at once,
            for request in reversed(started):                # completed newest first
                comm.wait_all([request])
            for k, (n, got) in enumerate(zip(SIZES, arrays)):
                exact = np.add.reduce([values(r, n, k).astype(np.float64) for r in range(size)])
                error = np.abs(got - exact).max(initial=0) / max(np.abs(exact).max(initial=0), 1e-30)
                assert error < bound, (reduction.describe(), n, error)
                assert same_everywhere(got), (reduction.describe(), n, "ranks hold different sums")
            print(f"rank {rank}: {reduction.describe()}: ok", flush=True)
    fp16 = TreeReduction(comm, 0, Float16Wire())
    # Values float16 holds, whose sums it holds too: exact.
    small = np.arange(-64, 64, dtype=np.float32) * (rank + 1) / 4
    fp16.run(small)
    assert (small == np.arange(-64, 64, dtype=np.float32) * sum(range(1, size + 1)) / 4).all(), small
    # Far beyond float16's range: no overflow, float16's relative precision.
    large = np.full(10, 3e36, dtype=np.float32) * np.arange(1, 11, dtype=np.float32)
    fp16.run(large)
    assert np.isfinite(large).all()
    np.testing.assert_allclose(large, 3e36 * size * np.arange(1, 11), rtol=2e-3)
    print(f"rank {rank}: fp16 exact and in range", flush=True)


run_guarded(comm, main)
'''


@pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
def test_sums_under_mpi_are_right_and_the_same_bytes_everywhere(tmp_path):
    script = tmp_path / "reduce.py"
    script.write_text(REDUCTION_SCRIPT)
    run = run_python([str(script)], 5, tmp_path, timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert len(re.findall(r"fp16 exact and in range", out)) == 5
    for colours in (1, 2, 4, 5):  # ranks' lines may interleave
        assert len(re.findall(rf"rank \d: {colours} colour[^:]*buffer's own dtype: ok", out)) == 5, out[-2000:]
        assert len(re.findall(rf"rank \d: {colours} colour[^:]*float16 messages[^:]*: ok", out)) == 5, out[-2000:]
