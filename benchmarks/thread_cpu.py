"""CPU time of this process's threads, by name, from /proc (Linux): where an iteration's CPU goes.

``snapshot()`` reads every thread's run time (``/proc/self/task/<tid>/schedstat``, nanoseconds,
system time included: with no IRQ time accounting in the kernel, the softirqs that move TCP segments
are charged to whichever thread they interrupt), its time waiting for a core, and its voluntary and
involuntary context switches. Threads are named by Python's ``threading`` name where Python started
them (``MainThread``, ``netdef-comm``) and ``other`` otherwise (the MPI library's, numba's pool).
``per_iteration(before, after, iterations)`` gives ``{name: {"run_ms", "wait_ms", "voluntary",
"involuntary"}}`` per iteration. Elsewhere than Linux both give nothing.
"""
from __future__ import annotations

import os
import threading

FIELDS = ("run_ms", "wait_ms", "voluntary", "involuntary")


def snapshot() -> dict[int, tuple[str, list[float]]]:
    """{thread id: (name, [run ms, wait ms, voluntary switches, involuntary switches])}."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/self/task/{tid}"
        try:
            with open(f"{base}/schedstat") as handle:
                run_ns, wait_ns = (int(v) for v in handle.read().split()[:2])
            with open(f"{base}/status") as handle:
                status = dict(line.split(":", 1) for line in handle if ":" in line)
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        values = [run_ns / 1e6, wait_ns / 1e6, int(status["voluntary_ctxt_switches"]),
                  int(status["nonvoluntary_ctxt_switches"])]
        out[int(tid)] = (names.get(int(tid), "other"), values)
    return out


def per_iteration(before: dict, after: dict, iterations: int) -> dict[str, dict[str, float]]:
    """Each thread name's share between two snapshots, per iteration (threads of one name summed)."""
    totals: dict[str, list[float]] = {}
    for tid, (name, values) in after.items():
        previous = before.get(tid, (name, [0.0] * len(FIELDS)))[1]
        sums = totals.setdefault(name, [0.0] * len(FIELDS))
        for k, (now, then) in enumerate(zip(values, previous)):
            sums[k] += now - then
    return {name: {field: value / iterations for field, value in zip(FIELDS, sums)}
            for name, sums in totals.items()}
