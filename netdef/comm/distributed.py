"""Data-parallel training over MPI: the solver side.

``create_solver(path, comm)`` returns the solver the file asks for (SGD, Adam...) extended for N
ranks (``DistributedSolver``). Every rank runs the same program (``mpiexec -n 4 netdef train
solver.prototxt``); what it does beyond Caffe's loop:

- Seeds: every rank builds its nets with the same random seed (the file's ``random_seed``, or one
  drawn by rank 0), so that data layers shuffle alike and shard consistently; training randomness
  (dropout...) is then re-seeded with ``seed + rank`` (Caffe's multi-GPU convention).
- Shards: ``set_shard(rank, size)`` is called on every layer that has it, in the train and test nets,
  before the first forward: record i is read by rank i % size. ``batch_size`` stays per rank; the
  effective batch is ``size * batch_size * iter_size`` (logged).
- Rank 0's parameters are broadcast before the first iteration (fresh, ``--weights`` or restored).
- Gradients: the net's backward hooks hand each layer's final gradients to the exchange rule
  (``exchange.py``) during the last of the ``iter_size`` passes; the rule is finished (waits, averages)
  in the first ``on_gradients_ready`` callback, so later callbacks and the update see the averaged
  gradients, and its ``after_update`` runs after the update.
- Tests run on every rank over its shard; the summed outputs and loss are averaged over the ranks,
  which equals one process testing all those records with an N times larger batch for outputs that
  are means over the batch (accuracy, normalized losses).
- Signals: stop/snapshot requests are agreed (a logical or over the ranks) at each iteration
  boundary, so every rank stops or snapshots at the same iteration.
- Snapshots: written by rank 0 only. Each rank's own random state and data positions go, gathered by
  rank 0, into ``<state file>.ranks.json`` beside the ``.solverstate`` (written before it). Resuming
  with the same number of ranks restores every rank exactly; with another number (or from a
  snapshot without that file) the weights, history and iteration are restored and each rank's data
  layers start their new shard from the beginning (a warning says so).
- Only rank 0 logs (``netdef train`` quiets the others to warnings and errors).
- Measurements: ``solver.measurements`` (``timeline.Measurements``), and with ``timeline`` a Chrome
  trace of every rank written at the end of ``solve()``.

Failures: ``netdef train`` runs each rank inside ``run_guarded``: an exception prints the rank's
traceback and calls ``MPI_Abort``, so the launcher ends every rank within seconds instead of leaving
them waiting in a collective; a rank killed outright makes the launcher end the job too. A script
using this API should do the same (``run_guarded(comm, main)``, or ``python -m mpi4py script.py``).

Layers without ``set_shard`` (Input, MemoryData, DummyData, Python layers that do not define it) are
not sharded: every rank gets what they produce. BatchNorm's running statistics are not exchanged
(as in Caffe's multi-GPU training): each rank keeps its own and rank 0's are saved.
"""
from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import sys
import time
import traceback

import numpy as np

from .. import backend, files
from ..proto import netdef_pb2 as pb
from ..solver import snapshot as _snapshot
from ..solver.solver import SOLVER_CLASSES, Solver, read_solver_param
from ..solver.updates import update_rule_class
from .communicator import Communicator, create_communicator
from .exchange import ExchangeOptions, exchange_class
from .progress import mode_name
from .timeline import Measurements, Timeline, instrument_net, write_chrome_trace

logger = logging.getLogger("netdef")

RANK_STATES_SUFFIX = ".ranks.json"
_RANK_STATES_FORMAT = "netdef-rank-states 1"


# ============================================================================================== options
def options_from(param: pb.SolverParameter, *, exchange: str | None = None, overlap: bool | None = None,
                 bucket_bytes: int | None = None, progress: str | None = None,
                 timeline: str | None = None) -> ExchangeOptions:
    """The solver file's ``netdef_distributed`` settings with the given (command line) overrides."""
    d = param.netdef_distributed
    options = ExchangeOptions(exchange=d.exchange, overlap=d.overlap, bucket_bytes=int(d.bucket_bytes),
                              progress=mode_name(d.progress), timeline=d.timeline)
    if exchange is not None:
        options.exchange = exchange
    if overlap is not None:
        options.overlap = bool(overlap)
    if bucket_bytes is not None:
        options.bucket_bytes = int(bucket_bytes)
    if progress is not None:
        options.progress = mode_name(progress)
    if timeline is not None:
        options.timeline = timeline
    if options.bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {options.bucket_bytes}")
    exchange_class(options.exchange)  # an unknown rule: a clear error before anything is built
    return options


