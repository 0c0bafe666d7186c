"""TEST-phase maps inside the convolution kernels against a pass of their own, alternating in one process.

    python benchmarks/fused_maps.py [--nets mobilenet,mobilenet_v2,resnet50,squeezenet,googlenet] [--batch 1]
                                    [--iters 60]

A TEST net's chain of a pointwise or depthwise convolution and the BatchNorm, Scale and ReLU layers
after it is one step whose channel map the convolution's kernels apply to each block of their output as
they write it (layers/fusion.py, ``MAPS_IN_KERNELS``); switched off, the products are written first
and the map runs in a pass of its own over the output. For every net (the zoo's deploy.prototxt, the
batch set, cpu_forward_backward's He-normal weights and BatchNorm statistics) this checks that both give the same bits,
then times forwards alternately, one of each in turn, and prints the medians and their ratio. One
process and one net for both, so the machine's load falls on both alike.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_forward_backward import NETS, deploy_param, fill_weights  # noqa: E402 (netdef first, as that script starts)

import numpy as np  # noqa: E402

import netdef  # noqa: E402
from netdef.layers import fusion  # noqa: E402


def random_test_net(key: str, batch: int):
    deploy, _, _ = deploy_param(key, batch)
    net = netdef.Net(deploy, netdef.TEST)
    rng = np.random.default_rng(0)
    fill_weights(net, rng)
    for name in net.inputs:
        net.blobs[name].data[...] = rng.standard_normal(net.blobs[name].shape)
    return net


def forward_ms(net, in_kernels: bool) -> float:
    fusion.MAPS_IN_KERNELS = in_kernels
    start = time.perf_counter()
    net.forward()
    return (time.perf_counter() - start) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nets", default="mobilenet,mobilenet_v2,resnet50,squeezenet,googlenet")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iters", type=int, default=60)
    args = parser.parse_args()
    print(f"{'net':<16}{'batch':>6} | {'in kernels ms':>14}{'own pass ms':>12}{'ratio':>7}")
    for key in [k.strip() for k in args.nets.split(",") if k.strip()]:
        net = random_test_net(key, args.batch)
        outputs = {}
        for in_kernels in (True, False):
            forward_ms(net, in_kernels)
            outputs[in_kernels] = {name: net.blobs[name].data.copy() for name in net.outputs}
        for name in net.outputs:
            if not np.array_equal(outputs[True][name], outputs[False][name], equal_nan=True):
                raise SystemExit(f"{key}: output {name!r} differs between the two ways")
        for _ in range(3):
            forward_ms(net, True), forward_ms(net, False)
        times = {True: [], False: []}
        for _ in range(args.iters):
            for in_kernels in (True, False):
                times[in_kernels].append(forward_ms(net, in_kernels))
        inside, apart = statistics.median(times[True]), statistics.median(times[False])
        print(f"{NETS[key][0]:<16}{args.batch:>6} | {inside:14.2f}{apart:12.2f}{inside / apart:7.3f}", flush=True)
    fusion.MAPS_IN_KERNELS = True


if __name__ == "__main__":
    main()
