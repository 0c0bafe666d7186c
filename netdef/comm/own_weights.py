"""The part that the asynchronous exchange rules share: every rank trains weights of its own.

Under ``easgd``, ``gossip`` and ``hybrid`` (``elastic.py``, ``gossip.py``) no gradient is averaged:
each rank (or group) applies its own gradients to its own weights and mixes them with the others'
now and then. What is tested and saved is then not any rank's training weights but the model (the
centre variable, or rank 0's weights): ``swap_in_model`` puts it into the net for a test or a
snapshot and ``swap_out_model`` puts the rank's own weights back.

The rules see the learnable parameters as one flat float32 vector in the net's order
(``flat_weights``/``set_flat_weights``): the centre, the messages and the arithmetic of mixing
are all on that vector. On a GPU the vector is gathered on the device and crosses to the host in one
copy through pinned memory (``DeviceFlatWeights``), and back the same way: not one synchronous copy
per blob, which for ResNet-50's 161 blobs was 161 waits each way at every elastic step or gossip.

Resume: a snapshot's model file holds the model; every rank's own weights and update history go
into its ``NetdefRankState`` (``data_parallel.py`` writes them). After a restore the net holds the
model; ``restore_state`` keeps a copy of it (``restored_model``) before the rank's own weights
replace it, and ``resumed`` tells ``broadcast_initial`` not to overwrite them with rank 0's.
"""
from __future__ import annotations

import time

import numpy as np

from .. import backend
from .exchange import ExchangeRule
from .gradient_staging import on_device


class DeviceFlatWeights:
    """The flat float32 vector of parameters on a GPU (``cupy``): a device buffer the blobs are gathered
    into and scattered from, and a pinned host buffer the one transfer each way goes through.
    ``offsets``/``sizes``: each blob's place in the vector."""

    def __init__(self, cupy, offsets: list[int], sizes: list[int]):
        count = int(sum(sizes))
        self.cupy = cupy
        self.offsets, self.sizes = offsets, sizes
        self.device = cupy.zeros(count, dtype=np.float32)
        self.pinned = np.frombuffer(cupy.cuda.alloc_pinned_memory(max(1, count * 4)), np.float32, count)
        self._uploaded = None  # the event after the last host-to-device copy out of ``pinned``

    def gather(self, params) -> np.ndarray:
        """A host copy of the vector (the caller may keep it: the pinned buffer is reused)."""
        for blob, start, size in zip(params, self.offsets, self.sizes):
            self.device[start:start + size] = blob.data.reshape(-1)
        self.device.get(out=self.pinned)  # waits for the gathering kernels and the copy
        return self.pinned.copy()

    def scatter(self, params, flat: np.ndarray) -> None:
        if self._uploaded is not None:
            self._uploaded.synchronize()  # the last upload has read the pinned buffer
        self.pinned[:] = flat
        self.device.set(self.pinned)
        self._uploaded = self.cupy.cuda.get_current_stream().record()
        for blob, start, size in zip(params, self.offsets, self.sizes):
            blob.data[...] = self.device[start:start + size].reshape(blob.shape)


class OwnWeightsRule(ExchangeRule):
    """Base of the rules under which each rank trains its own weights (see the module docstring).
    Subclasses say how the model gets into the net (``load_model``)."""

    trains_own_weights = True

    def __init__(self, comm, net, options=None, measurements=None, clock=time.perf_counter, seed: int = 0):
        super().__init__(comm, net, options, measurements, clock, seed)
        self.sizes = [int(blob.count) for blob in self.params]
        self.offsets = [int(o) for o in np.cumsum([0] + self.sizes[:-1])]
        self.count = int(sum(self.sizes))
        self.resumed = False
        self.restored_model: np.ndarray | None = None
        self._stash: list | None = None  # this rank's own weights while the model is in the net
        self._device = (DeviceFlatWeights(self.params[0].array_module, self.offsets, self.sizes)
                        if on_device(self.params) else None)

    # ------------------------------------------------------------------------------ the flat vector
    def flat_weights(self) -> np.ndarray:
        """A float32 copy of every learnable parameter, back to back, on the host."""
        if self._device is not None:
            return self._device.gather(self.params)
        flat = np.empty(self.count, dtype=np.float32)
        for blob, start, size in zip(self.params, self.offsets, self.sizes):
            flat[start:start + size] = backend.to_host(blob.data).reshape(-1)
        return flat

    def set_flat_weights(self, flat: np.ndarray) -> None:
        if self._device is not None:
            self._device.scatter(self.params, flat)
            return
        for blob, start, size in zip(self.params, self.offsets, self.sizes):
            values = flat[start:start + size].reshape(blob.shape).astype(blob.data.dtype, copy=False)
            blob.data[...] = backend.to_device(values, like=blob.data)

    # ------------------------------------------------------------------------------ the model
    def load_model(self) -> None:
        """Collective: write the model into the net's parameters."""
        raise NotImplementedError

    def swap_in_model(self) -> None:
        self._stash = [backend.to_host(blob.data).copy() for blob in self.params]
        self.load_model()

    def swap_out_model(self) -> None:
        if self._stash is None:
            return
        for blob, values in zip(self.params, self._stash):
            blob.data[...] = backend.to_device(values, like=blob.data)
        self._stash = None

    def own_weights(self) -> list:
        if self._stash is not None:
            return list(self._stash)
        return super().own_weights()

    # ------------------------------------------------------------------------------ resume
    def restore_state(self, state) -> None:
        self.restored_model = self.flat_weights()
        self.resumed = state is not None and len(state.param) > 0

    def take_resumed(self) -> bool:
        """Whether this rank resumes its own weights (once per restore: a later ``broadcast_initial``
        without a restore starts afresh)."""
        resumed, self.resumed = self.resumed, False
        return resumed

    def initial_model(self) -> np.ndarray:
        """The model to start from: the snapshot's after a restore, else the net's weights (rank 0's
        after ``broadcast_initial``)."""
        model, self.restored_model = self.restored_model, None
        return model if model is not None else self.flat_weights()
