"""A small mutation fuzzer: seeded and dependency-free; forked children read the inputs.

Each input is a seed mutated a few times (bit flips, interesting bytes, chunk deletion, duplication and
truncation; for text targets also numbers replaced by extreme values and lines dropped or repeated).
A forked child reads it under a memory limit and an alarm, and the parent classifies the outcome:

- ``accepted``: read without error;
- ``clean error``: one of the target's own exception classes (a message naming file, layer or field);
- ``raw exception``: any other exception (a finding);
- ``memory blow-up``: MemoryError (unless the target counts it as its own, as netdef's BlobTooLargeError,
  a refusal that names the blob before allocating), or killed by the kernel;
- ``hang``: still running at the alarm;
- ``crash``: killed by any other signal (SIGSEGV, SIGBUS, SIGABRT...).

Forking after the imports keeps the children import-free, and a crash or hang costs only the child. By
default a child reads up to 500 inputs in turn (persistent mode); ``Budget(inputs_per_child=1)`` forks
one per input. Both give every input the same verdict: fuzz/children.py says how, and what the inputs
of one child still share.
"""
from __future__ import annotations

import collections
import pathlib
import random
import re
import tempfile
from typing import Iterator

from fuzz.children import Budget, verdicts

OUTCOMES = ("accepted", "clean error", "raw exception", "memory blow-up", "hang", "crash")
FINDINGS = ("raw exception", "memory blow-up", "hang", "crash")
_CHUNK_INPUTS = 1000
_CHUNK_BYTES = 64 << 20
_INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF)
_INTERESTING_NUMBERS = ("0", "-1", "1", "2147483647", "2147483648", "4000000000", "-2147483648",
                        "99999999999999999999", "1e308", "nan", "-0")


def mutate(data: bytes, rng: random.Random, text: bool) -> bytes:
    """``data`` with 1-4 random mutations."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(8 if text else 6)
        if not buf:
            buf = bytearray(b"\0")
        i = rng.randrange(len(buf))
        if choice == 0:
            buf[i] ^= 1 << rng.randrange(8)
        elif choice == 1:
            buf[i] = rng.choice(_INTERESTING_BYTES)
        elif choice == 2:
            del buf[i:i + rng.randint(1, 32)]
        elif choice == 3:
            j = rng.randrange(len(buf))
            buf[j:j] = buf[i:i + rng.randint(1, 64)]
        elif choice == 4:
            del buf[i:]
        elif choice == 5:
            buf[i:i + 4] = rng.randrange(1 << 32).to_bytes(4, "little")
        elif choice == 6:
            numbers = list(re.finditer(rb"-?\d+(\.\d+)?", bytes(buf)))
            if numbers:
                m = rng.choice(numbers)
                buf[m.start():m.end()] = rng.choice(_INTERESTING_NUMBERS).encode()
        else:
            lines = bytes(buf).split(b"\n")
            k = rng.randrange(len(lines))
            if rng.random() < 0.5:
                del lines[k]
            else:
                lines.insert(rng.randrange(len(lines) + 1), lines[k])
            buf = bytearray(b"\n".join(lines))
    return bytes(buf)


def fuzzed_inputs(seeds: list[bytes], count: int, seed: int, text: bool) -> Iterator[bytes]:
    """The ``count`` inputs of a run: the same for the same ``seed``, whatever reads them."""
    rng = random.Random(seed)
    for _ in range(count):
        yield mutate(rng.choice(seeds), rng, text)


def _chunks(inputs: Iterator[bytes], inputs_per_child: int) -> Iterator[list[bytes]]:
    """``inputs`` a list at a time, each read by its own children (forked with the list in memory): at most
    ``max(inputs_per_child, _CHUNK_INPUTS)`` inputs and, unless one input is larger, ``_CHUNK_BYTES``
    (a caffemodel input is 1.7 MB: lists of 1,000 made the parent 2.8 GB and its forks slow)."""
    chunk: list[bytes] = []
    size = 0
    for data in inputs:
        if chunk and (size + len(data) > _CHUNK_BYTES or len(chunk) == max(inputs_per_child, _CHUNK_INPUTS)):
            yield chunk
            chunk, size = [], 0
        chunk.append(data)
        size += len(data)
    if chunk:
        yield chunk


def run_one(target, data: bytes, memory_bytes: int = 3 << 30, seconds: int = 10) -> tuple[str, str]:
    """(outcome, detail) of reading ``data`` with ``target`` in a forked child of its own."""
    return next(verdicts(target, [data], Budget(memory_bytes, seconds, inputs_per_child=1)))


def fuzz(target, count: int, seed: int, findings: pathlib.Path | None = None, progress=None,
         budget: Budget = Budget()) -> collections.Counter:
    """Run ``count`` mutated inputs through ``target``; return the outcome counts. Inputs with a finding's
    outcome are written under ``findings`` (when given) with their detail."""
    with tempfile.TemporaryDirectory(prefix="netdef-fuzz-seeds-") as folder:
        seeds = target.seeds(pathlib.Path(folder))
        # Read a seed here once, so that every module it needs is imported before the children fork.
        target.run(seeds[0], pathlib.Path(folder))
    counts: collections.Counter = collections.Counter()
    n = 0
    for batch in _chunks(fuzzed_inputs(seeds, count, seed, target.text), budget.inputs_per_child):
        for data, (outcome, detail) in zip(batch, verdicts(target, batch, budget)):
            counts[outcome] += 1
            if findings is not None and outcome in FINDINGS:
                findings.mkdir(parents=True, exist_ok=True)
                stem = findings / f"{target.name}-{outcome.replace(' ', '-')}-{n}"
                stem.with_suffix(".bin").write_bytes(data)
                stem.with_suffix(".txt").write_text(detail + "\n")
            n += 1
            if progress is not None:
                progress(n, counts)
    return counts
