"""A short fuzzing run of every target in the test suite (fuzz/run.py makes the long one): mutated
prototxts, caffemodels, Datums, images, LMDB data files and solver states give netdef's own errors, never a raw
exception, a hang, a crash or a memory blow-up. And the fuzzer does see each of those outcomes."""
from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("lmdb")

from fuzz.engine import fuzz, run_one  # noqa: E402
from fuzz.targets import TARGETS, Target  # noqa: E402

SHORT_RUN = {"net": 30, "caffemodel": 30, "datum": 150, "image": 60, "lmdb": 40, "solverstate": 60}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_short_fuzzing_run_finds_nothing(name, tmp_path):
    counts = fuzz(TARGETS[name], SHORT_RUN[name], seed=11, findings=tmp_path)
    assert sum(counts.values()) == SHORT_RUN[name]
    assert counts["clean error"] > 0, counts  # the mutations do reach the readers' checks
    findings = sorted(p.name for p in tmp_path.iterdir())
    assert not findings, f"{counts}; inputs kept in {tmp_path}: {findings[:10]}"


def _raise_index_error(data, folder):
    [][1]


def _segfault(data, folder):
    os.kill(os.getpid(), signal.SIGSEGV)


def _sleep(data, folder):
    time.sleep(30)


def _allocate(data, folder):
    bytearray(8 << 30)


@pytest.mark.parametrize("run, outcome", [(_raise_index_error, "raw exception"), (_segfault, "crash"),
                                          (_sleep, "hang"), (_allocate, "memory blow-up")])
def test_the_fuzzer_tells_each_outcome(run, outcome):
    target = Target("probe", lambda folder: [b""], run, lambda: (ValueError,))
    assert run_one(target, b"x", seconds=1)[0] == outcome
