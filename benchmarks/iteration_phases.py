"""Where the milliseconds of a training iteration go, from a ``netdef train --timeline`` trace.

    python benchmarks/iteration_phases.py TRACE_JSON [--rank 0] [--skip 60]

The trace (netdef/comm/timeline.py) holds, per iteration, the "forward" and "backward" passes (the
forward's span starts when the iteration begins), each layer's forward and backward, each parameter
blob's update and each wait for the exchange. Per iteration this prints, as medians over the
iterations after the first ``--skip`` (start-up, compilation):

- each layer's forward and backward (the data layer's forward is the hand-over of a prefetched batch),
- ``update``: the solver's per-blob updates, ``wait for gradients``: blocked on the exchange,
- ``between layers``: the passes minus the layers, updates and waits inside them (the net's dispatch,
  hooks, the loss sum; with several ranks also the exchange calls made from backward hooks),
- ``outside the passes``: the iteration minus the passes and the updates and waits after them:
  clearing gradients, display, callbacks, the signal check, the progress bar,
- ``iteration``: from one iteration's start to the next's.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys


def iteration_phases(trace_path: str, rank: int = 0, skip: int = 60) -> dict[str, float]:
    """{phase: median milliseconds per iteration} for ``rank``'s iterations after the first ``skip``."""
    with open(trace_path, encoding="utf-8") as handle:
        doc = json.load(handle)
    events = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("pid") == rank),
                    key=lambda e: e["ts"])
    starts = [e["ts"] for e in events if e["name"] == "forward" and e.get("cat") == "compute"]
    starts = starts[skip:]
    if len(starts) < 3:
        raise SystemExit(f"{trace_path}: fewer than 3 iterations of rank {rank} after the first {skip}")
    passes = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] in ("forward", "backward")
              and e.get("cat") == "compute"]
    per_iteration = [collections.defaultdict(float) for _ in starts[:-1]]
    which = 0
    for event in events:
        while which + 1 < len(starts) and event["ts"] >= starts[which + 1]:
            which += 1
        if event["ts"] < starts[0] or event["ts"] >= starts[-1]:
            continue
        phases = per_iteration[which]
        name, duration = event["name"], event["dur"] / 1e3
        if name in ("forward", "backward") and event.get("cat") == "compute":
            phases["passes"] += duration
            continue
        if name.startswith("update "):
            phase = "update"
        elif name.startswith("wait for") and name != "wait for exchanges + average":
            phase = "wait for gradients"
        elif name.endswith((" forward", " backward")):
            phases[name] += duration
            phase = "layers"
        else:
            continue
        phases[phase] += duration
        if phase != "layers" and _inside(event, passes):
            phases["updates and waits inside the passes"] += duration
    for index, phases in enumerate(per_iteration):
        phases["iteration"] = (starts[index + 1] - starts[index]) / 1e3
        phases["between layers"] = phases["passes"] - phases["layers"] - phases["updates and waits inside the passes"]
        after = phases["update"] + phases["wait for gradients"] - phases["updates and waits inside the passes"]
        phases["outside the passes"] = phases["iteration"] - phases["passes"] - after
    names = sorted({name for phases in per_iteration for name in phases})
    return {name: statistics.median(phases.get(name, 0.0) for phases in per_iteration) for name in names}


def _inside(event: dict, intervals: list[tuple[float, float]]) -> bool:
    """Whether ``event`` starts inside one of the (sorted, disjoint) ``intervals``."""
    at = event["ts"]
    low, high = 0, len(intervals)
    while low < high:
        middle = (low + high) // 2
        if intervals[middle][0] <= at:
            low = middle + 1
        else:
            high = middle
    return low > 0 and at < intervals[low - 1][1]


def format_phases(phases: dict[str, float]) -> str:
    summary = ("iteration", "layers", "between layers", "update", "wait for gradients", "outside the passes")
    lines = [f"  {phases['iteration']:8.2f} ms  iteration"]
    for name in summary[1:]:
        lines.append(f"  {phases.get(name, 0.0):8.2f} ms  {name}")
    layers = [(v, k) for k, v in phases.items() if k.endswith((" forward", " backward"))]
    lines.append("  layers:")
    for value, name in sorted(layers, reverse=True):
        lines.append(f"    {value:8.3f} ms  {name}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--skip", type=int, default=60, help="leave out the first SKIP iterations (default 60)")
    args = parser.parse_args(argv)
    print(format_phases(iteration_phases(args.trace, args.rank, args.skip)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
