"""Caffe-style logging: glog's line prefix, so Caffe's log parsers and plotters read netdef's logs.

A line looks like ``I1122 04:37:52.123456 12345 solver.py:210] Iteration 100, loss = 0.28``; the
messages themselves (``Iteration N, loss = x``, ``Test net output #0: accuracy = y``...) are Caffe's.
When stderr is a terminal, progress bars (``netdef.progress``) stay below the log: each record is
written with the bars lifted out of the way and redrawn after it.
"""
from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

from .excerpts import MESSAGE_CHARACTERS, excerpt

LOGGER_NAME = "netdef"


class GlogFormatter(logging.Formatter):
    """glog's ``Lmmdd hh:mm:ss.uuuuuu pid file:line] message``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        level = record.levelname[:1] if record.levelname != "CRITICAL" else "F"
        prefix = (f"{level}{time.strftime('%m%d %H:%M:%S', stamp)}.{micros:06d} {record.process:5d} "
                  f"{record.filename}:{record.lineno}]")
        # A message can quote a file (a layer's name): one bounded line, no raw terminal escapes.
        return f"{prefix} {excerpt(record.getMessage(), MESSAGE_CHARACTERS)}"


class _BelowBarsHandler(logging.StreamHandler):
    """Writes each record above any live progress bar on the same stream."""

    def emit(self, record: logging.LogRecord) -> None:
        with tqdm.external_write_mode(file=self.stream):
            super().emit(record)


def configure(level: int = logging.INFO, stream=None) -> logging.Logger:
    """Send the ``netdef`` logger to ``stream`` (stderr, as glog) in glog's format."""
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = _BelowBarsHandler(stream or sys.stderr)
    handler.setFormatter(GlogFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return logger
