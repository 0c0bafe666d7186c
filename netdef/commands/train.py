"""``netdef train``: train on one process, or as one rank of an MPI job (``mpiexec -n N netdef train ...``)."""
from __future__ import annotations

import contextlib
import logging

from netdef.progress import BarAfterFirstStep

from .common import CommandLineError, caffe_flag, cuda_graphs_flag, positive_iterations, precision_flag, set_device

log = logging.getLogger("netdef")


def add_parser(verbs, common) -> None:
    from netdef.comm.options import add_flags

    train = verbs.add_parser("train", parents=[common],
                             help="train or fine-tune a model from a solver prototxt",
                             description="Train a model. Resume with --snapshot, fine-tune with --weights. "
                                         "Under mpiexec every rank runs this command (data parallel).")
    train.add_argument("solver_positional", nargs="?", metavar="SOLVER", help="the solver prototxt")
    caffe_flag(train, "solver", help="the solver prototxt (same as the positional SOLVER)")
    caffe_flag(train, "snapshot", help="resume from this .solverstate (or .solverstate.h5)")
    caffe_flag(train, "weights", help="fine-tune from these .caffemodel files (comma separated)")
    caffe_flag(train, "iterations", type=int, help="override the solver's max_iter (at least 1)")
    caffe_flag(train, "gpu", help="GPU id to run on, or a list (0,1) or all; under MPI each rank of a machine takes the "
                                  "next of them in turn (default: the solver's solver_mode/device_id)")
    precision_flag(train)
    cuda_graphs_flag(train)
    caffe_flag(train, "sigint_effect", default="stop", choices=["stop", "snapshot", "none"],
               help="what Ctrl-C (SIGINT) does: stop (snapshot if enabled, then exit), snapshot, none")
    caffe_flag(train, "sighup_effect", default="snapshot", choices=["stop", "snapshot", "none"],
               help="what SIGHUP does")
    caffe_flag(train, "tensorboard", metavar="DIR",
               help="write the loss, outputs, learning rate, speed (and the exchange's wait) as TensorBoard scalars "
                    "in DIR (needs tensorboardX: the [tensorboard] extra)")
    add_flags(train.add_argument_group(
        "distributed training (under mpiexec/srun; these override the solver's netdef_distributed)"))
    train.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    """Train on one process, or as one rank of an MPI job (``mpiexec -n N netdef train ...``)."""
    from netdef.comm import create_communicator
    from netdef.comm.distributed import run_guarded
    from netdef.comm.options import flag_values, options_from
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
        param.max_iter = positive_iterations(args, "train")
    options = options_from(param, **flag_values(args))
    comm = create_communicator(async_progress=options.progress == "MPI_ASYNC")
    if comm.rank > 0:
        log.setLevel(logging.WARNING)  # only rank 0 logs progress; every rank reports its errors
    line, load = share_cores(comm)
    log.info("%s", line)
    if comm.size > 1:
        log.info("%s", share_data_cores(comm))
    return run_guarded(comm, _train, args, param, path, comm, options, load, debug=args.debug)


def _check_solver_state(state_path: str) -> None:
    """Refuse a FIFO, a device or an oversized file as --snapshot before the solver reads it whole (the
    solver's own reader in netdef/solver/snapshot.py does not check yet)."""
    from netdef.files import PROTOBUF_LIMIT, check_input_file

    check_input_file(state_path, "solver state", None if state_path.endswith(".h5") else PROTOBUF_LIMIT)


def _train(args, param, path, comm, options, load) -> int:
    from netdef.comm.distributed import create_solver
    from netdef.solver.signals import install_signal_handlers

    gpu = set_device(args.gpu, comm)
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
    for net in [solver.net, *solver.test_nets]:
        net.cuda_graphs = args.cuda_graphs
    if args.weights:
        for weights in args.weights.split(","):
            log.info("Finetuning from %s", weights)
            solver.net.copy_from(weights)
            for test_net in solver.test_nets:
                test_net.copy_from(weights)
    if load is not None:
        solver.add_callback(after_update=lambda: _follow_load(load))
    if gpu is None:
        from netdef.layers import jit

        notice = jit.compile_notice()
        if notice:
            log.info("%s", notice)
    log.info("Starting Optimization")
    # The handlers are put back when training ends: main() may run again in this process (tests, scripts).
    with install_signal_handlers(solver, sigint_effect=args.sigint_effect, sighup_effect=args.sighup_effect), \
            contextlib.ExitStack() as on_rank_0:
        if comm.rank == 0:
            if args.tensorboard:
                from netdef.tensorboard import TensorBoardWriter

                solver.add_scalar_observer(on_rank_0.enter_context(TensorBoardWriter(args.tensorboard)))
                log.info("Writing TensorBoard scalars to %s", args.tensorboard)
            iterations = on_rank_0.enter_context(BarAfterFirstStep("train", total=solver.param.max_iter, unit="iter"))
            solver.add_callback(after_update=lambda: iterations.update_to(solver.iter))
        solver.solve(resume_file=args.snapshot or None)
    return 0


def _follow_load(load) -> None:
    """After each iteration: the compute threads follow the load of the other processes (threads.py)."""
    if load.poll():
        log.info("Compute threads now %s", load.describe())
