"""CPU time per iteration of the zoo's nets: netdef against PyTorch, same nets, same weights, same run.

    python benchmarks/cpu_forward_backward.py [--nets lenet,cifar10_quick,...] [--iters 10] [--threads N]
                                              [--batch N] [--per-layer] [--unfused] [--no-rss] [--column-path]

For every net (the zoo's deploy.prototxt with its batch set, its final Softmax replaced by
SoftmaxWithLoss for training) it prints:

- forward+backward ms per iteration (TRAIN phase: BatchNorm on batch statistics, dropout on) of netdef
  and of PyTorch, and netdef / PyTorch; each netdef step first clears the parameter gradients as the
  solver does (deferred, ``Blob.defer_zero_diff``; ``--eager-clear`` zeroes them at once), PyTorch's
  its ``zero_grad()``;
- forward-only ms (netdef's TEST phase against PyTorch's eval() under torch.no_grad()) and the ratio;
- the sgemm floor: the net's multiply-adds (convolutions and inner products; 3x forward for forward +
  backward, less the input gradient nobody needs) at the GFLOP/s of a large float32 matrix product
  (1024 x 1024, NumPy's BLAS) timed in the same alternating rounds as the net's steps (its median, the
  ``sgemm`` column), and netdef's forward+backward time over it. The header's sgemm, measured once at
  the start, only describes the machine: this one's speed moves by 30% within minutes, and a floor
  from another minute than the net's timings moved LeNet's "x floor" by as much;
- peak RSS (MiB) of a fresh process per framework that builds the net and runs forward+backward,
  the median of --rss-runs such processes, run alternately (PyTorch's peak for ResNet-50 varied
  1555-1731 MiB between single runs; --no-rss skips these subprocesses).

PyTorch runs the same net through torch_mirror.py (its own operators, weights copied from netdef's:
He-normal random ones, ``fill_weights``; ``--zero-weights`` keeps the deploy files' zeros).
Both use the same thread count (--threads, default: all cores). Timed steps alternate netdef and
PyTorch, so the machine's other load falls on both, each timed step right after untimed runs of the same
step (warm, as in a training loop); figures are medians after warm-up. Ratios below 1
mean netdef is faster. --per-layer adds netdef's per-layer-type forward and backward medians (a BatchNorm chain, trained as
one step, as one type) and the
TEST forward's per step type (fused chains as one step, Net.forward_steps); --unfused also times the
TEST forward with its layers run one by one (Net.fuse_layers off) in the same rounds.
--column-path runs every convolution through im2col (the CPU row-product path off).
"""
from __future__ import annotations

import os

# Idle OpenMP threads wait alike in both frameworks: netdef's default for its kernels, a short spin then
# sleep (netdef/threads.py, KERNEL_SPIN), set here before torch loads its own OpenMP runtime (GNU libgomp
# too), because the steps alternate: torch's default 3 ms spin after each of its steps took the cores
# from netdef's next one (ResNet-50 2.0x PyTorch's time with torch's spinning threads around, 0.98x
# without), and sleeping at once (OMP_WAIT_POLICY=PASSIVE, this benchmark's choice until 2026-11-26)
# charged both frameworks a thread wake-up per parallel loop, which neither pays with its defaults.
# OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment applies to both instead.
from netdef.threads import let_idle_kernel_threads_sleep  # noqa: E402

let_idle_kernel_threads_sleep()

# netdef before NumPy, as `netdef` itself starts: it makes OpenBLAS's idle threads sleep at once, which
# OpenBLAS reads only when NumPy loads it (netdef/threads.py, BLAS_WAIT_POLICY).
import netdef  # noqa: E402

import argparse  # noqa: E402
import collections
import json
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from netdef.memory import status_bytes  # noqa: E402
from netdef.proto import io as proto_io  # noqa: E402
from netdef.proto import netdef_pb2 as pb  # noqa: E402
from netdef.summary import summarize  # noqa: E402

