"""The Solver: Caffe's training loop (``Solver::Step``/``Solve``) with its exact semantics.

One iteration (Caffe's order)::

    clear parameter diffs
    test every test net          when test_interval divides iter (and iter > 0 or test_initialization)
    on_start callbacks           (before the forward passes)
    compute_gradients()          iter_size x (forward + backward), diffs accumulate; loss = mean
    display                      "Iteration N (x iter/s, ys/D iters), loss = L" + the train outputs
    on_gradients_ready callbacks
    apply_update()               rate = policy(iter); "Iteration N, lr = r"; clip the global L2 norm of
                                 the accumulated diffs; per parameter: diff *= 1/iter_size,
                                 regularize, the update rule's value; data -= diff
    iter += 1
    after_update callbacks
    snapshot                     when snapshot divides iter, or on request (SIGHUP)
    stop                         on request (SIGINT): leave the loop; solve() then applies
                                 snapshot_after_train as Caffe does

Parallelism is not in this file: the solver calls a ``Parallel`` (``parallel.py``; a constructor
argument, one process by default) at fixed points of the loop: gradients of some parameters are
final (from the net's backward hooks, in the last of the ``iter_size`` passes), which gradients the
update may use, agree on signals, combine test scores, each rank's resume state for the snapshot.

The update is per parameter blob: normalize, regularize, the rule's value, ``data -= diff``, the
same float32 arithmetic as Caffe's (which does the last step for all blobs after the rest, with the
same result). A blob is updated as soon as its gradient is there (``Parallel.arrived``); with
data parallelism the ones still exchanging are updated just before the next iteration's forward
of the first layer that uses them (a layer hook on the train net), so the exchange overlaps that
forward. ``clip_gradients`` needs every gradient first. All updates are finished before a test,
a snapshot and the end of ``step()`` (``finish_updates``).

Paths in the solver file (``net``, ``train_net``, ``test_net``, ``weights``) are opened as Caffe opens
them, relative to the working directory; a path not found there is then tried relative to the solver
file's folder (an INFO log line says so). ``snapshot_prefix`` is used as given (relative to the working
directory), as in Caffe; when a solver file leaves it out it is the solver file's path without its
extension, and when it names a folder the solver file's name is appended (Caffe's
UpgradeSnapshotPrefixProperty).

netdef goes beyond Caffe in three places: a non-finite loss stops training with NonFiniteLossError
(and a snapshot of non-finite weights is refused), snapshots also carry the random generator's state
and the data layers' positions so that a resumed run continues bit for bit, and snapshot files are
replaced atomically.
"""
from __future__ import annotations

import enum
import logging
import math
import os
import signal
import time

import numpy as np

from .. import backend
from ..files import InputFileError, check_file_name
from ..layers.base import TEST, TRAIN
from ..net import Net
from ..proto import io as proto_io
from ..proto import netdef_pb2 as pb
from ..upgrade import upgrade_solver
from . import lr_policy
from . import snapshot as _snapshot
from .parallel import Parallel
from .prefix_lock import SnapshotPrefixLock
from .updates import SolverConfigError, update_rule_class
from .values import check_solver_values, train_net_field

logger = logging.getLogger("netdef")
f32 = np.float32


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or an infinity. ``iteration`` and ``layer`` (None when unknown) say where."""

    def __init__(self, message: str, iteration: int, layer: str | None = None):
        super().__init__(message)
        self.iteration = iteration
        self.layer = layer


class NonFiniteLossError(NonFiniteError):
    """The loss of an iteration is not finite; training stops before that iteration's update, so the
    weights in memory and the snapshots on disk are the last good ones."""


class NonFiniteParamsError(NonFiniteError):
    """A snapshot was asked of parameters that are not finite; nothing was written."""


class SolverAction(enum.Enum):
    """What a signal asks of the solver (Caffe's SolverAction)."""

    NONE = "none"
    STOP = "stop"
    SNAPSHOT = "snapshot"


def _fmt(value) -> str:
    """A number as C++'s ``ostream << float`` prints it (6 significant digits, %g)."""
    return "%g" % float(value)


# ============================================================================================ reading the solver
def read_solver_param(source) -> tuple[pb.SolverParameter, str | None]:
    """(upgraded SolverParameter, solver file path or None) from a path, prototxt text or a message."""
    if isinstance(source, pb.SolverParameter):
        param = pb.SolverParameter()
        param.CopyFrom(source)
        path = None
    else:
        text_or_path = os.fspath(source) if isinstance(source, os.PathLike) else source
        if not isinstance(text_or_path, str):
            raise TypeError(f"a solver is a prototxt path, prototxt text or a SolverParameter, not {type(source).__name__}")
        param = proto_io.read_text(text_or_path, pb.SolverParameter)
        path = None if proto_io.looks_like_text_message(text_or_path) else text_or_path
    if param.HasField("solver_type") and param.HasField("type"):
        raise SolverConfigError("Failed to upgrade solver: old solver_type field (enum) and new type field (string) "
                                "cannot be both specified in solver proto text.")
    upgrade_solver(param)
    check_solver_values(param, _solver_name(source, path))
    if path is not None:
        _upgrade_snapshot_prefix(param, path)
    return param, path


def _solver_name(source, path: str | None) -> str:
    """What errors call a solver: its file, or what it was given as."""
    if path is not None:
        return path
    return "<SolverParameter>" if isinstance(source, pb.SolverParameter) else "<solver prototxt string>"


def _upgrade_snapshot_prefix(param: pb.SolverParameter, solver_file: str) -> None:
    """Caffe's UpgradeSnapshotPrefixProperty."""
    stem = os.path.splitext(os.path.basename(solver_file))[0]
    if not param.HasField("snapshot_prefix"):
        param.snapshot_prefix = os.path.splitext(solver_file)[0]
        logger.info("snapshot_prefix was not specified and is set to %s", param.snapshot_prefix)
    elif os.path.isdir(param.snapshot_prefix):
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, stem)
        logger.info("snapshot_prefix was a directory and is replaced to %s", param.snapshot_prefix)


