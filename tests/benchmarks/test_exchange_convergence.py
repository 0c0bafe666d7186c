"""benchmarks/exchange_convergence.py: the test curve it reads from a distributed run's combined output
(rank 0's glog lines among the MPI launcher's), and the table it writes from the curves."""
import pytest

from tests.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def convergence():
    with benchmark_module("exchange_convergence") as module:
        yield module


# What `prterun ... netdef train --exchange=easgd` prints: rank 0's log with launcher and UCX noise
# between its lines, a second test output (the loss) after each accuracy, and a run across midnight.
DISTRIBUTED_LOG = """\
I1231 23:59:50.000000 20858 cli.py:116] Compute threads per rank: 1 BLAS thread
I1231 23:59:50.396774 20858 data_parallel.py:152] Gradient exchange: easgd (tau 10, alpha 0.3)
I1231 23:59:50.404403 20858 solver.py:403] Solving LeNet
I1231 23:59:50.424316 20858 solver.py:731] Iteration 0, Testing net (#0)
[1795623874.265004] [vm:20859:0]           mpool.c:54   UCX  WARN  object 0x55f37fb49800 was not returned
I1231 23:59:52.904403 20858 solver.py:781]     Test net output #0: accuracy = 0.110833
I1231 23:59:52.904500 20858 solver.py:781]     Test net output #1: loss = 2.31686 (* 1 = 2.31686 loss)
I1231 23:59:53.000000 20858 solver.py:552] Iteration 0 (0 iter/s, 38.1731s/100 iters), loss = 2.27751
I1231 23:59:53.000100 20858 solver.py:564]     Train net output #0: loss = 2.27751 (* 1 = 2.27751 loss)
I1231 23:59:53.000200 20858 solver.py:584] Iteration 0, lr = 0.01
prterun: a line of its own
I0101 00:00:10.404403 20858 solver.py:731] Iteration 100, Testing net (#0)
I0101 00:00:11.404403 20858 solver.py:781]     Test net output #0: accuracy = 0.9716
I0101 00:00:11.404500 20858 solver.py:781]     Test net output #1: loss = 0.0876 (* 1 = 0.0876 loss)
I0101 00:00:11.500000 20858 solver.py:426] Optimization Done.
"""


def test_points_are_the_accuracy_tests_timed_from_solving(convergence, tmp_path):
    log = tmp_path / "run.log"
    log.write_text(DISTRIBUTED_LOG)
    assert convergence.test_points(log) == [(0, 2.5, pytest.approx(0.110833)), (100, 21.0, pytest.approx(0.9716))]
    assert convergence.described_rule(DISTRIBUTED_LOG) == "easgd (tau 10, alpha 0.3)"


def test_table_has_the_milestones_and_marks_missing_ones(convergence):
    curve = convergence.Curve("hybrid", 4, ["--group_size=2"], points=[(500, 60.0, 0.975), (1000, 120.0, 0.98)],
                              wall_s=200.0, iterations=1200, final_accuracy=0.9812)
    row = convergence.markdown_table([curve]).splitlines()[2]
    assert row == "| hybrid (--group_size=2) | 4 | 0.9812 | 200 s | 6.0 | 0.9750 / 0.9800 / - |"
