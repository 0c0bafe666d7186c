"""Issue 29, GPU training at cuDNN speed: whole training iterations of the zoo's nets on one GPU,
netdef against PyTorch on the same nets, weights and batch, in the same run.

    python benchmarks/gpu_train.py [--nets alexnet,resnet50,...] [--precision float32,tf32]
                                   [--batch-scale 1] [--warmup 3] [--iters 10] [--rounds 3]
                                   [--time-budget SECONDS] [--json FILE] [--cuda-graphs]
    python benchmarks/gpu_train.py --device cpu --nets squeezenet,mobilenet_v2 --batch-scale 0.02 \\
                                   --iters 1 --warmup 1 --rounds 1      # smoke test of the script

An iteration is forward, backward and the update (SGD, momentum 0.9, weight decay 5e-4) on one fixed
random batch that is already on the device (random images, labels drawn from the net's classes):

- netdef: the zoo's train_val.prototxt, TRAIN phase, its Data layer replaced by an Input holding that
  batch, trained by the solver ``netdef train`` builds (``create_solver`` on this process's
  communicator, ``keep_blob_diffs`` off, ``solver_mode: GPU``); timed as ``solver.step(iters)``.
  ``netdef.backend.set_precision`` is set before the nets are built. ``--cuda-graphs``: the net replays
  its stretches of replayable layers from CUDA graphs (``Net.cuda_graphs``), recorded in the warm-up.
- PyTorch: the same net run by torch_mirror.py on the same device with a copy of netdef's initial
  weights (the prototxt's fillers), its own operators and ``torch.optim.SGD(params, lr, momentum=0.9,
  weight_decay=5e-4)``; ``zero_grad()``, forward, ``backward()``, ``step()``, as a PyTorch user writes
  it, with ``torch.backends.cudnn.benchmark = True``.
- Precision ``float32``: both strict float32 (netdef's default; TF32 off in PyTorch's matmul and
  cuDNN); ``tf32``: TensorFloat-32 allowed in both (``torch.backends.cuda.matmul.allow_tf32`` and
  ``torch.backends.cudnn.allow_tf32``).

Timing: after ``--warmup`` iterations of each framework (netdef's first, then PyTorch's), ``--rounds``
rounds each run ``--iters`` iterations of netdef and of PyTorch, the order swapped every round; a
framework's time is the wall time between two device-wide synchronisations, so the host's Python
time counts as it does in training. Figures are the medians of the rounds; images/s = batch / that
time; the ratio is netdef's images/s over PyTorch's (above 1: netdef faster).

Peak device memory, in training as it goes on (after the warm-up, whose first iterations time
cuDNN's plans and, with ``--cuda-graphs``, record the graphs): PyTorch's ``torch.cuda.max_memory_allocated()``
since ``reset_peak_memory_stats()`` after its warm-up (its weights included), over an untimed iteration
and the timed rounds. CuPy has no peak counter: during one untimed iteration after netdef's warm-up
every allocation goes through a wrapper of its pool's ``malloc`` that records the most bytes handed
out at once (``used_bytes``, the weights and whatever netdef keeps from earlier nets, such as cuDNN's
workspace, included), the figure comparable to PyTorch's; the CUDA graphs' own pools (``--cuda-graphs``)
are added whole. The timed rounds run without the wrapper. The bytes CuPy's pool holds (freed blocks
it keeps included, closer to PyTorch's ``max_memory_reserved()``) are in the JSON
(``netdef_pool_mib``). Memory that netdef's libraries allocate outside CuPy's pool is not counted. The
two frameworks keep separate pools; both are emptied between nets.

A net that fails (an exception, out of memory) prints its error in its row and the others still run.
``--time-budget`` stops starting new nets once that many seconds have passed. ``--device cpu`` runs
the same code on the CPU (no CuPy imported, no memory figures): a check of the script, not a benchmark.
"""
from __future__ import annotations

import argparse
import contextlib
import collections
import gc
import json
import pathlib
import shlex
import statistics
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import netdef  # noqa: E402
import netdef.cudnn.plans  # noqa: E402
from netdef import backend, net_graphs  # noqa: E402
from netdef.proto import netdef_pb2 as pb  # noqa: E402
from netdef.device_memory import PeakWatch  # noqa: E402

MODELS = HERE.parent / "models"

