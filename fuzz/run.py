"""The long fuzzing run: ``python -m fuzz.run [TARGET ...] --inputs 100000 --seed 1``.

Prints, per target, the inputs tried and the outcomes per class (see fuzz/engine.py); inputs with a
finding (raw exception, memory blow-up, hang, crash) are kept under --findings with their detail.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

from fuzz.engine import OUTCOMES, fuzz
from fuzz.targets import TARGETS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", default=sorted(TARGETS), help=f"of {sorted(TARGETS)} (default: all)")
    parser.add_argument("--inputs", type=int, default=1000, help="inputs per target")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--findings", default="fuzz-findings", help="folder for inputs with a finding")
    args = parser.parse_args(argv)
    print(f"{'target':<12} {'inputs':>8} " + " ".join(f"{o:>15}" for o in OUTCOMES) + f" {'inputs/s':>9}")
    found = 0
    for name in args.targets:
        start = time.monotonic()

        def progress(done, counts, name=name):
            if done % 500 == 0:
                print(f"  {name}: {done} inputs, {dict(counts)}", file=sys.stderr, flush=True)

        counts = fuzz(TARGETS[name], args.inputs, args.seed, pathlib.Path(args.findings), progress)
        rate = args.inputs / max(time.monotonic() - start, 1e-9)
        print(f"{name:<12} {args.inputs:>8} " + " ".join(f"{counts[o]:>15}" for o in OUTCOMES) + f" {rate:>9.0f}",
              flush=True)
        found += sum(counts[o] for o in ("raw exception", "memory blow-up", "hang", "crash"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
