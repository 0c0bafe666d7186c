"""The solver's seam to parallelism: the calls the Solver makes at fixed points of its loop.

The Solver holds one ``Parallel`` (``Solver(..., parallel=...)``) and calls it; it never knows how
many processes there are or how they talk. ``Parallel`` itself is the single-process
implementation (every call does what one process needs, which is mostly nothing); data
parallelism over MPI is ``netdef.comm.data_parallel.DataParallel``. In the order the loop calls
them::

    prepare(param)                 the solver file is read, the nets are not built yet
    attach(solver)                 nets and update rule built
    begin_step()                   at the start of every step() (the first makes the ranks agree)
    per iteration:
        begin_iteration(it)
        per pass of iter_size:     forward_done() after the forward, backward_done(last) after the
                                   backward; gradients_final(ids) from the net's backward hooks, in
                                   the last pass only, each time some parameters' gradients are final
        arrived(ids)               of these parameters, the ones whose gradient the update may use now
        wait_gradients(ids)        block until those gradients are all there
        take_divisor(id)           what the blob's diff must still be divided by (its update does it)
        before_update(id), after_update(id)   around each blob's update
        must_finish_updates()      asked after the iteration's update: when true the solver applies
                                   every update now (the parallel part mixes parameters after them)
        updated()                  every blob of the iteration is updated
        end_iteration()
        agree_requests(snap, stop) every rank acts on the same signals at the same iteration
    swap_in_model(), swap_out_model()   around a test and a snapshot: the net holds the model that is
                                   tested and saved (which differs from a rank's own training weights
                                   under the asynchronous exchange rules), then the rank's own again
    reduce_test_outputs(scores, loss)
    settle()                       before a snapshot: nothing in flight between the processes
    save_rank_state(state)         this process's part of its NetdefRankState (own weights...)
    gather_rank_states(own)        for a snapshot: every rank's own state (list on the writer)
    writes_snapshots               whether this process writes the snapshot files
    snapshot_written()
    restore_rank_state(own, where) after a restore loaded the model: this process's NetdefRankState
                                   (None when the snapshot has none for it)
    restored()                     after a restore: the ranks agree again at the next begin_step
    scalars()                      at each display: measurements for the solver's scalar observers
    end_training()                 after solve()'s last step (collective: every rank calls it)
    close()                        local only: it also runs when this rank fails

``rank`` and ``size`` say which process this is; resume state (``snapshot.py``) uses them.
"""
from __future__ import annotations


class Parallel:
    """One process: the default implementation of the seam (see the module docstring)."""

    rank = 0
    size = 1
    writes_snapshots = True

    def prepare(self, param) -> None:
        """The solver's upgraded SolverParameter, before any net is built (may set its random_seed)."""

    def attach(self, solver) -> None:
        """The solver's nets and update rule are built."""

    def begin_step(self) -> None:
        pass

    def begin_iteration(self, iteration: int) -> None:
        pass

    def forward_done(self) -> None:
        pass

    def gradients_final(self, param_ids) -> None:
        pass

    def backward_done(self, last: bool) -> None:
        pass

    def arrived(self, param_ids) -> list[int]:
        """Of ``param_ids``, those whose (combined) gradient is in its diff now, without waiting."""
        return list(param_ids)

    def wait_gradients(self, param_ids) -> None:
        """Block until the gradients of ``param_ids`` are all in their diffs."""

    def take_divisor(self, param_id: int):
        """What the diff of ``param_id``, arrived, must still be divided by to hold the gradient the
        update applies: the rank count where the exchange left the sum over the ranks for the update
        to average in its own pass over the blob (one memory pass fewer on the critical path), 1
        otherwise. The caller divides; a second call for the same iteration returns 1."""
        return 1

    def before_update(self, param_id: int) -> None:
        pass

    def after_update(self, param_id: int) -> None:
        pass

    def must_finish_updates(self) -> bool:
        """Whether every update of this iteration must be applied before ``end_iteration``."""
        return False

    def updated(self) -> None:
        """Every parameter blob of the iteration has been updated."""

    def end_iteration(self) -> None:
        pass

    def agree_requests(self, snapshot: bool, stop: bool) -> tuple[bool, bool]:
        return snapshot, stop

    def reduce_test_outputs(self, scores, loss):
        """A test's summed outputs (float32 vector or None) and loss, combined over the processes."""
        return scores, loss

    def swap_in_model(self) -> None:
        """Collective: the net's parameters hold the model that is tested and saved."""

    def swap_out_model(self) -> None:
        """Local: the net's parameters hold this process's own training weights again."""

    def settle(self) -> None:
        """Collective: complete what is in flight between the processes (before a snapshot)."""

    def save_rank_state(self, state) -> None:
        """Add this process's parallel state to ``state`` (its NetdefRankState)."""

    def restore_rank_state(self, state, where: str) -> None:
        """After a restore (``where``: the state file) has put the model into the net: this process's
        NetdefRankState, or None."""

    def gather_rank_states(self, own: bytes) -> list[bytes] | None:
        """Every process's serialized ``NetdefRankState``, by rank, on the process that writes the
        snapshot (None elsewhere)."""
        return [own]

    def snapshot_written(self) -> None:
        pass

    def restored(self) -> None:
        pass

    def scalars(self) -> dict:
        """``{tag: float}`` measured since the last call, for the solver's scalar observers (TensorBoard):
        none for one process."""
        return {}

    def end_training(self) -> None:
        pass

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return "one process"
