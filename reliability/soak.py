"""Soak: train LeNet for a long time with tests and snapshots, and watch the process for leaks.

    nice -n 19 python -m reliability.soak [--iterations 50000] [--work DIR] [--interval 5] [--minutes M]
    python -m reliability.soak --summarize --work DIR      # the figures of the samples taken so far

``netdef train`` runs as a child process on the MNIST split of ``reliability/mnist.py`` (test every
1,000 iterations, snapshot every 2,500). Every ``--interval`` seconds the script samples the child's
resident memory (VmRSS), thread count and open file descriptors from /proc, and the last iteration
its log reports. It writes ``samples.csv``, ``summary.json`` and ``soak.png`` into the work folder and
prints the figures: after the warm-up (the first 10% of the iterations) each resource must stay within
5% of its median (flat), and the throughput of each tenth of the run (per wall second and per CPU second of the trainer) is
compared with the others.
Exit status 1 when a resource is not flat.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import tempfile
import time

from .mnist import NETDEF, make_lenet_lmdbs, lenet_solver

ITERATION = re.compile(rb"Iteration (\d+)")
TOLERANCE = 0.05


TICKS = os.sysconf("SC_CLK_TCK")


def sample(pid: int) -> tuple[int, int, int, float]:
    """(resident KiB, threads, open descriptors, CPU seconds used) of process ``pid``."""
    rss = threads = 0
    with open(f"/proc/{pid}/status", "rb") as handle:
        for line in handle:
            if line.startswith(b"VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith(b"Threads:"):
                threads = int(line.split()[1])
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    return rss, threads, len(os.listdir(f"/proc/{pid}/fd")), cpu_s


def last_iteration(log: pathlib.Path, offset: int, current: int) -> tuple[int, int]:
    """The highest iteration the log names after byte ``offset`` (else ``current``), and the new offset."""
    with open(log, "rb") as handle:
        handle.seek(offset)
        text = handle.read()
    complete = text[:text.rfind(b"\n") + 1]
    found = [int(m) for m in ITERATION.findall(complete)]
    return (max(found + [current]), offset + len(complete))


def spread(values: list[float]) -> float:
    """Largest distance from the median, as a fraction of it."""
    median = statistics.median(values)
    return max(abs(v - median) for v in values) / median if median else 0.0


def throughput_windows(rows: list[dict], iterations: int, clock: str, parts: int = 10) -> list[float]:
    """Iterations per second of ``clock`` (time_s: wall, cpu_s: the process's CPU time) in each tenth of
    the run."""
    rates = []
    for k in range(parts):
        lo, hi = iterations * k // parts, iterations * (k + 1) // parts
        inside = [r for r in rows if lo <= r["iteration"] <= hi]
        if len(inside) >= 2 and inside[-1][clock] > inside[0][clock]:
            rates.append((inside[-1]["iteration"] - inside[0]["iteration"]) / (inside[-1][clock] - inside[0][clock]))
    return rates


def plot(rows: list[dict], warm: int, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [r["iteration"] for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(8, 10), sharex=True)
    series = (("rss_kib", "RSS (MiB)", 1 / 1024), ("threads", "threads", 1), ("fds", "open descriptors", 1))
    for ax, (key, label, scale) in zip(axes, series):
        ax.plot(its, [r[key] * scale for r in rows])
        ax.set_ylabel(label)
        ax.axvline(warm, color="grey", linestyle=":")
    for clock, label in (("time_s", "per wall second"), ("cpu_s", "per CPU second")):
        rates = [(b["iteration"], (b["iteration"] - a["iteration"]) / (b[clock] - a[clock]))
                 for a, b in zip(rows, rows[1:]) if b[clock] > a[clock] and b["iteration"] > a["iteration"]]
        axes[3].plot([i for i, _ in rates], [r for _, r in rates], linewidth=0.6, label=label)
    axes[3].legend()
    axes[3].set_ylabel("iterations / s")
    axes[3].set_xlabel("iteration")
    fig.suptitle("netdef train LeNet: soak")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def summarize(work: pathlib.Path, iterations: int, wall: float) -> dict:
    """The figures of the samples in ``work``/samples.csv (see the module docstring); writes
    summary.json and soak.png."""
    with open(work / "samples.csv", newline="") as handle:
        rows = [{k: float(v) if k in ("time_s", "cpu_s") else int(v) for k, v in row.items()}
                for row in csv.DictReader(handle)]
    reached = max(r["iteration"] for r in rows)
    warm = reached // 10  # the first tenth of what was trained
    after = [r for r in rows if r["iteration"] >= warm]
    summary = {"iterations_planned": iterations, "iterations_reached": reached, "wall_s": round(wall, 1),
               "samples": len(rows), "warm_up_iterations": warm,
               "snapshots": len(list((work / "snapshots").glob("*.solverstate")))}
    flat = True
    for key in ("rss_kib", "threads", "fds"):
        values = [r[key] for r in after]
        summary[key] = {"min": min(values), "median": statistics.median(values), "max": max(values),
                        "spread": round(spread(values), 4)}
        flat &= summary[key]["spread"] <= TOLERANCE
    # Wall-clock rates include other jobs' load on a shared machine (and pauses while it is lent to a
    # benchmark); rates per CPU second of the trainer are what a slowdown of netdef itself would show in.
    for clock in ("time_s", "cpu_s"):
        rates = throughput_windows(rows, reached, clock)
        summary[f"iterations_per_{clock}_by_tenth"] = [round(r, 2) for r in rates]
        summary[f"iterations_per_{clock}_spread_after_warm_up"] = round(spread(rates[1:]), 4) if len(rates) > 2 else None
    summary["flat_within_5_percent"] = flat
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(rows, warm, work / "soak.png")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=50000)
    parser.add_argument("--work", default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--minutes", type=float, default=0, help="stop training after this long (0: no limit)")
    parser.add_argument("--summarize", action="store_true", help="only summarize the samples already in --work")
    args = parser.parse_args()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="netdef-soak-"))
    if args.summarize:
        print(json.dumps(summarize(work, args.iterations, 0.0), indent=1))
        return 0
    make_lenet_lmdbs(work)
    solver = lenet_solver(work, max_iter=args.iterations, snapshot=2500, test_interval=1000, test_iter=20)
    log = work / "train.log"
    start = time.monotonic()
    with open(log, "wb") as out:
        child = subprocess.Popen(NETDEF + ["train", f"--solver={solver}"], cwd=work, stdout=out, stderr=subprocess.STDOUT)
    iteration, offset = 0, 0
    fields = ["time_s", "iteration", "rss_kib", "threads", "fds", "cpu_s"]
    with open(work / "samples.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        while child.poll() is None:
            if args.minutes and time.monotonic() - start > 60 * args.minutes:
                child.send_signal(signal.SIGINT)  # netdef stops at the next iteration, cleanly
                child.wait()
                break
            try:
                rss, threads, fds, cpu_s = sample(child.pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            iteration, offset = last_iteration(log, offset, iteration)
            writer.writerow({"time_s": round(time.monotonic() - start, 2), "iteration": iteration, "rss_kib": rss,
                             "threads": threads, "fds": fds, "cpu_s": cpu_s})
            handle.flush()
            time.sleep(args.interval)
    wall = time.monotonic() - start
    if child.wait() not in (0, 130, -signal.SIGINT):
        print(f"soak: netdef train failed (exit {child.returncode}); see {log}")
        return 1
    summary = summarize(work, args.iterations, wall)
    print(json.dumps(summary, indent=1))
    print(f"work folder: {work} (train.log, samples.csv, summary.json, soak.png)")
    return 0 if summary["flat_within_5_percent"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
