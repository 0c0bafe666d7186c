"""Reading MNIST-style IDX files (optionally gzipped), the format of LeCun's MNIST distribution.

An IDX file is a big-endian header (two zero bytes, a type code, the number of dimensions, then each
dimension as uint32) followed by the values in C order.
"""
from __future__ import annotations

import gzip
import pathlib

import numpy as np

_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
          0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


class IdxError(ValueError):
    """A file that is not a valid IDX file; the message names it."""


def read_idx(path) -> np.ndarray:
    """The array stored in an IDX file (``.gz`` files are decompressed)."""
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as exc:
        raise IdxError(f"{path}: cannot read ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        raise IdxError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()})")
    dtype, ndim = np.dtype(_TYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    dims = tuple(int(d) for d in np.frombuffer(raw[4:header], dtype=">u4"))
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise IdxError(f"{path}: header says {dims} ({expected} bytes of data) but the file holds "
                       f"{len(raw) - header} bytes after the header")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
