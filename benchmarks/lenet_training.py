"""Whole training iterations of Caffe's LeNet from an LMDB: netdef alone, netdef on 2 MPI ranks, and
a plain PyTorch loop over the same records. Prints images per second and the ratios.

    python benchmarks/lenet_training.py [--iterations 300] [--rounds 3] [--ranks 2]
    python benchmarks/lenet_training.py --baseline /path/to/other/netdef --phases
    python benchmarks/lenet_training.py --no-torch --ceiling

``--cpu-cost`` measures CPU time instead of throughput, which the load of other work on the machine
disturbs far less: every configuration (PyTorch's loop included) with one compute thread per process
(``OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1``), CPU milliseconds of all its threads (user + system, the
launcher's too) per iteration, from the difference between a run of ``--iterations`` and one of 3x.

``--baseline PATH`` also runs both netdef configurations with the netdef package of another checkout
(e.g. main before a change), in the same rounds. ``--phases`` then traces one more run of each
netdef configuration (``netdef train --timeline``) and prints where an iteration's milliseconds go
(``iteration_phases.py``: each layer, the update, the waits, what lies between and outside them)
and what stepping together costs the ranks (``lockstep.py``: waiting for the slowest rank, and the
time from the last backward to the next forward of the first layer with parameters, against one
process's).

What runs (each configuration ``--rounds`` times, the rounds interleaved so that load from other
work on the machine hits them alike; figures are medians):

- ``netdef 1 process``: ``netdef train`` on models/lenet's net (batch 64), the library's default
  BLAS threads, data from the LMDB through the Data layer's prefetch thread.
- ``netdef N ranks``: ``mpiexec -n N netdef train`` with the per-rank batch 64 / N (same images per
  iteration), netdef's defaults (each rank's share of the cores, ``netdef/threads.py``).
- ``netdef N ranks, BLAS default``: the same with every rank's BLAS at the library's default thread
  count (what netdef did before it shared the cores out), shown with ``--oversubscribed``.
- ``one rank's share alone``, shown with ``--ceiling``: ``netdef train`` with one rank's batch (64 /
  N) and one rank's threads (cores / N), alone on the machine. The N ranks step together, so with
  nothing exchanged, no waiting and no contention between them they would run at its iterations/s
  (and its row's images/s, counted at 64 per iteration, is theirs): the ceiling printed against one
  process. ``N shares at once, unexchanged``, with it: N such runs started together, the slower one's
  rate: the ceiling where other work shares the machine (the N ranks need N cores, one share alone
  finds a core free more easily), and the ranks' rate is printed against it.
- ``PyTorch loop``: the same net, initialisation aside, trained by a plain loop (read 64 records
  from the LMDB cursor, decode the Datums, scale, forward, backward, SGD with momentum 0.9,
  weight decay 5e-4 and the ``inv`` rate), torch's default threads.

Throughput: iterations are timed from the log's ``Iteration N (x iter/s ...)`` lines (display
every 50 iterations), leaving out the first window (start-up, first allocations); PyTorch's loop
times the same windows itself. Images per second = iterations/s x images per iteration.

The data: the first 8,000 images of the MNIST test set (../shared/data/mnist, ``--mnist``) written
to an LMDB by ``netdef convert-mnist``.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DISPLAY = 50
IMAGES_PER_ITERATION = 64
LAUNCHER_VARIABLES = ("PMI_", "OMPI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "MPIR_CVAR")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
# The environment as the user started this script, before ``prepare`` imports netdef, which sets its
# own idle-thread waits in os.environ (netdef/threads.py): every configuration starts from this one, so
# that PyTorch's loop runs with its own defaults (until 2026-11-26 it inherited netdef's
# OMP_WAIT_POLICY=PASSIVE, a thread wake-up per parallel loop), and netdef's processes set theirs.
USER_ENVIRONMENT = dict(os.environ)


def clean_environment(netdef_root: pathlib.Path = REPO) -> dict:
    """This environment without launcher variables and without user thread settings, importing
    netdef from ``netdef_root``."""
    env = {k: v for k, v in USER_ENVIRONMENT.items() if not k.startswith(LAUNCHER_VARIABLES) and k not in THREAD_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(netdef_root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def prepare(work: pathlib.Path, mnist: pathlib.Path) -> None:
    sys.path.insert(0, str(REPO))
    from netdef.data.convert import write_idx
    from netdef.data.idx import read_idx

    if (work / "mnist_train_lmdb").exists():
        return
    images = read_idx(mnist / "t10k-images-idx3-ubyte.gz")[:8000]
    labels = read_idx(mnist / "t10k-labels-idx1-ubyte.gz")[:8000]
    write_idx(work / "train-images.idx", images)
    write_idx(work / "train-labels.idx", labels)
    subprocess.run([sys.executable, "-m", "netdef.cli", "convert-mnist", "train-images.idx", "train-labels.idx",
                    "mnist_train_lmdb"], cwd=work, env=clean_environment(), check=True, capture_output=True)


def write_solver(work: pathlib.Path, batch: int, iterations: int) -> pathlib.Path:
    """models/lenet's net with the train batch set to ``batch`` and no test phase."""
    net = (REPO / "models" / "lenet" / "lenet_train_test.prototxt").read_text()
    net, count = re.subn(r"(source: \"mnist_train_lmdb\" batch_size: )64", rf"\g<1>{batch}", net)
    if count != 1:
        raise SystemExit("models/lenet/lenet_train_test.prototxt: the train Data layer's batch_size 64 not found")
    (work / f"net_b{batch}.prototxt").write_text(net)
    solver = work / f"solver_b{batch}.prototxt"
    solver.write_text(f'net: "net_b{batch}.prototxt"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n'
                      f'lr_policy: "inv"\ngamma: 0.0001\npower: 0.75\ndisplay: {DISPLAY}\nmax_iter: {iterations}\n'
                      f'snapshot_after_train: false\nrandom_seed: 1\nsolver_mode: CPU\n')
    return solver


