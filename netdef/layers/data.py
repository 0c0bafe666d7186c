"""Layers that produce blobs without bottoms: Input, DummyData, MemoryData and Parameter.

None of them has a backward pass into bottoms (they have none); Parameter is the one with a
learnable blob, whose gradient is the gradient of its top.
"""
from __future__ import annotations

import struct

import numpy as np

from ..blob import Blob
from ..fillers import fill
from ..proto import netdef_pb2 as pb
from .base import DataSource, Layer, register_layer


def _shape(blob_shape) -> tuple:
    return tuple(int(d) for d in blob_shape.dim)


# ---------------------------------------------------------------------------------------------- Input
@register_layer("Input")
class InputLayer(Layer):
    """Blobs the user fills (deploy nets).

    top[i]: ``input_param.shape`` (given once for every top, once per top, or not at all, in which
            case the shape is left to the user). Reshape does nothing, so a blob the user reshapes
            keeps its new shape; forward does nothing.
    """

    exact_num_bottom = 0
    min_top = 1

    def setup(self, bottom, top):
        shapes = self.layer_param.input_param.shape
        if len(shapes) not in (0, 1, len(top)):
            raise self.error(f"must specify 'shape' once, once per top blob, or not at all: "
                             f"{len(top)} tops vs. {len(shapes)} shapes")
        for i, blob in enumerate(top):
            if shapes:
                blob.reshape(_shape(shapes[0 if len(shapes) == 1 else i]))

    def reshape(self, bottom, top):
        """Nothing: the shapes are set up once and then belong to the user."""

    def forward(self, bottom, top):
        """Nothing: the user writes the data."""


# ---------------------------------------------------------------------------------------------- DummyData
@register_layer("DummyData")
class DummyDataLayer(Layer):
    """Blobs filled by fillers (for tests and benchmarks).

    top[i]: ``dummy_data_param.shape`` (once for all tops, or once per top), or the legacy
            num x channels x height x width (each field once, or once per top).
    Values: ``data_filler`` (none: constant 0; one for every top; or one per top). A top with a
    constant filler is filled once at setup; the others are refilled at every forward (as Caffe).
    """

    exact_num_bottom = 0
    min_top = 1

    def setup(self, bottom, top):
        param = self.layer_param.dummy_data_param
        n = len(top)
        fillers = list(param.data_filler)
        if len(fillers) not in (0, 1, n):
            raise self.error(f"number of data fillers must be 0, 1 or the number of tops ({n}), got {len(fillers)}")
        legacy = [param.num, param.channels, param.height, param.width]
        legacy_count = sum(len(f) for f in legacy)
        if param.shape and legacy_count:
            raise self.error("both shape and legacy fields (num, channels, height, width) were specified")
        if len(param.shape) not in (0, 1, n):
            raise self.error(f"number of shapes must be 0, 1 or the number of tops ({n}), got {len(param.shape)}")
        if not param.shape and not legacy_count:
            raise self.error("no shape given: set dummy_data_param.shape (or num, channels, height, width)")
        if legacy_count:
            for name, field in zip(("num", "channels", "height", "width"), legacy):
                if len(field) not in (1, n):
                    raise self.error(f"{name} must be specified once, or once per top blob ({n})")
        if not fillers:
            fillers = [pb.FillerParameter(type="constant", value=0)]
        self.fillers = fillers
        for i, blob in enumerate(top):
            if legacy_count:
                blob.reshape(tuple(int(f[0] if len(f) == 1 else f[i]) for f in legacy))
            else:
                blob.reshape(_shape(param.shape[0 if len(param.shape) == 1 else i]))
        self.shapes = [blob.shape for blob in top]
        # Constant blobs are filled here once and never again; the others at every forward.
        for i, blob in enumerate(top):
            if self._filler(i).type == "constant":
                fill(blob, self._filler(i))

    def _filler(self, i: int) -> pb.FillerParameter:
        return self.fillers[0 if len(self.fillers) == 1 else i]

    def reshape(self, bottom, top):
        """Nothing: the shapes are fixed at setup."""

    def forward(self, bottom, top):
        for i, blob in enumerate(top):
            if self._filler(i).type != "constant":
                fill(blob, self._filler(i))


