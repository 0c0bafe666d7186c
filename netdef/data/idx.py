"""Reading MNIST-style IDX files (optionally gzipped), the format of LeCun's MNIST distribution.

An IDX file is a big-endian header (two zero bytes, a type code, the number of dimensions, then each
dimension as uint32) followed by the values in C order.
"""
from __future__ import annotations

import gzip
import pathlib

import numpy as np

from ..files import InputFileError, open_input_file

_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
          0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


#: An IDX file's data is read into memory at once: bound it (MNIST's largest file holds 47 MB).
MAX_IDX_BYTES = 2**34


class IdxError(ValueError):
    """A file that is not a valid IDX file; the message names it."""


def read_idx(path) -> np.ndarray:
    """The array stored in an IDX file (``.gz`` files are decompressed).

    Only a regular file is opened, and no more is read than the header announces (plus one byte, to
    tell a longer file), so a gzip bomb or a huge file is refused after reading its header."""
    path = pathlib.Path(path)
    try:
        raw_handle = open_input_file(path, "IDX file")
    except InputFileError as exc:
        raise IdxError(str(exc)) from None
    try:
        with raw_handle, (gzip.GzipFile(fileobj=raw_handle) if path.suffix == ".gz" else raw_handle) as handle:
            magic = handle.read(4)
            if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in _TYPES:
                raise IdxError(f"{path}: not an IDX file (bad magic number {magic.hex()})")
            dtype, ndim = np.dtype(_TYPES[magic[2]]), magic[3]
            dims_raw = handle.read(4 * ndim)
            if len(dims_raw) != 4 * ndim:
                raise IdxError(f"{path}: the header announces {ndim} dimensions but the file ends before them")
            dims = tuple(int(d) for d in np.frombuffer(dims_raw, dtype=">u4"))
            expected = int(np.prod(dims, dtype=object)) * dtype.itemsize
            if expected > MAX_IDX_BYTES:
                raise IdxError(f"{path}: header says {dims} ({expected} bytes of data), more than netdef reads "
                               f"from an IDX file ({MAX_IDX_BYTES} bytes)")
            data = handle.read(expected + 1)
    except (OSError, EOFError) as exc:
        raise IdxError(f"{path}: cannot read ({exc})") from None
    if len(data) != expected:
        found = f"{len(data)} bytes" if len(data) <= expected else "more bytes"
        raise IdxError(f"{path}: header says {dims} ({expected} bytes of data) but the file holds "
                       f"{found} after the header")
    return np.frombuffer(data, dtype=dtype).reshape(dims)
