"""How close to the sgemm floor a net's matrix products alone can come: the bound under issue 7's
"within 2x of the floor" target.

    python benchmarks/floor_bound.py [--nets lenet,cifar10_quick] [--rounds 7] [--threads N]

The floor (``cpu_forward_backward.py``) is a net's forward+backward multiply-adds at the rate of a
1024 x 1024 float32 product. The products a convolution or inner product stands for are not that
product: LeNet's first layer multiplies 20 x 25 by 25 x 36,864 (one input channel: 25 taps), its
inner products have 64 rows. This prints, for every product of the net's forward+backward (each
convolution as im2col would run it: forward, weight gradient and, where the net needs one, input
gradient; per group for grouped ones; the inner products likewise), its time in NumPy's BLAS
(OpenBLAS) and in PyTorch's ``torch.matmul`` (MKL in its x86 build), then

- ``products at the better BLAS``: the sum over the products of the faster of the two, against the
  floor: what the products alone cost where every one ran at the better library's rate, before any
  layout copy, pooling, activation, loss or update;
- netdef's and PyTorch's whole forward+backward of the same net (as ``cpu_forward_backward.py`` builds
  them) against the same floor.

Everything is timed in the same alternating rounds, sgemm included (this machine's speed moves by 30%
within minutes): ``cpu_forward_backward.alternate``, medians, each step right after untimed runs of
itself.
"""
from __future__ import annotations

from netdef.threads import let_idle_kernel_threads_sleep

let_idle_kernel_threads_sleep()  # before torch loads its OpenMP runtime (cpu_forward_backward.py)

import argparse  # noqa: E402
import pathlib
import sys
from typing import NamedTuple

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_forward_backward import (NETS, SGEMM_SIZE, alternate, netdef_nets, set_threads, sgemm_step,  # noqa: E402
                                  torch_train_step)
from cpu_forward_backward import multiply_adds as multiply_adds_of  # noqa: E402


class Product(NamedTuple):
    """``count`` products of an (m x k) by a (k x n) matrix, for ``what``."""
    what: str
    m: int
    k: int
    n: int
    count: int = 1

    @property
    def multiply_adds(self) -> int:
        return self.count * self.m * self.k * self.n


def net_products(net) -> list[Product]:
    """The matrix products of ``net``'s forward+backward, as im2col and the inner products run them
    (the multiply-adds ``cpu_forward_backward.multiply_adds`` counts). A convolution with several
    bottoms runs the same products once per bottom."""
    products = []
    for li, layer in enumerate(net.layers):
        if layer.type == "Deconvolution":
            raise SystemExit(f"layer {layer.name}: Deconvolution's products are not counted here")
        if layer.type not in ("Convolution", "InnerProduct"):
            continue
        bottom, top = net._bottom_vecs[li][0], net._top_vecs[li][0]
        needs_input_gradient = any(net.bottom_need_backward[li])
        if layer.type == "Convolution":
            batch, channels = bottom.shape[:2]
            outputs, pixels = top.shape[1], int(np.prod(top.shape[2:]))
            groups = layer.group
            taps = channels // groups * int(np.prod(layer.blobs[0].shape[2:]))
            per_group = outputs // groups
            count = groups * len(net._bottom_vecs[li])
            products += [Product(f"{layer.name} forward", per_group, taps, batch * pixels, count),
                         Product(f"{layer.name} weight gradient", per_group, batch * pixels, taps, count)]
            if needs_input_gradient:
                products.append(Product(f"{layer.name} input gradient", taps, per_group, batch * pixels, count))
        else:
            batch, inputs = bottom.shape[0], int(np.prod(bottom.shape[1:]))
            outputs = top.shape[1]
            products += [Product(f"{layer.name} forward", batch, inputs, outputs),
                         Product(f"{layer.name} weight gradient", outputs, batch, inputs)]
            if needs_input_gradient:
                products.append(Product(f"{layer.name} input gradient", batch, outputs, inputs))
    return products


def product_steps(product: Product, torch, rng) -> tuple:
    """(NumPy step, torch step) computing one of ``product``'s products (its count is applied later)."""
    a = rng.standard_normal((product.m, product.k), dtype=np.float32)
    b = rng.standard_normal((product.k, product.n), dtype=np.float32)
    c = np.empty((product.m, product.n), np.float32)
    ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.empty((product.m, product.n))
    return (lambda: np.matmul(a, b, out=c)), (lambda: torch.matmul(ta, tb, out=tc))


def measure(key: str, rounds: int, torch) -> None:
    train, _ = netdef_nets(key, None)
    batch = train.blobs["data"].shape[0]
    products = net_products(train)
    rng = np.random.default_rng(0)
    steps = {"sgemm": sgemm_step(),
             "netdef": lambda: (train.clear_param_diffs(deferred=True), train.forward_backward()),
             "torch": torch_train_step(torch, train)}
    for index, product in enumerate(products):
        steps[index, "NumPy"], steps[index, "torch"] = product_steps(product, torch, rng)
    ms = alternate(steps, rounds)

    gflops = 2 * SGEMM_SIZE ** 3 / ms["sgemm"] / 1e6
    multiply_adds = multiply_adds_of(train)[1]  # the floor cpu_forward_backward.py prints
    floor_ms = 2 * multiply_adds / gflops / 1e6
    print(f"\n{key} (batch {batch}): {len(products)} products, {2 * multiply_adds / 1e6:.0f} MFLOP; "
          f"sgemm {gflops:.0f} GFLOP/s in these rounds, floor {floor_ms:.2f} ms")
    print(f"  {'product':<32} {'m x k x n':>22} {'NumPy ms':>9} {'GFLOP/s':>8} {'torch ms':>9} {'GFLOP/s':>8}")
    better_ms = 0.0
    for index, p in enumerate(products):
        each = [p.count * ms[index, library] for library in ("NumPy", "torch")]
        better_ms += min(each)
        rates = [2 * p.multiply_adds / m / 1e6 for m in each]
        shape = f"{p.m} x {p.k} x {p.n}" + (f" x{p.count}" if p.count > 1 else "")
        print(f"  {p.what:<32} {shape:>22} {each[0]:9.3f} {rates[0]:8.0f} {each[1]:9.3f} {rates[1]:8.0f}")
    print(f"  products at the better BLAS   {better_ms:8.2f} ms = {better_ms / floor_ms:.2f} x floor")
    print(f"  netdef forward+backward       {ms['netdef']:8.2f} ms = {ms['netdef'] / floor_ms:.2f} x floor")
    print(f"  PyTorch forward+backward      {ms['torch']:8.2f} ms = {ms['torch'] / floor_ms:.2f} x floor")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default="lenet,cifar10_quick")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (after 2 warm-up rounds)")
    parser.add_argument("--threads", type=int, help="threads for both frameworks (default: all cores)")
    args = parser.parse_args()
    unknown = [k for k in args.nets.split(",") if k not in NETS]
    if unknown:
        parser.error(f"unknown nets {unknown}; choose from {', '.join(NETS)}")
    set_threads(args.threads, True)
    import torch

    for key in args.nets.split(","):
        measure(key, args.rounds, torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
