"""The loss of a forward pass, read when the caller chooses.

A loss layer's weighted top is summed where it lies when its layer runs: on a GPU, a device scalar
queued behind the layer. Reading the loss (``QueuedLoss.value``) is what waits for the device, so a
caller that queues backward first, as the solver's training pass does, lets the device run backward
while the host waits for the end of forward: the device never runs dry for the read. On the CPU the
sums are plain NumPy scalars and reading costs nothing.

The value is computed as Caffe's ForwardFromTo adds it (``loss += weight * sum(top)``, in the order
the layers ran), in float64 on the host from each top's float32 sum, wherever the pass ran from
(eagerly, or around replayed CUDA graphs), so reading later changes no answer.
"""
from __future__ import annotations


class QueuedLoss:
    """The weighted sums of a forward pass's loss tops, in the order their layers ran."""

    __slots__ = ("_terms",)

    def __init__(self):
        self._terms: list[tuple[float, object]] = []

    def add(self, weight: float, total) -> None:
        """A top's sum ``total`` (a NumPy scalar, or a device scalar not yet read) weighted by ``weight``."""
        self._terms.append((weight, total))

    def extend(self, other: "QueuedLoss") -> None:
        """The terms of a later part of the same pass."""
        self._terms.extend(other._terms)

    def value(self) -> float:
        """The loss: waits for the device where a sum is still queued there."""
        loss = 0.0
        for weight, total in self._terms:
            loss += weight * float(total)
        return loss
