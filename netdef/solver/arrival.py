"""Updates applied as their gradients arrive: how the loop overlaps a gradient exchange.

Caffe updates every parameter blob once backward is over. When the gradients are combined over
several processes, bucket by bucket while backward goes on, ``ArrivalUpdates`` updates each blob as
soon as its combined gradient is there; a blob whose gradient is still on its way is updated just
before the next iteration's forward of the first layer that uses it (a ``before_forward`` hook on the
train net), so the exchange overlaps the rest of backward and the next forward. Every blob gets the
same update, bit for bit, as when all are updated at once (``step.py`` does the arithmetic; an
update remembers the rate and iteration it belongs to). ``clip_gradients`` needs the norm of every
gradient, so with it every update waits for the whole exchange. Everything still pending is applied
by ``finish()``, which the solver calls before a test, a snapshot, a restore and at the end of a step.

The updates talk to the exchange through the calls of ``GradientExchange``, whose defaults are one
process's (every gradient is final where backward leaves it). The parallel part connects its own
(``Parallel.attach``) and may observe the updates for its measurements (``UpdateObserver``). Where
these calls fall within an iteration is written in ``parallel.py``.
"""
from __future__ import annotations

import time

from .step import ParameterUpdate


class GradientExchange:
    """The exchange as the updates see it; this class is one process's. The distributed exchange
    rules derive from it (``netdef.comm.exchange.ExchangeRule``)."""

    def gradients_ready(self, param_ids) -> None:
        """The gradients of ``param_ids`` are final for this iteration (from the net's backward hook,
        in the last of the ``iter_size`` passes)."""

    def backward_done(self) -> None:
        """The last pass's backward has ended."""

    def arrived(self, param_ids) -> list[int]:
        """Of ``param_ids``, those whose combined gradient is in its diff now, without waiting."""
        return list(param_ids)

    def wait_for(self, param_ids) -> None:
        """Block until the combined gradients of ``param_ids`` are in their diffs."""

    def take_divisor(self, param_id: int):
        """What the arrived diff of ``param_id`` must still be divided by: the rank count where the
        exchange left the sum over the ranks for the update to average in its own pass over the blob
        (one memory pass fewer), 1 otherwise. The caller divides; a second call returns 1."""
        return 1

    def mixes_after_update(self, iteration: int) -> bool:
        """Whether ``after_update`` of ``iteration`` changes the parameters, so that every update of
        the iteration must be applied before the iteration ends."""
        return False

    def after_update(self, iteration: int) -> None:
        """Every parameter blob has been updated for ``iteration``. This may happen during the next
        iteration's forward, after its ``begin_iteration``: what the call does must depend on the
        argument, not on the iteration the exchange was last told of."""


class UpdateObserver:
    """Told what the updates waited for and did, for measurements; every call does nothing here.
    Times are ``time.perf_counter()`` seconds."""

    def arrivals_checked(self, start: float, end: float) -> None:
        """The update asked which gradients had arrived (and took them)."""

    def waited(self, param_ids, start: float, end: float) -> None:
        """The updates blocked until the gradients of ``param_ids`` had arrived."""

    def blob_updated(self, param_id: int, start: float, end: float) -> None:
        """Blob ``param_id`` was updated."""

    def applied(self) -> None:
        """The iteration's update is applied, as far as its gradients had arrived."""


class _Pending:
    """The updates of one iteration not applied yet: its rate and iteration (the next iteration may
    have begun when they are applied) and the parameter ids still to update."""

    def __init__(self, rate, iteration: int, param_ids):
        self.rate = rate
        self.iteration = iteration
        self.remaining = dict.fromkeys(param_ids)  # ordered, O(1) membership
        self.diffs_cleared = False


