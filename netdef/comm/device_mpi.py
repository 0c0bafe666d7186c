"""The MPI library's allreduce on GPU memory: CUDA-aware MPI, where the library says it is one.

Where NCCL is not used (not installed, ranks sharing a GPU with an NCCL that refuses it, or
``exchange_via: mpi``) and every rank's MPI library takes device memory (``MPIX_Query_cuda_support``:
``Communicator.device_buffers``), the allreduce family's buckets are flat device arrays and MPI sums
them where they are: no copy through the host, which the library may still make itself, but without
netdef's staging. Gradients reach the buckets as for NCCL (``gradient_staging.DeviceBuckets``: a copy
on the compute stream and an event), and the transports start a bucket's sum only once that event has
completed, because MPI, unlike NCCL, does not order itself after the device's streams.
"""
from __future__ import annotations

from .reduction import DeviceMemoryReduction


class DeviceMpiReduction(DeviceMemoryReduction):
    """Sum device arrays over the ranks of ``comm`` with its MPI library's ``Iallreduce`` (module
    docstring)."""

    def describe(self) -> str:
        return "the MPI library's allreduce on device memory (CUDA-aware MPI)"

    def start(self, array):
        return self.comm.iallreduce_on_device(array)

    def run(self, array) -> None:
        self.comm.wait_all([self.start(array)])
