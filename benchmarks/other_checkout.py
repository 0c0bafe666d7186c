"""Another checkout's netdef in this process, and calls timed in turn: what the benchmarks that compare
two checkouts call for call share (mapped_kernels.py, net_against_checkout.py).

Two checkouts in separate processes, alternating, measured an order effect on this machine as large
as the few percent such a comparison looks for (benchmarks/README.md, 2026-11-26): the process that ran
second in a round was faster, whichever checkout it held.
"""
from __future__ import annotations

import importlib
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import types

import netdef
import netdef.proto
import netdef.proto.netdef_pb2

BASELINE = "netdef_baseline"


def load_baseline(checkout: pathlib.Path, *modules: str) -> tuple:
    """The modules (``"net"``, ``"layers.matmul"``, ...) of the netdef package in ``checkout``, loaded
    from a copy under the package name ``netdef_baseline``. Its ``__init__`` does not run, and its
    ``proto`` modules are this checkout's: registering the protobuf descriptors a second time fails;
    its ``__version__`` is this checkout's too (``netdef.comm`` reads it)."""
    copy = pathlib.Path(tempfile.mkdtemp()) / BASELINE
    shutil.copytree(checkout / "netdef", copy, ignore=shutil.ignore_patterns("__pycache__"))
    package = types.ModuleType(BASELINE)
    package.__path__ = [str(copy)]
    package.__version__ = netdef.__version__
    sys.modules[BASELINE] = package
    sys.modules[f"{BASELINE}.proto"] = netdef.proto
    sys.modules[f"{BASELINE}.proto.netdef_pb2"] = netdef.proto.netdef_pb2
    return tuple(importlib.import_module(f"{BASELINE}.{name}") for name in modules)


def timed_in_turn(calls: list, rounds: int, warmup: int = 10) -> list[float]:
    """Median seconds of each call, the calls made in turn (the order reversed every other round),
    after ``warmup`` untimed rounds."""
    for _ in range(warmup):
        for call in calls:
            call()
    times = [[] for _ in calls]
    for r in range(rounds):
        order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
        for k in order:
            start = time.perf_counter()
            calls[k]()
            times[k].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]
