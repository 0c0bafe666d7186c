"""The exception the data pipeline raises for unreadable inputs."""
from __future__ import annotations


class DataError(ValueError):
    """A data source that cannot be read: a missing file, a corrupt record, a bad image. The message
    names the file, DB path and key, or image."""


#: What the entries of an image list and of an HDF5Data source list name.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".ppm", ".pgm", ".pbm", ".webp")
HDF5_EXTENSIONS = (".h5", ".hdf5", ".hdf", ".he5")
_LONGEST_QUOTED = 256


def listed_name(entry: str, extensions: tuple[str, ...]) -> str | None:
    """A file name read from a list file, for an error message, when it looks like what the list should
    hold (a printable name ending in one of ``extensions``); None otherwise. A list named by a model from
    elsewhere may be any file (``source: "/etc/passwd"``), and its lines must not end up in a message."""
    if len(entry) > _LONGEST_QUOTED or not entry.isprintable() or not entry.lower().endswith(extensions):
        return None
    return entry
