"""What the solver logs and reports: the displayed loss, the train and test outputs, as Caffe prints them.

- ``LossWindow``: the loss shown at each display, Caffe's running mean over the last ``average_loss``
  iterations (``Solver::UpdateSmoothedLoss``). netdef also keeps it in snapshots, so that a resumed
  run continues the same average (Caffe restarts it, so its resumed logs differ from an uninterrupted
  run's).
- ``log_train_outputs`` and ``log_test_outputs``: Caffe's lines, ``Train net output #i: name = v``
  (with ``(* w = wv loss)`` for a loss output) and ``Test net output #i: ...``, and the same numbers as
  ``{tag: float}`` scalars for the solver's scalar observers (TensorBoard).

Caffe lists a net's outputs in ``std::set<string>`` order, i.e. sorted by name (``output_order``).
"""
from __future__ import annotations

import logging

import numpy as np

from .. import backend
from .step import fmt

logger = logging.getLogger("netdef")
f32 = np.float32


def output_order(net) -> list[str]:
    """Caffe lists a net's outputs in std::set<string> order, i.e. sorted by name (bytes)."""
    return sorted(net.outputs, key=lambda n: n.encode("utf-8"))


def _tag(prefix: str, name: str, index: int, count: int) -> str:
    return f"{prefix}/{name}" if count == 1 else f"{prefix}/{name}[{index}]"


class LossWindow:
    """The displayed loss: the float32 mean of the last ``average_loss`` iterations' losses."""

    def __init__(self, average_loss: int):
        self.average_loss = average_loss
        self.smoothed = f32(0)
        self.losses: list = []
        self.start = 0  # the iteration the window's ring of losses is indexed from
        self.resumed: tuple | None = None

    def restart(self, iteration: int) -> None:
        """A step begins at ``iteration``: a new window, or the one ``resume`` gave."""
        if self.resumed is not None:
            self.smoothed, self.losses, self.start = self.resumed
            self.resumed = None
        else:
            self.smoothed, self.losses, self.start = f32(0), [], iteration

    def resume(self, smoothed: float, losses: list, start: int) -> None:
        """Make the next step continue this window (from a snapshot)."""
        self.resumed = (f32(smoothed), [f32(v) for v in losses], int(start))

    def add(self, loss, iteration: int, start_iter: int | None = None) -> None:
        """The loss of ``iteration``; ``start_iter`` is the iteration the ring of losses is indexed
        from (Caffe's UpdateSmoothedLoss argument), the window's own by default."""
        loss = f32(loss)
        if len(self.losses) < self.average_loss:
            self.losses.append(loss)
            size = len(self.losses)
            self.smoothed = f32((self.smoothed * f32(size - 1) + loss) / f32(size))
        else:
            idx = (iteration - (self.start if start_iter is None else start_iter)) % self.average_loss
            self.smoothed = f32(self.smoothed + (loss - self.losses[idx]) / f32(self.average_loss))
            self.losses[idx] = loss


def log_train_outputs(net) -> dict:
    """Log the train net's outputs as Caffe's display does; returns them as ``train/<output>`` scalars."""
    weights = net.blob_loss_weights
    scalars = {}
    index = 0
    for name in output_order(net):
        values = backend.to_host(net.blobs[name].data).astype(np.float32).ravel()
        weight = f32(weights.get(name, 0.0))
        for k, value in enumerate(values):
            suffix = f" (* {fmt(weight)} = {fmt(weight * value)} loss)" if weight else ""
            logger.info("    Train net output #%d: %s = %s%s", index, name, fmt(value), suffix)
            scalars[_tag("train", name, k, values.size)] = float(value)
            index += 1
    return scalars


def queued_test_outputs(test_net):
    """The test net's outputs after a forward pass, in ``output_order``, as one float32 vector where
    they lie (on a GPU, a device copy queued behind the pass: the next forward may overwrite the
    blobs, and the host reads the copy once that forward is queued)."""
    names = output_order(test_net)
    if not names:
        return np.zeros(0, np.float32)
    xp = backend.get_array_module(test_net.blobs[names[0]].data)
    return xp.concatenate([test_net.blobs[n].data.astype(np.float32).ravel() for n in names])


def log_test_outputs(test_net, test_net_id: int, scores: np.ndarray, iterations: int) -> tuple[dict, dict]:
    """Log the means of a test's summed ``scores`` over ``iterations`` batches as Caffe's Test does;
    returns ({output name: [means]}, their ``test<k>/<output>`` scalars)."""
    weights = test_net.blob_loss_weights
    names = output_order(test_net)
    owners = [n for n in names for _ in range(test_net.blobs[n].count)]
    means: dict[str, list] = {}
    for i, (name, score) in enumerate(zip(owners, scores)):
        mean = f32(score / f32(iterations))
        weight = f32(weights.get(name, 0.0))
        suffix = f" (* {fmt(weight)} = {fmt(weight * mean)} loss)" if weight else ""
        logger.info("    Test net output #%d: %s = %s%s", i, name, fmt(mean), suffix)
        means.setdefault(name, []).append(mean)
    scalars = {_tag(f"test{test_net_id}", name, k, len(values)): float(mean)
               for name, values in means.items() for k, mean in enumerate(values)}
    return means, scalars
