"""The version ``netdef --version`` prints: the installed distribution's, else the source's own."""
from __future__ import annotations

import importlib.metadata

#: The distribution's name on the package index ("netdef" there is an unrelated project).
DISTRIBUTION = "netdef-trainer"


def version() -> str:
    """The version of the installed netdef-trainer distribution; the source's ``netdef.__version__``
    when netdef runs from a checkout that was never installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        from netdef import __version__

        return __version__
