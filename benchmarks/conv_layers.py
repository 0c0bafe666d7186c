"""Each convolution of a zoo net alone: netdef's forward and backward against PyTorch's conv2d.

    python benchmarks/conv_layers.py [--nets lenet,cifar10_quick] [--iters 15] [--threads N] [--cpu-time]
                                     [--no-direct] [--rows-below-width W]

For every Convolution layer of the net (built as cpu_forward_backward.py builds it, batch included) it
prints the algorithm netdef chose (and, on the row path, its input gradient), its forward and backward
ms, and the same for ``torch.nn.functional.conv2d`` on the same shapes and weights (backward: the weight
and bias gradients, and the input gradient where the net needs one), timed alternately, medians. The
floor column is the layer's multiply-adds (forward; backward: one product for the weight gradient and
one for the input gradient where the net needs it) at the run's measured sgemm rate.

On a machine that other jobs load, wall times of two-thread runs say little; ``--threads 1 --cpu-time``
(with NUMBA_NUM_THREADS=1) times each step by the process's CPU time and keeps the least of the rounds,
which that load barely moves: the figures to compare algorithms by.
"""
from __future__ import annotations

import os

from netdef.threads import let_idle_kernel_threads_sleep  # noqa: E402

let_idle_kernel_threads_sleep()  # for both frameworks, as cpu_forward_backward.py, before torch loads

import argparse  # noqa: E402
import math
import pathlib
import statistics
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_forward_backward import NETS, netdef_nets, set_threads  # noqa: E402


def _ms(times, clock):
    # CPU time only grows with the machine's other load (caches, switches): its least is the figure.
    return 1000 * (min(times) if clock is time.process_time else statistics.median(times))


def sgemm_gflops(clock, size=1024, iters=7) -> float:
    """GFLOP/s of a large float32 product timed with ``clock`` (its best of ``iters``)."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    b, c = a.T.copy(), np.empty_like(a)
    times = []
    for _ in range(iters):
        start = clock()
        np.matmul(a, b, out=c)
        times.append(clock() - start)
    return 2 * size ** 3 / min(times) / 1e9


def layer_steps(net, li, torch):
    """(netdef forward, netdef backward, torch forward, torch forward+backward) callables for layer li."""
    layer = net.layers[li]
    bottoms, tops = net._bottom_vecs[li], net._top_vecs[li]
    down = net.bottom_need_backward[li]
    x = torch.from_numpy(bottoms[0].data.copy()).requires_grad_(bool(down[0]))
    w = torch.from_numpy(layer.blobs[0].data.copy()).requires_grad_(True)
    b = torch.from_numpy(layer.blobs[1].data.copy()).requires_grad_(True) if layer.bias_term else None
    dy = torch.from_numpy(tops[0].diff.copy())
    geom = layer.geom
    F = torch.nn.functional

    def torch_forward():
        with torch.no_grad():
            F.conv2d(x, w, b, geom.stride, geom.pad, geom.dilation, layer.group)

    def torch_both():
        y = F.conv2d(x, w, b, geom.stride, geom.pad, geom.dilation, layer.group)
        y.backward(dy)

    return (lambda: net.forward_range(li, li), lambda: net.backward_range(li, li), torch_forward, torch_both)


def time_layer(steps, iters, clock):
    fwd, bwd, t_fwd, t_both = steps
    times = {k: [] for k in ("fwd", "bwd", "t_fwd", "t_both")}
    for round_ in range(iters + 2):
        for name, fn in (("fwd", fwd), ("bwd", bwd), ("t_fwd", t_fwd), ("t_both", t_both)):
            fn()
            start = clock()
            fn()
            if round_ >= 2:
                times[name].append(clock() - start)
    ms = {k: _ms(v, clock) for k, v in times.items()}
    return ms["fwd"], ms["bwd"], ms["t_fwd"], ms["t_both"] - ms["t_fwd"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nets", default="lenet,cifar10_quick,cifar10_full")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the process's CPU time (with --threads 1 and NUMBA_NUM_THREADS=1: "
                             "figures that other jobs on the machine barely move)")
    parser.add_argument("--no-direct", action="store_true",
                        help="without the direct path (layers/direct.py): the row-product and column paths")
    parser.add_argument("--rows-below-width", type=int, default=None,
                        help="TRAIN convolutions whose outputs are narrower than this take the row path's backward "
                             "(direct.ROWS_BELOW_WIDTH; 8 before 2026-11-26)")
    args = parser.parse_args()
    from netdef.layers import direct

    if args.no_direct:
        direct.ENABLED = False
    if args.rows_below_width is not None:
        direct.ROWS_BELOW_WIDTH = args.rows_below_width
    import torch

    set_threads(args.threads, True)
    clock = time.process_time if args.cpu_time else time.perf_counter
    gflops = sgemm_gflops(clock)
    print(f"# sgemm {gflops:.0f} GFLOP/s; load average {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'layer':<22}{'algorithm/input gradient':<30} | {'fwd ms':>7}{'torch':>7}{'floor':>7} | "
          f"{'bwd ms':>7}{'torch':>7}{'floor':>7}")
    for key in [k.strip() for k in args.nets.split(",") if k.strip()]:
        train, _ = netdef_nets(key, None)
        train.forward_backward()
        for li, layer in enumerate(train.layers):
            if layer.type != "Convolution":
                continue
            f, b, tf, tb = time_layer(layer_steps(train, li, torch), args.iters, clock)
            top = train._top_vecs[li][0]
            macs = math.prod(top.shape) * layer.blobs[0].count // layer.num_output
            backward_products = 1 + bool(train.bottom_need_backward[li][0])
            floor = 2 * macs / (gflops * 1e9) * 1000
            print(f"{NETS[key][0] + ' ' + layer.name:<22}{layer.algorithm_summary():<30} | {f:7.2f}{tf:7.2f}"
                  f"{floor:7.2f} | {b:7.2f}{tb:7.2f}{floor * backward_products:7.2f}", flush=True)


if __name__ == "__main__":
    main()
