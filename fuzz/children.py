"""Forked children that read fuzzed inputs, and the parent's side of the conversation with them.

A child is forked with its inputs already in its memory (the parent made them), so nothing travels on
its pipe but news: ``S <n>`` when it starts input n and ``D <n> <[outcome, detail] as JSON>`` once the
input is read and its folder removed. A child reads up to ``Budget.inputs_per_child`` inputs in turn
(persistent mode, as libFuzzer and AFL's persistent mode do; 1 is the classic fork per input) and
takes no new one after ``Budget.child_seconds``. Forking is what costs (tens of milliseconds for a
process with NumPy, numba and protobuf loaded), so a child that reads 500 inputs pays it once.

When a child ends in the middle of an input, that input gets the verdict from how the child ended:
SIGALRM (the per-input alarm) a hang, SIGKILL a memory blow-up (the kernel's OOM killer), any other
signal a crash, an exit without the input's report a crash (exit status in the detail). A child that
says nothing for twice the alarm and 5 s more is killed, and its input is a hang. A fresh child then
goes on with the next input, so every input gets exactly the verdict the fork-per-input mode gives.

Each input, in either mode, gets a new empty folder inside the child's scratch folder (removed after
the input, and the whole scratch folder by the parent once the child has ended, crashed or not), an
address-space cap of the child's size at that moment plus ``Budget.memory_bytes`` (a soft limit, put
back after the input), and the alarm. Between inputs a persistent child checks that the input left
nothing behind that the next one could see: when it left file descriptors open (after a garbage
collection has closed what was merely unreferenced), extra threads, or the child grown by more than
``RETIRE_GROWTH_BYTES``, the child ends its batch and the next input starts in a fresh fork of the
parent, whose memory no input has touched.

Still shared by the inputs of one child: the modules imported so far and their module-level state
(lazily imported modules and plug-ins, caches of pure functions, the warnings "once" registry,
netdef's open-database registry in ``netdef.data.db``, and ``netdef.backend``'s device, dtype and
random generator, which the targets reseed per input), and the heap (its fragmentation: the cap is
measured from the child's size at each input, not from the fork). A target whose own fixture holds
state (a solver, a net) must build it per input, as the targets in fuzz/targets.py do.
"""
from __future__ import annotations

import dataclasses
import faulthandler
import gc
import json
import os
import pathlib
import resource
import select
import shutil
import signal
import tempfile
import time
from typing import Iterator

from netdef.memory import mapped_bytes

RETIRE_GROWTH_BYTES = 512 << 20
_DETAIL_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class Budget:
    memory_bytes: int = 3 << 30     # address space one input may add to the child
    seconds: int = 10               # the per-input alarm
    inputs_per_child: int = 500     # 1: a fresh fork for every input
    child_seconds: float = 60.0     # a child starts no input after this long

    @property
    def silence_seconds(self) -> float:
        """How long the parent waits for news of an input before it kills the child (the alarm first)."""
        return 2 * self.seconds + 5


def verdicts(target, inputs: list[bytes], budget: Budget = Budget()) -> Iterator[tuple[str, str]]:
    """(outcome, detail) of each of ``inputs``, in order, read by as many forked children as it takes."""
    done = 0
    children_without_progress = 0
    while done < len(inputs):
        before = done
        for verdict in _one_child(target, inputs, done, budget):
            done += 1
            yield verdict
        children_without_progress = children_without_progress + 1 if done == before else 0
        if children_without_progress == 2:
            raise RuntimeError(f"two fuzzing children in a row ended before starting input {done}")


# ----------------------------------------------------------------------------------------- the parent
def _one_child(target, inputs: list[bytes], first: int, budget: Budget) -> Iterator[tuple[str, str]]:
    """The verdicts of one child, which starts at ``inputs[first]``; the last may come from its end."""
    batch = inputs[first:first + budget.inputs_per_child]
    scratch = tempfile.mkdtemp(prefix="netdef-fuzz-")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(target, batch, first, pathlib.Path(scratch), write_fd, budget)
    os.close(write_fd)
    reaped = False
    try:
        in_progress, next_index = None, first
        news = _News(read_fd, budget.silence_seconds)
        for kind, index, verdict in news:
            if kind == "S" and in_progress is None and index == next_index:
                in_progress = index
            elif kind == "D" and index == in_progress:
                in_progress, next_index = None, index + 1
                yield verdict
            else:
                raise RuntimeError(f"fuzzing child: message {kind} {index} while expecting input {next_index}")
        if news.silent:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        reaped = True
        if in_progress is not None:
            yield _ending_verdict(status, budget, news.silent)
    finally:
        os.close(read_fd)
        if not reaped:  # the caller stopped early: the child must not outlive it
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        shutil.rmtree(scratch, ignore_errors=True)


def _ending_verdict(status: int, budget: Budget, silent: bool) -> tuple[str, str]:
    """The verdict of the input a child was reading when it ended with wait ``status``."""
    if silent:
        return "hang", f"no answer after {budget.silence_seconds} s (killed by the fuzzer)"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGALRM:
            return "hang", f"still running after {budget.seconds} s"
        if sig == signal.SIGKILL:
            return "memory blow-up", "killed (SIGKILL, the kernel's OOM killer?)"
        return "crash", f"killed by {signal.Signals(sig).name}"
    return "crash", f"the child ended without a report (exit status {os.WEXITSTATUS(status)})"