def rank_states_path(state_path) -> str:
    """Where the per-rank states of the snapshot whose state file is ``state_path`` are."""
    return os.fspath(state_path) + RANK_STATES_SUFFIX


def _data_layers(solver) -> list:
    seen, out = set(), []
    for net in [solver.net] + list(solver.test_nets):
        for layer in net.layers:
            if id(layer) not in seen:
                seen.add(id(layer))
                out.append(layer)
    return out


def _batch_size(net) -> int | None:
    for layer in net.layers:
        size = getattr(layer, "batch_size", None)
        if isinstance(size, (int, np.integer)) and size > 0:
            return int(size)
    for layer in net.layers:
        if not layer.layer_param.bottom and layer.layer_param.top:
            shape = net.blobs[layer.layer_param.top[0]].shape
            return int(shape[0]) if shape else None
    return None


@contextlib.contextmanager
def _captured_data_restores(layers):
    """While inside, a layer's ``restore_data_state(state)`` only records ``state`` (in the yielded
    dict, by layer): Solver.restore applies the snapshot's data positions, which are rank 0's, and
    each rank must apply its own instead."""
    captured: dict = {}
    patched = []
    for layer in layers:
        if callable(getattr(layer, "restore_data_state", None)) and callable(getattr(layer, "data_state", None)):
            layer.restore_data_state = (lambda state, _layer=layer: captured.__setitem__(_layer, bytes(state)))
            patched.append(layer)
    try:
        yield captured
    finally:
        for layer in patched:
            del layer.__dict__["restore_data_state"]