# ============================================================================================ the solver
class Solver:
    """Trains ``net`` as Caffe's solvers do. pycaffe's surface::

        solver = netdef.solver.get_solver("lenet_solver.prototxt")
        solver.net.copy_from("pretrained.caffemodel")   # optional
        solver.step(100)                                 # or solver.solve()
        solver.net, solver.test_nets, solver.iter

    ``solver`` is a solver prototxt path, prototxt text or a SolverParameter; ``solver_file`` (with a
    SolverParameter) is where relative net paths may also be looked up. Per-type subclasses
    (SGDSolver, AdamSolver...) use their rule whatever the file's ``type`` says, as pycaffe's do.
    """

    solver_type: str | None = None

    def __init__(self, solver, *, solver_file: str | None = None, parallel: Parallel | None = None):
        param, path = read_solver_param(solver)
        self.solver_file = path or solver_file
        if self.solver_type is not None and param.type != self.solver_type:
            if param.HasField("type"):
                logger.info("%s: using the %s update rule (the file says type: %r)", type(self).__name__,
                            self.solver_type, param.type)
            param.type = self.solver_type
        self.param = param
        self.parallel = parallel if parallel is not None else Parallel()
        rule_class = update_rule_class(param.type)
        self._validate(param, rule_class)
        logger.info("Initializing solver from parameters: \n%s", param)

        self.iter = 0
        self.current_step = 0
        self.smoothed_loss = f32(0)
        self._losses: list = []
        self._loss_window_start = 0
        self._resumed_loss_window = None
        self.requested_early_exit = False
        self._stop_requested = False
        self._snapshot_requested = False
        self._last_snapshot_iter = None
        self._callbacks: list[tuple] = []
        self._scalar_observers: list = []
        self._closed = False
        self._iterations_last = 0
        self._timer = time.perf_counter()
        self.test_scores: dict = {}
        self._pending: _PendingUpdate | None = None
        self._last_pass = False
        self._told_clipping_waits = False
        self._prefix_lock: SnapshotPrefixLock | None = None

        self._setup_device(param)
        self._setup_precision(param)
        self.parallel.prepare(param)
        if param.random_seed >= 0:
            backend.set_random_seed(param.random_seed)
        self.net = self._build_train_net()
        self.test_nets = self._build_test_nets()
        for test_net in self.test_nets:
            test_net.share_with(self.net)
        self.update_rule = rule_class(param)
        self.update_rule.setup(self.net.learnable_params)
        self._layer_param_ids = [self.net.layer_learnable_ids(li) for li in range(len(self.net.layers))]
        self.net.register_backward_hook(self._gradients_final)
        self.net.register_layer_hooks(before_forward=self._before_forward)
        self.parallel.attach(self)
        if self.parallel.writes_snapshots and param.snapshot_prefix:
            _snapshot.remove_stale_temps(param)
        logger.info("Solver scaffolding done.")

    # ---------------------------------------------------------------------------------------- set-up
    @staticmethod
    def _validate(param: pb.SolverParameter, rule_class) -> None:
        if param.average_loss < 1:
            raise SolverConfigError(f"average_loss should be non-negative (>= 1), got {param.average_loss}")
        if param.iter_size < 1:
            raise SolverConfigError(f"iter_size must be >= 1, got {param.iter_size}")
        if param.display < 0 or param.snapshot < 0 or param.test_interval < 0:
            raise SolverConfigError("display, snapshot and test_interval must not be negative")
        lr_policy.validate(param)
        if param.weight_decay and param.regularization_type not in ("L1", "L2"):
            raise SolverConfigError(f"Unknown regularization type: {param.regularization_type!r} (L1 or L2)")
        try:
            # Used by every snapshot, also the one at the end or on a signal (snapshot: 0 included).
            check_file_name(param.snapshot_prefix, "snapshot_prefix")
        except InputFileError as exc:
            raise SolverConfigError(str(exc)) from None
        if param.snapshot and not param.HasField("snapshot_prefix"):
            raise SolverConfigError("In solver params, snapshot is specified but snapshot_prefix is not")
        if param.snapshot:
            folder = os.path.dirname(param.snapshot_prefix) or "."
            if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
                raise SolverConfigError(f"Cannot write to snapshot prefix {param.snapshot_prefix!r}.  Make sure "
                                        f"that the directory exists and is writable.")
        rule_class.validate(param)

    @staticmethod
    def _setup_precision(param: pb.SolverParameter) -> None:
        """``precision`` when the file (or --precision) sets it; otherwise the process's setting stays
        (``netdef.set_precision``), strict float32 unless a script changed it."""
        if param.HasField("precision"):
            backend.set_precision(param.precision)
        if backend.device() == "gpu":
            logger.info("GPU precision: %s", "TensorFloat-32 convolutions and matrix products"
                        if backend.precision() == "tf32" else "strict float32")

    @staticmethod
    def _setup_device(param: pb.SolverParameter) -> None:
        """solver_mode/device_id, when the file sets solver_mode (pycaffe leaves the mode alone)."""
        if not param.HasField("solver_mode"):
            return
        if param.solver_mode == pb.SolverParameter.GPU:
            problem = backend.gpu_problem(param.device_id)
            if problem is None:
                backend.set_device("gpu", param.device_id)
                logger.info("Using GPU %d", param.device_id)
            else:
                # As `netdef VERB --gpu N` (cli.py): a solver written for a GPU still trains here.
                logger.warning("solver_mode: GPU (device_id: %d): no usable GPU, %s; training on the CPU "
                               "(set solver_mode: CPU to say so)", param.device_id, problem)
                backend.set_device("cpu")
        else:
            backend.set_device("cpu")

    def _resolve(self, path: str, what: str) -> str:
        # lexists: a link that leads nowhere (a loop) is the file meant; opening it will say what is wrong.
        if os.path.lexists(path):
            return path
        if self.solver_file and not os.path.isabs(path):
            beside = os.path.join(os.path.dirname(os.path.abspath(self.solver_file)), path)
            if os.path.lexists(beside):
                logger.info("%s %s is not in the working directory; using %s (relative to the solver file's folder)",
                            what, path, beside)
                return beside
        tried = f"the working directory {os.getcwd()!r}"
        if self.solver_file:
            tried += f" and the solver file's folder {os.path.dirname(os.path.abspath(self.solver_file))!r}"
        raise FileNotFoundError(f"{what} {path!r} not found (tried {tried})")

    def _make_net(self, source, file_param: pb.NetParameter | None, phase: int, extra_state: pb.NetState | None):
        """A Net with Caffe's state precedence: phase default < the net's own state < the solver's state."""
        own = file_param if file_param is not None else source
        state = pb.NetState()
        state.phase = phase
        state.MergeFrom(own.state)
        if extra_state is not None:
            state.MergeFrom(extra_state)
        if isinstance(source, str) and list(state.stage) == list(own.state.stage) and state.level == own.state.level:
            # From the path, so that errors name the file and line.
            net = Net(source, state.phase)
        else:
            base_dir = os.path.dirname(os.path.abspath(source)) if isinstance(source, str) else (
                os.path.dirname(os.path.abspath(self.solver_file)) if self.solver_file else None)
            param = pb.NetParameter()
            param.CopyFrom(own)
            param.state.CopyFrom(state)
            net = Net(param, state.phase, base_dir=base_dir)
        for weights in self.param.weights:
            for name in (n.strip() for n in weights.split(",")):
                logger.info("Finetuning from %s", name)
                net.copy_from(self._resolve(name, "weights file"))
        return net

    def _build_train_net(self) -> Net:
        p = self.param
        field = train_net_field(p, self.solver_file or "<solver>")
        train_state = p.train_state if p.HasField("train_state") else None
        if field in ("net_param", "train_net_param"):
            logger.info("Creating training net specified in %s.", field)
            return self._make_net(getattr(p, field), None, TRAIN, train_state)
        path = self._resolve(getattr(p, field), f"{field} file")
        logger.info("Creating training net from %s file: %s", field, path)
        return self._make_net(path, proto_io.read_text(path, pb.NetParameter), TRAIN, train_state)

    def _build_test_nets(self) -> list[Net]:
        p = self.param
        generic = int(p.HasField("net")) + int(p.HasField("net_param"))
        if generic > 1:
            raise SolverConfigError("Both net_param and net_file may not be specified.")
        num_listed = len(p.test_net_param) + len(p.test_net)
        if generic:
            if len(p.test_iter) < num_listed:
                raise SolverConfigError("test_iter must be specified for each test network.")
        elif len(p.test_iter) != num_listed:
            raise SolverConfigError(f"test_iter must be specified for each test network ({num_listed} test nets, "
                                    f"{len(p.test_iter)} test_iter values).")
        instances = len(p.test_iter) if generic else num_listed
        if p.test_state and len(p.test_state) != instances:
            raise SolverConfigError("test_state must be unspecified or specified once per test net.")
        if instances and p.test_interval <= 0:
            raise SolverConfigError(f"test nets need test_interval > 0, got {p.test_interval}")
        sources = []
        for net_param in p.test_net_param:
            sources.append(("test_net_param", net_param, None))
        for name in p.test_net:
            path = self._resolve(name, "test_net file")
            sources.append((f"test_net file: {path}", path, proto_io.read_text(path, pb.NetParameter)))
        for _ in range(instances - num_listed):
            if p.HasField("net_param"):
                sources.append(("net_param", p.net_param, None))
            else:
                path = self._resolve(p.net, "net file")
                sources.append((f"net file: {path}", path, proto_io.read_text(path, pb.NetParameter)))
        nets = []
        for i, (what, source, file_param) in enumerate(sources):
            logger.info("Creating test net (#%d) specified by %s", i, what)
            nets.append(self._make_net(source, file_param, TEST, p.test_state[i] if p.test_state else None))
        return nets

    # ---------------------------------------------------------------------------------------- properties
    @property
    def history(self):
        """The update rule's history blobs, in the order of SolverState.history."""
        return self.update_rule.history

    @property
    def type(self) -> str:
        return self.param.type

    # ---------------------------------------------------------------------------------------- callbacks
    def add_callback(self, on_start=None, on_gradients_ready=None, after_update=None):
        """Per-iteration callbacks (no arguments, as pycaffe's): ``on_start`` before the forward passes,
        ``on_gradients_ready`` after backward and before the update, ``after_update`` once the update is
        applied and ``iter`` incremented (before the snapshot check). One object with methods of those
        names also works: ``solver.add_callback(obj)``."""
        names = ("on_start", "on_gradients_ready", "after_update")
        if on_gradients_ready is None and after_update is None and on_start is not None and any(
                hasattr(on_start, n) for n in names):
            obj = on_start
            on_start, on_gradients_ready, after_update = (getattr(obj, n, None) for n in names)
        self._callbacks.append((on_start, on_gradients_ready, after_update))

    def add_scalar_observer(self, observer) -> None:
        """``observer(iteration, scalars)`` is called with the numbers the log shows, as a dict of
        ``{tag: float}``, at the iteration they belong to: at each display ``train/loss`` (the smoothed
        loss), ``train/iter_per_s``, ``train/<output>`` for each train net output and the parallel
        seam's measurements (``Parallel.scalars``, e.g. ``exchange/wait_s``); ``train/lr`` at each display;
        after each test ``test<k>/<output>`` (and ``test<k>/loss`` with test_compute_loss). An output
        with several values is reported as ``<output>[i]``."""
        self._scalar_observers.append(observer)

    def _report(self, scalars: dict) -> None:
        for observer in self._scalar_observers:
            observer(self.iter, scalars)

    def _run_callbacks(self, which: int) -> None:
        for callback in self._callbacks:
            if callback[which] is not None:
                callback[which]()

    # ---------------------------------------------------------------------------------------- requests
    def request_stop(self) -> None:
        """Stop at the next iteration boundary (safe to call from a signal handler)."""
        self._stop_requested = True

    def request_snapshot(self) -> None:
        """Snapshot at the next iteration boundary (safe to call from a signal handler)."""
        self._snapshot_requested = True

    def take_requests(self) -> tuple[bool, bool]:
        """(snapshot requested, stop requested) since the last call, and clear them; with several
        ranks, requested on any of them (every rank acts at the same iteration)."""
        snap, stop = self._snapshot_requested, self._stop_requested
        self._snapshot_requested = self._stop_requested = False
        return self.parallel.agree_requests(snap, stop)

    # ---------------------------------------------------------------------------------------- training
    def solve(self, resume_file=None) -> None:
        """Caffe's Solve: train to max_iter (resuming from ``resume_file``), snapshot after training,
        then a last display/test pass. The data layers are closed at the end."""
        logger.info("Solving %s", self.net.name)
        logger.info("Learning Rate Policy: %s", self.param.lr_policy)
        self.requested_early_exit = False
        try:
            if self.parallel.writes_snapshots and self.param.snapshot_prefix:
                # Held until close(): no other run may write this prefix's snapshots meanwhile.
                self._prefix_lock = SnapshotPrefixLock.acquire(self.param.snapshot_prefix)
            if resume_file:
                logger.info("Restoring previous solver status from %s", resume_file)
                self.restore(resume_file)
            start_iter = self.iter
            self.step(self.param.max_iter - self.iter)
            p = self.param
            if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0) \
                    and self._last_snapshot_iter != self.iter:
                self.snapshot()
            if self.requested_early_exit:
                logger.info("Optimization stopped early.")
                return
            if p.display and self.iter % p.display == 0:
                loss = f32(self.net.forward_range())
                self._update_smoothed_loss(loss, start_iter, p.average_loss)
                logger.info("Iteration %d, loss = %s", self.iter, _fmt(self.smoothed_loss))
            if p.test_interval and self.iter % p.test_interval == 0:
                self.test_all()
            self.parallel.end_training()
            logger.info("Optimization Done.")
        finally:
            self.close()

    def step(self, iters: int) -> None:
        """Run ``iters`` iterations (Caffe's Step)."""
        start_iter = self.iter
        stop_iter = self.iter + int(iters)
        self._losses = []
        self.smoothed_loss = f32(0)
        if self._resumed_loss_window is not None:
            # Continue the displayed loss's running average where the snapshot left it (netdef's
            # addition: Caffe restarts it, so its resumed logs differ from an uninterrupted run's).
            self.smoothed_loss, self._losses, start_iter = self._resumed_loss_window
            self._resumed_loss_window = None
        self._loss_window_start = start_iter
        self._timer = time.perf_counter()
        self._iterations_last = self.iter
        self.requested_early_exit = False
        self.parallel.begin_step()
        self._iterate(stop_iter, start_iter)
        # Not on an exception: the other ranks may never complete the exchanges it would wait for.
        self.finish_updates()

    def _iterate(self, stop_iter: int, start_iter: int) -> None:
        p = self.param
        while self.iter < stop_iter:
            self._clear_param_diffs()
            if p.test_interval and self.iter % p.test_interval == 0 and (self.iter > 0 or p.test_initialization):
                self.test_all()
                if self.requested_early_exit:
                    break
            self._run_callbacks(0)
            display = bool(p.display) and self.iter % p.display == 0
            self.parallel.begin_iteration(self.iter)
            loss = self.compute_gradients()
            self._update_smoothed_loss(loss, start_iter, p.average_loss)
            if display:
                self._display()
            self._run_callbacks(1)
            self.apply_update()
            if self.parallel.must_finish_updates():
                self.finish_updates()
            self.iter += 1
            self.parallel.end_iteration()
            self._run_callbacks(2)
            snap, stop = self.take_requests()
            if (p.snapshot and self.iter % p.snapshot == 0) or snap:
                self.snapshot()
            if stop:
                self.requested_early_exit = True
                break

    def compute_gradients(self) -> np.float32:
        """The forward/backward passes of one iteration: ``iter_size`` passes whose parameter gradients
        add up in the diffs; returns their mean loss. Raises NonFiniteLossError on a NaN/inf loss."""
        loss = f32(0)
        for pass_index in range(self.param.iter_size):
            pass_loss = f32(self.forward_backward_pass(pass_index))
            if not math.isfinite(pass_loss):
                self._raise_non_finite(pass_loss)
            loss += pass_loss
        return loss / f32(self.param.iter_size)

    def forward_backward_pass(self, pass_index: int) -> float:
        """Pass ``pass_index`` (0 .. iter_size-1) of an iteration: forward, backward; the loss.
        Gradients are handed to the parallel seam in the last pass only, so that iter_size > 1
        exchanges once."""
        last = pass_index == self.param.iter_size - 1
        loss = self.net.forward_range()
        self.parallel.forward_done()
        self._last_pass = last
        try:
            self.net.backward()
        finally:
            self._last_pass = False
        self.net.loss = loss
        self.parallel.backward_done(last)
        return loss

    def _gradients_final(self, layer_index: int, param_ids) -> None:
        if self._last_pass:
            self.parallel.gradients_final(param_ids)

    def _raise_non_finite(self, loss) -> None:
        net = self.net
        culprit = None
        for layer in net.layers:
            for name in net.top_names[layer.name]:
                blob = net.blobs[name]
                data = blob.data
                xp = backend.get_array_module(data)
                if data.dtype.kind == "f" and not bool(xp.isfinite(data).all()):
                    culprit = (layer, name)
                    break
            if culprit:
                break
        bad_params = [f"{layer.name}[{j}]" for layer in net.layers for j, b in enumerate(layer.blobs)
                      if not bool(backend.get_array_module(b.data).isfinite(b.data).all())]
        where = (f"; first non-finite output: top {culprit[1]!r} of layer {culprit[0].name!r} ({culprit[0].type})"
                 if culprit else "")
        params = f"; non-finite parameters: {', '.join(bad_params)}" if bad_params else ""
        raise NonFiniteLossError(f"Iteration {self.iter}: loss is {float(loss)}{where}{params}. Training stopped "
                                 f"before this iteration's update (the weights and snapshots are the last good ones)",
                                 self.iter, culprit[0].name if culprit else None)

    def resume_loss_window(self, smoothed_loss: float, losses: list, window_start: int) -> None:
        """Make the next step() continue this running average of the displayed loss."""
        self._resumed_loss_window = (f32(smoothed_loss), [f32(v) for v in losses], int(window_start))

    def _update_smoothed_loss(self, loss, start_iter: int, average_loss: int) -> None:
        loss = f32(loss)
        if len(self._losses) < average_loss:
            self._losses.append(loss)
            size = len(self._losses)
            self.smoothed_loss = f32((self.smoothed_loss * f32(size - 1) + loss) / f32(size))
        else:
            idx = (self.iter - start_iter) % average_loss
            self.smoothed_loss = f32(self.smoothed_loss + (loss - self._losses[idx]) / f32(average_loss))
            self._losses[idx] = loss

    def _display(self) -> None:
        p = self.param
        now = time.perf_counter()
        lapse = now - self._timer
        per_s = (self.iter - self._iterations_last) / (lapse if lapse else 1)
        logger.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter, _fmt(per_s), _fmt(lapse),
                    p.display, _fmt(self.smoothed_loss))
        self._timer = now
        self._iterations_last = self.iter
        weights = self.net.blob_loss_weights
        scalars = {"train/loss": float(self.smoothed_loss), "train/iter_per_s": float(per_s)}
        index = 0
        for name in _output_order(self.net):
            values = backend.to_host(self.net.blobs[name].data).astype(np.float32).ravel()
            weight = f32(weights.get(name, 0.0))
            for k, value in enumerate(values):
                suffix = f" (* {_fmt(weight)} = {_fmt(weight * value)} loss)" if weight else ""
                logger.info("    Train net output #%d: %s = %s%s", index, name, _fmt(value), suffix)
                scalars[f"train/{name}" if values.size == 1 else f"train/{name}[{k}]"] = float(value)
                index += 1
        scalars.update(self.parallel.scalars())
        self._report(scalars)

    # ---------------------------------------------------------------------------------------- the update
    @property
    def lr(self) -> np.float32:
        """The learning rate of the current iteration, ``iter``: the rate the next update applies
        (before the first step, iteration 0's). Reading it advances nothing."""
        return lr_policy.learning_rate(self.param, self.iter, self.current_step)[0]

    def share_weights(self, net) -> None:
        """pycaffe's ``solver.share_weights(net)``: ``net`` uses this solver's trained parameters from
        now on, layer by name (``net.share_with(solver.net)``), e.g. a deploy net following training."""
        net.share_with(self.net)

    def get_learning_rate(self) -> np.float32:
        """The rate for the current iteration (advances current_step for step/multistep, as Caffe)."""
        rate, self.current_step = lr_policy.learning_rate(self.param, self.iter, self.current_step)
        return rate

    def apply_update(self) -> None:
        """Caffe's SGDSolver::ApplyUpdate: learning rate, gradient clipping, then per parameter
        normalization, regularization, the update rule and ``data -= diff``; each blob as soon as
        its gradient is there (see the module docstring), the rest later (``finish_updates``)."""
        p = self.param
        rate = self.get_learning_rate()
        if p.display and self.iter % p.display == 0:
            logger.info("Iteration %d, lr = %s", self.iter, _fmt(rate))
            self._report({"train/lr": float(rate)})
        all_ids = list(range(len(self.net.learnable_params)))
        if p.clip_gradients >= 0:
            if self.parallel.size > 1 and not self._told_clipping_waits:
                logger.info("clip_gradients uses the norm of all gradients: every update waits for the whole "
                            "exchange")
                self._told_clipping_waits = True
            self.parallel.wait_gradients(all_ids)
            for param_id in all_ids:  # the norm is of the averaged gradients
                self._divide_now(param_id, self.parallel.take_divisor(param_id))
        self.clip_gradients()
        self._pending = _PendingUpdate(rate, self.iter, all_ids)
        self._apply_pending(self.parallel.arrived(all_ids))

    def finish_updates(self) -> None:
        """Apply every update still waiting for its gradient (before tests, snapshots, the end of step)."""
        if self._pending is not None:
            ids = list(self._pending.remaining)
            self.parallel.wait_gradients(ids)
            self._apply_pending(ids)

    def _before_forward(self, layer_index: int) -> None:
        # The next iteration's forward of a layer waits only for that layer's own parameters.
        if self._pending is not None:
            ids = [i for i in self._layer_param_ids[layer_index] if i in self._pending.remaining]
            if ids:
                self.parallel.wait_gradients(ids)
                self._apply_pending(ids)

    def _apply_pending(self, param_ids) -> None:
        pending = self._pending
        params = self.net.learnable_params
        for param_id in param_ids:
            if param_id not in pending.remaining:
                continue
            self.parallel.before_update(param_id)
            blob = params[param_id]
            divisor = self.parallel.take_divisor(param_id)
            if not self._fused_update(param_id, pending.rate, pending.iteration, divisor):
                self._divide_now(param_id, divisor)
                self.normalize(param_id)
                self.regularize(param_id)
                self.compute_update_value(param_id, pending.rate, pending.iteration)
                data = blob.data
                data -= blob.diff
            if pending.diffs_cleared:
                blob.defer_zero_diff()  # the iteration after this update has begun and cleared the others
            del pending.remaining[param_id]
            self.parallel.after_update(param_id)
        if not pending.remaining:
            self._pending = None
            self.parallel.updated()

    def _clear_param_diffs(self) -> None:
        if self._pending is None:
            self.net.clear_param_diffs(deferred=True)
            return
        self._pending.diffs_cleared = True
        for param_id, blob in enumerate(self.net.learnable_params):
            if param_id not in self._pending.remaining:
                blob.defer_zero_diff()

    def _divide_now(self, param_id: int, divisor) -> None:
        """Average a gradient the exchange left as a sum (``divisor`` 1: nothing to do)."""
        if divisor != 1:
            diff = self.net.learnable_params[param_id].diff
            diff /= diff.dtype.type(divisor)  # what the exchange's own average computes: the same bits

    def _fused_update(self, param_id: int, rate, iteration: int, divisor=1) -> bool:
        """The division by ``divisor`` (see Parallel.take_divisor), normalize, regularize,
        compute_update_value and ``data -= diff`` in one compiled pass where the update rule has
        one (the same bits); False where it has not and nothing was done."""
        p = self.param
        if p.regularization_type not in ("L1", "L2"):
            return False  # regularize() names the bad value
        decay = self._local_decay(param_id)
        if decay and p.regularization_type != "L2":
            return False
        scale = f32(1) / f32(p.iter_size) if p.iter_size != 1 else f32(1)
        local_rate = self._local_rate(param_id, rate)
        return self.update_rule.fused_step(param_id, self.net.learnable_params[param_id], scale,
                                           decay if decay else None, local_rate, iteration, divisor)

    def _local_rate(self, param_id: int, rate) -> np.float32:
        """The solver's rate times the blob's lr_mult, in float32 as Caffe computes it."""
        return f32(rate) * f32(self.net.params_lr[param_id])

    def _local_decay(self, param_id: int) -> np.float32:
        """weight_decay times the blob's decay_mult, in float32 as Caffe computes it."""
        return f32(self.param.weight_decay) * f32(self.net.params_weight_decay[param_id])

    def clip_gradients(self) -> None:
        clip = f32(self.param.clip_gradients)
        if clip < 0:
            return
        sumsq = f32(0)
        for blob in self.net.learnable_params:
            diff = blob.diff
            # float() first: a CuPy scalar does not convert to NumPy implicitly.
            sumsq += f32(float(backend.get_array_module(diff).vdot(diff.ravel(), diff.ravel())))
        norm = f32(np.sqrt(sumsq))
        if norm > clip:
            scale = f32(clip / norm)
            logger.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by scale factor %s",
                        _fmt(norm), _fmt(clip), _fmt(scale))
            for blob in self.net.learnable_params:
                diff = blob.diff
                diff *= scale

    def normalize(self, param_id: int) -> None:
        if self.param.iter_size == 1:
            return
        diff = self.net.learnable_params[param_id].diff
        diff *= f32(1) / f32(self.param.iter_size)

    def regularize(self, param_id: int) -> None:
        blob = self.net.learnable_params[param_id]
        local_decay = self._local_decay(param_id)
        if not local_decay:
            return
        diff = blob.diff
        if self.param.regularization_type == "L2":
            diff += local_decay * blob.data
        elif self.param.regularization_type == "L1":
            diff += local_decay * backend.get_array_module(blob.data).sign(blob.data)
        else:
            raise SolverConfigError(f"Unknown regularization type: {self.param.regularization_type!r}")

    def compute_update_value(self, param_id: int, rate, iteration: int | None = None) -> None:
        """The update rule's value for one blob at ``iteration`` (default: the current one)."""
        local_rate = self._local_rate(param_id, rate)
        iteration = self.iter if iteration is None else iteration
        self.update_rule.compute_update_value(param_id, self.net.learnable_params[param_id], local_rate, iteration)

    # ---------------------------------------------------------------------------------------- testing
    def test_all(self) -> None:
        self.finish_updates()
        for test_net_id in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.test(test_net_id)

    def test(self, test_net_id: int = 0) -> None:
        """Caffe's Test: ``test_iter`` forward passes; logs the mean of every output. What is tested is
        the model (``Parallel.swap_in_model``): the weights, or under an asynchronous exchange rule
        the centre variable or rank 0's weights."""
        logger.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        self.finish_updates()
        self.parallel.swap_in_model()
        try:
            self._test_model(test_net_id)
        finally:
            self.parallel.swap_out_model()

    def _test_model(self, test_net_id: int) -> None:
        p = self.param
        test_net = self.test_nets[test_net_id]
        test_net.share_with(self.net)
        iterations = p.test_iter[test_net_id]
        names = _output_order(test_net)
        scores = None
        loss = f32(0)
        for _ in range(iterations):
            snap, stop = self.take_requests()
            if snap:
                self.snapshot()
            if stop:
                self.requested_early_exit = True
            if self.requested_early_exit:
                break
            iter_loss = f32(test_net.forward_range())
            if p.test_compute_loss:
                loss += iter_loss
            values = np.concatenate([backend.to_host(test_net.blobs[n].data).astype(np.float32).ravel()
                                     for n in names]) if names else np.zeros(0, np.float32)
            scores = values.copy() if scores is None else scores + values
        if self.requested_early_exit:
            logger.info("Test interrupted.")
            return
        if scores is not None or p.test_compute_loss:
            scores, loss = self.parallel.reduce_test_outputs(scores, loss)
        reported = {}
        if p.test_compute_loss:
            loss /= f32(iterations)
            logger.info("Test loss: %s", _fmt(loss))
            reported[f"test{test_net_id}/loss"] = float(loss)
        if scores is None:
            self._report(reported)
            return
        weights = test_net.blob_loss_weights
        owners = [n for n in names for _ in range(test_net.blobs[n].count)]
        self.test_scores = {}
        for i, (name, score) in enumerate(zip(owners, scores)):
            mean = f32(score / f32(iterations))
            weight = f32(weights.get(name, 0.0))
            suffix = f" (* {_fmt(weight)} = {_fmt(weight * mean)} loss)" if weight else ""
            logger.info("    Test net output #%d: %s = %s%s", i, name, _fmt(mean), suffix)
            self.test_scores.setdefault(name, []).append(mean)
        for name, means in self.test_scores.items():
            for k, mean in enumerate(means):
                reported[f"test{test_net_id}/{name}" if len(means) == 1 else f"test{test_net_id}/{name}[{k}]"] = \
                    float(mean)
        self._report(reported)

    # ---------------------------------------------------------------------------------------- snapshots
    def snapshot(self) -> tuple[str, str]:
        """Write ``<prefix>_iter_<iter>`` model and state files; returns their paths. Refuses (with
        NonFiniteParamsError, writing nothing) when a parameter is not finite. With several ranks
        every rank calls it; one writes the files, with every rank's resume state in the state file."""
        self.finish_updates()
        bad = [f"{layer.name}[{j}]" for layer in self.net.layers for j, b in enumerate(layer.blobs)
               if not bool(backend.get_array_module(b.data).isfinite(b.data).all())]
        if bad:
            raise NonFiniteParamsError(f"Iteration {self.iter}: not snapshotting non-finite parameters "
                                       f"({', '.join(bad)})", self.iter, bad[0].split("[")[0])
        self.parallel.settle()
        self.parallel.swap_in_model()
        try:
            rank_states = self.parallel.gather_rank_states(_snapshot.rank_state(self).SerializeToString())
            if self.parallel.writes_snapshots:
                paths = _snapshot.write_snapshot(self, rank_states)
            else:
                paths = _snapshot.snapshot_paths(self.param, self.iter)
        finally:
            self.parallel.swap_out_model()
        self.parallel.snapshot_written()
        self._last_snapshot_iter = self.iter
        return paths

    def restore(self, path) -> None:
        """Restore a ``.solverstate`` / ``.solverstate.h5`` written by Caffe or netdef: iter,
        current_step, history, the learned_net weights, and netdef's random/data state if present."""
        self.finish_updates()
        _snapshot.restore(self, path)
        self.parallel.restored()

    # ---------------------------------------------------------------------------------------- the end
    def close(self) -> None:
        """Release the parallel seam's resources and close the data sources (prefetch threads, open
        databases)."""
        if self._closed:
            return
        self._closed = True
        if self._prefix_lock is not None:
            self._prefix_lock.release()
        self.parallel.close()
        seen = set()
        for net in [self.net] + list(self.test_nets):
            for layer in net.data_sources():
                if id(layer) not in seen:
                    seen.add(id(layer))
                    layer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} type={self.param.type!r} net={self.net.name!r} iter={self.iter}>"