# key (the folder in models/): (label, batch)
NETS = collections.OrderedDict([
    ("alexnet", ("AlexNet", 256)),
    ("googlenet", ("GoogLeNet", 128)),
    ("vgg16", ("VGG-16", 64)),
    ("resnet50", ("ResNet-50", 128)),
    ("resnet152", ("ResNet-152", 64)),
    ("mobilenet_v2", ("MobileNet v2", 128)),
    ("squeezenet", ("SqueezeNet v1.1", 256)),
])
PRECISIONS = ("float32", "tf32")
DATA_TYPES = {"Data", "ImageData", "HDF5Data", "WindowData", "MemoryData", "Input", "DummyData"}
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
# Small enough that no net's loss leaves the finite range on random data within a benchmark's
# iterations (netdef's solver stops on a non-finite loss); the rate does not change the work.
BASE_LR = 1e-4
MIB = 2 ** 20


# ------------------------------------------------------------------------------------------- nets
def scaled_batch(batch: int, scale: float) -> int:
    return max(1, round(batch * scale))


def image_shape(key: str) -> tuple[int, ...]:
    """One image's shape (C x H x W): the Input of models/<key>/deploy.prototxt without its batch."""
    from netdef.proto import io as proto_io

    path = MODELS / key / "deploy.prototxt"
    deploy = proto_io.read_text(str(path), pb.NetParameter)
    inputs = [layer for layer in deploy.layer if layer.type == "Input"]
    if not inputs or not inputs[0].input_param.shape:
        raise ValueError(f"{path}: no Input layer with a shape")
    return tuple(inputs[0].input_param.shape[0].dim[1:])


def train_net_param(key: str, batch: int) -> pb.NetParameter:
    """The TRAIN-phase layers of models/<key>/train_val.prototxt, its data layer replaced by an Input
    whose tops are ``data`` (batch x the deploy net's image shape) and ``label`` (batch)."""
    from netdef.net import layer_included
    from netdef.proto import io as proto_io

    path = MODELS / key / "train_val.prototxt"
    param, _, _ = proto_io.read_net_param(str(path))
    state = pb.NetState(phase=pb.TRAIN)
    out = pb.NetParameter(name=param.name)
    data_layers = 0
    for layer in param.layer:
        if not layer_included(layer, state):
            continue
        copy = out.layer.add()
        if layer.type in DATA_TYPES:
            data_layers += 1
            if len(layer.top) != 2:
                raise ValueError(f"{path}: data layer {layer.name!r} has {len(layer.top)} tops, expected data "
                                 f"and label")
            copy.name, copy.type = layer.name, "Input"
            copy.top.extend(layer.top)
            copy.input_param.shape.add(dim=[batch, *image_shape(key)])
            copy.input_param.shape.add(dim=[batch])
            continue
        copy.CopyFrom(layer)
        del copy.include[:]
        del copy.exclude[:]
    if data_layers != 1:
        raise ValueError(f"{path}: {data_layers} TRAIN-phase data layers, expected 1")
    return out


def solver_param(net_param: pb.NetParameter, gpu: bool) -> pb.SolverParameter:
    """SGD with momentum and weight decay on ``net_param``; no test nets, display or snapshots."""
    param = pb.SolverParameter(base_lr=BASE_LR, lr_policy="fixed", momentum=MOMENTUM, weight_decay=WEIGHT_DECAY,
                               type="SGD", max_iter=1_000_000, display=0, snapshot=0, snapshot_after_train=False,
                               random_seed=1, device_id=0)
    param.net_param.CopyFrom(net_param)
    param.solver_mode = pb.SolverParameter.GPU if gpu else pb.SolverParameter.CPU
    return param


def build_solver(param: pb.SolverParameter):
    """The solver as ``netdef train`` builds it (one process)."""
    from netdef.comm import create_communicator, create_solver, options_from

    solver = create_solver(param, comm=create_communicator(), options=options_from(param))
    solver.net.keep_blob_diffs = False
    return solver


def loss_classes(net) -> int:
    """Classes of the net's SoftmaxWithLoss: the channels of its first bottom."""
    for layer in net.layers:
        lp = layer.layer_param
        if lp.type == "SoftmaxWithLoss":
            return net.blobs[lp.bottom[0]].shape[1]
    raise ValueError(f"{net.name}: no SoftmaxWithLoss layer")