# ============================================================================================== solver
class DistributedSolver:
    """Mixed into a Solver class (``distributed_solver_class``); see the module docstring.

    ``comm``: a Communicator (default: ``create_communicator()``); ``options``: ExchangeOptions
    (default: the solver file's ``netdef_distributed``). With one rank it trains exactly as the
    plain solver does.
    """

    def __init__(self, solver, *, comm: Communicator | None = None, options: ExchangeOptions | None = None,
                 solver_file: str | None = None):
        param, path = read_solver_param(solver)
        options = options or options_from(param)
        if comm is None:
            comm = create_communicator(async_progress=options.progress == "MPI_ASYNC")
        self.comm = comm
        self.exchange_options = options
        seed = None
        if comm.size > 1:
            drawn = int(np.random.SeedSequence().entropy % (2**31)) if comm.rank == 0 else 0
            seed = int(param.random_seed) if param.random_seed >= 0 else comm.broadcast_int(drawn)
            param.random_seed = seed
        super().__init__(param, solver_file=path or solver_file)
        if seed is not None:
            backend.set_random_seed(seed + comm.rank)
        self.measurements = Measurements()
        self._shard_data_layers()
        self.exchange = exchange_class(options.exchange)(comm, self.net, options, self.measurements)
        self.net.register_backward_hook(self._gradients_final)
        self.add_callback(on_gradients_ready=self._finish_exchange, after_update=self._after_update)
        self._exchanging = False
        self._synchronized = False
        self.timeline = None
        if options.timeline:
            comm.barrier()
            self.timeline = Timeline(comm.rank, time.perf_counter())
            instrument_net(self.net, self.timeline)
        if comm.size > 1:
            self._log_setup()

    # ------------------------------------------------------------------------------ set-up
    def _shard_data_layers(self) -> None:
        self._sharded = []
        for layer in _data_layers(self):
            set_shard = getattr(layer, "set_shard", None)
            if callable(set_shard):
                set_shard(self.comm.rank, self.comm.size)
                self._sharded.append(layer)

    def _log_setup(self) -> None:
        comm, p = self.comm, self.param
        batch = _batch_size(self.net)
        if batch is None:
            batch_text = "batch size per rank unknown"
        else:
            batch_text = (f"batch_size {batch} per rank x {comm.size} ranks x iter_size {p.iter_size} = effective "
                          f"batch {batch * comm.size * p.iter_size}")
        logger.info("Distributed training on %d ranks (%s): %s", comm.size, comm.description, batch_text)
        logger.info("Gradient exchange: %s", self.exchange.describe())
        if comm.rank == 0 and not any(layer in self._sharded for layer in self.net.layers):
            logger.warning("The train net has no layer with set_shard (Data, ImageData, HDF5Data): each rank "
                           "trains on what its own layers produce, which is the same data on every rank unless "
                           "they shard it themselves")

    # ------------------------------------------------------------------------------ the iteration
    def step(self, iters: int) -> None:
        if not self._synchronized:
            self.exchange.broadcast_initial()
            self._synchronized = True
        super().step(iters)

    def forward_backward_pass(self, pass_index: int) -> float:
        clock = time.perf_counter
        net = self.net
        last = pass_index == self.param.iter_size - 1
        if pass_index == 0:
            self.measurements.begin(self.iter, clock())
            self.exchange.begin_iteration(self.iter)
        record = self.measurements.current
        start = clock()
        loss = net.forward_range()
        forward_end = clock()
        self._exchanging = last
        try:
            net.backward()
        finally:
            self._exchanging = False
        backward_end = clock()
        net.loss = loss
        record.forward_s += forward_end - start
        record.backward_s += backward_end - forward_end
        if last:
            record.backward_start_at, record.backward_end_at = forward_end, backward_end
        if last:
            self.exchange.backward_done()
        if self.timeline is not None:
            self.timeline.span("forward", start, forward_end, lane="passes")
            self.timeline.span("backward", forward_end, backward_end, lane="passes")
        return loss

    def _gradients_final(self, layer_index: int, param_ids) -> None:
        if self._exchanging:
            self.exchange.gradients_ready(param_ids)

    def _finish_exchange(self) -> None:
        start = time.perf_counter()
        self.exchange.finish()
        if self.timeline is not None:
            self.timeline.span("wait for exchanges + average", start, time.perf_counter())
            self.timeline.record_iteration(self.measurements.current)

    def _after_update(self) -> None:
        self.exchange.after_update()
        if self.measurements.current is not None:
            self.measurements.current.end_at = time.perf_counter()

    def take_requests(self) -> tuple[bool, bool]:
        snap, stop = super().take_requests()
        if self.comm.size == 1:
            return snap, stop
        flags = np.array([snap, stop], dtype=np.int32)
        self.comm.allreduce(flags, op="max")
        return bool(flags[0]), bool(flags[1])

    # ------------------------------------------------------------------------------ testing
    def test(self, test_net_id: int = 0) -> None:
        start = time.perf_counter()
        super().test(test_net_id)
        if self.timeline is not None:
            self.timeline.span(f"test net #{test_net_id}", start, time.perf_counter())

    def reduce_test_outputs(self, scores, loss):
        if self.comm.size == 1:
            return scores, loss
        values = np.zeros(0 if scores is None else scores.size, dtype=np.float64)
        if scores is not None:
            values[:] = scores
        values = np.append(values, np.float64(loss))
        self.comm.allreduce(values)
        values /= self.comm.size
        scores = None if scores is None else values[:-1].astype(np.float32)
        return scores, np.float32(values[-1])

    # ------------------------------------------------------------------------------ snapshots
    def snapshot(self) -> tuple[str, str]:
        if self.comm.size == 1:
            return super().snapshot()
        own = _snapshot.netdef_state(self).SerializeToString()
        states = self.comm.gather_bytes(own, root=0)
        p = self.param
        paths = (_snapshot.snapshot_filename(p, self.iter, _snapshot.model_extension(p)),
                 _snapshot.snapshot_filename(p, self.iter, _snapshot.state_extension(p)))
        if self.comm.rank == 0:
            doc = {"format": _RANK_STATES_FORMAT, "iter": self.iter, "ranks": self.comm.size,
                   "states": [base64.b64encode(s).decode("ascii") for s in states]}
            folder = os.path.dirname(paths[1]) or "."
            if os.path.isdir(folder):  # else super().snapshot() raises the error that names the prefix
                files.write_bytes_atomically(rank_states_path(paths[1]), json.dumps(doc).encode("utf-8"))
            paths = super().snapshot()
        self.comm.barrier()
        return paths

    def restore(self, path) -> None:
        with _captured_data_restores(_data_layers(self)) as captured:
            super().restore(path)
        self._synchronized = False
        ranks_path = rank_states_path(path)
        per_rank = os.path.exists(ranks_path)
        own = self._own_rank_state(ranks_path) if per_rank else None
        if own is not None:
            _snapshot.apply_netdef_state(self, own, ranks_path)
            return
        if not per_rank and self.comm.size == 1:
            # A single process's snapshot (netdef's or Caffe's), restored as the plain solver would.
            for layer, state in captured.items():
                layer.restore_data_state(state)
            return
        if not per_rank and self.comm.rank == 0:
            logger.warning("%s: no per-rank states (%s): each rank's data layers start their shard from the "
                           "beginning", path, os.path.basename(ranks_path))
        if self.comm.size > 1:
            # Rank 0's random state was restored everywhere; keep the ranks' streams apart.
            backend.set_random_seed(int(backend.rng().integers(0, 2**31)) + self.comm.rank)

    def _own_rank_state(self, ranks_path: str) -> pb.NetdefSolverState | None:
        """This rank's state from the per-rank file, or None (with a warning) when it was written by
        another number of ranks."""
        try:
            with open(ranks_path, "rb") as handle:
                doc = json.loads(handle.read().decode("utf-8"))
            if doc.get("format") != _RANK_STATES_FORMAT:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            ranks = int(doc["ranks"])
            states = doc["states"]
        except (ValueError, KeyError, TypeError) as exc:
            raise _snapshot.SnapshotError(f"{ranks_path}: not a netdef per-rank state file ({exc})") from None
        if ranks != self.comm.size:
            if self.comm.rank == 0:
                logger.warning("%s was written by %d ranks and this run has %d: each rank's data layers start "
                               "their new shard from the beginning", ranks_path, ranks, self.comm.size)
            return None
        return pb.NetdefSolverState.FromString(base64.b64decode(states[self.comm.rank]))

    # ------------------------------------------------------------------------------ the end
    def solve(self, resume_file=None) -> None:
        super().solve(resume_file)
        self.write_timeline()

    def write_timeline(self) -> None:
        """Write the Chrome trace (every rank must call it: it gathers the ranks' events)."""
        if self.timeline is None:
            return
        gathered = self.comm.gather_bytes(self.timeline.to_json(), root=0)
        if self.comm.rank == 0:
            write_chrome_trace(self.exchange_options.timeline, gathered)
            logger.info("Wrote the timeline of %d rank(s) to %s", len(gathered), self.exchange_options.timeline)

    def close(self) -> None:
        # Local only: close() also runs when this rank fails, when the others are not listening.
        self.exchange.close()
        super().close()


