"""Caffe's --sigint_effect / --sighup_effect: a signal asks the solver to stop or to snapshot.

The handlers only set a flag (``Solver.request_stop``, ``request_snapshot``); the solver acts at the
next iteration boundary (or between test iterations). The ranks of a distributed run agree on what
was asked (``Parallel.agree_requests``) while the next iteration runs, and all act on it at the
boundary after that one.
"""
from __future__ import annotations

import enum
import signal
import sys


class SolverAction(enum.Enum):
    """What a signal asks of the solver (Caffe's SolverAction)."""

    NONE = "none"
    STOP = "stop"
    SNAPSHOT = "snapshot"


class SignalHandlers:
    """Installed handlers; ``restore()`` (or leaving the ``with`` block) puts the previous ones back."""

    def __init__(self, previous: dict):
        self.previous = previous

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False


def install_signal_handlers(solver, sigint_effect: str = "stop", sighup_effect: str = "snapshot"):
    """Caffe's --sigint_effect / --sighup_effect: each of ``stop``, ``snapshot`` or ``none``.

    As in Caffe, ``none`` still catches the signal and ignores it. Returns a SignalHandlers whose
    ``restore()`` reinstates the previous handlers. Main thread only (Python's rule).
    """
    effects = {"stop": solver.request_stop, "snapshot": solver.request_snapshot, "none": None}
    for name, value in (("sigint_effect", sigint_effect), ("sighup_effect", sighup_effect)):
        if value not in effects:
            raise ValueError(f"{name} must be one of stop, snapshot, none; got {value!r}")

    def make(effect):
        action = effects[effect]

        def handler(signum, frame):
            if action is not None:
                action()

        return handler

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, make(sigint_effect))}
    if sys.platform != "win32":  # Windows has no SIGHUP
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, make(sighup_effect))
    return SignalHandlers(previous)
