"""Run ``netdef VERB ...`` in this process (the real ``netdef.cli.main``; a subprocess would spend most
of a test's time importing netdef again) in a folder, capturing what it writes to stderr."""
from __future__ import annotations

import contextlib
import io
import logging
import os

from netdef.cli import main


def run_netdef(*args, cwd) -> tuple[int, str]:
    """(exit status, stderr) of ``netdef ARGS`` run with ``cwd`` as working directory. The netdef
    logger is put back as it was afterwards (``main`` points it at the captured stream)."""
    logger = logging.getLogger("netdef")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    stderr = io.StringIO()
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(stderr):
            status = main([str(a) for a in args])
    finally:
        os.chdir(previous)
        logger.handlers[:], logger.level, logger.propagate = saved
    return status, stderr.getvalue()
