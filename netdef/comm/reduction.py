"""Reduction algorithms: how a flat buffer is summed over the ranks, in place, without blocking.

The bucket transports (the progress drivers of ``progress.py`` and the priority schedule of
``scheduler.py``) start every bucket or chunk through the exchange rule's ``Reduction`` and
complete what it returns with the communicator's ``test_some``/``wait_all``, so a rule changes the
collective by handing them another one (``AllreduceExchange.make_reduction``). This base is the MPI
library's own ``Iallreduce``; ``multicolor.TreeReduction`` builds one from point-to-point messages.
"""
from __future__ import annotations


class Reduction:
    """Sum a C-contiguous host array over the ranks, in place. Every rank starts the same reductions,
    of the same sizes, in the same order."""

    def __init__(self, comm):
        self.comm = comm

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
