"""Progress bars for long work (training, scoring, timing, the converters, the download), through tqdm.

A bar is drawn only when stderr is a terminal: under a job scheduler, in CI or with ``2> log`` the
output stays the log lines alone. Bars are transient (``leave=False``): when the work ends the bar is
erased and the log is what remains. Log records are printed above a live bar (``netdef.logs``).
"""
from __future__ import annotations

import sys

from tqdm import tqdm


def bar(what: str, iterable=None, total: int | None = None, unit: str = "it", unit_scale: bool = False) -> tqdm:
    """A bar labelled ``what`` over ``iterable`` or ``total`` steps (neither: a counter), on stderr; a
    silent stand-in that takes the same calls when stderr is not a terminal."""
    return tqdm(iterable, desc=what, total=total, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                disable=not sys.stderr.isatty(), leave=False, dynamic_ncols=True)