class _News:
    """The messages of a child's pipe as (kind, index, verdict or None), until it closes or stays
    silent for ``silence_seconds`` (then ``silent`` is True). A line cut short by the child's end is
    dropped: its input has no report."""

    def __init__(self, fd: int, silence_seconds: float):
        self._fd = fd
        self._silence_seconds = silence_seconds
        self.silent = False

    def __iter__(self):
        pending = b""
        while True:
            ready, _, _ = select.select([self._fd], [], [], self._silence_seconds)
            if not ready:
                self.silent = True
                return
            chunk = os.read(self._fd, 65536)
            if not chunk:
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                kind, _, rest = line.decode("utf-8", "replace").partition(" ")
                index, _, payload = rest.partition(" ")
                verdict = tuple(json.loads(payload)) if kind == "D" else None
                yield kind, int(index), verdict


# ------------------------------------------------------------------------------------------ the child
def _child(target, batch: list[bytes], first: int, scratch: pathlib.Path, fd: int, budget: Budget) -> None:
    """Runs in the forked child: reads ``batch`` (inputs ``first``, ``first + 1``...); never returns."""
    code = 0
    try:
        faulthandler.disable()  # a crash is an outcome to count, not a traceback to print (pytest enables it)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        started = time.monotonic()
        baseline = _Footprint.now()
        for offset, data in enumerate(batch):
            _send(fd, f"S {first + offset}")
            outcome, detail = _read_one(target, data, scratch, budget)
            # A message may hold lone surrogates (bytes decoded with surrogateescape): '?' for them, as
            # the parent writes the detail of a finding to a UTF-8 file.
            detail = detail[:_DETAIL_CHARS].encode("utf-8", "replace").decode("utf-8")
            _send(fd, f"D {first + offset} " + json.dumps([outcome, detail]))
            last = offset + 1 == len(batch)
            if last or time.monotonic() - started > budget.child_seconds or baseline.left_behind():
                break
    except BaseException:  # noqa: BLE001 - a child must never fall back into the parent's code
        code = 70
    finally:
        os._exit(code)


def _send(fd: int, message: str) -> None:
    data = (message + "\n").encode("utf-8", "replace")
    while data:
        data = data[os.write(fd, data):]


def _read_one(target, data: bytes, scratch: pathlib.Path, budget: Budget) -> tuple[str, str]:
    """(outcome, detail) of ``target`` reading ``data`` in a new folder, under the cap and the alarm."""
    folder = pathlib.Path(tempfile.mkdtemp(dir=scratch))
    limits = resource.getrlimit(resource.RLIMIT_AS)
    try:
        # The cap is on top of what the child has mapped now: after a long test session (numba's
        # compiler, BLAS thread buffers) that can pass 3 GiB, and an absolute cap would fail every input.
        cap = mapped_bytes() + budget.memory_bytes
        if limits[1] != resource.RLIM_INFINITY:
            cap = min(cap, limits[1])
        resource.setrlimit(resource.RLIMIT_AS, (cap, limits[1]))
        signal.alarm(budget.seconds)
        try:
            target.run(data, folder)
            return "accepted", ""
        except target.clean() as exc:  # first: a target's own errors may be MemoryErrors that name a blob
            return "clean error", type(exc).__name__
        except MemoryError as exc:
            return "memory blow-up", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - classifying is the point
            return "raw exception", f"{type(exc).__name__}: {exc}"
        finally:
            signal.alarm(0)
            resource.setrlimit(resource.RLIMIT_AS, limits)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _count_entries(folder: str) -> int:
    try:
        return len(os.listdir(folder))
    except OSError:  # no /proc: nothing to compare
        return 0


def _open_descriptors() -> frozenset:
    """(descriptor, what it points to) for each open descriptor: compared as sets, since collecting
    garbage may close a descriptor that the child inherited as garbage while an input leaves a new one
    open, and the count alone would then not change."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # no /proc: nothing to compare
        return frozenset()
    found = set()
    for name in names:
        try:
            found.add((name, os.readlink(f"/proc/self/fd/{name}")))
        except OSError:  # closed meanwhile (the listing's own descriptor)
            pass
    return frozenset(found)


@dataclasses.dataclass(frozen=True)
class _Footprint:
    """What a child holds that an input could leave behind: open descriptors, threads, mapped bytes."""
    descriptors: frozenset
    threads: int
    mapped_bytes: int

    @classmethod
    def now(cls) -> "_Footprint":
        return cls(_open_descriptors(), _count_entries("/proc/self/task"), mapped_bytes())

    def _more_than(self, now: "_Footprint") -> bool:
        return bool(now.descriptors - self.descriptors) or now.threads > self.threads

    def left_behind(self) -> bool:
        """True when the child now holds more than at this footprint (after collecting garbage, which
        closes what an input merely dropped): then it must not read another input."""
        now = _Footprint.now()
        if self._more_than(now):
            gc.collect()  # about 0.2 s with netdef loaded, so only when something looks left open
            now = _Footprint.now()
        return self._more_than(now) or now.mapped_bytes > self.mapped_bytes + RETIRE_GROWTH_BYTES
