"""What the training loop itself costs per iteration, against another checkout's, in one process.

A net so small that its layers cost next to nothing (DummyData of constant values, two inner products
of 8 and 3 outputs, softmax loss, batch 4) is trained by this checkout's solver and by the baseline's
(``other_checkout.py``), ``--steps`` iterations at a time, in turn (the order reversed every other
round), once as ``get_solver`` builds it (one process's seam) and once as ``netdef train`` does
(``create_solver``: DataParallel on one rank). Printed: the median CPU time of the training thread per
iteration (``time.thread_time``: what the loop's Python costs, unmoved by the other cores' load and by
kernel threads spinning) for each, their ratio, and whether both reached the same weights, bit for bit.

    NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 python benchmarks/loop_overhead.py --baseline ../other-checkout
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

from other_checkout import load_baseline  # noqa: E402

SOLVER = """
net_param { name: "tiny"
  layer { name: "data" type: "DummyData" top: "x" top: "y"
          dummy_data_param { shape { dim: 4 dim: 8 } shape { dim: 4 }
                             data_filler { type: "constant" value: 0.5 } data_filler { type: "constant" value: 1 } } }
  layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h"
          inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.1 } } }
  layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
  layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "z"
          inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
  layer { name: "loss" type: "SoftmaxWithLoss" bottom: "z" bottom: "y" top: "loss" } }
base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 lr_policy: "fixed" max_iter: 1000000 display: 0
random_seed: 3 solver_mode: CPU
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=pathlib.Path, required=True, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=200, help="iterations per timed call")
    args = parser.parse_args(argv)
    from netdef.comm import Communicator
    from netdef.comm.distributed import create_solver
    from netdef.solver import get_solver

    base_distributed, base_communicator, base_solver = load_baseline(
        args.baseline.resolve(), "comm.distributed", "comm.communicator", "solver")
    solver_text = SOLVER + f'snapshot_prefix: "{pathlib.Path(os.getcwd()) / "loop_overhead"}"\n'
    ways = (("get_solver (one process's seam)", lambda: get_solver(solver_text),
             lambda: base_solver.get_solver(solver_text)),
            ("create_solver (DataParallel, 1 rank)", lambda: create_solver(solver_text, comm=Communicator()),
             lambda: base_distributed.create_solver(solver_text, comm=base_communicator.Communicator())))
    print(f"# {args.rounds} rounds of {args.steps} iterations, in turn; training thread CPU per iteration")
    for label, this_one, baseline in ways:
        solvers = [this_one(), baseline()]
        for solver in solvers:  # warm-up: kernels compiled or loaded, buffers allocated
            solver.step(args.steps)
        times = [[], []]
        for r in range(args.rounds):
            for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                start = time.thread_time()
                solvers[k].step(args.steps)
                times[k].append(time.thread_time() - start)
        this_us, base_us = (statistics.median(t) / args.steps * 1e6 for t in times)
        same = all(np.array_equal(a.data, b.data)
                   for a, b in zip(solvers[0].net.learnable_params, solvers[1].net.learnable_params))
        print(f"{label}: this {this_us:.1f} us, baseline {base_us:.1f} us, this / baseline {this_us / base_us:.3f}; "
              f"the same weights after {solvers[0].iter} iterations: {same}; load {os.getloadavg()[0]:.1f}")
        for solver in solvers:
            solver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