MODELS = HERE.parent / "models"

# key: (label, deploy prototxt, batch, classes)
NETS = collections.OrderedDict([
    ("lenet", ("LeNet", MODELS / "lenet/lenet.prototxt", 64, 10)),
    ("cifar10_quick", ("CIFAR-10 quick", MODELS / "cifar10_quick/deploy.prototxt", 100, 10)),
    ("cifar10_full", ("CIFAR-10 full", MODELS / "cifar10_full/deploy.prototxt", 100, 10)),
    ("alexnet", ("AlexNet", MODELS / "alexnet/deploy.prototxt", 8, 1000)),
    ("caffenet", ("CaffeNet", MODELS / "caffenet/deploy.prototxt", 8, 1000)),
    ("googlenet", ("GoogLeNet", MODELS / "googlenet/deploy.prototxt", 8, 1000)),
    ("vgg16", ("VGG-16", MODELS / "vgg16/deploy.prototxt", 2, 1000)),
    ("resnet50", ("ResNet-50", MODELS / "resnet50/deploy.prototxt", 8, 1000)),
    ("resnet101", ("ResNet-101", MODELS / "resnet101/deploy.prototxt", 4, 1000)),
    ("resnet152", ("ResNet-152", MODELS / "resnet152/deploy.prototxt", 4, 1000)),
    ("squeezenet", ("SqueezeNet v1.1", MODELS / "squeezenet/deploy.prototxt", 8, 1000)),
    ("squeezenet_v1_0", ("SqueezeNet v1.0", MODELS / "squeezenet_v1_0/deploy.prototxt", 8, 1000)),
    ("mobilenet", ("MobileNet v1", MODELS / "mobilenet/deploy.prototxt", 8, 1000)),
    ("mobilenet_v2", ("MobileNet v2", MODELS / "mobilenet_v2/deploy.prototxt", 8, 1000)),
])


# ------------------------------------------------------------------------------------------- nets
def deploy_param(key: str, batch: int | None) -> tuple[pb.NetParameter, int, int]:
    """(deploy NetParameter with its Input batch set, batch, classes)."""
    _, source, default_batch, classes = NETS[key]
    batch = batch or default_batch
    param = proto_io.read_text(source, pb.NetParameter)
    data = param.layer[0]
    if data.type != "Input":
        raise SystemExit(f"{key}: the first layer of the deploy net must be an Input")
    data.input_param.shape[0].dim[0] = batch
    return param, batch, classes


def train_param(deploy: pb.NetParameter) -> pb.NetParameter:
    """The deploy net with a label input and SoftmaxWithLoss in place of its final Softmax."""
    param = pb.NetParameter()
    param.CopyFrom(deploy)
    last = param.layer[-1]
    if last.type != "Softmax":
        raise SystemExit(f"{param.name}: the deploy net must end in a Softmax")
    last.type = "SoftmaxWithLoss"
    last.bottom.append("label")
    del last.top[:]
    last.top.append("loss")
    data = param.layer[0]
    data.top.append("label")
    data.input_param.shape.add().dim.append(data.input_param.shape[0].dim[0])
    return param


def multiply_adds(net) -> tuple[int, int]:
    """(forward, forward+backward) multiply-adds of the net's convolutions and inner products (as
    `netdef summary` counts them). Backward costs one product for the weight gradient and one for the
    input gradient where one is needed."""
    forward = both = 0
    for li, layer in enumerate(summarize(net).layers):
        forward += layer.macs
        both += layer.macs * (2 + (1 if any(net.bottom_need_backward[li]) else 0))
    return forward, both


SGEMM_SIZE = 1024