def run_netdef(command: list[str], work: pathlib.Path, env: dict) -> str:
    """The log of a netdef run; exits naming the command when it fails."""
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        sys.stderr.write(log[-3000:])
        raise SystemExit(f"failed: {' '.join(command)}")
    return log


def netdef_iterations_per_second(command: list[str], work: pathlib.Path, env: dict) -> float:
    log = run_netdef(command, work, env)
    rates = [float(m) for m in re.findall(r"Iteration \d+ \(([\d.eE+-]+) iter/s", log)]
    if len(rates) < 3:
        raise SystemExit(f"too few timed windows in the log of {' '.join(command)} (raise --iterations)")
    thread_lines = re.findall(r"Compute threads per rank: .*", log)
    if thread_lines:
        print(f"    ({thread_lines[0]})")
    # rates[0] is iteration 0 (no window); rates[1] holds start-up. The rest are steady windows.
    return statistics.median(rates[2:])


def shares_at_once_iterations_per_second(command: list[str], work: pathlib.Path, env: dict, copies: int) -> float:
    """``copies`` independent runs of ``command`` started together (N ranks' shares with nothing exchanged,
    sharing the machine as the ranks do): the slower run's iterations/s, since ranks step together."""
    solver = (work / command[-1]).read_text()
    runs = []
    for copy in range(copies):  # each its own snapshot_prefix: netdef refuses two runs on one
        (work / f"copy{copy}_{command[-1]}").write_text(f'{solver}snapshot_prefix: "copy{copy}"\n')
        runs.append(subprocess.Popen(command[:-1] + [f"copy{copy}_{command[-1]}"], cwd=work, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    rates = []
    for run in runs:
        log = run.communicate(timeout=1200)[0]
        if run.returncode != 0:
            sys.stderr.write(log[-3000:])
            raise SystemExit(f"failed: {' '.join(command)}")
        windows = [float(m) for m in re.findall(r"Iteration \d+ \(([\d.eE+-]+) iter/s", log)]
        if len(windows) < 3:
            raise SystemExit(f"too few timed windows in the log of {' '.join(command)} (raise --iterations)")
        rates.append(statistics.median(windows[2:]))
    return min(rates)


def torch_iterations_per_second(work: pathlib.Path, iterations: int) -> float:
    import lmdb
    import numpy as np
    import torch
    from torch import nn

    sys.path.insert(0, str(REPO))
    from netdef.proto import netdef_pb2 as pb

    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2, 2),
                          nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))
    params = [{"params": [m.weight for m in model if hasattr(m, "weight")], "lr": 0.01},
              {"params": [m.bias for m in model if hasattr(m, "bias")], "lr": 0.02}]
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=0.0005)
    base_lrs = [0.01, 0.02]
    loss_fn = nn.CrossEntropyLoss()
    env = lmdb.open(str(work / "mnist_train_lmdb"), readonly=True, lock=False)
    datum = pb.Datum()
    rates = []
    with env.begin() as txn:
        cursor = txn.cursor()
        cursor.first()
        window_start = time.perf_counter()
        for it in range(iterations):
            images = np.empty((IMAGES_PER_ITERATION, 1, 28, 28), np.float32)
            labels = np.empty(IMAGES_PER_ITERATION, np.int64)
            for i in range(IMAGES_PER_ITERATION):
                datum.ParseFromString(cursor.value())
                images[i, 0] = np.frombuffer(datum.data, np.uint8).reshape(28, 28)
                labels[i] = datum.label
                if not cursor.next():
                    cursor.first()
            images *= np.float32(0.00390625)
            rate = (1 + 0.0001 * it) ** -0.75
            for group, base in zip(optimizer.param_groups, base_lrs):
                group["lr"] = base * rate
            optimizer.zero_grad()
            loss = loss_fn(model(torch.from_numpy(images)), torch.from_numpy(labels))
            loss.backward()
            optimizer.step()
            if (it + 1) % DISPLAY == 0:
                now = time.perf_counter()
                rates.append(DISPLAY / (now - window_start))
                window_start = now
    env.close()
    return statistics.median(rates[1:])


