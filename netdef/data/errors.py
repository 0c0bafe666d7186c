"""The exception the data pipeline raises for unreadable inputs."""
from __future__ import annotations


class DataError(ValueError):
    """A data source that cannot be read: a missing file, a corrupt record, a bad image. The message
    names the file, DB path and key, or image."""
