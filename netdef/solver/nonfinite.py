"""A NaN or an infinity in training: the errors that stop it, naming where it was found.

netdef goes beyond Caffe here: a non-finite loss stops training before that iteration's update, so the
weights in memory and the snapshots on disk are the last good ones, and a snapshot of non-finite
weights is refused.
"""
from __future__ import annotations

from .. import backend


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


def _finite(array) -> bool:
    return bool(backend.get_array_module(array).isfinite(array).all())


def non_finite_params(net) -> list[str]:
    """The parameter blobs of ``net`` holding a NaN or an infinity, as ``layer[j]``."""
    return [f"{layer.name}[{j}]" for layer in net.layers for j, b in enumerate(layer.blobs) if not _finite(b.data)]


def non_finite_loss(net, iteration: int, loss) -> NonFiniteLossError:
    """The error for a non-finite ``loss`` of ``net``'s forward at ``iteration``: the first top that is
    not finite and the parameters that are not."""
    culprit = None
    for layer in net.layers:
        for name in net.top_names[layer.name]:
            data = net.blobs[name].data
            if data.dtype.kind == "f" and not _finite(data):
                culprit = (layer, name)
                break
        if culprit:
            break
    bad_params = non_finite_params(net)
    where = (f"; first non-finite output: top {culprit[1]!r} of layer {culprit[0].name!r} ({culprit[0].type})"
             if culprit else "")
    params = f"; non-finite parameters: {', '.join(bad_params)}" if bad_params else ""
    return NonFiniteLossError(f"Iteration {iteration}: loss is {float(loss)}{where}{params}. Training stopped "
                              f"before this iteration's update (the weights and snapshots are the last good ones)",
                              iteration, culprit[0].name if culprit else None)
