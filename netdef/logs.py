"""Caffe-style logging: glog's line prefix, so Caffe's log parsers and plotters read netdef's logs.

A line looks like ``I1122 04:37:52.123456 12345 solver.py:210] Iteration 100, loss = 0.28``; the
messages themselves (``Iteration N, loss = x``, ``Test net output #0: accuracy = y``...) are Caffe's.
When stderr is a terminal a progress line (iterations, speed, time left) stays below the log.
"""
from __future__ import annotations

import logging
import sys
import time

LOGGER_NAME = "netdef"


class GlogFormatter(logging.Formatter):
    """glog's ``Lmmdd hh:mm:ss.uuuuuu pid file:line] message``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        level = record.levelname[:1] if record.levelname != "CRITICAL" else "F"
        prefix = (f"{level}{time.strftime('%m%d %H:%M:%S', stamp)}.{micros:06d} {record.process:5d} "
                  f"{record.filename}:{record.lineno}]")
        return f"{prefix} {record.getMessage()}"


class ProgressLine:
    """A single self-rewriting status line on a terminal; log records print above it."""

    def __init__(self, stream=None, total: int = 0):
        self.stream = stream or sys.stderr
        self.total = total
        self.start_iter = None
        self.start_time = None
        self.text = ""

    def clear(self) -> None:
        if self.text:
            self.stream.write("\r" + " " * len(self.text) + "\r")
            self.text = ""

    def update(self, iteration: int) -> None:
        now = time.perf_counter()
        if self.start_time is None:
            self.start_iter, self.start_time = iteration, now
            return
        done = iteration - self.start_iter
        elapsed = max(now - self.start_time, 1e-9)
        speed = done / elapsed
        left = (self.total - iteration) / speed if speed > 0 and self.total else 0.0
        width = 30
        filled = int(width * iteration / self.total) if self.total else 0
        bar = "#" * filled + "." * (width - filled)
        minutes, seconds = divmod(int(left), 60)
        text = f"[{bar}] {iteration}/{self.total} iters  {speed:.1f} iter/s  {minutes}:{seconds:02d} left"
        self.clear()
        self.stream.write(text)
        self.stream.flush()
        self.text = text


class _ProgressAwareHandler(logging.StreamHandler):
    def __init__(self, stream, progress: ProgressLine | None):
        super().__init__(stream)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        if self.progress is not None:
            text = self.progress.text
            self.progress.clear()
            super().emit(record)
            if text:
                self.progress.stream.write(text)
                self.progress.text = text
        else:
            super().emit(record)


def configure(level: int = logging.INFO, stream=None, progress: ProgressLine | None = None) -> logging.Logger:
    """Send the ``netdef`` logger to ``stream`` (stderr, as glog) in glog's format."""
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = _ProgressAwareHandler(stream or sys.stderr, progress)
    handler.setFormatter(GlogFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return logger
