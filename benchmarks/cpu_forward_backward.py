"""Forward+backward time per iteration on the CPU: netdef against PyTorch, same nets, same run.

    python benchmarks/cpu_forward_backward.py [--iters 20] [--threads N] [--per-layer] [--nets lenet,cifar]
                                              [--column-path]

Nets: LeNet (batch 64, 1x28x28) and CIFAR-10 quick (batch 100, 3x32x32), the BVLC definitions with the
Data layers replaced by Input layers. PyTorch (a benchmark-only dependency: pip install torch) runs the
same layers (Caffe's ceil-mode pooling included); when it is missing only netdef's figures print.
Both use the same number of BLAS/intra-op threads. Prints the median of --iters timed iterations after
warm-up, and the ratio netdef / PyTorch (below 1 means netdef is faster). --per-layer adds netdef's
per-layer forward and backward medians; --column-path times netdef's im2col path for every convolution
(the CPU row-product path off: netdef/layers/im2col.py) to compare the two. The machine's other load
shows up as noise: compare runs of the script, not single figures.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import netdef

LENET = """
name: "LeNet"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 64 dim: 1 dim: 28 dim: 28 } shape { dim: 64 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 20 kernel_size: 5 stride: 1 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 50 kernel_size: 5 stride: 1 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

CIFAR10_QUICK = """
name: "CIFAR10_quick"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 100 dim: 3 dim: 32 dim: 32 } shape { dim: 100 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 32 pad: 2 kernel_size: 5 stride: 1 weight_filler { type: "gaussian" std: 0.0001 } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 32 pad: 2 kernel_size: 5 stride: 1 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "conv3" type: "Convolution" bottom: "pool2" top: "conv3"
        convolution_param { num_output: 64 pad: 2 kernel_size: 5 stride: 1 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "pool3" type: "Pooling" bottom: "conv3" top: "pool3" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool3" top: "ip1" inner_product_param { num_output: 64 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def torch_lenet(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2, ceil_mode=True),
        nn.Conv2d(20, 50, 5), nn.MaxPool2d(2, 2, ceil_mode=True),
        nn.Flatten(), nn.Linear(800, 500), nn.ReLU(inplace=True), nn.Linear(500, 10))


def torch_cifar10_quick(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True), nn.ReLU(inplace=True),
        nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True),
        nn.Flatten(), nn.Linear(1024, 64), nn.Linear(64, 10))


def median_ms(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def time_netdef(text: str, shape: tuple, iters: int, per_layer: bool = False) -> tuple[float, dict]:
    netdef.set_random_seed(0)
    net = netdef.Net(text, netdef.TRAIN)
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal(shape).astype(np.float32)
    net.blobs["label"].data[...] = rng.integers(0, 10, shape[0]).astype(np.float32)

    def step():
        net.clear_param_diffs()
        net.forward_backward()

    ms = median_ms(step, iters)
    layers = {}
    for li, layer in enumerate(net.layers if per_layer else ()):
        # Each timed backward follows its forward, as in training (a layer may keep work from its
        # forward for the backward); medians over the repetitions after one warm-up.
        fwd, bwd = [], []
        for _ in range(max(3, iters // 2) + 1):
            start = time.perf_counter()
            net.forward_range(li, li)
            fwd.append(time.perf_counter() - start)
            net._fill_loss_diffs(0, len(net.layers) - 1)
            start = time.perf_counter()
            net.backward_range(li, li)
            bwd.append(time.perf_counter() - start)
        layers[layer.name] = (1000 * statistics.median(fwd[1:]), 1000 * statistics.median(bwd[1:]))
    return ms, layers


def time_torch(torch, build, shape: tuple, iters: int) -> float:
    torch.manual_seed(0)
    model = build(torch)
    x = torch.randn(*shape)
    y = torch.randint(0, 10, (shape[0],))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        model.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()

    return median_ms(step, iters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="BLAS / torch threads (default: all cores)")
    parser.add_argument("--per-layer", action="store_true", help="also print netdef's per-layer times")
    parser.add_argument("--nets", default="lenet,cifar", help="comma-separated subset of: lenet, cifar")
    parser.add_argument("--column-path", action="store_true",
                        help="run every convolution through im2col (the CPU row-product path off)")
    args = parser.parse_args()
    if args.column_path:
        from netdef.layers import im2col

        im2col.ROW_PRODUCTS = False
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        threadpool_limits, threadpool_info = None, None
    try:
        import torch
    except ImportError:
        torch = None
    if args.threads and threadpool_limits:
        threadpool_limits(args.threads)
    if torch is not None and args.threads:
        torch.set_num_threads(args.threads)
    if threadpool_info:
        for pool in threadpool_info():
            print(f"# numpy BLAS: {pool.get('internal_api')} {pool.get('version')} "
                  f"threads={pool.get('num_threads')} core={pool.get('architecture')}")
    if torch is not None:
        print(f"# torch {torch.__version__} threads={torch.get_num_threads()}")
    print(f"{'net':<16}{'batch':>6}{'netdef ms':>12}{'torch ms':>11}{'netdef/torch':>14}")
    cases = {"lenet": ("LeNet", LENET, (64, 1, 28, 28), torch_lenet),
             "cifar": ("CIFAR-10 quick", CIFAR10_QUICK, (100, 3, 32, 32), torch_cifar10_quick)}
    for key in args.nets.split(","):
        if key.strip() not in cases:
            parser.error(f"--nets: unknown net {key!r} (choose from {', '.join(cases)})")
    for name, text, shape, build in (cases[key.strip()] for key in args.nets.split(",")):
        ours, per_layer = time_netdef(text, shape, args.iters, args.per_layer)
        theirs = time_torch(torch, build, shape, args.iters) if torch is not None else float("nan")
        ratio = ours / theirs if torch is not None else float("nan")
        print(f"{name:<16}{shape[0]:>6}{ours:>12.2f}{theirs:>11.2f}{ratio:>14.2f}")
        if args.per_layer:
            for layer, (fwd, bwd) in per_layer.items():
                print(f"    {layer:<12} forward {fwd:8.3f} ms   backward {bwd:8.3f} ms")
            total = sum(f + b for f, b in per_layer.values())
            print(f"    {'(all)':<12} forward + backward {total:8.3f} ms")


if __name__ == "__main__":
    main()
