"""Counts that a user sets in an environment variable (``NETDEF_DATA_THREADS``,
``NETDEF_MAX_IMAGE_PIXELS``, ...), read one way, refused with one message."""
from __future__ import annotations

import os
from collections.abc import Mapping


def positive_int(text: str) -> int | None:
    """``text`` as a positive whole number, or None when it is not one."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def positive_count(variable: str, what: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """The positive number ``variable`` holds, ``default`` when it is unset or empty; ValueError
    naming the variable and ``what`` it counts when it holds anything else."""
    env = os.environ if environ is None else environ
    text = env.get(variable, "").strip()
    if not text:
        return default
    value = positive_int(text)
    if value is None:
        raise ValueError(f"environment variable {variable}={text[:40]!r}: expected a positive number of {what} "
                         f"(default {default})")
    return value
