"""Whole zoo nets of this checkout against another checkout's, in one process, call for call in turn.

    python benchmarks/net_against_checkout.py --baseline /path/to/other/checkout
        [--nets mobilenet_v2,squeezenet,resnet50] [--batch 1] [--rounds 60] [--train]

For each net (built as cpu_forward_backward.py builds it: the zoo's deploy file, He-normal weights) it
builds the TEST net with both checkouts' code, the same weights and input, checks that the two give
the same bits, and times their forward passes alternately (the order swapped every round), printing
the medians and this / baseline. ``--train`` also times forward+backward of the TRAIN nets as
``netdef train`` runs them (``keep_blob_diffs`` off: each gradient released once consumed; no bit
check there: Dropout draws its own masks in each).

The baseline's ``netdef`` package is loaded under another name (other_checkout.py, as
mapped_kernels.py loads its layers). A change that speeds up the Python between the kernels by a few
percent is below what separate processes can show on this machine: those alternated measured an
order effect as large as such a change (benchmarks/README.md, 2026-11-26).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np

import netdef

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cpu_forward_backward import deploy_param, netdef_nets, train_param  # noqa: E402
from other_checkout import load_baseline, timed_in_turn  # noqa: E402


def same_weights_and_input(source, target) -> None:
    for name, blobs in source.params.items():
        for mine, theirs in zip(blobs, target.params[name]):
            theirs.data[...] = mine.data
    for name in source.inputs:
        target.blobs[name].data[...] = source.blobs[name].data


def in_turn_ms(steps: list, rounds: int) -> list[float]:
    return [1e3 * seconds for seconds in timed_in_turn(steps, rounds, warmup=5)]


def train_step(net):
    net.keep_blob_diffs = False  # as `netdef train` runs its net: gradients released once consumed

    def step():
        net.forward()
        net.backward()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, type=pathlib.Path)
    parser.add_argument("--nets", default="mobilenet_v2,squeezenet,resnet50")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--train", action="store_true", help="also forward+backward of the TRAIN nets")
    args = parser.parse_args()
    baseline, _ = load_baseline(args.baseline.resolve(), "net", "layers")  # layers: its registry filled
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, baseline {args.baseline}, batch {args.batch}, "
          f"{args.rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    print(f"{'net':16} {'phase':12} {'this ms':>9} {'baseline':>9} {'ratio':>7}")
    for key in args.nets.split(","):
        train, test = netdef_nets(key, args.batch)
        deploy, _, _ = deploy_param(key, args.batch)
        base_test = baseline.Net(deploy, netdef.TEST)
        same_weights_and_input(test, base_test)
        mine, theirs = test.forward(), base_test.forward()
        for name in mine:
            if not np.array_equal(mine[name], theirs[name]):
                raise SystemExit(f"{key}: the checkouts' TEST forward differ in {name!r}")
        this_ms, base_ms = in_turn_ms([test.forward, base_test.forward], args.rounds)
        print(f"{key:16} {'TEST fwd':12} {this_ms:9.2f} {base_ms:9.2f} {this_ms / base_ms:7.3f}")
        if args.train:
            base_train = baseline.Net(train_param(deploy), netdef.TRAIN)
            same_weights_and_input(train, base_train)
            this_ms, base_ms = in_turn_ms([train_step(train), train_step(base_train)], args.rounds)
            print(f"{key:16} {'TRAIN f+b':12} {this_ms:9.2f} {base_ms:9.2f} {this_ms / base_ms:7.3f}")


if __name__ == "__main__":
    main()
