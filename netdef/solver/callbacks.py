"""The solver's per-iteration callbacks, as one object: Caffe's ``Solver::Callback``.

pycaffe's ``solver.add_callback(on_start, on_gradients_ready)`` takes functions; netdef's takes those
(and ``after_update``) or one ``SolverCallback``, whose methods are the three points. A subclass
overrides the points it wants; the others do nothing.
"""
from __future__ import annotations


class SolverCallback:
    """Called by the solver at three points of every iteration, with no arguments (as pycaffe's
    functions): ``on_start`` before the forward passes, ``on_gradients_ready`` after backward and
    before the update, ``after_update`` once the update is applied and ``iter`` incremented (before
    the snapshot check)::

        class Recorder(netdef.SolverCallback):
            def on_gradients_ready(self):
                ...
        solver.add_callback(Recorder())
    """

    def on_start(self) -> None:
        """Before the iteration's forward passes."""

    def on_gradients_ready(self) -> None:
        """After backward, before the update."""

    def after_update(self) -> None:
        """After the update, with ``iter`` incremented."""
