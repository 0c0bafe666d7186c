"""A pytest plugin: how long numba spent compiling, per kernel and per test file.

A clean clone compiles every kernel the tests reach (numba caches them on disk afterwards), and that
compilation is most of the suite's first run: 480-505 s of a 690-730 s run on 2026-11-26. This
plugin listens to numba's compile events and, at the end of the session, writes each outermost
compilation's seconds with the kernel and the test that triggered it, and the totals per kernel and
per test file, to ``--compile-report`` (default compile_report.txt). Compilations in subprocesses
(``netdef train``, MPI ranks) are not counted.

    rm -rf /tmp/cold && NUMBA_CACHE_DIR=/tmp/cold PYTHONPATH=benchmarks python -m pytest -q -n 0 -p compile_report

(``NUMBA_CACHE_DIR`` pointing at an empty folder makes every kernel compile as in a clean clone;
``-n 0``: in one process, as the suite ran before it used two workers, each of which would write the
report over the other's.)
"""
from __future__ import annotations

import collections
import time

from numba.core import event

_records: list[tuple[str, str, float]] = []  # (test node id, kernel, seconds)
_current_test = ["(collection)"]


class _CompileTimer(event.Listener):
    """Times numba's compile events; only the outermost one of nested events is recorded, so that a
    kernel's seconds include the helpers it compiled."""

    def __init__(self):
        self._starts: list[float] = []

    def on_start(self, ev):
        self._starts.append(time.perf_counter())

    def on_end(self, ev):
        start = self._starts.pop()
        if self._starts:
            return
        function = getattr(ev.data.get("dispatcher"), "py_func", None)
        kernel = f"{function.__module__}.{function.__qualname__}" if function else "?"
        _records.append((_current_test[0], kernel, time.perf_counter() - start))


def pytest_addoption(parser):
    parser.addoption("--compile-report", default="compile_report.txt",
                     help="where compile_report writes numba's compile times")


def pytest_configure(config):
    event.register("numba:compile", _CompileTimer())


def pytest_runtest_setup(item):
    _current_test[0] = item.nodeid


def _totals(key) -> list[tuple[str, float, int]]:
    seconds, counts = collections.defaultdict(float), collections.Counter()
    for record in _records:
        seconds[key(record)] += record[2]
        counts[key(record)] += 1
    return sorted(((name, seconds[name], counts[name]) for name in seconds), key=lambda t: -t[1])


def pytest_sessionfinish(session):
    path = session.config.getoption("--compile-report")
    with open(path, "w") as out:
        out.write(f"numba compiled {len(_records)} times, {sum(r[2] for r in _records):.1f} s in all\n\n")
        out.write("seconds  compilations  kernel\n")
        for kernel, seconds, count in _totals(lambda r: r[1]):
            out.write(f"{seconds:7.1f}  {count:12d}  {kernel}\n")
        out.write("\nseconds  compilations  test file\n")
        for path_, seconds, count in _totals(lambda r: r[0].split("::")[0]):
            out.write(f"{seconds:7.1f}  {count:12d}  {path_}\n")
        out.write("\nseconds  kernel  test\n")
        for test, kernel, seconds in _records:
            out.write(f"{seconds:7.2f}  {kernel}  {test}\n")
