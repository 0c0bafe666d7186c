"""A small mutation fuzzer: seeded, dependency-free, one forked child per input.

Each input is a seed mutated a few times (bit flips, interesting bytes, chunk deletion, duplication and
truncation; for text targets also numbers replaced by extreme values and lines dropped or repeated).
A forked child reads it under a memory limit and an alarm, and the parent classifies the outcome:

- ``accepted``: read without error;
- ``clean error``: one of the target's own exception classes (a message naming file, layer or field);
- ``raw exception``: any other exception (a finding);
- ``memory blow-up``: MemoryError, or killed by the kernel;
- ``hang``: still running at the alarm;
- ``crash``: killed by any other signal (SIGSEGV, SIGBUS, SIGABRT...).

Forking after the imports keeps an input at a few milliseconds, and a crash or hang costs only the child.
"""
from __future__ import annotations

import collections
import faulthandler
import os
import pathlib
import random
import re
import resource
import signal
import tempfile

OUTCOMES = ("accepted", "clean error", "raw exception", "memory blow-up", "hang", "crash")
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


def _mapped_bytes() -> int:
    """This process's virtual memory size (VmSize), or 0 where /proc does not tell it."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _child(target, data: bytes, folder: pathlib.Path, write_fd: int, memory_bytes: int, seconds: int) -> None:
    """Runs in the forked child; never returns."""
    code = 0
    try:
        faulthandler.disable()  # a crash is an outcome to count, not a traceback to print (pytest enables it)
        # The budget is on top of what the parent had already mapped: after a long test session (numba's
        # compiler, BLAS thread buffers) that can pass 3 GiB, and an absolute cap would fail every input.
        limit = _mapped_bytes() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(seconds)
        try:
            target.run(data, folder)
            line = "accepted\t"
        except MemoryError as exc:
            line = f"memory blow-up\t{type(exc).__name__}: {exc}"
        except target.clean() as exc:
            line = f"clean error\t{type(exc).__name__}"
        except Exception as exc:  # noqa: BLE001 - classifying is the point
            line = f"raw exception\t{type(exc).__name__}: {exc}"
        os.write(write_fd, line.encode("utf-8", "replace")[:4000])
    except BaseException:  # noqa: BLE001 - a child must never fall back into the parent's code
        code = 70
    finally:
        os._exit(code)


def run_one(target, data: bytes, memory_bytes: int = 3 << 30, seconds: int = 10) -> tuple[str, str]:
    """(outcome, detail) of reading ``data`` with ``target`` in a forked child."""
    with tempfile.TemporaryDirectory(prefix="netdef-fuzz-") as folder:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _child(target, data, pathlib.Path(folder), write_fd, memory_bytes, seconds)
        os.close(write_fd)
        chunks = []
        while chunk := os.read(read_fd, 4096):
            chunks.append(chunk)
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    report = b"".join(chunks).decode("utf-8", "replace")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGALRM:
            return "hang", f"still running after {seconds} s"
        if sig == signal.SIGKILL:
            return "memory blow-up", "killed (SIGKILL, the kernel's OOM killer?)"
        return "crash", f"killed by {signal.Signals(sig).name}"
    outcome, _, detail = report.partition("\t")
    if outcome not in OUTCOMES:
        return "crash", f"the child ended without a report (exit status {os.WEXITSTATUS(status)})"
    return outcome, detail


def fuzz(target, count: int, seed: int, findings: pathlib.Path | None = None, progress=None) -> collections.Counter:
    """Run ``count`` mutated inputs through ``target``; return the outcome counts. Inputs with a finding's
    outcome are written under ``findings`` (when given) with their detail."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="netdef-fuzz-seeds-") as folder:
        seeds = target.seeds(pathlib.Path(folder))
        # Read a seed here once, so that every module it needs is imported before the children fork.
        target.run(seeds[0], pathlib.Path(folder))
    counts: collections.Counter = collections.Counter()
    for n in range(count):
        data = mutate(rng.choice(seeds), rng, target.text)
        outcome, detail = run_one(target, data)
        counts[outcome] += 1
        if findings is not None and outcome in ("raw exception", "memory blow-up", "hang", "crash"):
            findings.mkdir(parents=True, exist_ok=True)
            stem = findings / f"{target.name}-{outcome.replace(' ', '-')}-{n}"
            stem.with_suffix(".bin").write_bytes(data)
            stem.with_suffix(".txt").write_text(detail + "\n")
        if progress is not None:
            progress(n + 1, counts)
    return counts