def sgemm_step(size: int = SGEMM_SIZE):
    """One float32 product of two size x size matrices, as a step ``alternate`` can time."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    b = a.T.copy()
    c = np.empty_like(a)
    return lambda: np.matmul(a, b, out=c)


def sgemm_gflops(size: int = SGEMM_SIZE, iters: int = 7) -> float:
    product = sgemm_step(size)
    times = []
    for _ in range(iters + 2):
        start = time.perf_counter()
        product()
        times.append(time.perf_counter() - start)
    return 2 * size ** 3 / statistics.median(times[2:]) / 1e9


# ----------------------------------------------------------------------------------------- timing
# Whether the nets keep the all-zero weights their deploy files give them (--zero-weights: the tables
# made before 2026-11-26 16:30) instead of fill_weights'.
ZERO_WEIGHTS = False


def fill_weights(net, rng) -> None:
    """Weights as a net trained from scratch has them: He-normal filters and inner products (variance
    2 / fan-in), small biases, BatchNorm statistics of unit-scale activations, Scale near 1 (any other
    learned blob small and random). The deploy files name no fillers, so without this every weight is
    0 and every activation after the first layer constant. Speed can depend on the values: PyTorch's
    max_pool2d took 2.1 ms over LeNet's pool1 input (64 x 20 x 24 x 24, 2 threads) of zeros and 3.7 over
    random values, and its SqueezeNet TEST forward (batch 8) 134-149 ms on the zero weights against
    199-205 on these, netdef's 110-125 on both. A user's values are not constant."""
    for layer in net.layers:
        blobs = layer.blobs
        if layer.type in ("Convolution", "Deconvolution", "InnerProduct"):
            weights = blobs[0].data
            weights[...] = rng.standard_normal(weights.shape) * np.sqrt(2.0 / weights[0].size)
            for blob in blobs[1:]:
                blob.data[...] = rng.standard_normal(blob.shape) * 0.01
        elif layer.type == "BatchNorm":
            blobs[0].data[...] = rng.standard_normal(blobs[0].shape) * 0.1
            blobs[1].data[...] = rng.uniform(0.5, 1.5, blobs[1].shape)
            blobs[2].data[...] = 1
        elif layer.type == "Scale":
            blobs[0].data[...] = 1 + rng.standard_normal(blobs[0].shape) * 0.1
            for blob in blobs[1:]:
                blob.data[...] = rng.standard_normal(blob.shape) * 0.1
        else:
            for blob in blobs:
                blob.data[...] = rng.standard_normal(blob.shape) * 0.1


def netdef_nets(key, batch):
    deploy, batch, classes = deploy_param(key, batch)
    netdef.set_random_seed(0)
    train = netdef.Net(train_param(deploy), netdef.TRAIN)
    rng = np.random.default_rng(0)
    if not ZERO_WEIGHTS:
        fill_weights(train, rng)
    shape = train.blobs["data"].shape
    train.blobs["data"].data[...] = rng.standard_normal(shape).astype(np.float32)
    train.blobs["label"].data[...] = rng.integers(0, classes, batch).astype(np.float32)
    test = netdef.Net(deploy, netdef.TEST)
    test.share_with(train)
    test.blobs["data"].data[...] = train.blobs["data"].data
    return train, test


SETTLE_RUNS = 2
# What the timings read: wall time (perf_counter, the default), or with --clock cpu the process's CPU time
# (process_time, every thread's), which other jobs on the machine change far less: with --threads 1 it
# is the work a step does, where a loaded machine makes wall times of 2 threads meaningless (load 8-17
# on the 2 cores, 2026-11-25 evening: sgemm 11-24 GFLOP/s instead of 300).
clock = time.perf_counter


def alternate(steps: dict, iters: int, warmup: int = 2) -> dict:
    """Median ms of each step. Every round runs the steps in turn, so that the machine's other load falls
    on all of them; each step runs SETTLE_RUNS times untimed right before its timed run, so that the
    other framework's threads have gone quiet and this one's are awake, as in a training loop. Timed
    straight after a netdef step, PyTorch's CIFAR-10 quick took 94 ms against 45-48 ms alone (netdef's
    96 ms either way): the table of 2026-11-25 morning, made that way, flattered netdef."""
    times = {name: [] for name in steps}
    for round_ in range(warmup + iters):
        for name, fn in steps.items():
            for _ in range(SETTLE_RUNS):
                fn()
            start = clock()
            fn()
            if round_ >= warmup:
                times[name].append(clock() - start)
    return {name: 1000 * statistics.median(ts) for name, ts in times.items()}


def torch_train_step(torch, net):
    """PyTorch's forward+backward of the TRAIN net ``net`` (a mirror of it, on its data and labels)."""
    from torch_mirror import TorchMirror

    mirror = TorchMirror(net, torch)
    inputs = {"data": torch.from_numpy(net.blobs["data"].data.copy()),
              "label": torch.from_numpy(net.blobs["label"].data.copy())}

    def forward_backward():
        mirror.zero_grad()
        mirror(inputs).backward()

    return forward_backward


