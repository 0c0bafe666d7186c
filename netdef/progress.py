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


def bar(what: str, iterable=None, total: int | None = None, unit: str = "it", unit_scale: bool = False) -> tqdm:
    """A bar labelled ``what`` over ``iterable`` or ``total`` steps (neither: a counter), on stderr; a
    silent stand-in that takes the same calls when stderr is not a terminal."""
    return tqdm(iterable, desc=what, total=total, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                disable=not bars_wanted(), leave=False, dynamic_ncols=True)