class _PendingUpdate:
    """The updates of one iteration not applied yet: its rate and iteration (the next iteration may
    have begun when they are applied) and the parameter ids still to update."""

    def __init__(self, rate, iteration: int, param_ids):
        self.rate = rate
        self.iteration = iteration
        self.remaining = dict.fromkeys(param_ids)  # ordered, O(1) membership
        self.diffs_cleared = False


def _output_order(net) -> list[str]:
    """Caffe lists a net's outputs in std::set<string> order, i.e. sorted by name (bytes)."""
    return sorted(net.outputs, key=lambda n: n.encode("utf-8"))


# ============================================================================================ per-type classes
class SGDSolver(Solver):
    solver_type = "SGD"


class NesterovSolver(Solver):
    solver_type = "Nesterov"


class AdaGradSolver(Solver):
    solver_type = "AdaGrad"


class RMSPropSolver(Solver):
    solver_type = "RMSProp"


class AdaDeltaSolver(Solver):
    solver_type = "AdaDelta"


class AdamSolver(Solver):
    solver_type = "Adam"


SOLVER_CLASSES = {cls.solver_type: cls for cls in
                  (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver, AdaDeltaSolver, AdamSolver)}


def get_solver(solver, *, solver_file: str | None = None, parallel: Parallel | None = None) -> Solver:
    """pycaffe's ``caffe.get_solver``: the solver class for the file's ``type`` (or legacy
    ``solver_type``); types registered with ``register_update_rule`` get the generic Solver.
    ``parallel``: see ``parallel.py`` (one process by default)."""
    param, path = read_solver_param(solver)
    cls = SOLVER_CLASSES.get(param.type, Solver)
    update_rule_class(param.type)  # unknown type: a clear error before anything is built
    return cls(param, solver_file=path or solver_file, parallel=parallel)


