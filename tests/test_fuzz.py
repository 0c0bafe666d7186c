"""A short fuzzing run of every target in the test suite (fuzz/run.py makes the long one): mutated
prototxts, caffemodels, Datums, images, LMDB data files and solver states give netdef's own errors, never a raw
exception, a hang, a crash or a memory blow-up. And the fuzzer does see each of those outcomes, gives each
input the same verdict whether a child reads one input or many, and keeps one input's leftovers from the next."""
from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("lmdb")

from fuzz.children import Budget, verdicts  # noqa: E402
from fuzz.engine import fuzz, fuzzed_inputs, run_one  # noqa: E402
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


def _by_input(data, folder):
    """A toy target that does what its input says."""
    {b"ok": lambda: None, b"clean": _raise_value_error, b"raise": lambda: _raise_index_error(data, folder),
     b"segv": lambda: _segfault(data, folder), b"hang": lambda: _sleep(data, folder),
     b"alloc": lambda: _allocate(data, folder), b"exit": lambda: os._exit(3)}[data]()


def _raise_value_error():
    raise ValueError("a clear error")


TOY = Target("toy", lambda folder: [b"ok"], _by_input, lambda: (ValueError,))
SEQUENCE = [b"ok", b"segv", b"clean", b"hang", b"raise", b"ok", b"alloc", b"exit", b"ok"]
EXPECTED = ["accepted", "crash", "clean error", "hang", "raw exception", "accepted", "memory blow-up", "crash",
            "accepted"]


def test_a_persistent_child_gives_each_input_the_verdict_of_a_fork_per_input():
    forked = list(verdicts(TOY, SEQUENCE, Budget(1 << 30, seconds=1, inputs_per_child=1)))
    persistent = list(verdicts(TOY, SEQUENCE, Budget(1 << 30, seconds=1, inputs_per_child=500)))
    assert [outcome for outcome, _ in forked] == EXPECTED
    assert persistent == forked  # the details too: "killed by SIGSEGV", "exit status 3"...


def test_both_modes_agree_input_by_input_on_a_real_target(tmp_path):
    target = TARGETS["datum"]
    inputs = list(fuzzed_inputs(target.seeds(tmp_path), 60, seed=5, text=target.text))
    forked = list(verdicts(target, inputs, Budget(inputs_per_child=1)))
    assert list(verdicts(target, inputs, Budget(inputs_per_child=25))) == forked
    assert {"accepted", "clean error"} <= {outcome for outcome, _ in forked}


_LEFT_OPEN: list = []  # a toy target's leak: grows only in the forked children


def _leaves_files_open(data, folder):
    if any(folder.iterdir()):
        raise ValueError("an earlier input's file is in this input's folder")
    if _LEFT_OPEN:
        raise ValueError("an earlier input's file is still open")
    (folder / "left").write_bytes(data)
    _LEFT_OPEN.append(open(folder / "left", "rb"))  # noqa: SIM115 - the leak under test


def test_an_input_sees_neither_the_files_nor_the_open_descriptors_of_the_one_before():
    target = Target("leaky", lambda folder: [b"x"], _leaves_files_open, lambda: (ValueError,))
    outcomes = [outcome for outcome, _ in verdicts(target, [b"x"] * 3, Budget(inputs_per_child=500))]
    assert outcomes == ["accepted"] * 3  # each in a clean folder, and a new child after each leak
