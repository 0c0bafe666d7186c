"""The own-weights rules' flat vector on a GPU (comm/own_weights.DeviceFlatWeights), against stand-ins
for CuPy's arrays, pinned memory and events, for the bookkeeping: every blob's place in the vector,
the casts, and that an upload out of the pinned buffer is waited for before the host writes it again.
The real transfers run on a GPU (tests/test_gpu.py)."""
from __future__ import annotations

import numpy as np

from netdef.comm.own_weights import DeviceFlatWeights


class DeviceArray(np.ndarray):
    """Host memory with CuPy's ``get(out=...)`` and ``set(...)``."""

    def get(self, out=None):
        np.copyto(out, self)
        return out

    def set(self, values):
        self[...] = values


class StandInCupy:
    def __init__(self):
        stand_in = self
        self.waits = []
        self.pending_upload = False

        class Event:
            def synchronize(self):
                stand_in.waits.append("upload")
                stand_in.pending_upload = False

        class Stream:
            def record(self):
                stand_in.pending_upload = True
                return Event()

        class Cuda:
            alloc_pinned_memory = staticmethod(bytearray)
            get_current_stream = staticmethod(Stream)

        self.cuda = Cuda

    @staticmethod
    def zeros(count, dtype=np.float32):
        return np.zeros(count, dtype=dtype).view(DeviceArray)


class Blob:
    def __init__(self, values):
        self.data = np.asarray(values).view(DeviceArray)
        self.shape = self.data.shape


def test_blobs_gather_into_one_vector_and_scatter_back_in_place_and_type():
    blobs = [Blob(np.arange(6, dtype=np.float32).reshape(2, 3)), Blob(np.array([0.5, -1.5], dtype=np.float64)),
             Blob(np.full((1, 1, 2), 7, dtype=np.float32))]
    sizes = [6, 2, 2]
    cupy = StandInCupy()
    flat = DeviceFlatWeights(cupy, [0, 6, 8], sizes)
    got = flat.gather(blobs)
    np.testing.assert_array_equal(got, [0, 1, 2, 3, 4, 5, 0.5, -1.5, 7, 7])
    assert got.dtype == np.float32 and not np.shares_memory(got, flat.pinned)
    flat.scatter(blobs, got * 2)
    assert cupy.waits == []  # nothing uploaded before
    np.testing.assert_array_equal(blobs[0].data, np.arange(6).reshape(2, 3) * 2)
    assert blobs[1].data.dtype == np.float64 and list(blobs[1].data) == [1.0, -3.0]
    np.testing.assert_array_equal(blobs[2].data, np.full((1, 1, 2), 14))
    flat.scatter(blobs, np.zeros(10, dtype=np.float32))
    assert cupy.waits == ["upload"]  # the first upload had to finish before the pinned buffer was rewritten
    assert all(not b.data.any() for b in blobs)