def cpu_ms_per_iteration(command_for, work: pathlib.Path, env: dict, iterations: int) -> float:
    """CPU milliseconds per iteration of every process ``command_for(n)`` starts (n iterations), from
    the difference between runs of ``iterations`` and ``3 * iterations``: start-up cancels out."""
    def cpu_seconds(n: int) -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run_netdef(command_for(n), work, env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime

    return (cpu_seconds(3 * iterations) - cpu_seconds(iterations)) / (2 * iterations) * 1e3


def print_cpu_cost(configs: dict, work: pathlib.Path, iterations: int, rounds: int, with_torch: bool) -> None:
    one_thread = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    commands = {name: (lambda n, c=command: c + [f"--iterations={n}"], dict(run_env, **one_thread))
                for name, (command, run_env) in configs.items()}
    if with_torch:
        commands["PyTorch loop"] = (lambda n: [sys.executable, __file__, "--worker-torch", str(work), "--iterations",
                                               str(n)], dict(clean_environment(), **one_thread))
    costs: dict[str, list[float]] = {name: [] for name in commands}
    for round_index in range(rounds):
        for name, (command_for, run_env) in commands.items():
            costs[name].append(cpu_ms_per_iteration(command_for, work, run_env, iterations))
            print(f"  round {round_index + 1}: {name:<34} {costs[name][-1]:7.2f} CPU ms per iteration")
    print(f"\n{'configuration (one compute thread per process)':<50}{'CPU ms per iteration':>22}")
    for name, values in costs.items():
        print(f"{name:<50}{statistics.median(values):22.2f}")


def print_phases(configs: dict, work: pathlib.Path) -> None:
    """One traced run of each configuration, and rank 0's milliseconds per iteration by phase."""
    from iteration_phases import format_phases, iteration_phases
    from lockstep import format_lockstep, lockstep

    for index, (name, (command, run_env)) in enumerate(configs.items()):
        trace = work / f"trace{index}.json"
        run_netdef(command + [f"--timeline={trace}"], work, run_env)
        print(f"\n{name}, rank 0, medians per iteration (netdef train --timeline):")
        print(format_phases(iteration_phases(str(trace), rank=0, skip=DISPLAY)))
        print("every rank, stepping together (lockstep.py):")
        print(format_lockstep(lockstep(str(trace), skip=DISPLAY)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mnist", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--iterations", type=int, default=300, help="iterations per run (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each configuration (default 3)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--oversubscribed", action="store_true",
                        help="also run the ranks with the BLAS library's default thread count")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    parser.add_argument("--baseline", metavar="PATH",
                        help="also run the netdef configurations with the netdef package found in PATH")
    parser.add_argument("--phases", action="store_true",
                        help="then trace one run of each netdef configuration and print where the time goes")
    parser.add_argument("--ceiling", action="store_true",
                        help="also run one rank's share alone (its batch, its threads, no exchange): the most N "
                             "ranks can reach against one process")
    parser.add_argument("--cpu-cost", action="store_true",
                        help="measure CPU milliseconds per iteration with one compute thread instead of throughput")
    parser.add_argument("--worker-torch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_torch:
        print(torch_iterations_per_second(pathlib.Path(args.worker_torch), args.iterations))
        return 0
    if IMAGES_PER_ITERATION % args.ranks:
        parser.error(f"--ranks must divide {IMAGES_PER_ITERATION}")
    mnist = pathlib.Path(args.mnist)
    if not (mnist / "t10k-images-idx3-ubyte.gz").exists():
        parser.error(f"no MNIST files in {mnist} (--mnist)")
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    mpiexec = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if mpiexec is None:
        parser.error("no mpiexec (pip install mpich)")

    work = pathlib.Path(tempfile.mkdtemp(prefix="netdef-lenet-training-"))
    prepare(work, mnist)
    one = write_solver(work, IMAGES_PER_ITERATION, args.iterations)
    per_rank = write_solver(work, IMAGES_PER_ITERATION // args.ranks, args.iterations)
    netdef_cmd = [sys.executable, "-m", "netdef.cli", "train"]
    env = clean_environment()
    configs = {"netdef 1 process": (netdef_cmd + [one.name], env),
               f"netdef {args.ranks} ranks": ([mpiexec, "-n", str(args.ranks)] + netdef_cmd + [per_rank.name], env)}
    if args.baseline:
        baseline_env = clean_environment(pathlib.Path(args.baseline).resolve())
        for name in list(configs):
            configs[f"{name} (baseline)"] = (configs[name][0], baseline_env)
    share_name = together_name = None
    if args.ceiling:
        threads = str(max(1, len(os.sched_getaffinity(0)) // args.ranks))
        share_name = f"one rank's share alone ({threads} thread{'' if threads == '1' else 's'})"
        configs[share_name] = (netdef_cmd + [per_rank.name], dict(env, OMP_NUM_THREADS=threads, NUMBA_NUM_THREADS=threads))
        together_name = f"{args.ranks} shares at once, unexchanged"
        configs[together_name] = configs[share_name]
    if args.oversubscribed:
        cores = str(len(os.sched_getaffinity(0)))
        configs[f"netdef {args.ranks} ranks, BLAS default"] = (
            configs[f"netdef {args.ranks} ranks"][0], dict(env, OPENBLAS_NUM_THREADS=cores, OMP_NUM_THREADS=cores))
    if args.cpu_cost:
        print(f"LeNet, {IMAGES_PER_ITERATION} images per iteration, CPU time of {args.iterations} against "
              f"{3 * args.iterations} iterations, {args.rounds} rounds")
        print_cpu_cost(configs, work, args.iterations, args.rounds, not args.no_torch)
        shutil.rmtree(work, ignore_errors=True)
        return 0
    results: dict[str, list[float]] = {name: [] for name in configs}
    if not args.no_torch:
        results["PyTorch loop"] = []
    print(f"LeNet, {IMAGES_PER_ITERATION} images per iteration, {args.iterations} iterations per run, "
          f"{args.rounds} rounds, {os.cpu_count()} cores; data: {work / 'mnist_train_lmdb'}")
    for round_index in range(args.rounds):
        for name, (command, run_env) in configs.items():
            if name == together_name:
                rate = shares_at_once_iterations_per_second(command, work, run_env, args.ranks)
            else:
                rate = netdef_iterations_per_second(command, work, run_env)
            results[name].append(rate)
            print(f"  round {round_index + 1}: {name:<34} {rate:7.2f} iter/s")
        if not args.no_torch:
            done = subprocess.run([sys.executable, __file__, "--worker-torch", str(work),
                                   "--iterations", str(args.iterations)], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-3000:])
                raise SystemExit("the PyTorch loop failed")
            rate = float(done.stdout.strip().splitlines()[-1])
            results["PyTorch loop"].append(rate)
            print(f"  round {round_index + 1}: {'PyTorch loop':<34} {rate:7.2f} iter/s")
    print(f"\n{'configuration':<36}{'iter/s':>8}{'images/s':>10}{'vs netdef 1 process':>22}")
    base = statistics.median(results["netdef 1 process"])
    for name, rates in results.items():
        median = statistics.median(rates)
        print(f"{name:<36}{median:8.2f}{median * IMAGES_PER_ITERATION:10.0f}{median / base:21.2f}x")
    if share_name is not None:
        # The ranks step together: with no exchange, no waiting and a core each, N ranks would run at the
        # rate of one rank's share run alone, on the same images per iteration.
        print(f"\nceiling: {args.ranks} ranks at most {statistics.median(results[share_name]) / base:.2f}x one "
              f"process ({IMAGES_PER_ITERATION // args.ranks} images per rank, nothing exchanged, no waiting)")
        ranks = f"netdef {args.ranks} ranks"
        pairs = [r / c for r, c in zip(results[ranks], results[together_name])]
        print(f"{args.ranks} ranks / {args.ranks} shares run at once (the ceiling on a machine others share too): "
              f"{statistics.median(results[ranks]) / statistics.median(results[together_name]):.2f} "
              f"(per round: {', '.join(f'{x:.2f}' for x in pairs)})")
    if "PyTorch loop" in results:
        print(f"\nnetdef 1 process / PyTorch loop, images per second: "
              f"{base / statistics.median(results['PyTorch loop']):.2f}x")
    if args.phases:
        print_phases(configs, work)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