_CLASSES: dict[type, type] = {}


def distributed_solver_class(base: type) -> type:
    """``base`` (a Solver subclass) with DistributedSolver mixed in."""
    if not issubclass(base, Solver):
        raise TypeError(f"{base.__name__} is not a Solver class")
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Distributed{base.__name__}", (DistributedSolver, base), {})
    return _CLASSES[base]


def create_solver(solver, comm: Communicator | None = None, options: ExchangeOptions | None = None,
                  solver_file: str | None = None) -> Solver:
    """``get_solver`` for a distributed run: the solver class for the file's ``type``, distributed."""
    param, path = read_solver_param(solver)
    update_rule_class(param.type)
    cls = distributed_solver_class(SOLVER_CLASSES.get(param.type, Solver))
    return cls(param, comm=comm, options=options, solver_file=path or solver_file)


# ============================================================================================== failure
def run_guarded(comm: Communicator, fn, *args, debug: bool = False, **kwargs):
    """``fn(*args, **kwargs)``; when it raises in a run of several ranks, print one line naming this rank
    and the error to stderr (with the traceback before it when ``debug``) and abort the whole job
    (MPI_Abort), so that no rank waits forever in a collective for this one. With one rank the
    exception propagates."""
    if comm.size == 1:
        return fn(*args, **kwargs)
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            raise
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) if debug else ""
        message = " ".join((str(exc) if not isinstance(exc, SystemExit) else str(exc.code)).split())
        sys.stderr.write(f"{detail}netdef: error: rank {comm.rank} of {comm.size} failed: {type(exc).__name__}: "
                         f"{message}; aborting all {comm.size} ranks\n")
        comm.abort(1)
        raise  # not reached
