"""``netdef <verb>``: the command line a Caffe user knows (``caffe train/test/time``, the data tools).

Each verb is one function that parses nothing and decides little: it calls the library. Flags keep
Caffe's names and also accept Caffe's single-dash spelling (``-solver x``, ``--solver=x``).

A failure ends the command with one line on stderr, ``netdef: error: ...`` naming the file, layer or
field, and exit status 1; ``--debug`` shows the traceback instead. Under MPI each failing rank prints
its own line and the job is aborted.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
import time

from netdef.progress import bar as progress_bar

log = logging.getLogger("netdef")


class CommandLineError(ValueError):
    """Flags that do not make sense together or out of range; the message names the flag."""


def _expected_errors() -> tuple[type, ...]:
    """Failures that bad input, a bad definition or a full machine cause, and that the user can fix from
    the one-line message: netdef's own errors (all ValueErrors, LayerError, the solver's NonFiniteError),
    the system's (OSError, MemoryError), a missing optional package (ImportError) and lmdb's errors.
    Anything else is a bug, reported as an internal error."""
    import lmdb

    from netdef.layers.base import LayerError
    from netdef.solver.solver import NonFiniteError

    return (ValueError, LayerError, NonFiniteError, OSError, MemoryError, ImportError, RuntimeError, lmdb.Error)


def _one_line(exc: BaseException, expected: bool) -> str:
    from netdef.excerpts import safe_line

    # A message may quote names and values from a file: bounded and escaped before the terminal sees it.
    text = safe_line(str(exc)) or type(exc).__name__
    if isinstance(exc, MemoryError):
        text = f"out of memory: {text}"
    if expected:
        return f"netdef: error: {text}"
    return (f"netdef: internal error: {type(exc).__name__}: {text} (a bug; run again with --debug for the "
            f"traceback and please report it)")


def _positive_iterations(args, verb: str) -> int:
    if args.iterations < 1:
        raise CommandLineError(f"{verb}: --iterations must be at least 1, got {args.iterations}")
    return args.iterations


def _positive_int(value: str) -> int:
    from netdef.environment import positive_int

    number = positive_int(value)
    if number is None:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {value!r}")
    return number


def _flag(parser, name: str, **kwargs):
    """Add ``--name`` with Caffe's ``-name`` spelling as an alias."""
    parser.add_argument(f"--{name}", f"-{name}", **kwargs)


def _set_device(gpu: str | None) -> int | None:
    """Put new blobs on the GPU that --gpu names; returns its id (None without --gpu)."""
    import netdef

    if gpu in (None, ""):
        return None
    if gpu == "all":
        gpu = "0"
    try:
        ids = [int(g) for g in gpu.split(",")]
    except ValueError:
        raise CommandLineError(f"--gpu takes GPU ids (0, or 0,1) or all, not {gpu!r}") from None
    if len(ids) > 1:
        log.warning("several GPUs in one process are not supported; use MPI ranks (mpiexec -n N). Using GPU %d", ids[0])
    problem = netdef.backend.gpu_problem(ids[0])
    if problem is not None:
        # As solver_mode: GPU in a solver file (solver.py): the same run, on the CPU, said once.
        log.warning("--gpu %d: no usable GPU, %s; running on the CPU (leave out --gpu to say so)", ids[0], problem)
        netdef.set_device("cpu")
        return None
    netdef.set_device("gpu", ids[0])
    return ids[0]


def _precision_flag(parser) -> None:
    from netdef.backend import PRECISIONS

    _flag(parser, "precision", choices=list(PRECISIONS),
          help="what float32 convolutions and matrix products on a GPU compute in: float32 (strict, "
               "Caffe's; the default, or the solver file's precision) or tf32 (TensorFloat-32 tensor cores)")


def _set_precision(args) -> None:
    """--precision for the verbs without a solver file (test, time)."""
    import netdef

    if args.precision:
        netdef.set_precision(args.precision)


def _stages(args) -> list[str]:
    return [s for s in (args.stage or "").split(",") if s]


