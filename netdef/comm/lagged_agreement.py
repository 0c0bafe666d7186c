"""Stop and snapshot requests agreed one iteration late, without a blocking collective per iteration.

A signal reaches one rank (or each rank at a different moment), but every rank must stop or snapshot
at the same iteration, so the ranks combine their requests (a logical or) at each iteration boundary.
A blocking allreduce there made every iteration end wait for the slowest rank, and MPI libraries wait
by spinning: over Open MPI's TCP transport, 2 ranks on 2 cores (benchmarks/schedule.py, compute-bound,
on a loaded machine), the waiting rank spent 0.1-0.7 s per iteration in it, CPU time taken from the
threads of the rank it waited for (``perf``: mutexes and epoll inside ``opal_progress``).

``LaggedAgreement`` starts a non-blocking allreduce of the requests made up to the end of iteration
k - 1 when iteration k begins, and collects it when iteration k ends, by which time whatever drives
the exchange's progress has completed it: every rank acts on them at the end of iteration k. Nothing
is left in flight between iterations (a request still in flight when the process ends would be
written into freed memory). Between iterations (the solver asks again before each batch of a
test) there is no iteration to lag behind: ``DataParallel`` starts and collects at once there, which
waits for the other ranks, but without spinning. It runs on a communicator of its own (``Communicator.duplicate``): the
communication thread starts collectives on the exchange's communicator meanwhile, and collectives on
one communicator must start in the same order on every rank.
"""
from __future__ import annotations

import time

import numpy as np


class LaggedAgreement:
    """The logical or over the ranks of ``count`` flags, started by ``start`` and collected by
    ``collect`` (see the module docstring); both collective, in pairs, on every rank."""

    # How often a collection that finds the allreduce still in flight tests it, sleeping in between
    # (the communication thread's urgent poll: a sleeping wait leaves the cores to the other ranks).
    poll_interval = 0.0002

    def __init__(self, comm, count: int, sleep=time.sleep):
        self.comm = comm
        self._sleep = sleep
        self._flags = np.zeros(count, dtype=np.int32)
        self._request = None

    def start(self, flags) -> None:
        """Start combining this rank's ``flags`` with the other ranks'. An agreement never collected
        (an iteration that raised on every rank) is collected first and passed on with them."""
        leftover = self.collect()
        self._flags[:] = [bool(flag) or old for flag, old in zip(flags, leftover)]
        self._request = self.comm.iallreduce(self._flags, op="max")

    @property
    def pending(self) -> bool:
        """Whether an agreement was started and not collected yet."""
        return self._request is not None

    def collect(self) -> tuple[bool, ...]:
        """The combined flags of the last ``start``, waiting (without spinning inside MPI) if they are
        still in flight; all False when nothing was started."""
        if self._request is None:
            return (False,) * len(self._flags)
        pending = [self._request]
        while not self.comm.test_some(pending):
            self._sleep(self.poll_interval)
        self._request = None
        return tuple(bool(flag) for flag in self._flags)
