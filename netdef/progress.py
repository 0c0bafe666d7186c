"""Progress bars for long work (training, scoring, timing, the converters, the download), through tqdm.

A bar is drawn only when stderr is a terminal: under a job scheduler, in CI or with ``2> log`` the
output stays the log lines alone. ``!netdef train`` in a Jupyter notebook runs on a pseudo-terminal
whose carriage returns the notebook does not honour (each log line would arrive behind a copy of the
bar), so a process started from a Jupyter kernel (``JPY_PARENT_PID`` in its environment, which the
kernel's children inherit) draws none either. Bars are transient (``leave=False``): when the work ends the bar is
erased and the log is what remains. Log records are printed above a live bar (``netdef.logs``).
"""
from __future__ import annotations

import os
import sys

from tqdm import tqdm


#: Set in a Jupyter kernel's environment by the program that starts it, so inherited by ``!cmd``.
JUPYTER_KERNEL_ENV = "JPY_PARENT_PID"


def bars_wanted() -> bool:
    """Whether stderr is a terminal that redraws a bar in place (not a notebook's pseudo-terminal)."""
    return sys.stderr.isatty() and JUPYTER_KERNEL_ENV not in os.environ


def bar(what: str, iterable=None, total: int | None = None, unit: str = "it", unit_scale: bool = False,
        initial: int = 0) -> tqdm:
    """A bar labelled ``what`` over ``iterable`` or ``total`` steps (neither: a counter), ``initial`` of
    them done before it starts, on stderr; a silent stand-in that takes the same calls when stderr is
    not a terminal."""
    return tqdm(iterable, desc=what, total=total, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                disable=not bars_wanted(), leave=False, dynamic_ncols=True, initial=initial)


class BarAfterFirstStep:
    """A bar over ``total`` steps that appears once the first step is done, its clock started then: the
    first step of training compiles kernels and fills caches, and a rate taken from it would promise
    hours. ``update_to(done)`` after each step; a context manager (the bar is erased on leaving)."""

    def __init__(self, what: str, total: int, unit: str = "it"):
        self.what, self.total, self.unit = what, total, unit
        self.bar: tqdm | None = None

    def update_to(self, done: int) -> None:
        if self.bar is None:
            self.bar = bar(self.what, total=self.total, unit=self.unit, initial=done)
        else:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> BarAfterFirstStep:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