# ------------------------------------------------------------------------------------------- train
def _on_off(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("on", "true", "1", "yes"):
        return True
    if lowered in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")


def cmd_train(args) -> int:
    """Train on one process, or as one rank of an MPI job (``mpiexec -n N netdef train ...``)."""
    from netdef.comm import create_communicator
    from netdef.comm.distributed import options_from, run_guarded
    from netdef.solver.solver import read_solver_param
    from netdef.threads import share_cores, share_data_cores

    solver_path = args.solver or args.solver_positional
    if not solver_path:
        raise CommandLineError("train: give the solver prototxt (netdef train SOLVER or --solver=SOLVER)")
    if args.snapshot and args.weights:
        raise CommandLineError("train: give --snapshot (resume) or --weights (fine-tune), not both")
    if args.snapshot:
        _check_solver_state(args.snapshot)
    param, path = read_solver_param(solver_path)
    if args.iterations is not None:
        param.max_iter = _positive_iterations(args, "train")
    options = options_from(param, exchange=args.exchange, overlap=args.overlap, bucket_bytes=args.bucket_bytes,
                           progress=args.progress, timeline=args.timeline, schedule=args.schedule,
                           chunk_bytes=args.chunk_bytes, credit_bytes=args.credit_bytes,
                           multicolor_colors=args.colors, tau=args.tau, alpha=args.alpha, beta=args.beta,
                           group_size=args.group_size, gossip_probability=args.gossip_probability,
                           stall_warning_s=args.stall_warning, stall_abort_s=args.stall_abort)
    comm = create_communicator(async_progress=options.progress == "MPI_ASYNC")
    if comm.rank > 0:
        log.setLevel(logging.WARNING)  # only rank 0 logs progress; every rank reports its errors
    if comm.size > 1:
        log.info("%s", share_cores(comm))
        log.info("%s", share_data_cores(comm))
    return run_guarded(comm, _train, args, param, path, comm, options, debug=args.debug)


def _check_solver_state(state_path: str) -> None:
    """Refuse a FIFO, a device or an oversized file as --snapshot before the solver reads it whole (the
    solver's own reader in netdef/solver/snapshot.py does not check yet)."""
    from netdef.files import PROTOBUF_LIMIT, check_input_file

    check_input_file(state_path, "solver state", None if state_path.endswith(".h5") else PROTOBUF_LIMIT)


def _train(args, param, path, comm, options) -> int:
    from netdef.comm.distributed import create_solver
    from netdef.solver.solver import install_signal_handlers

    gpu = _set_device(args.gpu)
    if args.gpu and gpu is None:
        param.solver_mode = param.CPU  # --gpu fell back to the CPU (said once): the solver file is overridden
    if gpu is not None:
        # As in Caffe, --gpu overrides the solver file's solver_mode and device_id (the zoo's files say
        # CPU): the solver would otherwise move the blobs back to the CPU as it starts.
        param.solver_mode = param.GPU
        param.device_id = gpu
    if args.precision:
        param.precision = args.precision  # as --gpu, the flag wins over the solver file
    solver = create_solver(param, comm=comm, options=options, solver_file=path)
    solver.net.keep_blob_diffs = False  # no one can read them here (see Net)
    if args.weights:
        for weights in args.weights.split(","):
            log.info("Finetuning from %s", weights)
            solver.net.copy_from(weights)
            for test_net in solver.test_nets:
                test_net.copy_from(weights)
    log.info("Starting Optimization")
    # The handlers are put back when training ends: main() may run again in this process (tests, scripts).
    with install_signal_handlers(solver, sigint_effect=args.sigint_effect, sighup_effect=args.sighup_effect), \
            contextlib.ExitStack() as on_rank_0:
        if comm.rank == 0:
            if args.tensorboard:
                from netdef.tensorboard import TensorBoardWriter

                solver.add_scalar_observer(on_rank_0.enter_context(TensorBoardWriter(args.tensorboard)))
                log.info("Writing TensorBoard scalars to %s", args.tensorboard)
            iterations = on_rank_0.enter_context(progress_bar("train", total=solver.param.max_iter, unit="iter"))
            solver.add_callback(after_update=lambda: iterations.update(solver.iter - iterations.n))
        solver.solve(resume_file=args.snapshot or None)
    return 0


# -------------------------------------------------------------------------------------------- test
def cmd_test(args) -> int:
    import numpy as np

    import netdef

    if not args.model:
        raise CommandLineError("test: --model is required")
    if not args.weights:
        # Caffe's own refusal: scoring the fillers' random weights would print a meaningless accuracy.
        raise CommandLineError("test: Need model weights to score (--weights=MODEL.caffemodel)")
    iterations = _positive_iterations(args, "test")
    _set_device(args.gpu)
    _set_precision(args)
    net = netdef.Net(args.model, netdef.TEST, weights=args.weights or None, stages=_stages(args), level=args.level)
    net.forward_only = True  # scoring runs no backward: every chain of per-channel layers may run fused
    log.info("Running for %d iterations.", iterations)
    weights = net.blob_loss_weights
    totals: dict[str, np.ndarray] = {}
    order: list[str] = []
    loss = 0.0
    for i in progress_bar("test", range(iterations), unit="batch"):
        outputs = net.forward()
        loss += net.loss
        for name, value in outputs.items():
            values = np.asarray(netdef.backend.to_host(value), dtype=np.float64).ravel()
            for k, v in enumerate(values):
                key = name if values.size == 1 else f"{name}[{k}]"
                log.info("Batch %d, %s = %g", i, name, v)
                if key not in totals:
                    totals[key] = 0.0
                    order.append(key)
                totals[key] += v
    loss /= iterations
    log.info("Loss: %g", loss)
    for key in order:
        mean = totals[key] / iterations
        name = key.split("[")[0]
        weight = weights.get(name, 0.0)
        suffix = f" (* {weight:g} = {weight * mean:g} loss)" if weight else ""
        log.info("%s = %g%s", name, mean, suffix)
    return 0


# -------------------------------------------------------------------------------------------- time
def cmd_time(args) -> int:
    from netdef.timing import LayerTimer, clock_for

    if not args.model:
        raise CommandLineError("time: --model is required")
    _positive_iterations(args, "time")
    gpu_id = _set_device(args.gpu)
    _set_precision(args)
    if gpu_id is not None:
        log.info("Use GPU with device ID %d", gpu_id)
    net = _net_maybe_without_data(args)
    if args.data_shape:
        log.info("The data layers are Inputs of --data_shape %s (zeros): their reading is not timed", args.data_shape)
    log.info("Performing Forward")
    log.info("Initial loss: %g", net.forward_range())
    if any(net.layer_need_backward):
        log.info("Performing Backward")
        net.forward_backward()
    else:
        log.warning("No layer of this net needs backward (a deploy net: no loss, no force_backward: true): "
                    "only the forward pass is timed, and a profile of it (--json) has no backward times")
    log.info("*** Benchmark begins ***")
    log.info("Testing for %d iterations.", args.iterations)
    total_start = time.perf_counter()
    # Timed as the net runs: by steps, a chain the net runs as one (layers/fusion.py, layers/
    # trained_chain.py) as one step (see LayerTimer); on a GPU by CUDA events, as caffe time -gpu.
    timer = LayerTimer(net, clock_for(gpu_id))
    for it in progress_bar("time", range(1, args.iterations + 1)):
        iteration_ms = timer.run_iteration()
        # %g as the averages below, so that the lines add up to what they average.
        log.info("Iteration: %d forward-backward time: %g ms.", it, iteration_ms)
    log.info("Average time per layer: ")
    chains = [f"{net.layers[a].name}..{net.layers[b].name}" for a, b in timer.steps if b > a]
    if chains:
        named = ", ".join(chains[:3]) + (f" and {len(chains) - 3} more" if len(chains) > 3 else "")
        log.info("(layers run as one step: %s; each step's time is on its first layer forward, its last "
                 "backward)", named)
    forward_ms = [ms / args.iterations for ms in timer.forward_ms]
    backward_ms = [ms / args.iterations for ms in timer.backward_ms]
    for li, layer in enumerate(net.layers):
        log.info("%10s\tforward: %g ms.", layer.name, forward_ms[li])
        log.info("%10s\tbackward: %g ms.", layer.name, backward_ms[li])
    log.info("Average Forward pass: %g ms.", timer.total_forward_ms / args.iterations)
    log.info("Average Backward pass: %g ms.", timer.total_backward_ms / args.iterations)
    log.info("Average Forward-Backward: %g ms.", (timer.total_forward_ms + timer.total_backward_ms) / args.iterations)
    log.info("Total Time: %g ms.", (time.perf_counter() - total_start) * 1000)
    log.info("*** Benchmark ends ***")
    if args.json:
        from netdef.simulate import profile_of, write_profile

        profile = profile_of(net, forward_ms, backward_ms, model=args.model)
        write_profile(profile, args.json, phase=args.phase.upper(), iterations=args.iterations,
                      device="cpu" if gpu_id is None else f"gpu {gpu_id}",
                      blas_threads=os.environ.get("OPENBLAS_NUM_THREADS", ""))
        log.info("Per-layer times written to %s (netdef simulate reads them)", args.json)
    return 0


def _net_maybe_without_data(args):
    """The net of --model (or summary's MODEL) in --phase, its data layers Inputs of --data_shape when
    given (netdef/without_data.py)."""
    import netdef
    from netdef import without_data

    data_shape = without_data.parse_data_shape(args.data_shape) if args.data_shape else None
    phase = netdef.TRAIN if args.phase.upper() == "TRAIN" else netdef.TEST
    return without_data.build_net(args.model, phase, stages=_stages(args), level=args.level, data_shape=data_shape)


def _data_shape_flag(parser) -> None:
    _flag(parser, "data_shape", metavar="C,H,W",
          help="build the net without its data: each Data/ImageData/HDF5Data/WindowData layer becomes an Input "
               "of this shape (batch: the layer's batch_size; or give N,C,H,W), a label top of shape N; all zeros")


# ---------------------------------------------------------------------------------------- simulate
def cmd_simulate(args) -> int:
    """Predict iteration time and scaling efficiency from a per-layer profile (netdef.simulate)."""
    import json

    from netdef import simulate
    from netdef.simulate import report

    profile = simulate.load_profile(args.profile)
    if not profile.backward_s > 0:
        # Without backward the model has no gradients to exchange in training's way: it would predict
        # a perfect efficiency at any number of workers.
        log.warning("%s has no backward pass (netdef time of a deploy net, or of a net with no loss): training "
                    "needs one, so these predictions are not of training; profile the train_val net "
                    "(netdef time --model=TRAIN_VAL --json=FILE)",
                    args.profile)
    if args.compute_scale is not None:
        profile = profile.scaled(args.compute_scale)
    if args.compute_ms is not None:
        total = profile.forward_s + profile.backward_s
        if not args.compute_ms > 0 or not total > 0:
            raise CommandLineError(f"simulate: --compute_ms must be positive and the profile's times non-zero "
                                   f"(got {args.compute_ms} and {total * 1e3:g} ms)")
        profile = profile.scaled(args.compute_ms / 1e3 / total)
    network = simulate.Network(
        simulate.parse_rate(args.bandwidth), simulate.parse_duration(args.latency), args.topology,
        args.ranks_per_node,
        simulate.parse_rate(args.intra_bandwidth, "--intra_bandwidth") if args.intra_bandwidth else 0.0,
        simulate.parse_duration(args.intra_latency, "--intra_latency"), args.allreduce_algorithm)
    schedule = simulate.ScheduleOptions(args.schedule, args.overlap, args.bucket_bytes, args.chunk_bytes,
                                        args.credit_bytes, args.progress, args.poll_ms * 1e-3,
                                        args.polled_ms * 1e-3)
    if not args.update_rate > 0:
        raise CommandLineError(f"simulate: --update_rate must be positive, got {args.update_rate}")
    options = simulate.RuleOptions(args.exchange, args.colors, args.tau, args.gossip_probability, args.group_size,
                                   schedule, 1.0 / (args.update_rate * 1e9), args.exchange_cpu_ns * 1e-9,
                                   args.sync_ms * 1e-3)
    try:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        raise CommandLineError(f"simulate: --workers must be comma-separated integers, got {args.workers!r}") from None
    predictions = simulate.predict(profile, network, workers, options)
    if args.json:
        print(json.dumps(report.as_json(profile, network, options, predictions), indent=1))
    else:
        print(report.describe(profile, network, options))
        print(report.table(predictions))
    return 0


# -------------------------------------------------------------------------------------- data tools
def cmd_convert_mnist(args) -> int:
    from netdef.data.convert import convert_mnist

    count = convert_mnist(args.images, args.labels, args.output_db, backend=args.backend)
    log.info("Processed %s files.", count)
    return 0


def cmd_convert_imageset(args) -> int:
    from netdef.data.convert import convert_imageset

    count = convert_imageset(args.root_folder, args.listfile, args.db_name, resize_height=args.resize_height,
                             resize_width=args.resize_width, shuffle=args.shuffle, gray=args.gray,
                             encoded=args.encoded, encode_type=args.encode_type, backend=args.backend,
                             check_size=args.check_size, threads=args.threads)
    log.info("Processed %s files.", count)
    return 0


def cmd_compute_image_mean(args) -> int:
    from netdef.data.convert import compute_image_mean

    compute_image_mean(args.input_db, args.output_file, backend=args.backend)
    return 0


def cmd_prepare_digits(args) -> int:
    import pathlib

    from netdef.data.convert import convert_mnist, digits_to_idx

    folder = pathlib.Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    train_images, train_labels, test_images, test_labels = digits_to_idx(folder)
    for split, images, labels in (("train", train_images, train_labels), ("test", test_images, test_labels)):
        db = folder / f"digits_{split}_lmdb"
        if db.exists():
            log.info("%s exists; keeping it", db)
            continue
        count = convert_mnist(images, labels, str(db), backend="lmdb")
        log.info("Wrote %s (%s images)", db, count)
    return 0


def cmd_download_mnist(args) -> int:
    from netdef.data.convert import MNIST_URL, download_mnist

    paths = download_mnist(args.folder, base_url=args.url or MNIST_URL)
    for path in paths:
        log.info("%s", path)
    return 0


def cmd_device_query(args) -> int:
    import netdef

    problem = netdef.backend.gpu_problem(args.gpu_id)
    if problem is not None:
        log.error("No usable GPU %d: %s", args.gpu_id, problem)
        return 1
    try:
        netdef.set_device("gpu", args.gpu_id)
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(args.gpu_id)
        log.info("Device id: %d", args.gpu_id)
        log.info("Name: %s", props["name"].decode() if isinstance(props["name"], bytes) else props["name"])
        log.info("Total global memory: %d", props["totalGlobalMem"])
    except Exception as exc:  # noqa: BLE001 - reported to the user as is
        log.error("No usable GPU: %s", exc)
        return 1
    return 0


def cmd_zoo(args) -> int:
    from netdef import zoo

    if args.action == "list":
        models = zoo.list_models()
        width = max(len(m.name) for m in models)
        for model in models:
            print(f"{model.name:<{width}}  {model.title}")
        return 0
    if not args.name:
        raise SystemExit("netdef zoo copy: give the model's name (netdef zoo list shows them)")
    destination = args.destination or args.name
    for path in zoo.copy_model(args.name, destination, overwrite=args.overwrite):
        log.info("Wrote %s", path)
    return 0


# ----------------------------------------------------------------------------------------- summary
def cmd_summary(args) -> int:
    """Per layer: top shapes, parameters, multiply-adds and activation memory, then totals."""
    from netdef import summary

    net = _net_maybe_without_data(args)
    print(summary.format_summary(summary.summarize(net)))
    return 0


# ------------------------------------------------------------------------------------- export-onnx
def cmd_export_onnx(args) -> int:
    import netdef
    from netdef.export.onnx import OPSET, export_onnx  # first: without onnx, say which extra to install

    if not args.model:
        raise CommandLineError("export-onnx: --model is required")
    net = netdef.Net(args.model, netdef.TEST, weights=args.weights or None, stages=_stages(args), level=args.level)
    outputs = [name for name in (args.outputs or "").split(",") if name]
    plan = export_onnx(net, args.output, outputs=outputs or None, overwrite=args.overwrite)
    for layer in plan.left_out:
        log.info("Left out layer %s (%s): no exported output needs it", layer.name, layer.type)
    log.info("Wrote %s (ONNX opset %d): inputs %s, outputs %s", args.output, OPSET,
             ", ".join(f"{name} {list(shape)}" for name, shape in plan.inputs),
             ", ".join(f"{name} {list(shape)}" for name, shape in plan.outputs))
    return 0


def _add_simulate(verbs, common) -> None:
    from netdef.comm.scheduler import ScheduleThread
    from netdef.simulate.rules import CPU_UPDATE_S_PER_BYTE, RULES

    sim = verbs.add_parser(
        "simulate", parents=[common], help="predict iteration time and scaling efficiency at 1 to 1,024 workers",
        description="Predict the iteration time, exposed exchange, efficiency and speed-up of data-parallel "
                    "training from a per-layer profile (netdef time --json=FILE, or a GPU's in the same format), "
                    "an exchange rule and a network. docs/scaling.md describes the model.")
    sim.add_argument("profile", metavar="PROFILE", help="per-layer times: the JSON of netdef time --json")
    _flag(sim, "workers", default="1,2,4,8,16,32,64,128,256,512,1024", help="worker counts (comma separated)")
    _flag(sim, "compute_scale", type=float, help="multiply every layer's time by this (another device)")
    _flag(sim, "compute_ms", type=float, help="rescale the profile to this forward+backward time (ms)")
    _flag(sim, "update_rate", type=float, default=round(1e-9 / CPU_UPDATE_S_PER_BYTE, 2), metavar="GB_PER_S",
          help="GB of parameters the update rule processes per second (default: this CPU's fused SGD)")
    _flag(sim, "exchange_cpu_ns", type=float, default=0.0, metavar="NS",
          help="CPU ns per gradient byte the exchange takes from compute (cores all busy; default 0)")
    _flag(sim, "sync_ms", type=float, default=0.0, metavar="MS",
          help="per iteration, the wait for the slowest rank at the agreement beyond its latency (ranks "
               "sharing cores, stragglers; measured by benchmarks/scaling_model.py; default 0)")
    net = sim.add_argument_group("network")
    _flag(net, "bandwidth", default="10gbit", help="per link (1gbit, 100gbit, 12.5GB/s; default 10gbit)")
    _flag(net, "latency", default="5us", help="per message (5us, 1.5ms; default 5us)")
    _flag(net, "topology", default="flat", choices=["flat", "nodes", "shared"],
          help="flat: a link per rank; nodes: --ranks_per_node share a node's link and talk inside over "
               "--intra_bandwidth; shared: one medium for all traffic (the emulated loopback)")
    _flag(net, "ranks_per_node", type=int, default=1, help="ranks per node (topology nodes)")
    _flag(net, "intra_bandwidth", help="intra-node link (topology nodes), e.g. 100GB/s")
    _flag(net, "intra_latency", default="2us", help="intra-node latency (default 2us)")
    _flag(net, "allreduce_algorithm", default="auto", choices=["auto", "ring", "recursive_doubling", "rabenseifner"],
          help="the allreduce's algorithm (default auto: the cheapest for each size, as MPI libraries choose)")
    rule = sim.add_argument_group("exchange")
    _flag(rule, "exchange", default="allreduce", choices=list(RULES), help="the exchange rule (default allreduce)")
    _flag(rule, "schedule", type=str.lower, default="priority", choices=["fifo", "priority"],
          help="synchronous rules: the solver's schedule (default priority)")
    _flag(rule, "overlap", type=_on_off, default=True, metavar="on|off", help="exchange during backward (default on)")
    _flag(rule, "bucket_bytes", type=int, default=4 << 20, metavar="BYTES", help="bucket size bound (default 4194304)")
    _flag(rule, "chunk_bytes", type=int, default=0, metavar="BYTES", help="priority: chunk (default: as measured)")
    _flag(rule, "credit_bytes", type=int, default=0, metavar="BYTES", help="priority: in flight (default: as measured)")
    _flag(rule, "progress", type=str.lower, default="thread", choices=["thread", "deferred"],
          help="synchronous rules: thread (the communication thread tests the exchange every --poll_ms) or "
               "deferred (it moves only while the training thread waits: the solver's choice over shared "
               "memory); default thread")
    _flag(rule, "poll_ms", type=float, default=ScheduleThread.poll_interval * 1e3, metavar="MS",
          help=f"the communication thread's poll interval (default {ScheduleThread.poll_interval * 1e3:g}, the "
               f"solver's; 0 where nothing polls: NCCL, MPI's own progress thread)")
    _flag(rule, "polled_ms", type=float, default=0.0, metavar="MS",
          help="measured: how long a tiny non-blocking allreduce takes when tested every --poll_ms "
               "(benchmarks/scaling_model.py measures it; default 0: one poll per round plus one)")
    _flag(rule, "colors", type=int, default=0, help="multicolor: trees (default: min(workers, 4))")
    _flag(rule, "tau", type=int, default=10, help="easgd, hybrid: iterations between elastic steps (default 10)")
    _flag(rule, "gossip_probability", type=float, default=0.1, help="gossip: per iteration (default 0.1)")
    _flag(rule, "group_size", type=int, default=2, help="hybrid: ranks per synchronous group (default 2)")
    _flag(sim, "json", action="store_true", help="print JSON instead of the table")
    sim.set_defaults(func=cmd_simulate)


def _add_export_onnx(verbs, common) -> None:
    export = verbs.add_parser("export-onnx", parents=[common],
                              help="write the TEST-phase net and its weights as an ONNX model",
                              description="Write the TEST-phase net as an ONNX graph (opset 17) with its weights. "
                                          "Needs the onnx package (pip install 'netdef-trainer[onnx]').")
    export.add_argument("output", metavar="OUT.onnx", help="the ONNX file to write")
    _flag(export, "model", help="the model prototxt")
    _flag(export, "weights", help="the .caffemodel to export (default: the fillers' weights)")
    _flag(export, "outputs", metavar="BLOB,...",
          help="the blobs to export as outputs (default: the net's outputs, less losses and metrics)")
    _flag(export, "stage", help="comma-separated stages of the net state")
    _flag(export, "level", type=int, default=0, help="level of the net state")
    export.add_argument("--overwrite", action="store_true", help="replace OUT.onnx if it exists")
    export.set_defaults(func=cmd_export_onnx)


def cmd_upgrade(args) -> int:
    from netdef.tools.upgrade_cmd import upgrade_file

    done = upgrade_file(args.input, args.output, overwrite=args.overwrite)
    state = "upgraded" if done.changed else "already in the current format; copied"
    log.info("%s (%s): %s to %s", args.input, done.kind, state, args.output)
    return 0


def cmd_draw(args) -> int:
    import netdef
    from netdef.tools.draw import draw

    phase = {"TRAIN": netdef.TRAIN, "TEST": netdef.TEST, "ALL": None}[args.phase.upper()]
    draw(args.model, args.output, rankdir=args.rankdir.upper(), phase=phase, overwrite=args.overwrite)
    log.info("Drew %s to %s", args.model, args.output)
    return 0


def cmd_plot(args) -> int:
    from netdef.tools.plot import plot_logs

    plot_logs(args.logs, args.output, x=args.x, overwrite=args.overwrite)
    log.info("Plotted %s to %s", ", ".join(args.logs), args.output)
    return 0


def cmd_parse_log(args) -> int:
    from netdef.tools.curves import write_tables

    for path in write_tables(args.log, args.output_dir, delimiter=args.delimiter, overwrite=args.overwrite):
        log.info("Wrote %s", path)
    return 0


# ------------------------------------------------------------------------------------------ parser
def _common_flags() -> argparse.ArgumentParser:
    """Flags every verb takes (also before the verb: ``netdef --debug train ...``). Defaults are
    suppressed so that a verb's parser does not overwrite what was given before the verb."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("code and diagnostics (every verb)")
    _flag(group, "python_layers", choices=["allow", "deny"], default=argparse.SUPPRESS,
          help="whether a net's Python layers may import their modules (default: $NETDEF_PYTHON_LAYERS, "
               "else allow); deny refuses every Python layer, for models from elsewhere")
    _flag(group, "python_path", action="append", metavar="DIR", default=argparse.SUPPRESS,
          help="a folder to search for Python layers' modules (repeatable; added to $NETDEF_PYTHON_PATH). "
               "The working directory is never searched unless named here")
    _flag(group, "debug", action="store_true", default=argparse.SUPPRESS,
          help="on an error, show the Python traceback instead of one line")
    return common


def _apply_python_trust(args) -> None:
    """Hand --python_layers/--python_path to every net this process builds (the solver's included)
    through the environment variables they stand for, which MPI ranks' own parsing repeats."""
    from netdef.layers.python import PYTHON_LAYERS_ENV, PYTHON_PATH_ENV

    if args.python_layers:
        os.environ[PYTHON_LAYERS_ENV] = args.python_layers
    folders = [os.path.abspath(f) for f in args.python_path or []]
    if folders:
        existing = [f for f in os.environ.get(PYTHON_PATH_ENV, "").split(os.pathsep) if f]
        os.environ[PYTHON_PATH_ENV] = os.pathsep.join(existing + folders)


def _version() -> str:
    from netdef.version import version

    return version()


def build_parser() -> argparse.ArgumentParser:
    common = _common_flags()
    parser = argparse.ArgumentParser(
        prog="netdef", parents=[common],
        description="netdef: train, test and time Caffe-format networks (prototxt) on NumPy/CuPy, and "
                    "prepare their data. Flags follow Caffe's command line (-solver, --solver=...).")
    parser.add_argument("--version", action="version", version=f"netdef {_version()}",
                        help="print netdef's version and exit")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    train = verbs.add_parser("train", parents=[common],
                             help="train or fine-tune a model from a solver prototxt",
                             description="Train a model. Resume with --snapshot, fine-tune with --weights. "
                                         "Under mpiexec every rank runs this command (data parallel).")
    train.add_argument("solver_positional", nargs="?", metavar="SOLVER", help="the solver prototxt")
    _flag(train, "solver", help="the solver prototxt (same as the positional SOLVER)")
    _flag(train, "snapshot", help="resume from this .solverstate (or .solverstate.h5)")
    _flag(train, "weights", help="fine-tune from these .caffemodel files (comma separated)")
    _flag(train, "iterations", type=int, help="override the solver's max_iter (at least 1)")
    _flag(train, "gpu", help="GPU id to run on (default: the solver's solver_mode/device_id)")
    _precision_flag(train)
    _flag(train, "sigint_effect", default="stop", choices=["stop", "snapshot", "none"],
          help="what Ctrl-C (SIGINT) does: stop (snapshot if enabled, then exit), snapshot, none")
    _flag(train, "sighup_effect", default="snapshot", choices=["stop", "snapshot", "none"],
          help="what SIGHUP does")
    _flag(train, "tensorboard", metavar="DIR",
          help="write the loss, outputs, learning rate, speed (and the exchange's wait) as TensorBoard scalars "
               "in DIR (needs tensorboardX: the [tensorboard] extra)")
    dist = train.add_argument_group(
        "distributed training (under mpiexec/srun; these override the solver's netdef_distributed)")
    _flag(dist, "exchange", help="the gradient exchange rule (default: allreduce)")
    _flag(dist, "overlap", type=_on_off, metavar="on|off",
          help="start each layer's exchange during backward (on, the default) or after it (off)")
    _flag(dist, "bucket_bytes", type=int, metavar="BYTES",
          help="size bound of a fused gradient bucket (default 4194304)")
    _flag(dist, "progress", type=str.upper, choices=["AUTO", "POLL", "THREAD", "MPI_ASYNC"],
          help="what drives non-blocking exchanges: auto, poll (between layers), thread (a communication "
               "thread), mpi_async (MPICH's progress thread)")
    _flag(dist, "timeline", metavar="TRACE_JSON", help="write a Chrome trace (Perfetto) of every rank here")
    _flag(dist, "schedule", type=str.lower, choices=["fifo", "priority"],
          help="priority: first what the next forward needs, in chunks, each blob updated as its gradient "
               "arrives; fifo: backward order, update after the whole exchange")
    _flag(dist, "chunk_bytes", type=int, metavar="BYTES", help="priority: chunk size (default: measured)")
    _flag(dist, "credit_bytes", type=int, metavar="BYTES", help="priority: bytes in flight (default: measured)")
    _flag(dist, "colors", type=int, metavar="K",
          help="multicolor and fp16: trees the gradients are split over (default: min(ranks, 4); at most one "
               "per rank)")
    _flag(dist, "tau", type=int, metavar="N", help="easgd, hybrid: updates between elastic steps (default 10)")
    _flag(dist, "alpha", type=float, help="easgd, hybrid: the elastic moving rate (default: beta / the number of "
                                          "ranks or groups)")
    _flag(dist, "beta", type=float, help="easgd, hybrid: alpha = beta / ranks or groups when alpha is not set "
                                         "(default 0.9)")
    _flag(dist, "group_size", type=int, metavar="N", help="hybrid: ranks per synchronous group (default 2)")
    _flag(dist, "gossip_probability", type=float, metavar="P",
          help="gossip: probability of sending the weights to a random peer after an update (default 0.1)")
    _flag(dist, "stall_warning", type=float, metavar="SECONDS",
          help="a rank that has waited this long for the others logs which ranks have not reached the exchange, "
               "and again each time as long again (default 60; 0: never)")
    _flag(dist, "stall_abort", type=float, metavar="SECONDS",
          help="a rank that has waited this long ends the job with one line naming the ranks that have not "
               "come (default 600; 0: never)")
    train.set_defaults(func=cmd_train)

    test = verbs.add_parser("test", parents=[common],
                            help="score a model: print each output's mean over --iterations batches")
    _flag(test, "model", help="the model prototxt (TEST phase)")
    _flag(test, "weights", help="the trained .caffemodel")
    _flag(test, "iterations", type=int, default=50, help="number of batches (default 50)")
    _flag(test, "gpu", help="GPU id")
    _precision_flag(test)
    _flag(test, "stage", help="comma-separated stages of the net state")
    _flag(test, "level", type=int, default=0, help="level of the net state")
    test.set_defaults(func=cmd_test)

    timing = verbs.add_parser("time", parents=[common],
                              help="benchmark forward and backward, per layer")
    _flag(timing, "model", help="the model prototxt")
    _flag(timing, "iterations", type=int, default=50, help="number of timed iterations (default 50)")
    _flag(timing, "phase", default="TRAIN", choices=["TRAIN", "TEST", "train", "test"], help="net phase")
    _flag(timing, "gpu", help="GPU id")
    _precision_flag(timing)
    _flag(timing, "stage", help="comma-separated stages")
    _flag(timing, "level", type=int, default=0, help="level of the net state")
    _flag(timing, "json", metavar="FILE", help="also write the per-layer times and parameter sizes here "
                                               "(the profile netdef simulate reads)")
    _data_shape_flag(timing)
    timing.set_defaults(func=cmd_time)
    _add_simulate(verbs, common)

    mnist = verbs.add_parser("convert-mnist", parents=[common],
                             help="IDX image and label files (gzipped or not) to a DB of Datums")
    mnist.add_argument("images")
    mnist.add_argument("labels")
    mnist.add_argument("output_db")
    _flag(mnist, "backend", default="lmdb", choices=["lmdb", "leveldb"], help="the DB type")
    mnist.set_defaults(func=cmd_convert_mnist)

    imageset = verbs.add_parser("convert-imageset", parents=[common],
                                help="a list of images ('path label' lines) to a DB of Datums")
    imageset.add_argument("root_folder")
    imageset.add_argument("listfile")
    imageset.add_argument("db_name")
    _flag(imageset, "resize_height", type=int, default=0, help="resize images to this height (0: keep)")
    _flag(imageset, "resize_width", type=int, default=0, help="resize images to this width (0: keep)")
    _flag(imageset, "shuffle", action="store_true", help="shuffle the list order")
    _flag(imageset, "gray", action="store_true", help="load images as grayscale")
    _flag(imageset, "encoded", action="store_true", help="store encoded images (PNG/JPEG bytes)")
    _flag(imageset, "encode_type", default="", help="encoding to store: png or jpg (default: the file's own)")
    _flag(imageset, "backend", default="lmdb", choices=["lmdb", "leveldb"], help="the DB type")
    _flag(imageset, "check_size", action="store_true", help="check that all images have the same size")
    _flag(imageset, "threads", type=_positive_int, default=None,
          help="threads that read and encode images (netdef's; default: NETDEF_DATA_THREADS, else every core)")
    imageset.set_defaults(func=cmd_convert_imageset)

    mean = verbs.add_parser("compute-image-mean", parents=[common],
                            help="the mean image of a DB, as a .binaryproto")
    mean.add_argument("input_db")
    mean.add_argument("output_file")
    _flag(mean, "backend", default="lmdb", choices=["lmdb", "leveldb"], help="the DB type")
    mean.set_defaults(func=cmd_compute_image_mean)

    digits = verbs.add_parser("prepare-digits", parents=[common],
                              help="write scikit-learn's bundled 8x8 digits as IDX files and "
                                    "LMDBs (offline data for a first run)")
    digits.add_argument("folder")
    digits.set_defaults(func=cmd_prepare_digits)

    download = verbs.add_parser("download-mnist", parents=[common],
                                help="download the four MNIST files (needs the internet)")
    download.add_argument("folder")
    _flag(download, "url", default="", help="base address of a mirror holding the four .gz files")
    download.set_defaults(func=cmd_download_mnist)

    query = verbs.add_parser("device-query", parents=[common],
                             help="show the GPU that --gpu would use")
    _flag(query, "gpu_id", type=int, default=0, help="GPU id")
    query.set_defaults(func=cmd_device_query)

    described = verbs.add_parser("summary", parents=[common],
                                 help="per layer: top shapes, parameters, multiply-adds, activation memory; totals")
    described.add_argument("model", help="the model prototxt")
    _flag(described, "phase", default="TEST", choices=["TRAIN", "TEST", "train", "test"], help="net phase (default TEST)")
    _flag(described, "stage", help="comma-separated stages of the net state")
    _flag(described, "level", type=int, default=0, help="level of the net state")
    _data_shape_flag(described)
    described.set_defaults(func=cmd_summary)

    models = verbs.add_parser("zoo", parents=[common], help="list the model zoo, or copy a model's prototxts out",
                              description="list: print each model of the zoo (models/, installed with netdef) "
                                          "with its title. copy NAME [DIR]: write that model's train_val, "
                                          "deploy and solver prototxts and its README into DIR (default: NAME); "
                                          "an existing file is replaced only with --overwrite.")
    models.add_argument("action", choices=["list", "copy"],
                        help="list: the models and their titles; copy: a model's files into a folder")
    models.add_argument("name", nargs="?", help="the model to copy (copy)")
    models.add_argument("destination", nargs="?", help="the folder to copy into (default: the model's name)")
    models.add_argument("--overwrite", action="store_true", help="replace files that exist")
    models.set_defaults(func=cmd_zoo)
    _add_export_onnx(verbs, common)

    upgrade = verbs.add_parser("upgrade", parents=[common],
                               help="rewrite a legacy (V0/V1) net prototxt, caffemodel or solver in the current "
                                    "format", description="Rewrite IN in the current format: a binary "
                                    ".caffemodel stays binary, a prototxt net or solver stays text.")
    upgrade.add_argument("input", metavar="IN", help="the legacy prototxt or caffemodel")
    upgrade.add_argument("output", metavar="OUT", help="where to write the upgraded file")
    upgrade.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    upgrade.set_defaults(func=cmd_upgrade)

    drawing = verbs.add_parser("draw", parents=[common], help="draw a net definition through Graphviz",
                               description="Draw MODEL (layers as boxes, blobs as octagons) to OUT; the "
                                           "extension of OUT gives the format: .png, .svg, .pdf, or .dot "
                                           "for the Graphviz text. Needs Graphviz's dot program.")
    drawing.add_argument("model", metavar="MODEL", help="the net prototxt")
    drawing.add_argument("output", metavar="OUT", help="the picture to write (.png, .svg, .pdf or .dot)")
    _flag(drawing, "rankdir", default="LR", type=str.upper, choices=["LR", "TB", "BT", "RL"],
          help="direction of the data flow (default LR, as Caffe's draw_net.py)")
    _flag(drawing, "phase", default="ALL", type=str.upper, choices=["TRAIN", "TEST", "ALL"],
          help="draw the layers of this phase only (default ALL)")
    drawing.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    drawing.set_defaults(func=cmd_draw)

    plotting = verbs.add_parser("plot", parents=[common], help="plot learning curves of training logs (matplotlib)",
                                description="Plot the train outputs, test outputs and learning rate of one or "
                                            "more caffe/netdef training logs (their stderr) to OUT (.png, .svg "
                                            "or .pdf). Needs matplotlib (the [plot] extra).")
    plotting.add_argument("logs", metavar="LOG", nargs="+", help="a training log")
    plotting.add_argument("output", metavar="OUT", help="the picture to write")
    plotting.add_argument("--x", default="iterations", type=str.lower, choices=["iterations", "seconds"],
                          help="the x axis (default iterations)")
    plotting.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    plotting.set_defaults(func=cmd_plot)

    parse_log = verbs.add_parser("parse-log", parents=[common],
                                 help="a training log as the two CSV tables of Caffe's parse_log.py",
                                 description="Write OUTDIR/LOG.train and OUTDIR/LOG.test (NumIters, Seconds, "
                                             "LearningRate, then each output), as Caffe's "
                                             "tools/extra/parse_log.py does.")
    parse_log.add_argument("log", metavar="LOG", help="a caffe/netdef training log")
    parse_log.add_argument("output_dir", metavar="OUTDIR", help="the folder for the two tables")
    parse_log.add_argument("--delimiter", default=",", help="column delimiter (default ',')")
    parse_log.add_argument("--overwrite", action="store_true", help="replace the tables if they exist")
    parse_log.set_defaults(func=cmd_parse_log)
    return parser


def main(argv: list[str] | None = None) -> int:
    from netdef import logs

    parser = build_parser()
    # The common flags' defaults, given here because each verb's parser suppresses its own.
    args = parser.parse_args(argv, namespace=argparse.Namespace(python_layers=None, python_path=None, debug=False))
    if not args.verb:
        parser.print_help()
        return 1
    logs.configure()
    # netdef checks every image's size itself before decoding (netdef/data/image.py) and refuses one
    # past its cap in one line; Pillow's own warning about a large image would only repeat that, raw.
    warnings.filterwarnings("ignore", message=r"Image size \(\d+ pixels\) exceeds limit", module="PIL")
    _apply_python_trust(args)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        log.error("Interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line (or a traceback with --debug)
        if args.debug:
            raise
        # netdef's errors already name the file, line, layer, blob or field: show them plainly.
        sys.stderr.write(_one_line(exc, isinstance(exc, _expected_errors())) + "\n")
        return 1


if __name__ == "__main__":
    # `python -m netdef.cli` puts the working directory first on sys.path (as `python -P` would not):
    # drop it, so that a model's Python layer cannot import a module that merely lies there.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    sys.exit(main())
