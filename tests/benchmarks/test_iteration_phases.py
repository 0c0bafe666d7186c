"""benchmarks/iteration_phases.py: milliseconds per iteration by phase from a ``--timeline`` trace."""
import json

import pytest

from tests.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def phases_module():
    with benchmark_module("iteration_phases") as module:
        yield module


def span(name, start_ms, duration_ms, tid=1, category="compute"):
    return {"name": name, "cat": category, "ph": "X", "pid": 0, "tid": tid, "ts": start_ms * 1000.0,
            "dur": duration_ms * 1000.0}


def iteration(start):
    """One 10 ms iteration as DataParallel and instrument_net record it: a 4 ms forward pass holding
    a 0.5 ms wait and a 0.5 ms update for the first layer, a 3 ms backward pass, a 1 ms update after it."""
    return [span("forward", start, 4, tid=2), span("data forward", start + 0.1, 0.4),
            span("wait for conv[0]", start + 0.5, 0.5, category="wait"),
            span("update conv[0]", start + 1.0, 0.5, tid=3, category="update"),
            span("conv forward", start + 1.5, 2.0),
            span("backward", start + 4, 3, tid=2), span("conv backward", start + 4.2, 2.5),
            span("update fc[0]", start + 7.2, 1.0, tid=3, category="update")]


def test_phases_add_up_to_the_iteration(tmp_path, phases_module):
    events = [event for k in range(6) for event in iteration(10.0 * k)]
    events.append(span("forward", 60.0, 4, tid=2))  # the start of the iteration after the last
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    phases = phases_module.iteration_phases(str(trace), rank=0, skip=1)
    assert phases["iteration"] == pytest.approx(10.0)
    assert phases["layers"] == pytest.approx(4.9)
    assert phases["conv backward"] == pytest.approx(2.5)
    assert phases["update"] == pytest.approx(1.5) and phases["wait for gradients"] == pytest.approx(0.5)
    assert phases["between layers"] == pytest.approx(7.0 - 4.9 - 1.0)
    assert phases["outside the passes"] == pytest.approx(10.0 - 7.0 - 1.0)
    assert "outside the passes" in phases_module.format_phases(phases)
