"""The kernels that apply a channel map to the output they write, alone: the blocked depthwise
convolution (``depthwise.forward_mapped``) and the pointwise product by panels
(``matmul.matmul_row_mapped``), each with BatchNorm + Scale + ReLU mapped in, on MobileNet v2's and
ResNet-50's shapes. Median microseconds per call.

``--baseline PATH`` times another checkout's netdef too, each checkout in a process of its own, the
processes alternating for ``--rounds`` rounds (the machine's speed drifts: compare within a round).

    python benchmarks/mapped_kernels.py --batches 8,1 --rounds 3 --baseline /path/to/other/checkout
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
DEPTHWISE = ((144, 56), (576, 14))  # channels, plane side: MobileNet v2's first and 14 x 14 expansions
POINTWISE = ((256, 64, 56), (960, 160, 7))  # output channels, input channels, plane side


def median_us(fn, reps: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def worker(batch: int, reps: int) -> None:
    """Runs in the checkout under test (its netdef first on sys.path); prints one line of figures."""
    import numpy as np

    from netdef.layers import depthwise, matmul
    from netdef.layers.fusion import ChannelMap
    from netdef.layers.im2col import Geometry

    rng = np.random.default_rng(0)

    def channel_map(channels, dims):
        values = lambda: rng.standard_normal(channels).astype(np.float32)  # noqa: E731
        return ChannelMap(dims, mean=values(), std=np.abs(values()) + 1, scale=values(), bias=values(),
                          negative_slope=0.0)

    figures = []
    geom = Geometry((3, 3), (1, 1), (1, 1), (1, 1))
    for channels, side in DEPTHWISE:
        x = rng.standard_normal((batch, channels, side, side)).astype(np.float32)
        w = rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)
        out, m = np.empty_like(x), channel_map(channels, (batch, channels, side * side))
        if not depthwise.forward_mapped(x, w, geom, out, m):
            raise SystemExit("the blocked depthwise kernel does not take these arrays here")
        figures.append(median_us(lambda: depthwise.forward_mapped(x, w, geom, out, m), reps))
    for outputs, inputs, side in POINTWISE:
        a = rng.standard_normal((outputs, inputs)).astype(np.float32)
        b = rng.standard_normal((batch, inputs, side * side)).astype(np.float32)
        out, m = np.empty((batch, outputs, side * side), np.float32), channel_map(outputs, (batch, outputs, side * side))
        if not matmul.matmul_row_mapped(a, b, out, m):
            raise SystemExit("the products run on NumPy here (no pool BLAS)")
        figures.append(median_us(lambda: matmul.matmul_row_mapped(a, b, out, m), reps))
    print(" ".join(f"{f:.1f}" for f in figures))


def run_worker(checkout: pathlib.Path, batch: int, reps: int) -> list[float]:
    code = (f"import sys; sys.path.insert(0, {str(checkout)!r}); sys.path.insert(0, {str(HERE)!r}); "
            f"import netdef; assert netdef.__file__.startswith({str(checkout)!r}), netdef.__file__; "
            f"import mapped_kernels; mapped_kernels.worker({batch}, {reps})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [float(v) for v in done.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--baseline", type=pathlib.Path, help="another checkout, timed in the same rounds")
    args = parser.parse_args()
    checkouts = {"this": HERE.parent}
    if args.baseline:
        checkouts["baseline"] = args.baseline.resolve()
    names = [f"depthwise {c} x {s} x {s}" for c, s in DEPTHWISE] + [f"1x1 {o} x {i} on {s} x {s}"
                                                                    for o, i, s in POINTWISE]
    for batch in (int(b) for b in args.batches.split(",")):
        results = {name: [] for name in checkouts}
        for round_ in range(args.rounds):
            # Every other round in the reverse order: the process that runs second in a round ran
            # faster, whichever checkout it was (2026-11-26).
            order = list(checkouts.items())
            for name, path in order if round_ % 2 == 0 else order[::-1]:
                results[name].append(run_worker(path, batch, args.reps))
        print(f"batch {batch}: median us per call, one figure per round")
        for k, kernel in enumerate(names):
            cells = "; ".join(f"{name} " + ", ".join(f"{r[k]:.0f}" for r in rounds) for name, rounds in results.items())
            print(f"  {kernel:<28} {cells}")


if __name__ == "__main__":
    main()
