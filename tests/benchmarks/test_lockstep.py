"""benchmarks/lockstep.py: what stepping together costs the ranks, from a ``--timeline`` trace."""
import json

import pytest

from tests.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def lockstep_module():
    with benchmark_module("lockstep") as module:
        yield module


def span(rank, name, start_ms, duration_ms, tid=1, category="compute"):
    return {"name": name, "cat": category, "ph": "X", "pid": rank, "tid": tid, "ts": start_ms * 1000.0,
            "dur": duration_ms * 1000.0}


def iteration(rank, start, backward_ms):
    """One iteration of a rank from ``start``: the data layer (0.5 ms), a 3 ms wait for conv's
    parameters, conv's update (0.5 ms) and forward (1 ms), then conv's backward of ``backward_ms``."""
    return [span(rank, "forward", start, 5.0, tid=2), span(rank, "data forward", start, 0.5),
            span(rank, "wait for conv[0]", start + 0.5, 3.0, category="wait"),
            span(rank, "update conv[0]", start + 3.5, 0.5, tid=3, category="update"),
            span(rank, "conv forward", start + 4.0, 1.0),
            span(rank, "backward", start + 5.0, backward_ms, tid=2),
            span(rank, "conv backward", start + 5.0, backward_ms)]


def test_the_slowest_rank_and_the_time_after_the_last_backward(tmp_path, lockstep_module):
    # Iterations 10 ms apart on both ranks; rank 0's backward takes 3 or 3.5 ms, rank 1's 4 or 2 ms
    # (even or odd iterations): the slowest is 0.5 or 0.75 ms above the two ranks' mean, and the ranks
    # are perfectly anti-correlated. The later rank's backward ends at 5 + (4 or 3.5) ms, its next conv
    # forward starts at 10 + 4 ms: 5 or 5.5 ms after.
    events = []
    for k in range(8):
        events += iteration(0, 10.0 * k, 3.5 if k % 2 else 3.0)
        events += iteration(1, 10.0 * k, 2.0 if k % 2 else 4.0)
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    figures = lockstep_module.lockstep(str(trace), skip=1)  # iterations 1..6 (7 has no next one)
    assert figures["ranks"] == 2 and figures["iterations"] == 6
    assert figures["layers_ms"] == pytest.approx([1.5 + (3.5 + 3.0) / 2, 1.5 + (2.0 + 4.0) / 2])
    assert figures["waiting_for_slowest_ms"] == pytest.approx((0.75 + 0.5) / 2)
    assert figures["correlation"] == pytest.approx(-1.0)
    assert figures["after_last_backward_ms"] == pytest.approx((5.0 + 5.5) / 2)
    assert "waiting for the slowest" in lockstep_module.format_lockstep(figures)


def test_one_process_gives_the_time_after_its_backward(tmp_path, lockstep_module):
    events = [event for k in range(5) for event in iteration(0, 10.0 * k, 3.0)]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    figures = lockstep_module.lockstep(str(trace), skip=0)
    assert figures["ranks"] == 1 and figures["waiting_for_slowest_ms"] == 0
    assert figures["after_last_backward_ms"] == pytest.approx(14.0 - 8.0)
