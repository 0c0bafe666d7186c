"""Reading an HDF5 data set only after checking the size it declares.

An HDF5 file can declare far more than it holds: a chunked data set that was never written is read
back as its fill value, so a 1.7 KB file whose ``data`` declares 19 GB makes ``dataset[()]`` allocate
19 GB, and the kernel ends the process (or another user's). Every read of a data set from a file netdef
did not write (HDF5Data sources, HDF5 weights, HDF5 solver states) goes through ``read_dataset``,
which refuses, naming the file, the data set and the size, before allocating anything.
"""
from __future__ import annotations

import numpy as np

from .. import memory


def declared_bytes(dataset, dtype=None) -> int:
    """Bytes that reading ``dataset`` (converted to ``dtype``, when given) will allocate at its peak:
    the values as stored, plus their converted copy."""
    stored = dataset.size * dataset.dtype.itemsize
    if dtype is None or np.dtype(dtype) == dataset.dtype:
        return stored
    return stored + dataset.size * np.dtype(dtype).itemsize


def check_dataset_fits(dataset, path, dtype=None) -> None:
    """Raise BlobTooLargeError, naming ``path``, the data set and its size, when reading ``dataset``
    could not fit in what this process may allocate."""
    memory.check_fits(declared_bytes(dataset, dtype),
                      f"HDF5 file {path}: data set {dataset.name!r} of shape {tuple(dataset.shape)}")


def read_dataset(dataset, path, dtype=None) -> np.ndarray:
    """The values of ``dataset`` (as ``dtype`` when given), once ``check_dataset_fits`` allows it."""
    check_dataset_fits(dataset, path, dtype)
    values = np.asarray(dataset[()])
    return values if dtype is None else values.astype(dtype, copy=False)