def torch_test_step(torch, net):
    """PyTorch's forward of the deploy net ``net`` in eval mode under no_grad."""
    from torch_mirror import TorchMirror

    mirror = TorchMirror(net, torch)
    mirror.train(False)
    inputs = {"data": torch.from_numpy(net.blobs["data"].data.copy())}

    def forward():
        with torch.no_grad():
            mirror(inputs)

    return forward


def per_layer_type(net, iters: int) -> dict:
    """{step type: (forward ms, backward ms)} medians over iterations, summed over the steps of a
    type; a step is a layer or a chain the net trains as one (a BatchNorm chain, typed like
    "BatchNorm+Scale+ReLU": ``Net.forward_steps``)."""
    totals = collections.defaultdict(lambda: [[], []])
    n = len(net.layers)
    steps = net.forward_steps()
    for _ in range(iters + 1):
        fwd = collections.Counter()
        bwd = collections.Counter()
        for first, last in steps:
            start = clock()
            net.forward_range(first, last)
            fwd[step_type(net, first, last)] += clock() - start
        net._fill_loss_diffs(0, n - 1)
        for first, last in reversed(steps):
            start = clock()
            net.backward_range(last, first)
            bwd[step_type(net, first, last)] += clock() - start
        for kind in fwd:
            totals[kind][0].append(fwd[kind])
            totals[kind][1].append(bwd[kind])
    return {kind: (1000 * statistics.median(f[1:]), 1000 * statistics.median(b[1:])) for kind, (f, b) in totals.items()}


def step_type(net, first: int, last: int) -> str:
    return "+".join(layer.type for layer in net.layers[first:last + 1])


def per_step_type(net, iters: int) -> dict:
    """{step type: forward ms} medians over iterations of the TEST net's forward, a step being a
    layer or a fused chain (``Net.forward_steps``, typed like "Convolution+BatchNorm+Scale+ReLU")."""
    totals = collections.defaultdict(list)
    steps = net.forward_steps()
    for _ in range(iters + 1):
        spent = collections.Counter()
        for first, last in steps:
            start = clock()
            net.forward_range(first, last)
            spent[step_type(net, first, last)] += clock() - start
        for kind in spent:
            totals[kind].append(spent[kind])
    return {kind: 1000 * statistics.median(ts[1:]) for kind, ts in totals.items()}


def print_test_steps(net, iters: int, label: str) -> None:
    for kind, ms in sorted(per_step_type(net, iters).items(), key=lambda kv: -kv[1]):
        print(f"    TEST {label:<8} {kind:<40} forward {ms:8.2f} ms")


# ---------------------------------------------------------------------------------------- peak RSS
def rss_child(framework: str, key: str, batch: int | None, threads: int | None) -> None:
    """Run in a fresh process: build the net, 3 forward+backward passes, print peak RSS in MiB."""
    set_threads(threads, framework == "torch")
    train, test = netdef_nets(key, batch)
    del test
    if framework == "torch":
        import torch

        forward_backward = torch_train_step(torch, train)
        del train
    else:
        train.keep_blob_diffs = False  # as `netdef train` trains (PyTorch too frees gradients once used)
        # The solver's clear (deferred: the first gradient overwrites), as `netdef train` runs it.
        forward_backward = lambda: (train.clear_param_diffs(deferred=True), train.forward_backward())  # noqa: E731
    for _ in range(3):
        forward_backward()
    print(json.dumps({"rss_mib": peak_rss_of_this_process() / 2**20}))


