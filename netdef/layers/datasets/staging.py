"""Where a data layer's batches are written, and how they reach the device its tops live on.

On the CPU (``HostStaging``) a batch is a host array that the top blob takes as it is. Its memory is
reused for a later batch once nothing refers to the array any more (not the blob, not a view a user
kept): a fresh array of a batch's size is memory the kernel maps and zeroes page by page as the
transform first writes it, a fifth of the data threads' CPU time at ImageNet's crop (benchmarks/
README.md, "Decoded items in reused memory").

On a GPU (``PinnedDeviceStaging``) the prefetch thread writes each batch into page-locked (pinned) host
memory and copies it to the device itself, asynchronously on a copy stream of its own, so that the copy
runs while the layers compute on the compute stream and the forward that takes the batch only makes the
compute stream wait for it (an event; the host does not wait). From pageable memory the copy would be
synchronous, and the forward would wait for it.

Two hazards decide the order of the calls in ``stage``:
- CuPy's memory pool hands a freed device block to the next allocation of the same stream at once. The
  device arrays are allocated on the copy stream, so no compute allocation reuses them early, and the
  copy stream waits for everything the compute stream has queued by then (an event recorded after the
  allocation), so a block that a batch of the compute stream's past still reads is not overwritten.
  Where the compute stream is CUDA's per-thread default stream (``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM``)
  the prefetch thread cannot name it (the handle means the calling thread's own), so the event is
  recorded on the legacy default stream, which follows all work queued on blocking streams.
- The pinned pool reuses a buffer as soon as it is dropped, even while a copy from it is in flight.
  The staging keeps each host buffer until its copy's event has completed, whatever becomes of the
  batch (taken, or discarded when a snapshot is restored).
"""
from __future__ import annotations

import math
import threading
import weakref

import numpy as np


class HostBatch:
    """A batch of host arrays, for tops on the CPU."""

    def __init__(self, arrays):
        self.arrays = arrays

    def take(self) -> list:
        """The arrays for the tops, in order."""
        return self.arrays


# Below this a batch comes from the allocator's own reuse (it maps fresh memory only for large blocks).
REUSED_BATCH_BYTES = 1 << 20
# Released batches kept per size: the prefetch queue and the blob hold the rest of those in use.
SPARE_BATCHES = 2


class HostStaging:
    """Batches in host arrays whose memory is reused once nothing refers to an earlier batch (module
    docstring). A batch array is a view of a flat array made over a memoryview of the kept memory:
    every view of the batch refers to that flat array, so it lives, and its memory stays out of reuse,
    until the last of them is gone."""

    def __init__(self):
        self._spare: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()  # batches are released by whichever thread drops them last

    def allocate(self, shape, dtype) -> np.ndarray:
        """An uninitialised host array, in reused memory when it is large enough to be worth it."""
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if nbytes < REUSED_BATCH_BYTES:
            return np.empty(shape, dtype)
        with self._lock:
            spare = self._spare.get(nbytes)
            memory = spare.pop() if spare else None
        if memory is None:
            memory = np.empty(nbytes, dtype=np.uint8)
        flat = np.frombuffer(memoryview(memory), dtype, count)
        weakref.finalize(flat, self._release, memory)
        return flat.reshape(shape)

    def _release(self, memory: np.ndarray) -> None:
        with self._lock:
            spare = self._spare.setdefault(memory.nbytes, [])
            if len(spare) < SPARE_BATCHES:
                spare.append(memory)

    def spare_bytes(self) -> int:
        """The bytes kept for the next batches."""
        with self._lock:
            return sum(memory.nbytes for spare in self._spare.values() for memory in spare)

    def stage(self, arrays) -> HostBatch:
        return HostBatch(arrays)


class DeviceBatch:
    """A batch on its way to the device: its device arrays and the event that marks the copy done."""

    def __init__(self, arrays, copied, compute_stream):
        self.arrays = arrays
        self.copied = copied
        self.compute_stream = compute_stream

    def take(self) -> list:
        """The device arrays, after the compute stream has been told to wait for their copy."""
        self.compute_stream.wait_event(self.copied)
        return self.arrays


class PinnedDeviceStaging:
    """Batches in pinned host memory, copied to GPU ``device_id`` on a copy stream (module docstring).
    ``compute_stream``: the stream the layers run on (the constructing thread's current stream)."""

    def __init__(self, cupy, device_id: int, compute_stream):
        self.cupy = cupy
        self.device_id = int(device_id)
        self.compute_stream = compute_stream
        # Where the prefetch thread marks what the compute stream has queued (module docstring).
        per_thread = compute_stream.ptr == cupy.cuda.runtime.streamPerThread
        self._compute_stream_seen_from_other_threads = cupy.cuda.Stream.null if per_thread else compute_stream
        self._copy_stream = None
        self._in_flight: list[tuple[object, list]] = []  # (copy event, host arrays it reads)
        self._lock = threading.Lock()

    def allocate(self, shape, dtype) -> np.ndarray:
        """A host array in page-locked memory (it holds the memory while it lives)."""
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        memory = self.cupy.cuda.alloc_pinned_memory(max(1, count * dtype.itemsize))
        return np.frombuffer(memory, dtype, count).reshape(shape)

    def stage(self, arrays) -> DeviceBatch:
        """Start copying ``arrays`` (host, ideally from ``allocate``) to the device; returns at once."""
        cupy = self.cupy
        with cupy.cuda.Device(self.device_id):
            if self._copy_stream is None:
                self._copy_stream = cupy.cuda.Stream(non_blocking=True)
            stream = self._copy_stream
            with stream:
                device = [cupy.empty(a.shape, dtype=a.dtype) for a in arrays]
            stream.wait_event(self._compute_stream_seen_from_other_threads.record())
            for target, source in zip(device, arrays):
                target.set(source, stream=stream)
            copied = stream.record()
        with self._lock:
            self._in_flight = [(event, held) for event, held in self._in_flight if not event.done]
            self._in_flight.append((copied, list(arrays)))
        return DeviceBatch(device, copied, self.compute_stream)


def staging_for(array_module) -> HostStaging | PinnedDeviceStaging:
    """The staging for tops whose arrays live in ``array_module`` (NumPy or CuPy), on the current
    device and stream of the calling thread."""
    if array_module is np:
        return HostStaging()
    cupy = array_module
    return PinnedDeviceStaging(cupy, cupy.cuda.Device().id, cupy.cuda.get_current_stream())
