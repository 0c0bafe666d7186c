"""How a GPU's batches are staged (netdef/layers/datasets/staging.py ``PinnedDeviceStaging``), what the
CPU can check: on which stream the prefetch thread marks what the compute stream has queued, before a
batch's copy may write device memory an earlier batch had. A stand-in for CuPy notes each stream's
calls; the copies themselves run on a GPU (tests/test_gpu_data.py)."""
from __future__ import annotations

import contextlib
import types

import numpy as np

from netdef.layers.datasets.staging import PinnedDeviceStaging

PER_THREAD = 2  # CUDA's cudaStreamPerThread handle


class StandInCupy:
    def __init__(self):
        self.calls: list[tuple] = []
        stand_in = self

        class Event:
            def __init__(self, stream):
                self.stream = stream
                self.done = True

        class Stream:
            def __init__(self, ptr=None, non_blocking=False):
                self.ptr = 0x5000 if ptr is None else ptr

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def record(self):
                stand_in.calls.append(("record", self.ptr))
                return Event(self)

            def wait_event(self, event):
                stand_in.calls.append(("wait", self.ptr, event.stream.ptr))

        Stream.null = Stream(ptr=0)
        self.Stream = Stream
        self.cuda = types.SimpleNamespace(Stream=Stream, Device=lambda device_id: contextlib.nullcontext(),
                                          runtime=types.SimpleNamespace(streamPerThread=PER_THREAD))

    def empty(self, shape, dtype):
        return types.SimpleNamespace(set=lambda source, stream: None)


def _staged_waits(compute_ptr: int) -> list[tuple]:
    cupy = StandInCupy()
    staging = PinnedDeviceStaging(cupy, 0, cupy.Stream(ptr=compute_ptr))
    staging.stage([np.zeros((2, 3), np.float32)])
    return [call for call in cupy.calls if call[0] == "wait"]


def test_the_copy_waits_for_what_the_compute_stream_has_queued():
    assert _staged_waits(0x1234) == [("wait", 0x5000, 0x1234)]


def test_a_per_thread_default_compute_stream_is_followed_through_the_legacy_stream():
    # The prefetch thread's cudaStreamPerThread would be its own stream, with nothing queued on it.
    assert _staged_waits(PER_THREAD) == [("wait", 0x5000, 0)]