def fill_batch(net, seed: int = 0) -> None:
    """A fixed random batch in the net's Input blobs, on the net's device: standard normal images,
    labels uniform over the classes."""
    rng = np.random.default_rng(seed)
    images, labels = net.blobs["data"], net.blobs["label"]
    images.data[...] = backend.to_device(rng.standard_normal(images.shape, dtype=np.float32), like=images.data)
    classes = rng.integers(0, loss_classes(net), labels.shape).astype(np.float32)
    labels.data[...] = backend.to_device(classes, like=labels.data)


def convolution_algorithms(net) -> dict:
    """{algorithm_summary(): number of Convolution layers that chose it}."""
    chosen = collections.Counter()
    for layer in net.layers:
        if layer.type == "Convolution":
            chosen[layer.algorithm_summary()] += 1
    return dict(chosen.most_common())


def torch_trainer(torch, net, device: str):
    """(one PyTorch training iteration as a function, the mirror) for netdef's TRAIN net ``net``, with
    a copy of its current weights and batch on ``device``."""
    from torch_mirror import TorchMirror

    mirror = TorchMirror(net, torch, device)
    inputs = {"data": torch.from_numpy(backend.to_host(net.blobs["data"].data).copy()).to(device),
              "label": torch.from_numpy(backend.to_host(net.blobs["label"].data).astype(np.int64)).to(device)}
    optimizer = torch.optim.SGD(mirror.params, BASE_LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)

    def iteration():
        optimizer.zero_grad()
        mirror(inputs).backward()
        optimizer.step()

    return iteration


# ----------------------------------------------------------------------------------------- devices
class CpuDevice:
    """Runs both frameworks on the CPU, to check the script: no memory figures."""

    name = "cpu"
    torch_device = "cpu"

    def use_for_netdef(self) -> None:
        netdef.set_device("cpu")

    def configure_torch(self, torch, precision: str) -> None:
        """Nothing: TF32 and cuDNN's search are GPU settings."""

    def synchronize(self) -> None:
        """Nothing: the CPU computes synchronously."""

    def netdef_pool_bytes(self) -> float:
        return float("nan")

    @contextlib.contextmanager
    def netdef_peak(self):
        """Nothing measured on the CPU: the peak stays NaN."""
        yield [float("nan")]

    def reset_torch_peak(self) -> None:
        """Nothing to reset."""

    def torch_peak_bytes(self) -> tuple[float, float]:
        return float("nan"), float("nan")

    def free(self) -> None:
        gc.collect()

    def describe(self, torch) -> list[str]:
        return [f"device: CPU (a check of the script, not a benchmark); torch {torch.__version__}"]


class GpuDevice:
    """Both frameworks on CUDA device ``device_id``: netdef through CuPy, PyTorch through its own
    allocator (the two pools are separate)."""

    name = "gpu"

    def __init__(self, device_id: int = 0):
        import cupy

        self.cupy = cupy
        self.device_id = device_id
        self.torch_device = f"cuda:{device_id}"
        self.pool = cupy.get_default_memory_pool()

    def use_for_netdef(self) -> None:
        netdef.set_device("gpu", self.device_id)

    def configure_torch(self, torch, precision: str) -> None:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"

    def synchronize(self) -> None:
        self.cupy.cuda.runtime.deviceSynchronize()  # the whole device: every stream of both frameworks

    def netdef_pool_bytes(self) -> float:
        return float(self.pool.total_bytes())

    @contextlib.contextmanager
    def netdef_peak(self):
        """For the block, the most bytes CuPy's pool had handed out and not got back at once (what
        PyTorch's ``max_memory_allocated`` counts), in the one-element list it yields, filled when the
        block ends: every allocation goes through the wrapper ``netdef train`` measures its first
        iterations with (``netdef.device_memory.PeakWatch``), which is why only one untimed
        iteration runs under it (the timed rounds keep the pool's allocator)."""
        watch = PeakWatch(self.cupy)
        if not watch.opened:
            raise RuntimeError("CuPy's allocator is not its memory pool's: netdef's peak cannot be measured")
        peak = [float("nan")]
        try:
            yield peak
        finally:
            watch.close()
            peak[0] = float(watch.peak)

    def reset_torch_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.torch_device)

    def torch_peak_bytes(self) -> tuple[float, float]:
        """(max allocated, max reserved) since the last reset."""
        import torch

        return (float(torch.cuda.max_memory_allocated(self.torch_device)),
                float(torch.cuda.max_memory_reserved(self.torch_device)))

    def free(self) -> None:
        import torch

        gc.collect()
        self.synchronize()
        # The next net's peak starts from its own plans' workspace, not the largest an earlier net chose.
        netdef.cudnn.plans.release_workspaces()
        self.pool.free_all_blocks()
        self.cupy.get_default_pinned_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()

    def describe(self, torch) -> list[str]:
        props = self.cupy.cuda.runtime.getDeviceProperties(self.device_id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        lines = [f"GPU {self.device_id}: {name}, {props['totalGlobalMem'] / 2**30:.0f} GiB",
                 f"CuPy {self.cupy.__version__} (CUDA runtime {self.cupy.cuda.runtime.runtimeGetVersion()}); "
                 f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})"]
        lines.append(f"netdef's cuDNN: {netdef.cudnn.status()[1]}; workspace limit "
                     f"{netdef.cudnn.workspace_limit() / MIB:.0f} MiB, benchmark limit "
                     f"{netdef.cudnn.benchmark_limit()}")
        return lines


