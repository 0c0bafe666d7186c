"""Python layers used by the distributed-training tests (imported by the nets as
``tests.comm.layers_for_tests``; the MPI runs get the repository root on PYTHONPATH)."""
from __future__ import annotations

import os
import signal
import time

import netdef
from netdef.comm.communicator import mapped_mpi_segments
from netdef.comm.launch import detect_launch


class LearnedScale(netdef.Layer):
    """top = bottom * s, with one learnable factor per feature (s starts at 1).

    bottom[0]: (N x C); top[0]: (N x C); blobs[0]: s (C).
    dL/dx = s dL/dy;  dL/ds += sum over N of x dL/dy.

    ``param_str`` "fail_rank=R fail_iter=K mode=raise|kill|stop|sleep|sighup|sigint" makes rank R fail in
    its K-th training forward pass (counting from 0): raise a RuntimeError, SIGKILL itself, SIGSTOP
    itself, or sleep ``sleep=S`` seconds (default an hour) and go on: a stalled rank; or send itself
    SIGHUP or SIGINT, as a user signalling one rank's process. "show_segments=1" prints
    the MPI library's shared-memory files the process has mapped, at set-up.
    """

    def setup(self, bottom, top):
        if not self.blobs:
            blob = self.blobs.add_blob(bottom[0].shape[1], dtype=bottom[0].dtype)
            blob.data[...] = 1
        options = dict(item.split("=", 1) for item in (self.param_str or "").split())
        self.fail_rank = int(options.get("fail_rank", -1))
        self.fail_iter = int(options.get("fail_iter", -1))
        self.fail_mode = options.get("mode", "raise")
        self.sleep_s = float(options.get("sleep", 3600))
        self.passes = 0
        if options.get("show_segments"):
            print("segments", *mapped_mpi_segments(), flush=True)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        if self.phase == netdef.TRAIN:
            launch = detect_launch()
            rank = launch.rank if launch is not None else 0
            if rank == self.fail_rank and self.passes == self.fail_iter:
                self._fail(rank)
            self.passes += 1
        top[0].data = bottom[0].data * self.blobs[0].data

    def _fail(self, rank: int) -> None:
        if self.fail_mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.fail_mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # trains on if continued
        elif self.fail_mode == "sleep":
            time.sleep(self.sleep_s)
        elif self.fail_mode in ("sighup", "sigint"):
            os.kill(os.getpid(), signal.SIGHUP if self.fail_mode == "sighup" else signal.SIGINT)
        else:
            raise RuntimeError(f"deliberate failure in layer {self.name!r} on rank {rank} at pass {self.passes}")

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff
        if self.param_propagate_down[0]:
            self.blobs[0].diff += (bottom[0].data * dy).sum(axis=0)
        if propagate_down[0]:
            bottom[0].diff = dy * self.blobs[0].data