# ============================================================================================ signals
class SignalHandlers:
    """Installed handlers; ``restore()`` (or leaving the ``with`` block) puts the previous ones back."""

    def __init__(self, previous: dict):
        self.previous = previous

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False


def install_signal_handlers(solver: Solver, sigint_effect: str = "stop", sighup_effect: str = "snapshot"):
    """Caffe's --sigint_effect / --sighup_effect: each of ``stop``, ``snapshot`` or ``none``.

    The handlers only set a flag; the solver acts at the next iteration boundary (or between test
    iterations). As in Caffe, ``none`` still catches the signal and ignores it. Returns a
    SignalHandlers whose ``restore()`` reinstates the previous handlers. Main thread only (Python's rule).
    """
    effects = {"stop": solver.request_stop, "snapshot": solver.request_snapshot, "none": None}
    for name, value in (("sigint_effect", sigint_effect), ("sighup_effect", sighup_effect)):
        if value not in effects:
            raise ValueError(f"{name} must be one of stop, snapshot, none; got {value!r}")

    def make(effect):
        action = effects[effect]

        def handler(signum, frame):
            if action is not None:
                action()

        return handler

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, make(sigint_effect))}
    if hasattr(signal, "SIGHUP"):
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, make(sighup_effect))
    return SignalHandlers(previous)
