"""The loss of a forward pass, read when the caller chooses.

A loss layer's weighted top is summed where it lies when its layer runs: on a GPU, a device scalar
queued behind the layer, and its copy to pinned host memory is queued right behind it, with an event
after the copy (``DeviceRead``). Reading the loss (``QueuedLoss.value``) waits for that event only,
so a caller that queues backward first, as the solver's training pass does, waits for the end of
forward while the device runs backward, and goes on queueing the update and the next forward while
backward still runs: the device never runs dry for the read. (Reading the device scalar itself would
copy it on the compute stream, behind backward.) On the CPU the sums are plain NumPy scalars and
reading costs nothing.

The value is computed as Caffe's ForwardFromTo adds it (``loss += weight * sum(top)``, in the order
the layers ran), in float64 on the host from each top's float32 sum, wherever the pass ran from
(eagerly, or around replayed CUDA graphs), so reading later changes no answer.
"""
from __future__ import annotations

import numpy as np

from . import backend


class DeviceRead:
    """A device scalar (``value``, a CuPy array of one value) on its way to pinned host memory: the copy
    and an event after it are queued on the current stream at once, behind the work that makes the
    value and ahead of all later work, so ``float()`` waits for nothing queued after it."""

    __slots__ = ("_value", "_host", "_copied")

    def __init__(self, cupy, value):
        stream = cupy.cuda.get_current_stream()
        self._value = value  # alive until the copy has run
        self._host = np.frombuffer(cupy.cuda.alloc_pinned_memory(value.dtype.itemsize), value.dtype, 1)
        cupy.asnumpy(value.reshape(1), stream=stream, out=self._host, blocking=False)
        # A blocking-sync event: the host may wait for a whole forward here, asleep rather than
        # spinning a core that the data threads could use.
        self._copied = cupy.cuda.Event(block=True, disable_timing=True)
        self._copied.record(stream)

    def __float__(self) -> float:
        self._copied.synchronize()
        return float(self._host[0])

    def __del__(self):
        # CuPy's pinned pool hands a dropped buffer out again at once (to a data batch, say): a copy
        # into it must have run first, also for a loss dropped unread (a pass that failed).
        try:
            self._copied.synchronize()
        except Exception:  # noqa: BLE001 - at exit CUDA may be gone, and the buffer with it
            pass


class QueuedLoss:
    """The weighted sums of a forward pass's loss tops, in the order their layers ran."""

    __slots__ = ("_terms",)

    def __init__(self):
        self._terms: list[tuple[float, object]] = []

    def add(self, weight: float, total) -> None:
        """A top's sum ``total`` (a NumPy scalar, or a device scalar not yet read) weighted by ``weight``."""
        xp = backend.get_array_module(total)
        self._terms.append((weight, total if xp is np else DeviceRead(xp, total)))

    def extend(self, other: "QueuedLoss") -> None:
        """The terms of a later part of the same pass."""
        self._terms.extend(other._terms)

    def value(self) -> float:
        """The loss: waits for the device where a sum's copy is still queued there."""
        loss = 0.0
        for weight, total in self._terms:
            loss += weight * float(total)
        return loss