# ----------------------------------------------------------------------------------------- measure
def timed_ms(run, iters: int, device) -> float:
    """Milliseconds per iteration of ``run(iters)``, between two device-wide synchronisations."""
    device.synchronize()
    start = time.perf_counter()
    run(iters)
    device.synchronize()
    return (time.perf_counter() - start) * 1000 / iters


def measure(row: dict, torch, device, args) -> None:
    """Fill ``row`` (net, batch, precision given) with both frameworks' figures; what is filled
    before an exception stays."""
    precision = row["precision"]
    backend.set_precision(precision)
    device.configure_torch(torch, precision)
    device.free()
    row["netdef_pool_before_mib"] = device.netdef_pool_bytes() / MIB
    solver = build_solver(solver_param(train_net_param(row["key"], row["batch"]), device.name == "gpu"))
    try:  # closed whatever happens: a net that fails in its first iterations leaves no memory watch behind
        solver.net.cuda_graphs = args.cuda_graphs
        if backend.device() != device.name:
            raise RuntimeError(f"netdef's solver runs on the {backend.device()}, not the {device.name}")
        fill_batch(solver.net)
        torch_iteration = torch_trainer(torch, solver.net, device.torch_device)

        def run_torch(iters: int) -> None:
            for _ in range(iters):
                torch_iteration()

        run_netdef = solver.step
        # With graphs, the warm-up ends with every stretch recorded (the first iteration, which makes the
        # gradients, is a kind of pass of its own): the timed rounds replay.
        run_netdef(max(args.warmup, net_graphs.WARM_UP_PASSES + 2) if args.cuda_graphs else args.warmup)
        with device.netdef_peak() as peak:
            run_netdef(1)  # a training iteration as every later one, its memory peak measured
        # A recording's memory pool is its own (net_graphs.py): held throughout, on top of the default pool's peak.
        graph_pools = solver.net.cuda_graphs.pool_bytes() if solver.net.cuda_graphs else 0
        row["netdef_peak_mib"] = (peak[0] + graph_pools) / MIB
        device.synchronize()
        netdef_pool = device.netdef_pool_bytes()
        row["conv_algorithms"] = convolution_algorithms(solver.net)
        row["cudnn_workspace_mib"] = netdef.cudnn.plans.shared_workspace_bytes() / MIB  # in the peak
        if solver.net.cuda_graphs:
            row["cuda_graph_runs"] = solver.net.cuda_graphs.replayed()
            row["cuda_graph_refusals"] = solver.net.cuda_graphs.refused()
        run_torch(args.warmup)
        device.reset_torch_peak()  # PyTorch's peak from here: the same steady iterations as netdef's
        run_torch(1)
        runs = {"netdef": run_netdef, "torch": run_torch}
        times = {"netdef": [], "torch": []}
        for round_index in range(args.rounds):
            order = list(runs) if round_index % 2 == 0 else list(reversed(runs))
            for framework in order:
                times[framework].append(timed_ms(runs[framework], args.iters, device))
        row["netdef_pool_mib"] = max(netdef_pool, device.netdef_pool_bytes()) / MIB
        row["torch_peak_mib"], row["torch_reserved_mib"] = (b / MIB for b in device.torch_peak_bytes())
        for framework, ms in times.items():
            row[f"{framework}_ms"] = ms
            row[f"{framework}_img_s"] = row["batch"] / (statistics.median(ms) / 1000)
        row["ratio"] = row["netdef_img_s"] / row["torch_img_s"]
    finally:
        solver.close()