class ArrivalUpdates:
    """The updates of ``net``'s learnable blobs, each applied as its gradient arrives (see the module
    docstring). ``update``: the arithmetic of one blob's update."""

    def __init__(self, net, update: ParameterUpdate):
        self.net = net
        self.update = update
        self.exchange = GradientExchange()
        self._observers: list[UpdateObserver] = []
        self._pending: _Pending | None = None
        self._exchanging = False  # the last pass's backward is running: its final gradients go out
        self._layer_param_ids = [net.layer_learnable_ids(li) for li in range(len(net.layers))]
        self._hooked = False

    def connect(self, exchange: GradientExchange) -> None:
        """Take the gradients from ``exchange`` from now on. Its gradients may arrive during backward
        and after it, so the net's hooks hand them over and make a forward wait for its own: one
        process's exchange needs neither (every update is applied in ``apply``). The hooks may be
        called at the edges of stretches replayed from CUDA graphs."""
        self.exchange = exchange
        if not self._hooked:
            self.net.register_backward_hook(self._gradients_final, at_run_edges=True)
            self.net.register_layer_hooks(before_forward=self._before_forward, at_run_edges=True)
            self._hooked = True

    def observe(self, observer: UpdateObserver) -> None:
        self._observers.append(observer)

    # ---------------------------------------------------------------------------------------- the iteration
    def clear_diffs(self) -> None:
        """Caffe's ClearParamDiffs at the start of an iteration, for the blobs whose update is done
        (the others are cleared once updated)."""
        if self._pending is None:
            self.net.clear_param_diffs(deferred=True)
            return
        self._pending.diffs_cleared = True
        for param_id, blob in enumerate(self.net.learnable_params):
            if param_id not in self._pending.remaining:
                blob.defer_zero_diff()

    def backward(self) -> None:
        """The backward of the last of an iteration's passes: each gradient goes to the exchange as
        it becomes final, so that iter_size > 1 exchanges once."""
        self._exchanging = True
        try:
            self.net.backward()
        finally:
            self._exchanging = False
        self.exchange.backward_done()

    def apply(self, rate, iteration: int) -> None:
        """Caffe's ApplyUpdate at learning rate ``rate``: clip the gradients (which waits for all of
        them), then update each blob whose gradient has arrived; the others follow as theirs arrive."""
        all_ids = list(range(len(self.net.learnable_params)))
        if self.update.clips:
            self._wait(all_ids)
            for param_id in all_ids:  # the norm is of the combined gradients
                self.update.divide(param_id, self.exchange.take_divisor(param_id))
        self.update.clip_gradients()
        self._pending = _Pending(rate, iteration, all_ids)
        self._apply(self._arrived(all_ids))
        if self.exchange.mixes_after_update(iteration):
            self.finish()
        for observer in self._observers:
            observer.applied()

    def finish(self) -> None:
        """Apply every update still waiting for its gradient."""
        if self._pending is not None:
            ids = list(self._pending.remaining)
            self._wait(ids)
            self._apply(ids)

    # ---------------------------------------------------------------------------------------- the hooks
    def _gradients_final(self, layer_index: int, param_ids) -> None:
        if self._exchanging:
            self.exchange.gradients_ready(param_ids)

    def _before_forward(self, layer_index: int) -> None:
        # The next iteration's forward of a layer waits only for that layer's own parameters.
        if self._pending is not None:
            ids = [i for i in self._layer_param_ids[layer_index] if i in self._pending.remaining]
            if ids:
                self._wait(ids)
                self._apply(ids)

    # ---------------------------------------------------------------------------------------- the exchange
    def _arrived(self, param_ids) -> list[int]:
        if not self._observers:
            return self.exchange.arrived(param_ids)
        start = time.perf_counter()
        ids = self.exchange.arrived(param_ids)
        end = time.perf_counter()
        for observer in self._observers:
            observer.arrivals_checked(start, end)
        return ids

    def _wait(self, param_ids) -> None:
        if not self._observers:
            self.exchange.wait_for(param_ids)
            return
        start = time.perf_counter()
        self.exchange.wait_for(param_ids)
        end = time.perf_counter()
        for observer in self._observers:
            observer.waited(param_ids, start, end)

    def _apply(self, param_ids) -> None:
        pending = self._pending
        ids = [param_id for param_id in dict.fromkeys(param_ids) if param_id in pending.remaining]
        if len(ids) == len(self.net.learnable_params) and not self._observers:
            self._update_all(ids)
            for param_id in ids:
                self._done(param_id)
        else:
            for param_id in ids:
                start = time.perf_counter() if self._observers else 0.0
                self.update.apply(param_id, pending.rate, pending.iteration, self.exchange.take_divisor(param_id))
                self._done(param_id)
                if self._observers:
                    end = time.perf_counter()
                    for observer in self._observers:
                        observer.blob_updated(param_id, start, end)
        if not pending.remaining:
            self._pending = None
            self.exchange.after_update(pending.iteration)

    def _update_all(self, param_ids) -> None:
        """Every blob's update at once where ``ParameterUpdate.apply_all`` can (one launch on a GPU
        instead of one per blob), else one by one. Only for all the blobs together: a subset that
        changes from call to call (gradients arriving over the ranks) would upload the kernel's tables
        each time."""
        pending = self._pending
        # Taken once, and kept for the one-by-one path if the update declines (a second call gives 1).
        divisors = [self.exchange.take_divisor(param_id) for param_id in param_ids]
        if not self.update.apply_all(param_ids, pending.rate, pending.iteration, divisors):
            for param_id, divisor in zip(param_ids, divisors):
                self.update.apply(param_id, pending.rate, pending.iteration, divisor)

    def _done(self, param_id: int) -> None:
        """Blob ``param_id``'s update of the pending iteration is applied."""
        if self._pending.diffs_cleared:
            # The iteration after this update has begun and cleared the others.
            self.net.learnable_params[param_id].defer_zero_diff()
        del self._pending.remaining[param_id]
