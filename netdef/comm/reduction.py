"""Reduction algorithms: how a flat buffer is summed over the ranks, in place, without blocking.

The bucket transports (the progress drivers of ``progress.py`` and the priority schedule of
``scheduler.py``) start every bucket or chunk through the exchange rule's ``Reduction`` and
complete what it returns with the communicator's ``test_some``/``wait_all``, so a rule changes the
collective by handing them another one (``AllreduceExchange.make_reduction``). This base is the MPI
library's own ``Iallreduce``; ``multicolor.TreeReduction`` builds one from point-to-point messages.
"""
from __future__ import annotations

import numpy as np

from .gradient_staging import DeviceBuckets, gradients_for


class Reduction:
    """Sum a C-contiguous host array over the ranks, in place. Every rank starts the same reductions,
    of the same sizes, in the same order.

    ``polls_cheaply``: whether testing a started reduction costs so little that testing between
    layers pays (the exchange then asks for the POLL driver); an MPI test enters the library, which
    on one machine is not worth it (``progress.choose_mode``)."""

    polls_cheaply = False
    #: Whether the allreduce rule's log line names this reduction (``describe``): MPI's own allreduce is
    #: what the rule means by default, and the multicolour trees' rules describe theirs themselves.
    named_in_log = False
    #: The priority schedule's (chunk bytes, credit bytes) where the reduction shares no link between
    #: the reductions in flight (nothing to measure); None: measured (``scheduler.choose_sizes``).
    unshared_link_sizes: tuple[int, int] | None = None

    def __init__(self, comm):
        self.comm = comm

    def gradients_for(self, params):
        """How the gradients of parameter Blobs ``params`` reach the buckets this reduction sums
        (``gradient_staging.py``): in place on the CPU, through pinned host buffers from a GPU."""
        return gradients_for(params)

    def trace_to(self, spans) -> None:
        """Record the reductions in ``spans`` (a timeline's DeviceSpans), where they run on a device."""

    def empty(self, count: int, dtype=np.float32):
        """A zeroed flat array of ``count`` elements that ``start`` and ``run`` take (for measuring the link)."""
        return np.zeros(count, dtype=dtype)

    def buffers(self, sizes_and_dtypes):
        """Flat buffers for the buckets, one per (element count, dtype), where this reduction sums
        fastest (collective, called once the bucket layout is known); None: wherever the buckets
        like (their own memory, or a blob's diff)."""
        return None

    def release(self) -> None:
        """Collective, once the run has ended and nothing is in flight: free the memory ``buffers``
        gave out. A rank that fails never gets here; the job ends without it."""

    def close(self) -> None:
        """Local, also when this rank fails (the others may not be listening): free what ``release``
        did not, without waiting for any other rank."""

    def copy_of(self, array):
        """A copy of ``array`` as the reductions this one starts find it: one started next does not
        change it (on a device, the copy runs on the stream they run on)."""
        return array.copy()

    def describe(self) -> str:
        """The algorithm in words, for the log."""
        return "the MPI library's allreduce"

    def start(self, array):
        """Start summing ``array``; returns a request for ``comm.test_some``/``comm.wait_all``.
        ``array`` must not be touched until the request completes."""
        return self.comm.iallreduce(array)

    def run(self, array) -> None:
        """Sum ``array`` and return when done (link measurements time this)."""
        self.comm.allreduce(array)


class DeviceMemoryReduction(Reduction):
    """What the reductions that sum GPU memory where it lies share (NCCL: ``nccl_sum.py``; CUDA-aware
    MPI: ``device_mpi.py``): their buckets are device arrays on this rank's GPU, and gradients reach
    them through ``gradient_staging.DeviceBuckets``. ``cupy``: the module to use (default: CuPy; a test
    of the bookkeeping gives a stand-in)."""

    named_in_log = True

    def __init__(self, comm, cupy=None):
        super().__init__(comm)
        if cupy is None:
            import cupy
        self.cupy = cupy
        self.device = cupy.cuda.Device()  # this rank's GPU: current on the thread that builds the exchange
        self.compute_stream = cupy.cuda.get_current_stream()

    def gradients_for(self, params):
        return DeviceBuckets(self.cupy, self.compute_stream)

    def empty(self, count: int, dtype=np.float32):
        with self.device:
            return self.cupy.zeros(count, dtype=dtype)

    def buffers(self, sizes_and_dtypes):
        return [self.empty(count, dtype) for count, dtype in sizes_and_dtypes]