def peak_rss_of_this_process() -> float:
    """Bytes: VmHWM where /proc has it. Linux carries ru_maxrss across exec, so a child started by a
    large parent (this benchmark, after a few nets) reported the parent's peak instead of its own."""
    peak = status_bytes("VmHWM")
    if peak:
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss(framework: str, key: str, batch: int | None, threads: int | None) -> float:
    cmd = [sys.executable, __file__, "--rss-child", framework, "--nets", key]
    if batch:
        cmd += ["--batch", str(batch)]
    if threads:
        cmd += ["--threads", str(threads)]
    if ZERO_WEIGHTS:
        cmd += ["--zero-weights"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if done.returncode:
        return float("nan")
    return json.loads(done.stdout.strip().splitlines()[-1])["rss_mib"]


def median_peak_rss(key: str, args) -> tuple[float, float]:
    """(netdef, torch) MiB: the medians of ``args.rss_runs`` fresh processes each, alternating."""
    runs = {"netdef": [], "torch": []}
    for _ in range(max(1, args.rss_runs)):
        for framework, values in runs.items():
            values.append(peak_rss(framework, key, args.batch, args.threads))
    return statistics.median(runs["netdef"]), statistics.median(runs["torch"])


# ------------------------------------------------------------------------------------------- main
def set_threads(threads: int | None, with_torch: bool) -> None:
    if threads:
        from threadpoolctl import threadpool_limits

        from netdef.threads import set_kernel_threads

        threadpool_limits(threads)
        set_kernel_threads(threads)  # numba's pool reads no BLAS variable
    if with_torch:
        import torch

        torch.set_num_threads(threads or os.cpu_count())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nets", default=",".join(NETS), help=f"comma-separated subset of: {', '.join(NETS)}")
    parser.add_argument("--iters", type=int, default=10, help="timed rounds per net (after 2 warm-up rounds)")
    parser.add_argument("--batch", type=int, default=None, help="batch for every net (default: each net's)")
    parser.add_argument("--threads", type=int, default=None, help="BLAS / torch threads (default: all cores)")
    parser.add_argument("--per-layer", action="store_true", help="also print netdef's per-layer-type times")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
    parser.add_argument("--eager-clear", dest="deferred_clear", action="store_false",
                        help="zero the gradients at once before each forward+backward (the solver defers it)")
    parser.add_argument("--rss-runs", type=int, default=3, help="fresh processes per framework for peak RSS "
                        "(their median; default 3)")
    parser.add_argument("--unfused", action="store_true",
                        help="also time netdef's TEST forward with its layers run one by one (Net.fuse_layers off)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time (default) or the process's CPU time, all threads (for loaded machines)")
    parser.add_argument("--test-only", action="store_true",
                        help="time the TEST-phase forward only (no forward+backward steps)")
    parser.add_argument("--column-path", action="store_true",
                        help="run every convolution through im2col (the CPU row-product path off)")
    parser.add_argument("--no-direct", action="store_true",
                        help="convolutions without the direct path (layers/direct.py): the row-product and "
                             "column paths, as before it (the RSS subprocesses keep the defaults)")
    parser.add_argument("--zero-weights", action="store_true",
                        help="keep the deploy files' all-zero weights (as the tables before 2026-11-26 16:30) "
                             "instead of fill_weights' He-normal ones")
    parser.add_argument("--rss-child", choices=("netdef", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    global ZERO_WEIGHTS
    ZERO_WEIGHTS = args.zero_weights
    keys = [k.strip() for k in args.nets.split(",") if k.strip()]
    for key in keys:
        if key not in NETS:
            parser.error(f"--nets: unknown net {key!r} (choose from {', '.join(NETS)})")
    if args.rss_child:
        return rss_child(args.rss_child, keys[0], args.batch, args.threads)
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.column_path:
        from netdef.layers import im2col

        im2col.ROW_PRODUCTS = False
    if args.no_direct:
        from netdef.layers import direct

        direct.ENABLED = False
    import torch
    from threadpoolctl import threadpool_info

    set_threads(args.threads, True)
    for pool in threadpool_info():
        print(f"# numpy BLAS: {pool.get('internal_api')} {pool.get('version')} threads={pool.get('num_threads')}")
    gflops = sgemm_gflops()
    print(f"# torch {torch.__version__} threads={torch.get_num_threads()}; sgemm {gflops:.0f} GFLOP/s; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}; "
          f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset')}; clock {args.clock}; load average {os.getloadavg()[0]:.2f}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'net':<15}{'batch':>6} | {'fwd+bwd ms':>10}{'torch':>9}{'ratio':>7} | {'fwd ms':>8}{'torch':>8}"
          f"{'ratio':>7} | {'sgemm':>6}{'floor ms':>9}{'x floor':>8} | {'RSS MiB':>8}{'torch':>7}")
    for key in keys:
        label = NETS[key][0]
        train, test = netdef_nets(key, args.batch)
        fb_torch, fwd_torch = torch_train_step(torch, train), torch_test_step(torch, test)

        def fb_netdef():
            train.clear_param_diffs(deferred=args.deferred_clear)   # the solver's default: deferred
            train.forward_backward()

        def fwd_netdef(fused=True):
            test.fuse_layers = fused
            test.forward_range()

        steps = {"fwd": fwd_netdef, "fwd_torch": fwd_torch, "sgemm": sgemm_step()}
        if not args.test_only:
            steps = {"fb": fb_netdef, "fb_torch": fb_torch, **steps}
        if args.unfused:
            steps["fwd_unfused"] = lambda: fwd_netdef(fused=False)
        ms = {"fb": float("nan"), "fb_torch": float("nan"), **alternate(steps, args.iters)}
        _, both = multiply_adds(train)
        net_gflops = 2 * SGEMM_SIZE ** 3 / (ms["sgemm"] / 1000) / 1e9
        floor = 2 * both / (net_gflops * 1e9) * 1000
        rss = median_peak_rss(key, args) if not args.no_rss else (float("nan"),) * 2
        batch = train.blobs["data"].shape[0]
        print(f"{label:<15}{batch:>6} | {ms['fb']:>10.1f}{ms['fb_torch']:>9.1f}{ms['fb'] / ms['fb_torch']:>7.2f} | "
              f"{ms['fwd']:>8.1f}{ms['fwd_torch']:>8.1f}{ms['fwd'] / ms['fwd_torch']:>7.2f} | "
              f"{net_gflops:>6.0f}{floor:>9.1f}{ms['fb'] / floor:>8.2f} | {rss[0]:>8.0f}{rss[1]:>7.0f}", flush=True)
        if args.unfused:
            print(f"    TEST forward with the layers one by one {ms['fwd_unfused']:.1f} ms: fused / unfused "
                  f"{ms['fwd'] / ms['fwd_unfused']:.2f}, unfused / torch {ms['fwd_unfused'] / ms['fwd_torch']:.2f}")
        if args.per_layer and not args.test_only:
            for kind, (f, b) in sorted(per_layer_type(train, max(3, args.iters // 2)).items(),
                                       key=lambda kv: -sum(kv[1])):
                print(f"    {kind:<22} forward {f:8.2f} ms   backward {b:8.2f} ms")
        if args.per_layer:
            test.fuse_layers = True
            print_test_steps(test, max(3, args.iters // 2), "fused")
            if args.unfused:
                test.fuse_layers = False
                print_test_steps(test, max(3, args.iters // 2), "unfused")
        del train, test, fb_torch, fwd_torch


if __name__ == "__main__":
    main()
