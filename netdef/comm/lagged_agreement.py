"""Stop and snapshot requests agreed one iteration late, without a blocking collective per iteration.

A signal reaches one rank (or each rank at a different moment), but every rank must stop or snapshot
at the same iteration, so the ranks combine their requests (a logical or) at each iteration boundary.
A blocking allreduce there made every iteration end wait for the slowest rank, and MPI libraries wait
by spinning: over Open MPI's TCP transport, 2 ranks on 2 cores (benchmarks/schedule.py, compute-bound,
on a loaded machine), the waiting rank spent 0.1-0.7 s per iteration in it, CPU time taken from the
threads of the rank it waited for (``perf``: mutexes and epoll inside ``opal_progress``).

``LaggedAgreement`` starts a non-blocking allreduce of the requests at the end of iteration k and
collects it at the end of iteration k + 1, by which time whatever drives the exchange's progress
has completed it; every rank then acts on the requests of iteration k at iteration k + 1. The
iteration boundaries pair up because every rank calls ``exchange`` once per iteration. It runs on a
communicator of its own (``Communicator.duplicate``): the communication thread starts collectives
on the exchange's communicator meanwhile, and collectives on one communicator must start in the same
order on every rank.
"""
from __future__ import annotations

import time

import numpy as np


class LaggedAgreement:
    """The logical or over the ranks of ``count`` flags, one call late (see the module docstring)."""

    # How often a collection that finds the allreduce still in flight tests it, sleeping in between
    # (the communication thread's urgent poll: a sleeping wait leaves the cores to the other ranks).
    poll_interval = 0.0002

    def __init__(self, comm, count: int, sleep=time.sleep):
        self.comm = comm
        self._sleep = sleep
        self._flags = np.zeros(count, dtype=np.int32)
        self._request = None
        self._agreed = (False,) * count

    def exchange(self, flags) -> tuple[bool, ...]:
        """Start agreeing on this iteration's ``flags``; returns what the ranks agreed on at the
        previous call (all False at the first). A collective call, once per iteration on every rank."""
        agreed = self.collect()
        self._agreed = (False,) * len(agreed)  # acted on once
        self._flags[:] = [bool(flag) for flag in flags]
        self._request = self.comm.iallreduce(self._flags, op="max")
        return agreed

    def collect(self) -> tuple[bool, ...]:
        """Complete the agreement in flight (without spinning inside MPI) and return its result, which
        the next ``exchange`` returns (a collective call: before the end of training nothing may be
        left in flight)."""
        if self._request is not None:
            pending = [self._request]
            while not self.comm.test_some(pending):
                self._sleep(self.poll_interval)
            self._request = None
            self._agreed = tuple(bool(flag) for flag in self._flags)
        return self._agreed
