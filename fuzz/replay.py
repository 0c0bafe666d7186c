"""Read saved findings again: ``python -m fuzz.replay FINDING.bin ...`` (or a folder of them).

A finding is saved by the fuzzer as ``TARGET-OUTCOME-N.bin`` (fuzz/engine.py); the target is taken from
the name, or from ``--target``. Each input is read by a forked child under the same address-space cap
and alarm as in a fuzzing run (fuzz/children.py), and the verdict is printed beside the outcome the
finding was saved with. ``--traceback`` instead reads one input in this process (under the same cap)
and lets its exception through, to see where it came from. The exit status is 1 when any input still
ends in a finding's outcome.
"""
from __future__ import annotations

import argparse
import pathlib
import resource
import sys
import tempfile

from fuzz.children import Budget, verdicts
from fuzz.engine import FINDINGS
from fuzz.targets import TARGETS
from netdef.memory import mapped_bytes


def _target_of(path: pathlib.Path, name: str | None):
    name = name or path.name.split("-", 1)[0]
    if name not in TARGETS:
        raise SystemExit(f"{path}: no target named {name!r} (name it with --target, one of {', '.join(sorted(TARGETS))})")
    return TARGETS[name]


def _finding_files(paths: list[str]) -> list[pathlib.Path]:
    found = []
    for text in paths:
        path = pathlib.Path(text)
        found.extend(sorted(path.glob("*.bin")) if path.is_dir() else [path])
    return found


def _run_here(target, data: bytes, budget: Budget) -> None:
    """Read ``data`` in this process under the cap, so that an exception shows its whole traceback."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped_bytes() + budget.memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        with tempfile.TemporaryDirectory(prefix="netdef-replay-") as folder:
            target.run(data, pathlib.Path(folder))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    print("accepted")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("findings", nargs="+", help="finding .bin files, or folders of them")
    parser.add_argument("--target", help="the target that reads them (default: from each file's name)")
    parser.add_argument("--traceback", action="store_true", help="read the (one) input here, traceback and all")
    args = parser.parse_args(argv)
    budget = Budget(inputs_per_child=1)
    paths = _finding_files(args.findings)
    if args.traceback:
        if len(paths) != 1:
            parser.error("--traceback reads one input")
        _run_here(_target_of(paths[0], args.target), paths[0].read_bytes(), budget)
        return 0
    still = 0
    for path in paths:
        outcome, detail = next(verdicts(_target_of(path, args.target), [path.read_bytes()], budget))
        still += outcome in FINDINGS
        print(f"{path.name}: {outcome}" + (f" ({detail})" if detail else ""), flush=True)
    print(f"{len(paths)} inputs, {still} still a finding")
    return 1 if still else 0


if __name__ == "__main__":
    sys.exit(main())
