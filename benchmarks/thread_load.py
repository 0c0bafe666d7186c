"""Threads beside other processes: each net with netdef's default thread choice and with 1..N threads,
on a quiet machine and beside one and two busy processes (``yes > /dev/null``), PyTorch in the same rounds.

    python benchmarks/thread_load.py [--nets logreg,lenet,cifar10_quick,...] [--loads 0,1,2] [--rounds 7]
    python benchmarks/thread_load.py --loop [--nets logreg,lenet] [--loads 0,1,2] [--steps 200]
    python benchmarks/thread_load.py --train DIR/SOLVER.prototxt [--loads 0,1] [--rounds 3]

For every load (that many ``yes`` processes started before the nets are timed and stopped after) and
every net (the zoo's, as cpu_forward_backward.py builds them, and ``logreg``: BVLC's logistic regression
example, 4 features of batch 10 into an inner product of 2 outputs and a softmax loss) it prints the
median forward+backward ms of

- ``default``: netdef as ``netdef train`` runs it: the thread plan of netdef/threads.py, its
  ``LoadAwareThreads`` polled after each step as the solver's callback does (and run untimed for a
  few seconds first, as a training run's first iterations, so that it has tried the other counts);
- ``1`` .. ``N``: netdef with that many compute threads (kernels and BLAS), N the cores this process
  may run on;
- ``torch``: PyTorch with its default thread count (every core), the same net (torch_mirror.py);

then default / best of 1..N and default / torch. The contenders run in turn, round after round
(cpu_forward_backward.alternate: each timed step after untimed runs of itself), so that the
machine's other load falls on all of them alike. ``--loop`` times whole training iterations instead:
netdef's ``Solver.step`` (SGD with momentum and weight decay) against PyTorch's zero_grad, forward,
backward and ``optim.SGD`` step, ``--steps`` iterations per timed call: the per-iteration fixed cost
of a small net. ``--train`` runs ``netdef train SOLVER`` (in the solver's directory, as a user would)
with the defaults and with OMP_NUM_THREADS=1..N, in turn, and prints the median wall seconds of each
(and their CPU seconds, children's rusage) and default / best, default / the first load's default. The machine's load average (``uptime``) before and after is printed with each load.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cpu_forward_backward as cfb  # noqa: E402 (sets the kernels' wait policy before numba loads)

import argparse  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import netdef  # noqa: E402
from netdef.proto import netdef_pb2 as pb  # noqa: E402
from netdef.proto import io as proto_io  # noqa: E402
from netdef.comm import Communicator  # noqa: E402
from netdef.threads import LoadAwareThreads, own_cores, set_compute_threads, share_cores  # noqa: E402

LOGREG = """name: "logreg"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 10 dim: 4 } } }
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "fc1" inner_product_param { num_output: 2 } }
layer { name: "prob" type: "Softmax" bottom: "fc1" top: "prob" }
"""
# A rate small enough that no net's loss leaves the finite range on its random batch over the rounds'
# thousands of iterations (at 0.01 LeNet's did by iteration 16; the solver stops on a non-finite loss).
# The rate does not change the work.
BASE_LR = 1e-4
SOLVER = f'base_lr: {BASE_LR} momentum: 0.9 weight_decay: 0.0005 lr_policy: "fixed" max_iter: 100000000 display: 0 ' \
         'random_seed: 1 solver_mode: CPU snapshot_prefix: "/tmp/thread_load"'


def deploy(key: str, batch: int | None) -> tuple[pb.NetParameter, int, int]:
    if key == "logreg":
        return proto_io.read_text(LOGREG, pb.NetParameter), 10, 2
    return cfb.deploy_param(key, batch)


def uptime() -> str:
    with open("/proc/loadavg") as handle:
        return "load average " + " ".join(handle.read().split()[:3])


def start_busy(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(count)]


def stop_busy(processes) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait()


def netdef_inputs(net, classes: int, rng) -> None:
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape).astype(np.float32)
    net.blobs["label"].data[...] = rng.integers(0, classes, net.blobs["label"].shape).astype(np.float32)


def torch_inputs(torch, net) -> dict:
    return {"data": torch.from_numpy(net.blobs["data"].data.copy()),
            "label": torch.from_numpy(net.blobs["label"].data.copy())}


def contenders(key: str, batch: int | None, load: LoadAwareThreads | None, cores: int, loop: bool, steps: int,
               torch) -> dict:
    """{name: a function that runs one timed unit}: netdef's default, 1..cores threads, PyTorch."""
    from torch_mirror import TorchMirror

    param, batch, classes = deploy(key, batch)
    rng = np.random.default_rng(0)
    netdef.set_random_seed(0)
    if loop:
        solver_param = proto_io.read_text(SOLVER, pb.SolverParameter)
        solver_param.net_param.CopyFrom(cfb.train_param(param))
        from netdef.solver import get_solver

        solver = get_solver(solver_param)
        net = solver.net
        cfb.fill_weights(net, rng)
        netdef_inputs(net, classes, rng)
        mirror = TorchMirror(net, torch)
        optimizer = torch.optim.SGD(mirror.params, lr=BASE_LR, momentum=0.9, weight_decay=0.0005)
        inputs = torch_inputs(torch, net)

        polled = [False]  # the solver's callback polls LoadAwareThreads in the default's units only
        if load is not None:
            solver.add_callback(after_update=lambda: polled[0] and load.poll())

        def netdef_unit():
            solver.step(steps)

        def torch_unit():
            for _ in range(steps):
                optimizer.zero_grad()
                mirror(inputs).backward()
                optimizer.step()
    else:
        net = netdef.Net(cfb.train_param(param), netdef.TRAIN)
        cfb.fill_weights(net, rng)
        netdef_inputs(net, classes, rng)
        step = cfb.torch_train_step(torch, net)

        def netdef_unit():
            net.clear_param_diffs(deferred=True)
            net.forward_backward()

        def torch_unit():
            step()

        polled = [False]

    current = [None]

    def use(count):  # threadpoolctl takes a while to change a count: only on a change, as the solver does
        if count != current[0]:
            set_compute_threads(count)
            current[0] = count

    def with_threads(count):
        def unit():
            use(count)
            netdef_unit()
        return unit

    def default():
        use(load.in_effect if load is not None else cores)
        if load is None:
            netdef_unit()
            return
        load.resume()
        polled[0] = True
        netdef_unit()
        polled[0] = False
        if not loop:
            load.poll()  # as the solver's callback after each iteration (commands/train.py)
        current[0] = load.in_effect

    if load is not None:  # as in training, the first minute's probes have been made (LoadAwareThreads)
        start = time.monotonic()
        for _ in range(2 * load.MIN_ITERATIONS // (steps if loop else 1) + 1):
            default()
        while time.monotonic() - start < 3 * load.interval_s:
            default()

    units = {"default": default}
    units.update({str(k): with_threads(k) for k in range(1, cores + 1)})
    units["torch"] = torch_unit
    return units


def time_training(solver: pathlib.Path, loads: list[int], rounds: int) -> None:
    """Wall seconds of ``netdef train`` with the defaults and with OMP_NUM_THREADS=1..N under each load."""
    cores = len(own_cores())
    variants = {"default": {}} | {str(k): {"OMP_NUM_THREADS": str(k)} for k in range(1, cores + 1)}
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    command = [sys.executable, "-c", "import sys; from netdef.cli import main; sys.exit(main())", "train",
               solver.name]
    quiet = None
    for busy_count in loads:
        busy = start_busy(busy_count)
        try:
            time.sleep(0.5)
            seconds = {name: [] for name in variants}
            cpu_seconds = {name: [] for name in variants}
            print(f"\n== netdef train {solver.name}, {busy_count} busy beside ({uptime()})", flush=True)
            for _ in range(rounds):
                for name, extra in variants.items():
                    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
                    subprocess.run(command, cwd=solver.parent, env=base | extra, check=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    seconds[name].append(time.perf_counter() - start)
                    cpu_seconds[name].append(after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime)
            medians = {name: statistics.median(values) for name, values in seconds.items()}
            best = min(medians[str(k)] for k in range(1, cores + 1))
            quiet = medians["default"] if quiet is None else quiet
            cells = "  ".join(f"{name} {value:6.2f} s" for name, value in medians.items())
            print(f"{cells}  default/best {medians['default'] / best:.2f}  default/first load's default "
                  f"{medians['default'] / quiet:.2f}  ({uptime()})", flush=True)
            print("   CPU seconds: " + "  ".join(f"{name} {statistics.median(v):6.2f}" for name, v in cpu_seconds.items())
                  + "\n   every run: " + "  ".join(f"{name} {' '.join(f'{t:.1f}' for t in v)}"
                                                   for name, v in seconds.items()), flush=True)
        finally:
            stop_busy(busy)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default="logreg,lenet,cifar10_quick,squeezenet,mobilenet_v2")
    parser.add_argument("--loads", default="0,1,2", help="how many busy processes beside, in turn")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--loop", action="store_true", help="whole training iterations (Solver.step)")
    parser.add_argument("--steps", type=int, default=200, help="iterations per timed unit with --loop")
    parser.add_argument("--train", type=pathlib.Path, help="time `netdef train` of this solver instead")
    args = parser.parse_args(argv)
    if args.train:
        time_training(args.train.resolve(), [int(v) for v in args.loads.split(",")], args.rounds)
        return 0
    import logging

    logging.getLogger("netdef").setLevel(logging.WARNING)
    import torch

    torch.set_num_threads(len(own_cores()))
    cores = len(own_cores())
    unit_name = f"ms per {args.steps} iterations" if args.loop else "forward+backward ms"
    print(f"{cores} cores; {unit_name}, medians of {args.rounds} rounds; ratios default/best-of-1..{cores}, "
          f"default/torch")
    for busy_count in (int(v) for v in args.loads.split(",")):
        busy = start_busy(busy_count)
        try:
            time.sleep(0.5)
            line, load = share_cores(Communicator())
            print(f"\n== {busy_count} busy process{'es' if busy_count != 1 else ''} beside ({uptime()})\n   {line}")
            for key in args.nets.split(","):
                units = contenders(key, args.batch, load, cores, args.loop, args.steps, torch)
                ms = cfb.alternate(units, args.rounds)
                best = min(ms[str(k)] for k in range(1, cores + 1))
                cells = "  ".join(f"{name} {value:8.2f}" for name, value in ms.items())
                chosen = f" (default at {load.threads})" if load is not None else ""
                print(f"{key:14s} {cells}  default/best {ms['default'] / best:.2f}  "
                      f"default/torch {ms['default'] / ms['torch']:.2f}{chosen}", flush=True)
            print(f"   ({uptime()})")
        finally:
            stop_busy(busy)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
