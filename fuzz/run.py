"""The long fuzzing run: ``python -m fuzz.run [TARGET ...] --inputs 100000 --seed 1``.

Prints, per target, the inputs tried and the outcomes per class (see fuzz/engine.py); inputs with a
finding (raw exception, memory blow-up, hang, crash) are kept under --findings with their detail.
A forked child reads up to --inputs-per-child inputs in turn; --fork-per-input forks one per input
(slower, the same verdicts: fuzz/children.py).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

from fuzz.children import Budget
from fuzz.engine import FINDINGS, OUTCOMES, fuzz
from fuzz.targets import TARGETS


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", default=sorted(TARGETS), metavar="TARGET",
                        help=f"of {sorted(TARGETS)} (default: all)")
    parser.add_argument("--inputs", type=_positive, default=1000, help="inputs per target")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--findings", default="fuzz-findings", help="folder for inputs with a finding")
    parser.add_argument("--inputs-per-child", type=_positive, default=Budget.inputs_per_child,
                        help="inputs one forked child reads in turn (default: %(default)s)")
    parser.add_argument("--child-seconds", type=float, default=Budget.child_seconds,
                        help="a child starts no new input after this long (default: %(default)s)")
    parser.add_argument("--fork-per-input", action="store_true", help="a fresh child for every input")
    args = parser.parse_args(argv)
    unknown = [name for name in args.targets if name not in TARGETS]
    if unknown:
        parser.error(f"unknown target {unknown[0]!r} (choose from {', '.join(sorted(TARGETS))})")
    budget = Budget(inputs_per_child=1 if args.fork_per_input else args.inputs_per_child,
                    child_seconds=args.child_seconds)
    print(f"{'target':<12} {'inputs':>8} " + " ".join(f"{o:>15}" for o in OUTCOMES) + f" {'inputs/s':>9}")
    found = 0
    for name in args.targets:
        start = time.monotonic()

        def progress(done, counts, name=name, start=start):
            if done % 500 == 0:
                rate = done / max(time.monotonic() - start, 1e-9)
                print(f"  {name}: {done} inputs, {rate:.0f}/s, {dict(counts)}", file=sys.stderr, flush=True)

        counts = fuzz(TARGETS[name], args.inputs, args.seed, pathlib.Path(args.findings), progress, budget)
        rate = args.inputs / max(time.monotonic() - start, 1e-9)
        print(f"{name:<12} {args.inputs:>8} " + " ".join(f"{counts[o]:>15}" for o in OUTCOMES) + f" {rate:>9.0f}",
              flush=True)
        found += sum(counts[o] for o in FINDINGS)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