# ---------------------------------------------------------------------------------------------- MemoryData
@register_layer("MemoryData")
class MemoryDataLayer(DataSource):
    """Batches taken in turn from arrays handed over with ``set_input_arrays`` (pycaffe's
    ``net.set_input_arrays``).

    top[0]: (batch_size x channels x height x width) data.
    top[1]: (batch_size) labels.
    Each forward hands out the next ``batch_size`` items and wraps around to the start after the
    last one. No transformation is applied to the arrays (Caffe applies none either).
    ``data_state()`` / ``restore_data_state()`` save and restore the position of the next batch
    (not the arrays, which are the user's: set them first, since setting them rewinds).
    """

    exact_num_bottom = 0
    exact_num_top = 2

    def setup(self, bottom, top):
        param = self.layer_param.memory_data_param
        self.batch_size = int(param.batch_size)
        self.channels = int(param.channels)
        self.height = int(param.height)
        self.width = int(param.width)
        if self.batch_size * self.channels * self.height * self.width <= 0:
            raise self.error("batch_size, channels, height, and width must be specified and positive "
                             "in memory_data_param")
        self._data = None
        self._labels = None
        self.n = 0
        self.pos = 0

    def reshape(self, bottom, top):
        top[0].reshape(self.batch_size, self.channels, self.height, self.width)
        top[1].reshape(self.batch_size)

    def set_input_arrays(self, data, labels) -> None:
        """Use ``data`` (N x channels x height x width) and ``labels`` (N values) from now on,
        starting at item 0. N must be a multiple of batch_size. The arrays are referenced, not
        copied (as Caffe), so later changes to them show in later batches."""
        data = np.asarray(data)
        labels = np.asarray(labels)
        item = (self.channels, self.height, self.width)
        if data.ndim != 4 or tuple(data.shape[1:]) != item:
            raise self.error(f"data array must have shape (N, {self.channels}, {self.height}, {self.width}), "
                             f"got {data.shape}")
        if labels.ndim == 0 or labels.size != labels.shape[0]:
            raise self.error(f"labels array must hold one value per item (shape (N,) or (N, 1, 1, 1)), got {labels.shape}")
        if data.shape[0] != labels.shape[0]:
            raise self.error(f"data and labels must have the same first dimension: {data.shape[0]} vs {labels.shape[0]}")
        if data.shape[0] == 0 or data.shape[0] % self.batch_size:
            raise self.error(f"first dimensions of input arrays must be a (nonzero) multiple of batch size "
                             f"{self.batch_size}, got {data.shape[0]}")
        self._data = data
        self._labels = labels.reshape(-1)
        self.n = data.shape[0]
        self.pos = 0

    # Caffe's C++ name for the same operation.
    def reset(self, data, labels) -> None:
        self.set_input_arrays(data, labels)

    def set_batch_size(self, batch_size: int) -> None:
        if batch_size <= 0:
            raise self.error(f"batch size must be positive, got {batch_size}")
        self.batch_size = int(batch_size)

    def forward(self, bottom, top):
        if self._data is None:
            raise self.error("MemoryData needs its arrays: call set_input_arrays(data, labels) before forward")
        self.reshape(bottom, top)
        end = self.pos + self.batch_size
        if end <= self.n:
            rows = slice(self.pos, end)
        else:
            # Only after set_batch_size to a size that does not divide N (Caffe would read past
            # the end of the arrays): take the batch cyclically instead.
            rows = np.arange(self.pos, end) % self.n
        # Copies, so that an in-place layer above cannot write into the user's arrays.
        top[0].data = np.array(self._data[rows], dtype=top[0].dtype)
        top[1].data = np.array(self._labels[rows], dtype=top[1].dtype)
        self.pos = end % self.n

    # An int64 item index, little-endian: the whole state, as the arrays belong to the user.
    _STATE_FORMAT = "<q"

    def data_state(self) -> bytes:
        """Where the next batch starts, as bytes for ``restore_data_state``."""
        return struct.pack(self._STATE_FORMAT, int(self.pos))

    def restore_data_state(self, state: bytes) -> None:
        """Make the next batch start where it did when ``data_state()`` was taken. Call it after
        ``set_input_arrays``, which rewinds to item 0."""
        state = bytes(state)
        if len(state) != struct.calcsize(self._STATE_FORMAT):
            raise self.error(f"restore_data_state: not a MemoryData state ({len(state)} bytes)")
        (pos,) = struct.unpack(self._STATE_FORMAT, state)
        if self._data is None:
            if pos == 0:
                return  # nothing to restore: arrays set later start at item 0 anyway
            raise self.error(f"restore_data_state: the state says item {pos}, but no arrays are set; call "
                             f"set_input_arrays first (it rewinds to item 0)")
        if not 0 <= pos < self.n:
            raise self.error(f"restore_data_state: the state says item {pos}, but the arrays hold {self.n} items")
        self.pos = pos


# ---------------------------------------------------------------------------------------------- Parameter
@register_layer("Parameter")
class ParameterLayer(Layer):
    """A learnable blob presented as a top (e.g. to feed a learned tensor into other layers).

    blobs[0]: ``parameter_param.shape``, zero at start (Caffe has no filler here).
    top[0]:   the same shape, holding the blob's values.
    Backward adds the top's gradient into the blob's gradient.
    """

    exact_num_bottom = 0
    exact_num_top = 1

    def setup(self, bottom, top):
        shape = _shape(self.layer_param.parameter_param.shape)
        if self.blobs:
            if tuple(self.blobs[0].shape) != shape:
                raise self.error(f"stored blob has shape {self.blobs[0].shape}, parameter_param.shape is {shape}")
        else:
            self.blobs = [Blob(shape, dtype=top[0].dtype)]
            self.blobs[0].data[...] = 0

    def reshape(self, bottom, top):
        top[0].reshape(self.blobs[0].shape)

    def forward(self, bottom, top):
        top[0].data = self.blobs[0].data.copy()

    def backward(self, top, propagate_down, bottom):
        if self.param_propagate_down and self.param_propagate_down[0]:
            self.blobs[0].diff += top[0].diff