def run_job(row: dict, torch, device, args) -> None:
    """``measure`` with its failure recorded in the row, and both frameworks' memory freed after."""
    started = time.perf_counter()
    try:
        measure(row, torch, device, args)
    except Exception as exc:  # noqa: BLE001 - one net's failure (out of memory included) must not stop the others
        row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
    finally:
        device.free()
    row["seconds"] = time.perf_counter() - started


# -------------------------------------------------------------------------------------------- print
def print_table(rows: list[dict], environment: list[str], command: str, memory_note: str,
                limited: list = ()) -> None:
    """The table and its notes; ``limited``: the cuDNN plans whose candidates the workspace limit
    cut (netdef.cudnn.plans.limited_by_workspace)."""
    print()
    for line in environment:
        print(f"# {line}")
    print(f"# {command}")
    print(f"{'net':<16}{'batch':>6}  {'precision':<9} | {'netdef img/s':>12}{'PyTorch img/s':>14}{'ratio':>7} | "
          f"{'netdef MiB':>11}{'PyTorch MiB':>12}")
    for row in rows:
        head = f"{row['label']:<16}{row['batch']:>6}  {row['precision']:<9} | "
        if "ratio" in row:
            print(head + f"{row['netdef_img_s']:>12.1f}{row['torch_img_s']:>14.1f}{row['ratio']:>7.2f} | "
                  f"{_mib(row['netdef_peak_mib']):>11}{_mib(row['torch_peak_mib']):>12}")
        if "error" in row:
            print(head + f"error: {row['error']}")
    print(f"# {memory_note}")
    for row in rows:
        if row.get("netdef_pool_before_mib", 0) > 0:  # NaN on the CPU: no line
            print(f"#   {row['label']} {row['precision']}: CuPy's pool already held "
                  f"{row['netdef_pool_before_mib']:.0f} MiB before the net was built (in its figure)")
    for row in rows:
        if row.get("cudnn_workspace_mib", 0) > 0:
            print(f"#   {row['label']} {row['precision']}: cuDNN's shared workspace "
                  f"{row['cudnn_workspace_mib']:.0f} MiB (the largest chosen plan's; in netdef's figure)")
    for row in rows:
        if "cuda_graph_runs" in row:
            runs = row["cuda_graph_runs"]
            print(f"#   {row['label']} {row['precision']}: {len(runs)} stretches replayed from CUDA graphs"
                  + (f" ({', '.join(f'{d} {a}..{b}' for d, a, b in runs)})" if 0 < len(runs) <= 6 else ""))
            for direction, first, last, why in row.get("cuda_graph_refusals", []):
                print(f"#     not recorded: {direction} {first}..{last}: {why}")
    if limited:
        print(f"# cuDNN plans that left out candidates over the workspace limit: {len(limited)}; the most any "
              f"wanted: {max(wanted for _, wanted in limited) / MIB:.0f} MiB (--cudnn-workspace-mib raises it)")
    print("# netdef's convolution algorithms (layers per choice):")
    for row in rows:
        if row.get("conv_algorithms"):
            chosen = ", ".join(f"{count} x {name}" for name, count in row["conv_algorithms"].items())
            print(f"#   {row['label']} {row['precision']}: {chosen}")


def _mib(value: float) -> str:
    return "-" if value != value else f"{value:.0f}"  # NaN: no figure on this device


def write_json(path: str, rows: list[dict], environment: list[str], command: str) -> None:
    with open(path, "w") as out:
        json.dump({"command": command, "environment": environment, "rows": rows}, out, indent=1)


