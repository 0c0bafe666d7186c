"""How long a candidate cuDNN plan takes on the device, timed without the host in the figure.

Launching a plan from Python takes the host longer than many convolutions take the GPU (the
frontend's indexed call walks its plan filters in Python on every launch). Timed by two events around
launches issued one by one from Python, a small convolution would give the host's gaps between the
launches, and the "fastest" candidate would be picked by noise (PyTorch and the frontend's own
autotuner time from C++, where the gaps are negligible). So a kernel that holds the stream (it waits
on the GPU's nanosecond timer) is queued first: the events and the launches queue behind it, and the
interval between the events is the plans' own time. Where the host took longer to queue them than
the wait lasted, the wait is made longer and the candidate timed again.
"""
from __future__ import annotations

import time

import numpy as np

#: A kernel of one thread that returns once ``nanoseconds`` have passed on the GPU's global timer.
WAIT_SOURCE = r"""
extern "C" __global__ void netdef_hold_stream(unsigned long long nanoseconds) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
}
"""
WAIT_KERNEL = "netdef_hold_stream"

#: The first wait: several launches through the frontend's Python, with room to spare.
FIRST_WAIT_S = 0.002
#: Tries per candidate, the wait doubled (at least) after each whose launches outlasted it, up to
#: ``LONGEST_WAIT_S``: a host that slow for that long times what it can (the last try's figure).
TRIES = 3
LONGEST_WAIT_S = 0.1


class DeviceTimer:
    """Times work queued on the current stream of ``cupy``'s device (a test may give a stand-in for
    CuPy and for the host's ``clock``)."""

    def __init__(self, cupy, clock=time.perf_counter):
        self.cupy = cupy
        self.clock = clock
        self.wait_s = FIRST_WAIT_S
        self._kernel = None

    def milliseconds(self, launch, runs: int) -> float:
        """Device milliseconds per run of ``launch()``, which queues one run on the current stream,
        over ``runs`` runs queued behind a wait (module docstring)."""
        cuda = self.cupy.cuda
        for _ in range(TRIES):
            held, start, stop = cuda.Event(), cuda.Event(), cuda.Event()
            queued_from = self.clock()
            held.record()
            self._hold_stream(self.wait_s)
            start.record()
            for _ in range(runs):
                launch()
            stop.record()
            queueing_s = self.clock() - queued_from
            stop.synchronize()
            if queueing_s * 1e3 < cuda.get_elapsed_time(held, start):
                break  # every launch was queued while the stream was held: no gap of the host's is timed
            self.wait_s = min(2 * max(self.wait_s, queueing_s), LONGEST_WAIT_S)
        return cuda.get_elapsed_time(start, stop) / runs

    def _hold_stream(self, seconds: float) -> None:
        if self._kernel is None:
            self._kernel = self.cupy.RawKernel(WAIT_SOURCE, WAIT_KERNEL)
        self._kernel((1,), (1,), (np.uint64(seconds * 1e9),))
