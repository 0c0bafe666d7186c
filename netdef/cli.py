"""``netdef <verb>``: the command line a Caffe user knows (``caffe train/test/time``, the data tools).

Each verb is one function that parses nothing and decides little: it calls the library. Flags keep
Caffe's names and also accept Caffe's single-dash spelling (``-solver x``, ``--solver=x``).

A failure ends the command with one line on stderr, ``netdef: error: ...`` naming the file, layer or
field, and exit status 1; ``--debug`` shows the traceback instead. Under MPI each failing rank prints
its own line and the job is aborted.

The verbs of ``train``, ``simulate`` and the data tools are in ``netdef/commands/``; this module builds
the parser, runs a verb and holds the others.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
import time

from netdef.commands import data, simulate, train
from netdef.commands.common import (
    CommandLineError,
    caffe_flag,
    cuda_graphs_flag,
    positive_iterations,
    precision_flag,
    set_device,
    set_precision,
    stages,
)
from netdef.progress import bar as progress_bar

log = logging.getLogger("netdef")


def _expected_errors() -> tuple[type, ...]:
    """Failures that bad input, a bad definition or a full machine cause, and that the user can fix from
    the one-line message: netdef's own errors (all ValueErrors, LayerError, the solver's NonFiniteError),
    the system's (OSError, MemoryError), a missing optional package (ImportError) and lmdb's errors.
    Anything else is a bug, reported as an internal error."""
    import lmdb

    from netdef.layers.base import LayerError
    from netdef.solver import NonFiniteError

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


# -------------------------------------------------------------------------------------------- test
def cmd_test(args) -> int:
    import numpy as np

    import netdef

    if not args.model:
        raise CommandLineError("test: --model is required")
    if not args.weights:
        # Caffe's own refusal: scoring the fillers' random weights would print a meaningless accuracy.
        raise CommandLineError("test: Need model weights to score (--weights=MODEL.caffemodel)")
    iterations = positive_iterations(args, "test")
    set_device(args.gpu)
    set_precision(args)
    net = netdef.Net(args.model, netdef.TEST, weights=args.weights or None, stages=stages(args), level=args.level)
    net.forward_only = True  # scoring runs no backward: every chain of per-channel layers may run fused
    net.cuda_graphs = args.cuda_graphs
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
    from netdef import device_memory
    from netdef.timing import LayerTimer, clock_for

    if not args.model:
        raise CommandLineError("time: --model is required")
    positive_iterations(args, "time")
    gpu_id = set_device(args.gpu)
    set_precision(args)
    if gpu_id is not None:
        log.info("Use GPU with device ID %d", gpu_id)
    net = _net_maybe_without_data(args)
    if args.data_shape:
        log.info("The data layers are Inputs of --data_shape %s (zeros): their reading is not timed", args.data_shape)
    watch = device_memory.watch_for(net)  # on a GPU: what the first passes take at once
    log.info("Performing Forward")
    log.info("Initial loss: %g", net.forward_range())
    if any(net.layer_need_backward):
        log.info("Performing Backward")
        net.forward_backward()
    else:
        log.warning("No layer of this net needs backward (a deploy net: no loss, no force_backward: true): "
                    "only the forward pass is timed, and a profile of it (--json) has no backward times")
    if watch is not None:
        watch.close()
        log.info(device_memory.peak_line(watch, "over the first forward and backward"))
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
    return without_data.build_net(args.model, phase, stages=stages(args), level=args.level, data_shape=data_shape)


def _data_shape_flag(parser) -> None:
    caffe_flag(parser, "data_shape", metavar="C,H,W",
          help="build the net without its data: each Data/ImageData/HDF5Data/WindowData layer becomes an Input "
               "of this shape (batch: the layer's batch_size; or give N,C,H,W), a label top of shape N; all zeros")


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
    net = netdef.Net(args.model, netdef.TEST, weights=args.weights or None, stages=stages(args), level=args.level)
    outputs = [name for name in (args.outputs or "").split(",") if name]
    plan = export_onnx(net, args.output, outputs=outputs or None, overwrite=args.overwrite)
    for layer in plan.left_out:
        log.info("Left out layer %s (%s): no exported output needs it", layer.name, layer.type)
    log.info("Wrote %s (ONNX opset %d): inputs %s, outputs %s", args.output, OPSET,
             ", ".join(f"{name} {list(shape)}" for name, shape in plan.inputs),
             ", ".join(f"{name} {list(shape)}" for name, shape in plan.outputs))
    return 0


def _add_export_onnx(verbs, common) -> None:
    export = verbs.add_parser("export-onnx", parents=[common],
                              help="write the TEST-phase net and its weights as an ONNX model",
                              description="Write the TEST-phase net as an ONNX graph (opset 17) with its weights. "
                                          "Needs the onnx package (pip install 'netdef-trainer[onnx]').")
    export.add_argument("output", metavar="OUT.onnx", help="the ONNX file to write")
    caffe_flag(export, "model", help="the model prototxt")
    caffe_flag(export, "weights", help="the .caffemodel to export (default: the fillers' weights)")
    caffe_flag(export, "outputs", metavar="BLOB,...",
          help="the blobs to export as outputs (default: the net's outputs, less losses and metrics)")
    caffe_flag(export, "stage", help="comma-separated stages of the net state")
    caffe_flag(export, "level", type=int, default=0, help="level of the net state")
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
    caffe_flag(group, "python_layers", choices=["allow", "deny"], default=argparse.SUPPRESS,
          help="whether a net's Python layers may import their modules (default: $NETDEF_PYTHON_LAYERS, "
               "else allow); deny refuses every Python layer, for models from elsewhere")
    caffe_flag(group, "python_path", action="append", metavar="DIR", default=argparse.SUPPRESS,
          help="a folder to search for Python layers' modules (repeatable; added to $NETDEF_PYTHON_PATH). "
               "The working directory is never searched unless named here")
    caffe_flag(group, "debug", action="store_true", default=argparse.SUPPRESS,
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

    train.add_parser(verbs, common)

    test = verbs.add_parser("test", parents=[common],
                            help="score a model: print each output's mean over --iterations batches")
    caffe_flag(test, "model", help="the model prototxt (TEST phase)")
    caffe_flag(test, "weights", help="the trained .caffemodel")
    caffe_flag(test, "iterations", type=int, default=50, help="number of batches (default 50)")
    caffe_flag(test, "gpu", help="GPU id")
    precision_flag(test)
    cuda_graphs_flag(test)
    caffe_flag(test, "stage", help="comma-separated stages of the net state")
    caffe_flag(test, "level", type=int, default=0, help="level of the net state")
    test.set_defaults(func=cmd_test)

    timing = verbs.add_parser("time", parents=[common],
                              help="benchmark forward and backward, per layer")
    caffe_flag(timing, "model", help="the model prototxt")
    caffe_flag(timing, "iterations", type=int, default=50, help="number of timed iterations (default 50)")
    caffe_flag(timing, "phase", default="TRAIN", choices=["TRAIN", "TEST", "train", "test"], help="net phase")
    caffe_flag(timing, "gpu", help="GPU id")
    precision_flag(timing)
    caffe_flag(timing, "stage", help="comma-separated stages")
    caffe_flag(timing, "level", type=int, default=0, help="level of the net state")
    caffe_flag(timing, "json", metavar="FILE", help="also write the per-layer times and parameter sizes here "
                                               "(the profile netdef simulate reads)")
    _data_shape_flag(timing)
    timing.set_defaults(func=cmd_time)
    simulate.add_parser(verbs, common)
    data.add_parsers(verbs, common)

    query = verbs.add_parser("device-query", parents=[common],
                             help="show the GPU that --gpu would use")
    caffe_flag(query, "gpu_id", type=int, default=0, help="GPU id")
    query.set_defaults(func=cmd_device_query)

    described = verbs.add_parser("summary", parents=[common],
                                 help="per layer: top shapes, parameters, multiply-adds, activation memory; totals")
    described.add_argument("model", help="the model prototxt")
    caffe_flag(described, "phase", default="TEST", choices=["TRAIN", "TEST", "train", "test"],
               help="net phase (default TEST)")
    caffe_flag(described, "stage", help="comma-separated stages of the net state")
    caffe_flag(described, "level", type=int, default=0, help="level of the net state")
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
    caffe_flag(drawing, "rankdir", default="LR", type=str.upper, choices=["LR", "TB", "BT", "RL"],
          help="direction of the data flow (default LR, as Caffe's draw_net.py)")
    caffe_flag(drawing, "phase", default="ALL", type=str.upper, choices=["TRAIN", "TEST", "ALL"],
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
