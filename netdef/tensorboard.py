"""``netdef train --tensorboard DIR``: the solver's scalars as TensorBoard event files.

A ``TensorBoardWriter`` is a scalar observer of the solver (``Solver.add_scalar_observer``): every number
the log shows at a display or a test (train loss and outputs, learning rate, iterations per second, test
outputs, and in a distributed run the exchange's wait and hidden fraction) becomes a scalar with the
iteration as its step. Only rank 0 writes (``netdef train`` attaches it there alone). The events are
written by tensorboardX (``pip install 'netdef-trainer[tensorboard]'``); ``tensorboard --logdir DIR``
shows them.
"""
from __future__ import annotations


class TensorBoardWriter:
    """Writes each reported scalar to an event file in ``logdir``; use as a context manager, or call
    ``close()`` so that the last events reach the disk."""

    def __init__(self, logdir):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ImportError("--tensorboard needs tensorboardX: pip install 'netdef-trainer[tensorboard]' "
                              "(or pip install tensorboardX)") from None
        self.writer = SummaryWriter(logdir=str(logdir))

    def __call__(self, iteration: int, scalars: dict) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=iteration)

    def close(self) -> None:
        self.writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
