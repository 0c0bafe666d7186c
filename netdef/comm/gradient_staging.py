"""How a bucket's gradients travel between the parameters' diffs and the host buffer that MPI sums.

On the CPU (``HostGradients``) a diff is copied into its bucket (or a bucket of one blob is the diff's
own memory, ``Bucket.pack``), and the average is written back by ``Bucket.unpack``: nothing waits.

On a GPU without a GPU collective (``PinnedDeviceGradients``: the staged path) each bucket has a
buffer in page-locked (pinned) host memory. Packing a gradient records an event on the compute
stream (the diff is final once the kernels queued so far have run), makes a copy stream of the
exchange's own wait for it, and queues the device-to-host copy there: the training thread goes on
queueing the backward of the layers below at once. The exchange starts a bucket's MPI sum only once
its copies are done (``copied``, tested between layers without waiting; ``wait_copied`` when backward
has ended), in bucket order on every rank. Unpacking queues the host-to-device copy of the sum and
the division by the rank count on the copy stream, and makes the compute stream wait for them: the
update that follows, and everything queued after it, runs once the average is in the diff, and the
host does not wait.

Ordering that keeps the buffers safe without any host wait: one copy stream carries, per bucket,
this iteration's device-to-host copies, then (after the host's MPI sum) its host-to-device copy,
then the next iteration's copies, so a pinned buffer is never written while a copy still reads it;
the compute stream waits for the host-to-device copy before anything it queues later (the next
backward writing the diff among it), and the next device-to-host copy waits for the compute stream.

On a GPU whose reduction sums device memory (NCCL: ``nccl_sum.NcclReduction``; ``DeviceBuckets``) the
buckets are device arrays the reduction gave: packing copies a gradient into its bucket on the compute
stream and records an event, and a bucket is ``copied`` once that event has completed, so the
transports start a sum only once its gradients are final on the device. Unpacking copies the average
back on the compute stream; nothing waits there, because a bucket is unpacked only once the host has
seen its reduction's events complete.
"""
from __future__ import annotations

import numpy as np

from .. import backend


class HostGradients:
    """Diffs in host memory: the bucket copies them in and out itself.

    ``asynchronous``: whether a packed bucket is ready only once ``copied`` says so (a GPU's copies);
    ``diffs_may_live_in_buckets``: whether a parameter's diff may be kept in its bucket's memory
    (``AllreduceExchange._keep_gradients_in_buckets``: backward then writes it where it is summed)."""

    asynchronous = False
    diffs_may_live_in_buckets = True

    def trace_to(self, spans) -> None:
        """Record the copies in ``spans`` (a timeline's DeviceSpans; None: nothing to record)."""

    def pack(self, bucket, slot: int, diff) -> None:
        bucket.pack(slot, diff)

    def copied(self, bucket) -> bool:
        """Whether every gradient packed into ``bucket`` is in its host buffer."""
        return True

    def wait_copied(self, bucket) -> None:
        """Block until ``copied(bucket)``."""

    def unpack(self, bucket, slot: int, diff, divisor, leave_division: bool) -> bool:
        """Write the bucket's sum over the ranks, divided by ``divisor``, into ``diff``; see
        ``Bucket.unpack`` for ``leave_division`` and the result."""
        return bucket.unpack(slot, diff, divisor, leave_division)


class _DeviceGradients:
    """What the GPU's stagings share: a bucket is ``copied`` once the event recorded after its last
    gradient's copy (``_copied``, by bucket index) has completed. ``compute_stream``: the stream the
    layers and the updates run on."""

    asynchronous = True
    diffs_may_live_in_buckets = False  # pinned host memory: the device's diffs cannot live there

    def __init__(self, cupy, compute_stream):
        self.cupy = cupy
        self.compute_stream = compute_stream
        self._copied: dict[int, object] = {}

    def copied(self, bucket) -> bool:
        event = self._copied.get(bucket.index)
        return event is None or event.done

    def wait_copied(self, bucket) -> None:
        event = self._copied.get(bucket.index)
        if event is not None:
            event.synchronize()


