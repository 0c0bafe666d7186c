"""The solver's seam to parallelism, and the one place where the calls of an iteration are in order.

The Solver holds one ``Parallel`` (``Solver(..., parallel=...)``) and calls it at fixed points of its
loop: lifecycle, tests, agreement between the processes, snapshots. It never knows how many processes
there are or how they talk. ``Parallel`` itself is one process's implementation (every call does what
one process needs, which is mostly nothing); data parallelism over MPI is
``netdef.comm.data_parallel.DataParallel``. The gradients do not pass through this seam: the solver's
``ArrivalUpdates`` (``arrival.py``) talks to the exchange (a ``GradientExchange``) that ``attach``
connects, and a parallel implementation measures an iteration by observing the net's layer hooks
and the updates (``UpdateObserver``), not through calls of its own.

One training run, as the calls it makes (``parallel.`` this seam, ``exchange.`` the GradientExchange,
``updates.`` the solver's ArrivalUpdates, ``net.`` the train net)::

    parallel.prepare(param)                the solver file is read; the nets are not built yet
    net, test nets, update rule built; updates = ArrivalUpdates(net): it hooks the net's backward
                                           (gradients final) and each layer's forward (wait for its
                                           parameters' updates)
    parallel.attach(net, test_nets, updates)   connects the exchange: updates.connect(exchange)
    step(n):
      parallel.begin_step(iter, current_step)  the first makes the ranks agree and start alike
      per iteration:
        updates.clear_diffs()              Caffe's ClearParamDiffs (blobs still to update keep theirs)
        test every test net                when test_interval divides iter (see "a test" below)
        on_start callbacks
        parallel.begin_iteration(iter)
        per pass of iter_size:
          net.forward                      each layer first waits for its parameters' pending updates:
                                           exchange.wait_for(ids), then their updates
          net.backward                     the last pass only: exchange.gradients_ready(ids) from the
                                           net's backward hook each time some gradients are final,
                                           then exchange.backward_done()
        display                            the smoothed loss and the outputs; parallel.scalars()
        on_gradients_ready callbacks
        apply_update: rate = lr policy(iter); updates.apply(rate, iter):
          clip_gradients >= 0:             exchange.wait_for(all), exchange.take_divisor(id) each
          exchange.arrived(all)            the blobs whose gradient is there are updated now:
                                           exchange.take_divisor(id), then the update (step.py)
          exchange.mixes_after_update(iter) if true: every update now (updates.finish())
          exchange.after_update(iter)      once every blob of the iteration is updated, which may be
                                           during the next iteration's forward
        iter += 1
        after_update callbacks
        parallel.agree_requests(snapshot, stop)   then snapshot and/or stop, on every rank alike
      updates.finish()                     every update still pending
    a test: updates.finish(); with parallel.model(): test_iter forwards; parallel.reduce_test_outputs
    a snapshot: updates.finish(); parallel.snapshot(own resume state, history, write)
    a restore: updates.finish(); the files read; parallel.restore_rank_state(own, where, history)
               when the state file has netdef's state; parallel.restored()
    parallel.end_training()                after solve()'s last step (collective)
    parallel.close()                       local only: it also runs when this rank fails

``rank``, ``size`` and ``writes_snapshots`` say which process this is; the resume state
(``snapshot.py``) uses them.
"""
from __future__ import annotations

import contextlib


class Parallel:
    """One process: the default implementation of the seam (see the module docstring)."""

    rank = 0
    size = 1
    writes_snapshots = True

    # ---------------------------------------------------------------------------------------- lifecycle
    def prepare(self, param) -> None:
        """The solver's upgraded SolverParameter, before any net is built (may set its random_seed)."""

    def attach(self, net, test_nets, updates) -> None:
        """The train net, the test nets and the solver's ``ArrivalUpdates`` are built: connect the
        gradient exchange to the updates (one process keeps theirs, which has every gradient at once)."""

    def begin_step(self, iteration: int, current_step: int) -> None:
        """At the start of every step(), from ``iteration`` (and the rate policy's ``current_step``)."""

    def begin_iteration(self, iteration: int) -> None:
        """Before the forward passes of ``iteration``."""

    def scalars(self) -> dict:
        """``{tag: float}`` measured since the last call, for the solver's scalar observers
        (TensorBoard), at each display: none for one process."""
        return {}

    def end_training(self) -> None:
        """After solve()'s last step (collective: every process calls it)."""

    def close(self) -> None:
        """Release what the parallel part holds (local: it also runs when this process fails)."""

    # ---------------------------------------------------------------------------------------- agreement
    def agree_requests(self, snapshot: bool, stop: bool) -> tuple[bool, bool]:
        """The signals' requests, as every process acts on them now: requested on any of them (the
        processes may act on requests a call later than they were made, all at the same call)."""
        return snapshot, stop

    # ---------------------------------------------------------------------------------------- tests
    def model(self):
        """A context in which the net's parameters hold the model that is tested and saved, which
        differs from a process's own training weights under the asynchronous exchange rules
        (collective on entry, local on exit)."""
        return contextlib.nullcontext()

    def reduce_test_outputs(self, scores, loss):
        """A test's summed outputs (float32 vector or None) and loss, combined over the processes."""
        return scores, loss

    # ---------------------------------------------------------------------------------------- snapshots
    def snapshot(self, own, history, write) -> None:
        """Collective: complete what is in flight between the processes, put the model into the net,
        add this process's parallel state to ``own`` (its NetdefRankState; ``history``: the update
        rule's blobs), and where this process writes the snapshot call ``write(states)`` with every
        process's serialized state, by rank."""
        write([own.SerializeToString()])

    def restore_rank_state(self, state, where: str, history) -> None:
        """After a restore (``where``: the state file) has put the model into the net: this process's
        NetdefRankState, or None when the snapshot has none for it."""

    def restored(self) -> None:
        """After a restore: the processes agree again at the next begin_step."""
