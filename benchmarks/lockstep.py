"""What stepping together costs N ranks, from a ``netdef train --timeline`` trace of a multi-rank run
(and, for comparison, of one process).

    python benchmarks/lockstep.py TRACE_JSON [--skip 60]

Synchronous data parallelism makes every iteration as long as the slowest rank's, plus what the
exchange adds after the last rank's backward. Independent processes (the ceiling of
``lenet_training.py --ceiling``) pay neither. Per iteration after the first ``--skip``, from every
rank's layer spans (the trace's "<layer> forward" and "<layer> backward" events):

- ``compute``: each rank's layer time (the sum of its layer spans), its mean and spread, and the
  correlation between the ranks' per-iteration figures (near 0: each rank's slow iterations are
  its own, from other work on its core, not from the work both do);
- ``waiting for the slowest``: the mean of the slowest rank's layer time minus the ranks' mean
  layer time, what stepping together costs when everything else is equal (for independent normal
  spreads of s, about 0.56 s with two ranks);
- ``after the last backward``: from the end of the backward of the rank whose backward ended last
  to the start of that rank's next forward of the first layer with parameters (the sum of the
  gradients still on their way, the updates, the loop's bookkeeping, the hand-over of the next
  batch). A trace of one process gives the same figure without an exchange: the difference is what
  the exchange adds where every rank waits for it.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys


def _per_rank_iterations(events: list[dict], skip: int) -> dict[int, list[dict]]:
    """{rank: [per iteration {"layers": ms, "backward_end": us, "first_learning_layer_start": us or None}]}."""
    by_rank: dict[int, list[dict]] = collections.defaultdict(list)
    for event in sorted(events, key=lambda e: e["ts"]):
        by_rank[event["pid"]].append(event)
    # The layers with parameters: those whose blobs have "update <layer>[<i>]" spans.
    learning = {e["name"][len("update "):].rsplit("[", 1)[0] for e in events if e["name"].startswith("update ")}
    out = {}
    for rank, rank_events in by_rank.items():
        starts = [e["ts"] for e in rank_events if e["name"] == "forward" and e.get("cat") == "compute"]
        iterations = [{"layers": 0.0, "backward_end": None, "first_learning_layer_start": None} for _ in starts]
        which = -1
        for event in rank_events:
            while which + 1 < len(starts) and event["ts"] >= starts[which + 1]:
                which += 1
            if which < 0:
                continue
            record, name = iterations[which], event["name"]
            if name == "backward" and event.get("cat") == "compute":
                record["backward_end"] = event["ts"] + event["dur"]
            elif name.endswith((" forward", " backward")):
                record["layers"] += event["dur"] / 1e3
                if (record["first_learning_layer_start"] is None and name.endswith(" forward")
                        and name[:-len(" forward")] in learning):
                    record["first_learning_layer_start"] = event["ts"]
        out[rank] = iterations[skip:]
    return out


def lockstep(trace_path: str, skip: int = 60) -> dict:
    """The figures of the module docstring: {"ranks", "iterations", "layers_ms" (mean per rank),
    "layers_sd_ms" (per rank), "correlation" (ranks 0 and 1), "waiting_for_slowest_ms",
    "after_last_backward_ms" (median)}."""
    with open(trace_path, encoding="utf-8") as handle:
        doc = json.load(handle)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    per_rank = _per_rank_iterations(events, skip)
    ranks = sorted(per_rank)
    count = min(len(per_rank[r]) for r in ranks) - 1  # the last one has no next iteration
    if count < 3:
        raise SystemExit(f"{trace_path}: fewer than 3 iterations after the first {skip}")
    layers = {r: [per_rank[r][k]["layers"] for k in range(count)] for r in ranks}
    slowest_excess = [max(layers[r][k] for r in ranks) - statistics.fmean(layers[r][k] for r in ranks)
                      for k in range(count)]
    after = []
    for k in range(count):
        ends = {r: per_rank[r][k]["backward_end"] for r in ranks if per_rank[r][k]["backward_end"] is not None}
        if len(ends) < len(ranks):
            continue
        last = max(ends, key=ends.get)
        ready = per_rank[last][k + 1]["first_learning_layer_start"]
        if ready is not None:
            after.append((ready - ends[last]) / 1e3)
    return {
        "ranks": len(ranks),
        "iterations": count,
        "layers_ms": [statistics.fmean(layers[r]) for r in ranks],
        "layers_sd_ms": [statistics.pstdev(layers[r]) for r in ranks],
        "correlation": statistics.correlation(layers[ranks[0]], layers[ranks[1]]) if len(ranks) > 1 else float("nan"),
        "waiting_for_slowest_ms": statistics.fmean(slowest_excess),
        "after_last_backward_ms": statistics.median(after) if after else float("nan"),
    }


def format_lockstep(figures: dict) -> str:
    means = ", ".join(f"{m:.2f}" for m in figures["layers_ms"])
    spreads = ", ".join(f"{s:.2f}" for s in figures["layers_sd_ms"])
    if figures["ranks"] == 1:
        lines = [f"  1 process, {figures['iterations']} iterations",
                 f"  {means} ms  layers per iteration, mean (standard deviation {spreads})"]
    else:
        lines = [f"  {figures['ranks']} ranks, {figures['iterations']} iterations",
                 f"  {means} ms  layers per iteration, mean by rank (standard deviation {spreads}; ranks 0 and 1 "
                 f"correlated {figures['correlation']:.2f})",
                 f"  {figures['waiting_for_slowest_ms']:8.2f} ms  waiting for the slowest (mean of the slowest rank's "
                 f"layers minus the ranks' mean)"]
    return "\n".join(lines + [
        f"  {figures['after_last_backward_ms']:8.2f} ms  after the last backward (median, to the forward of the "
        f"first layer with parameters)",
    ])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--skip", type=int, default=60, help="leave out the first SKIP iterations (default 60)")
    args = parser.parse_args(argv)
    print(format_lockstep(lockstep(args.trace, args.skip)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
