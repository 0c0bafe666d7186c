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

The Solver composes the parts that do the rest, each in its own module: ``building.py`` reads the
solver file and builds the nets, ``arrival.py`` applies each parameter's update (``step.py``'s
arithmetic) as soon as its gradient is there, ``display.py`` keeps the displayed loss and logs the
outputs, ``snapshot.py`` writes and reads the snapshot files. Parallelism is a ``Parallel``
(``parallel.py``; a constructor argument, one process by default) that the loop calls at fixed
points; ``parallel.py`` also lists every call of one iteration in order.

netdef goes beyond Caffe in three places: a non-finite loss stops training with NonFiniteLossError
(and a snapshot of non-finite weights is refused), snapshots also carry the random generator's state
and the data layers' positions so that a resumed run continues bit for bit, and snapshot files are
replaced atomically.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from .. import backend, device_memory
from ..net import Net
from . import display, lr_policy
from . import snapshot as _snapshot
from .arrival import ArrivalUpdates
from .building import (
    NetBuilder,
    check_training_values,
    read_solver_param,
    set_up_device,
    set_up_precision,
)
from .callbacks import SolverCallback
from .nonfinite import NonFiniteParamsError, non_finite_loss, non_finite_params
from .parallel import Parallel
from .prefix_lock import SnapshotPrefixLock
from .step import ParameterUpdate, fmt
from .updates import update_rule_class

