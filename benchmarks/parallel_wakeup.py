"""What one parallel loop of the compiled kernels costs when its threads wait in each way.

    python benchmarks/parallel_wakeup.py [--calls 300]

A numba parallel loop over 2,048 floats (microseconds of work) is called after a gap of busy Python
(0 to 1,000 us, as the interpreter runs between the layers' kernels), in a fresh process per setting of
libgomp's idle wait, because libgomp reads it once when the pool starts:

- ``passive``: OMP_WAIT_POLICY=PASSIVE, sleep at once (netdef's default until 2026-11-26);
- ``spin N``: GOMP_SPINCOUNT=N, spin N times (libgomp counts ~100,000 per ms), then sleep; netdef's
  default is netdef/threads.py's KERNEL_SPIN;
- ``libgomp default``: neither variable (300,000 spins, ~3 ms).

Prints the median microseconds of one call per gap.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

PROBE = r"""
import sys, time
import numpy as np
from numba import njit, prange

@njit(parallel=True, nogil=True)
def loop(a):
    for i in prange(a.size):
        a[i] += 1.0

a = np.zeros(2048, np.float32)
loop(a)
calls = int(sys.argv[1])
medians = []
for gap_us in (0, 20, 50, 100, 200, 500, 1000):
    times = []
    for _ in range(calls):
        end = time.perf_counter() + gap_us * 1e-6
        while time.perf_counter() < end:
            pass
        start = time.perf_counter()
        loop(a)
        times.append(time.perf_counter() - start)
    medians.append(sorted(times)[len(times) // 2] * 1e6)
print(" ".join(f"{m:9.1f}" for m in medians))
"""

SETTINGS = [("passive", {"OMP_WAIT_POLICY": "PASSIVE"}), ("spin 1000", {"GOMP_SPINCOUNT": "1000"}),
            ("spin 3000", {"GOMP_SPINCOUNT": "3000"}), ("spin 10000", {"GOMP_SPINCOUNT": "10000"}),
            ("spin 30000", {"GOMP_SPINCOUNT": "30000"}), ("libgomp default", {})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    base["NUMBA_THREADING_LAYER"] = "omp"
    print(f"# us per call of a parallel loop over 2,048 floats after a gap; {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'idle wait':<16}" + "".join(f"{f'{gap} us gap':>12}" for gap in (0, 20, 50, 100, 200, 500, 1000)))
    for name, extra in SETTINGS:
        done = subprocess.run([sys.executable, "-c", PROBE, str(args.calls)], env=dict(base, **extra),
                              capture_output=True, text=True, check=True)
        print(f"{name:<16}" + "".join(f"{float(v):12.1f}" for v in done.stdout.split()))


if __name__ == "__main__":
    main()