# --------------------------------------------------------------------------------------------- main
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nets", default=",".join(NETS), help=f"comma-separated subset of: {', '.join(NETS)}")
    parser.add_argument("--precision", default=",".join(PRECISIONS), help="comma-separated: float32,tf32")
    parser.add_argument("--batch-scale", type=float, default=1.0, help="multiplies every net's batch (quick runs)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations per framework (default 3)")
    parser.add_argument("--iters", type=int, default=10, help="iterations per framework per round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, alternating the frameworks (default 3)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                        help="gpu (the benchmark) or cpu (a check of the script with tiny batches)")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="start no new net once this many seconds have passed (the first always runs)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    parser.add_argument("--cudnn-benchmark-limit", type=int, metavar="N",
                        help="candidate cuDNN plans timed per operation and shape (netdef.cudnn.set_benchmark_limit; "
                             f"default {netdef.cudnn.DEFAULT_BENCHMARK_LIMIT}, as PyTorch's cudnn.benchmark_limit)")
    parser.add_argument("--cudnn-workspace-mib", type=int, metavar="MIB",
                        help="the most workspace a cuDNN plan of netdef's may use (netdef.cudnn.set_workspace_limit; "
                             "default 1024): PyTorch's cudnn.benchmark sets itself no such limit")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="netdef replays its stretches of replayable layers from CUDA graphs (Net.cuda_graphs, "
                             "netdef train --cuda_graphs); the table says how many stretches each net replayed")
    args = parser.parse_args(argv)
    args.nets = [k.strip() for k in args.nets.split(",") if k.strip()]
    for key in args.nets:
        if key not in NETS:
            parser.error(f"--nets: unknown net {key!r} (choose from {', '.join(NETS)})")
    args.precision = [p.strip() for p in args.precision.split(",") if p.strip()]
    for precision in args.precision:
        if precision not in PRECISIONS:
            parser.error(f"--precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if min(args.iters, args.rounds) < 1 or args.warmup < 0 or args.batch_scale <= 0:
        parser.error("--iters and --rounds must be at least 1, --warmup at least 0, --batch-scale positive")
    if args.cudnn_benchmark_limit is not None and args.cudnn_benchmark_limit < 1:
        parser.error("--cudnn-benchmark-limit must be at least 1")
    return args


def main(argv=None) -> list[dict]:
    """Run the benchmark; returns the table's rows (dicts, as written to --json)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    command = "python benchmarks/gpu_train.py " + " ".join(shlex.quote(a) for a in argv)
    import torch

    device = GpuDevice(0) if args.device == "gpu" else CpuDevice()
    device.use_for_netdef()
    previous_workspace_limit, previous_benchmark_limit = netdef.cudnn.workspace_limit(), netdef.cudnn.benchmark_limit()
    if args.cudnn_workspace_mib is not None:
        netdef.cudnn.set_workspace_limit(args.cudnn_workspace_mib * MIB)
    if args.cudnn_benchmark_limit is not None:
        netdef.cudnn.set_benchmark_limit(args.cudnn_benchmark_limit)
    environment = device.describe(torch) + [time.strftime("%Y-%m-%d %H:%M")]
    memory_note = ("memory: netdef = the most bytes CuPy's pool had handed out at once in an iteration after the "
                   "warm-up (plus the CUDA graphs' own pools), PyTorch = "
                   "torch.cuda.max_memory_allocated() after its warm-up" if args.device == "gpu"
                   else "memory: not measured on the CPU")
    for line in environment:
        print(f"# {line}", flush=True)
    jobs = [(key, precision) for key in args.nets for precision in args.precision]
    rows = []
    started = time.perf_counter()
    previous_precision = backend.precision()
    try:
        for index, (key, precision) in enumerate(jobs):
            if index and args.time_budget is not None and time.perf_counter() - started > args.time_budget:
                skipped = ", ".join(f"{k} {p}" for k, p in jobs[index:])
                print(f"# time budget of {args.time_budget:.0f} s spent: not run: {skipped}", flush=True)
                break
            label, batch = NETS[key]
            row = {"key": key, "label": label, "batch": scaled_batch(batch, args.batch_scale), "precision": precision}
            run_job(row, torch, device, args)
            rows.append(row)
            outcome = row.get("error") or f"netdef / PyTorch {row['ratio']:.2f}"
            print(f"# {label} {precision} batch {row['batch']}: {outcome} ({row['seconds']:.0f} s)", flush=True)
            if args.json:
                write_json(args.json, rows, environment, command)
    finally:
        backend.set_precision(previous_precision)
        netdef.cudnn.set_workspace_limit(previous_workspace_limit)
        netdef.cudnn.set_benchmark_limit(previous_benchmark_limit)
    print_table(rows, environment, command, memory_note,
                netdef.cudnn.plans.limited_by_workspace() if args.device == "gpu" else [])
    return rows


if __name__ == "__main__":
    main()