logger = logging.getLogger("netdef")
f32 = np.float32


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
        check_training_values(param, rule_class)
        logger.info("Initializing solver from parameters: \n%s", param)

        self.iter = 0
        self.current_step = 0
        self.loss_window = display.LossWindow(param.average_loss)
        self.test_scores: dict = {}
        self.requested_early_exit = False
        self._requests = {"snapshot": False, "stop": False}
        self._last_snapshot_iter = None
        self._callbacks: list[tuple] = []
        self._scalar_observers: list = []
        self._speed = (time.perf_counter(), 0)  # (when, iteration) of the last display
        self._prefix_lock: SnapshotPrefixLock | None = None
        self._closed = False
        self._device_memory: device_memory.DeviceMemoryReport | None = None

        set_up_device(param)
        set_up_precision(param)
        self.parallel.prepare(param)
        if param.random_seed >= 0:
            backend.set_random_seed(param.random_seed)
        nets = NetBuilder(param, self.solver_file)
        self.net = nets.train_net()
        self.test_nets = nets.test_nets()
        for test_net in self.test_nets:
            test_net.share_with(self.net)
        self.update_rule = rule_class(param)
        self.update_rule.setup(self.net.learnable_params)
        self.updates = ArrivalUpdates(self.net, ParameterUpdate(param, self.net, self.update_rule))
        self.parallel.attach(self.net, self.test_nets, self.updates)
        self._device_memory = device_memory.report_for(self.net)
        if self.parallel.writes_snapshots and param.snapshot_prefix:
            _snapshot.remove_stale_temps(param)
        logger.info("Solver scaffolding done.")

    # ---------------------------------------------------------------------------------------- properties
    @property
    def history(self):
        """The update rule's history blobs, in the order of SolverState.history."""
        return self.update_rule.history

    @property
    def type(self) -> str:
        return self.param.type

    @property
    def smoothed_loss(self) -> np.float32:
        """The loss the display shows: the mean of the last ``average_loss`` iterations' losses."""
        return self.loss_window.smoothed

    @property
    def lr(self) -> np.float32:
        """The learning rate of the current iteration, ``iter``: the rate the next update applies
        (before the first step, iteration 0's). Reading it advances nothing."""
        return lr_policy.learning_rate(self.param, self.iter, self.current_step)[0]

    def get_learning_rate(self) -> np.float32:
        """The rate for the current iteration (advances current_step for step/multistep, as Caffe)."""
        rate, self.current_step = lr_policy.learning_rate(self.param, self.iter, self.current_step)
        return rate

    def share_weights(self, net: Net) -> None:
        """pycaffe's ``solver.share_weights(net)``: ``net`` uses this solver's trained parameters from
        now on, layer by name (``net.share_with(solver.net)``), e.g. a deploy net following training."""
        net.share_with(self.net)

    # ---------------------------------------------------------------------------------------- callbacks
    def add_callback(self, on_start=None, on_gradients_ready=None, after_update=None):
        """Per-iteration callbacks (no arguments, as pycaffe's): ``on_start`` before the forward passes,
        ``on_gradients_ready`` after backward and before the update, ``after_update`` once the update is
        applied and ``iter`` incremented (before the snapshot check). One ``SolverCallback`` (whose
        methods are those three) also works: ``solver.add_callback(callback)``."""
        if isinstance(on_start, SolverCallback):
            if on_gradients_ready is not None or after_update is not None:
                raise TypeError("add_callback: a SolverCallback comes alone; its methods are the three callbacks")
            callback = on_start
            on_start, on_gradients_ready, after_update = (callback.on_start, callback.on_gradients_ready,
                                                          callback.after_update)
        for name, function in (("on_start", on_start), ("on_gradients_ready", on_gradients_ready),
                               ("after_update", after_update)):
            if function is not None and not callable(function):
                raise TypeError(f"add_callback: {name} must be a function taking no arguments or None (or the "
                                f"one argument a netdef.SolverCallback), not {type(function).__name__}")
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
        self._requests["stop"] = True

    def request_snapshot(self) -> None:
        """Snapshot at the next iteration boundary (safe to call from a signal handler)."""
        self._requests["snapshot"] = True

    def take_requests(self) -> tuple[bool, bool]:
        """(snapshot requested, stop requested) since the last call, and clear them; with several
        ranks, requested on any of them (every rank acts at the same iteration)."""
        snap, stop = self._requests["snapshot"], self._requests["stop"]
        self._requests["snapshot"] = self._requests["stop"] = False
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
                self.loss_window.add(f32(self.net.forward_range()), self.iter, start_iter)
                logger.info("Iteration %d, loss = %s", self.iter, fmt(self.smoothed_loss))
            if p.test_interval and self.iter % p.test_interval == 0:
                self.test_all()
            self.parallel.end_training()
            logger.info("Optimization Done.")
        finally:
            self.close()

    def step(self, iters: int) -> None:
        """Run ``iters`` iterations (Caffe's Step)."""
        stop_iter = self.iter + int(iters)
        self.loss_window.restart(self.iter)
        self._speed = (time.perf_counter(), self.iter)
        self.requested_early_exit = False
        self.parallel.begin_step(self.iter, self.current_step)
        p = self.param
        while self.iter < stop_iter:
            self.updates.clear_diffs()
            if p.test_interval and self.iter % p.test_interval == 0 and (self.iter > 0 or p.test_initialization):
                self.test_all()
                if self.requested_early_exit:
                    break
            self._run_callbacks(0)
            self.parallel.begin_iteration(self.iter)
            self.loss_window.add(self.compute_gradients(), self.iter)
            if p.display and self.iter % p.display == 0:
                self._display()
            self._run_callbacks(1)
            self.apply_update()
            self.iter += 1
            if self._device_memory is not None:
                self._device_memory.iteration_ended(self.iter)
            self._run_callbacks(2)
            snap, stop = self.take_requests()
            if (p.snapshot and self.iter % p.snapshot == 0) or snap:
                self.snapshot()
            if stop:
                self.requested_early_exit = True
                break
        # Not on an exception: the other ranks may never complete the exchanges it would wait for.
        self.updates.finish()

    def compute_gradients(self) -> np.float32:
        """The forward/backward passes of one iteration: ``iter_size`` passes whose parameter gradients
        add up in the diffs; returns their mean loss. Raises NonFiniteLossError on a NaN/inf loss."""
        loss = f32(0)
        for pass_index in range(self.param.iter_size):
            pass_loss = f32(self.forward_backward_pass(pass_index))
            if not math.isfinite(pass_loss):
                raise non_finite_loss(self.net, self.iter, pass_loss)
            loss += pass_loss
        return loss / f32(self.param.iter_size)

    def forward_backward_pass(self, pass_index: int) -> float:
        """Pass ``pass_index`` (0 .. iter_size-1) of an iteration: forward, backward; the loss. The
        last pass's backward hands the gradients to the exchange as they become final. The loss is
        read once backward is queued: on a GPU the host then waits for the end of forward while the
        device runs backward (``net_loss.py``), and the check of its value still comes before the
        update."""
        loss = self.net.forward_queued()
        if pass_index == self.param.iter_size - 1:
            self.updates.backward()
        else:
            self.net.backward()
        self.net.loss = loss.value()
        return self.net.loss

    def _display(self) -> None:
        now, since = time.perf_counter(), self._speed
        lapse = now - since[0]
        per_s = (self.iter - since[1]) / (lapse if lapse else 1)
        logger.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter, fmt(per_s), fmt(lapse),
                    self.param.display, fmt(self.smoothed_loss))
        self._speed = (now, self.iter)
        scalars = {"train/loss": float(self.smoothed_loss), "train/iter_per_s": float(per_s)}
        scalars.update(display.log_train_outputs(self.net))
        scalars.update(self.parallel.scalars())
        self._report(scalars)

    def apply_update(self) -> None:
        """Caffe's SGDSolver::ApplyUpdate: the learning rate, then (``arrival.py``) gradient clipping
        and per parameter normalization, regularization, the update rule and ``data -= diff``; each
        blob as soon as its gradient is there, the rest later."""
        rate = self.get_learning_rate()
        if self.param.display and self.iter % self.param.display == 0:
            logger.info("Iteration %d, lr = %s", self.iter, fmt(rate))
            self._report({"train/lr": float(rate)})
        self.updates.apply(rate, self.iter)

    # ---------------------------------------------------------------------------------------- testing
    def test_all(self) -> None:
        self.updates.finish()
        for test_net_id in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.test(test_net_id)

    def test(self, test_net_id: int = 0) -> None:
        """Caffe's Test: ``test_iter`` forward passes; logs the mean of every output. What is tested is
        the model (``Parallel.model``): the weights, or under an asynchronous exchange rule the centre
        variable or rank 0's weights."""
        logger.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        self.updates.finish()
        with self.parallel.model():
            self._test_model(test_net_id)

    def _test_model(self, test_net_id: int) -> None:
        p = self.param
        test_net = self.test_nets[test_net_id]
        test_net.share_with(self.net)
        iterations = p.test_iter[test_net_id]
        scores = None
        loss = f32(0)
        # Each pass's loss and outputs are read once the next pass is queued: on a GPU the device then
        # goes on with that pass while the host reads (net_loss.py); the sums are the same.
        previous = None
        for _ in range(iterations):
            snap, stop = self.take_requests()
            if snap:
                self.snapshot()
            if stop:
                self.requested_early_exit = True
            if self.requested_early_exit:
                break
            queued = (test_net.forward_queued(), display.queued_test_outputs(test_net))
            if previous is not None:
                scores, loss = self._add_test_pass(previous, scores, loss)
            previous = queued
        if self.requested_early_exit:
            logger.info("Test interrupted.")
            return
        if previous is not None:
            scores, loss = self._add_test_pass(previous, scores, loss)
        if scores is not None or p.test_compute_loss:
            scores, loss = self.parallel.reduce_test_outputs(scores, loss)
        reported = {}
        if p.test_compute_loss:
            loss /= f32(iterations)
            logger.info("Test loss: %s", fmt(loss))
            reported[f"test{test_net_id}/loss"] = float(loss)
        if scores is not None:
            self.test_scores, scalars = display.log_test_outputs(test_net, test_net_id, scores, iterations)
            reported.update(scalars)
        self._report(reported)

    def _add_test_pass(self, queued, scores, loss):
        """(scores, loss) with a test pass's ``queued`` (loss, outputs) added, in float32 as Caffe adds them."""
        queued_loss, outputs = queued
        if self.param.test_compute_loss:
            loss += f32(queued_loss.value())
        values = backend.to_host(outputs)
        return (values.copy() if scores is None else scores + values), loss

    # ---------------------------------------------------------------------------------------- snapshots
    def snapshot(self) -> tuple[str, str]:
        """Write ``<prefix>_iter_<iter>`` model and state files; returns their paths. Refuses (with
        NonFiniteParamsError, writing nothing) when a parameter is not finite. With several ranks
        every rank calls it; one writes the files, with every rank's resume state in the state file."""
        self.updates.finish()
        bad = non_finite_params(self.net)
        if bad:
            raise NonFiniteParamsError(f"Iteration {self.iter}: not snapshotting non-finite parameters "
                                       f"({', '.join(bad)})", self.iter, bad[0].split("[")[0])
        self.parallel.snapshot(_snapshot.rank_state(self), self.history,
                               lambda rank_states: _snapshot.write_snapshot(self, rank_states))
        self._last_snapshot_iter = self.iter
        return _snapshot.snapshot_paths(self.param, self.iter)

    def restore(self, path) -> None:
        """Restore a ``.solverstate`` / ``.solverstate.h5`` written by Caffe or netdef: iter,
        current_step, history, the learned_net weights, and netdef's random/data state if present."""
        self.updates.finish()
        _snapshot.restore(self, path)
        self.parallel.restored()

    # ---------------------------------------------------------------------------------------- the end
    def close(self) -> None:
        """Release the parallel seam's resources and close the data sources (prefetch threads, open
        databases)."""
        if self._closed:
            return
        self._closed = True
        if self._device_memory is not None:
            self._device_memory.close()
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