class PinnedDeviceGradients(_DeviceGradients):
    """Diffs on a GPU, staged through pinned host buffers on a copy stream (module docstring)."""

    def __init__(self, cupy, compute_stream):
        super().__init__(cupy, compute_stream)
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)
        self._buffers: dict[int, np.ndarray] = {}   # bucket index -> its pinned flat buffer
        self._spans = None                          # a timeline's DeviceSpans, when one is written

    def trace_to(self, spans) -> None:
        self._spans = spans

    def _buffer(self, bucket) -> np.ndarray:
        buffer = self._buffers.get(bucket.index)
        count = sum(bucket.sizes)
        if buffer is None or buffer.size != count or buffer.dtype != bucket.dtype:
            if buffer is not None:
                # A bucket replanned: the pinned pool hands a dropped buffer out again at once, so the
                # copies still reading or writing the old one must have run (a rare host wait).
                self.copy_stream.synchronize()
            memory = self.cupy.cuda.alloc_pinned_memory(max(1, count * bucket.dtype.itemsize))
            buffer = np.frombuffer(memory, bucket.dtype, count)
            self._buffers[bucket.index] = buffer
        return buffer

    def pack(self, bucket, slot: int, diff) -> None:
        bucket.take_buffer(self._buffer(bucket))
        self.copy_stream.wait_event(self.compute_stream.record())
        started = self._spans.begin(self.copy_stream) if self._spans is not None else None
        self.cupy.asnumpy(diff, stream=self.copy_stream, out=bucket.slot_view(slot), blocking=False)
        if started is not None:
            self._spans.end(f"bucket {bucket.index} to the host", started, self.copy_stream, lane="device exchange",
                            category="exchange")
        self._copied[bucket.index] = self.copy_stream.record()

    def unpack(self, bucket, slot: int, diff, divisor, leave_division: bool) -> bool:
        cupy = self.cupy
        started = self._spans.begin(self.copy_stream) if self._spans is not None else None
        with self.copy_stream:
            diff.set(bucket.slot_view(slot), stream=self.copy_stream)
            if divisor != 1:
                cupy.divide(diff, diff.dtype.type(divisor), out=diff)  # as Bucket.unpack divides
        if started is not None:
            self._spans.end(f"bucket {bucket.index} back", started, self.copy_stream, lane="device exchange",
                            category="exchange")
        self.compute_stream.wait_event(self.copy_stream.record())
        return False


class DeviceBuckets(_DeviceGradients):
    """Diffs on a GPU, summed in device buckets by a GPU collective (module docstring). A diff kept in
    its bucket (``diffs_may_live_in_buckets``) is neither copied in nor out: one kernel launch fewer
    each way per blob, which on a deep net whose host launches every kernel is host time saved."""

    diffs_may_live_in_buckets = True

    def trace_to(self, spans) -> None:
        """The copies are on the compute stream, among the layers' own spans."""

    def pack(self, bucket, slot: int, diff) -> None:
        bucket.take_buffer(bucket.own_buffer())
        if not _same_memory(diff, bucket.slot_view(slot)):
            with self.compute_stream:
                bucket.slot_view(slot)[...] = diff
        self._copied[bucket.index] = self.compute_stream.record()

    def unpack(self, bucket, slot: int, diff, divisor, leave_division: bool) -> bool:
        summed = bucket.slot_view(slot)
        home = _same_memory(diff, summed)
        with self.compute_stream:
            if leave_division:
                if not home:
                    diff[...] = summed
                return True
            self.cupy.divide(summed, diff.dtype.type(divisor), out=diff)
        return False


def _same_memory(a, b) -> bool:
    """Whether arrays ``a`` and ``b`` (CuPy's, or NumPy's) start at the same address with as many values."""
    return a.size == b.size and backend.address(a) == backend.address(b)


def on_device(params) -> bool:
    """Whether parameter Blobs ``params`` live on a GPU."""
    return not {blob.array_module for blob in params} <= {np}


def gradients_for(params) -> HostGradients | PinnedDeviceGradients:
    """The staging for parameter Blobs ``params`` (all on one device): host, or pinned for a GPU's."""
    modules = {blob.array_module for blob in params}
    if modules <= {np}:
        return HostGradients()
    (cupy,) = modules
    return PinnedDeviceGradients(cupy, cupy.cuda.get_current_stream())

