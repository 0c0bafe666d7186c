"""Dataset tools with Caffe's behaviour and flags (keyword arguments here), used by the ``netdef`` CLI:

- ``convert_mnist``: Caffe's examples/mnist/convert_mnist_data (IDX pair -> DB of raw Datums).
- ``convert_imageset``: Caffe's tools/convert_imageset (image list -> DB of raw or encoded Datums).
- ``compute_image_mean``: Caffe's tools/compute_image_mean (DB -> mean .binaryproto, legacy layout).
- ``write_idx``: IDX files (the inverse of ``netdef.data.idx.read_idx``).
- ``download_mnist``: the four MNIST files (for users who are online).
- ``digits_to_idx``: scikit-learn's bundled 8x8 digits as MNIST-named IDX files (offline first run).

Each long loop shows a progress bar when stderr is a terminal (``netdef.progress``).
"""
from __future__ import annotations

import gzip
import logging
import os
import pathlib
import shutil
import tempfile
import urllib.error
import urllib.request

import numpy as np

from tqdm.utils import CallbackIOWrapper

from .. import backend as _backend
from ..progress import bar as progress_bar
from ..threads import data_threads
from ..proto import netdef_pb2 as pb
from .datum import datum_to_array, parse_datum, read_image_to_datum, write_mean_file
from .db import open_db
from .errors import DataError
from .idx import IdxError, read_idx
from .workers import DataWorkers
from .image import read_image_list

log = logging.getLogger("netdef")

# Caffe commits its write transaction every 1000 records.
_COMMIT_EVERY = 1000
# Lines convert_imageset hands its threads at a time, per thread: enough that a slow image rarely
# leaves the others idle, few enough that the images waiting to be written stay a few MB.
_WINDOW_PER_THREAD = 16

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
               "t10k-labels-idx1-ubyte")
#: Where download_mnist looks by default (a mirror of yann.lecun.com/exdb/mnist with the same files).
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"


# ---------------------------------------------------------------------------------------------- IDX
_IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">i2"): 0x0B, np.dtype(">i4"): 0x0C,
              np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


def write_idx(path, array) -> pathlib.Path:
    """Write ``array`` as an IDX file (gzipped when the name ends in .gz). uint8, int8, int16,
    int32, float32 and float64 are stored (big-endian, as the format says)."""
    path = pathlib.Path(path)
    arr = np.asarray(array)
    big = arr.dtype.newbyteorder(">") if arr.dtype.itemsize > 1 else arr.dtype
    if big not in _IDX_CODES:
        raise ValueError(f"IDX files hold uint8, int8, int16, int32, float32 or float64, not {arr.dtype}")
    if arr.ndim == 0 or arr.ndim > 255:
        raise ValueError(f"IDX files hold 1 to 255 dimensions, got {arr.ndim}")
    header = bytes([0, 0, _IDX_CODES[big], arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    payload = header + np.ascontiguousarray(arr, dtype=big).tobytes()
    if path.suffix == ".gz":
        # mtime 0: the same array gives the same bytes.
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as handle:
            handle.write(payload)
    else:
        path.write_bytes(payload)
    return path


# ---------------------------------------------------------------------------------------------- MNIST
def convert_mnist(images_path, labels_path, output_db, backend="lmdb") -> int:
    """Caffe's convert_mnist_data: one raw Datum (1 x rows x cols uint8, label) per image, keys
    "%08d" in file order. Returns the number of records. The output must not exist."""
    try:
        images = read_idx(images_path)
        labels = read_idx(labels_path)
    except IdxError as exc:
        raise DataError(str(exc)) from None
    if images.dtype != np.uint8 or images.ndim != 3:
        raise DataError(f"{images_path}: not an MNIST image file (uint8 N x rows x cols expected, got "
                        f"{images.dtype} {images.shape})")
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise DataError(f"{labels_path}: not an MNIST label file (uint8 N expected, got {labels.dtype} "
                        f"{labels.shape})")
    if len(images) != len(labels):
        raise DataError(f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels")
    n, rows, cols = images.shape
    # Caffe reads the label into a (signed) char.
    signed = labels.astype(np.int8).astype(np.int64)
    db = open_db(output_db, backend, "w")
    try:
        txn = db.transaction()
        datum = pb.Datum(channels=1, height=rows, width=cols)
        for i in progress_bar("convert-mnist", range(n), unit="image"):
            datum.data = images[i].tobytes()
            datum.label = int(signed[i])
            txn.put(b"%08d" % i, datum.SerializeToString())
            if (i + 1) % _COMMIT_EVERY == 0:
                txn.commit()
        txn.commit()
    finally:
        db.close()
    return n


# ---------------------------------------------------------------------------------------------- imagesets
def convert_imageset(root_folder, list_file, output_db, resize_height: int = 0, resize_width: int = 0,
                     shuffle: bool = False, gray: bool = False, encoded: bool = False, encode_type: str = "",
                     backend="lmdb", check_size: bool = False, threads: int | None = None) -> int:
    """Caffe's convert_imageset: the images of ``list_file`` (paths relative to ``root_folder``,
    joined by plain concatenation as Caffe does) to a DB, keys "%08d_<path>" by line number.

    Raw Datums hold the decoded image (BGR, C x H x W; resized when both sizes are > 0). With
    ``encoded`` (or an ``encode_type``) the Datum holds image file bytes: the file itself when there
    is no resize and its extension matches ``encode_type`` (or no encode_type is given), else the
    image re-encoded. Unreadable images are skipped with a logged error, as Caffe does. ``shuffle``
    permutes the list with netdef's generator. Returns the number of records written.

    The images are read, decoded, resized and encoded on ``threads`` threads (default
    ``threads.data_threads()``: every core this process may use), a window of lines at a time; the DB
    is written in list order, so the result does not depend on the count.
    """
    lines = read_image_list(list_file)
    if shuffle:
        order = _backend.rng().permutation(len(lines))
        lines = [lines[i] for i in order]
    resize_height = max(0, int(resize_height))
    resize_width = max(0, int(resize_width))
    is_color = not gray
    root_folder = os.fspath(root_folder)
    workers = DataWorkers(threads or data_threads(), name="netdef-convert-imageset")

    def read_line(numbered_line):
        line_id, (name, label) = numbered_line
        enc = encode_type
        if encoded and not enc:
            # Caffe guesses the encoding from the file name's extension.
            p = name.rfind(".")
            enc = name[p + 1:].lower() if p >= 0 else name.lower()
        try:
            return read_image_to_datum(root_folder + name, label, resize_height, resize_width, is_color, enc)
        except DataError as exc:
            return exc  # skipped, and logged in list order below

    db = open_db(output_db, backend, "w")
    count = 0
    data_size = None
    window = _WINDOW_PER_THREAD * workers.threads
    try:
        txn = db.transaction()
        with progress_bar("convert-imageset", total=len(lines), unit="image") as bar:
            for start in range(0, len(lines), window):
                numbered = list(enumerate(lines[start:start + window], start))
                for (line_id, (name, _)), datum in zip(numbered, workers.map(read_line, numbered)):
                    if isinstance(datum, DataError):
                        log.error("Skipping line %d of %s: %s", line_id + 1, os.fspath(list_file), datum)
                        continue
                    if check_size:
                        size = datum.channels * datum.height * datum.width
                        if data_size is None:
                            data_size = size
                        elif len(datum.data) != data_size:
                            raise DataError(f"{root_folder + name}: incorrect data field size {len(datum.data)} "
                                            f"(the first image had {data_size})")
                    txn.put(b"%08d_" % line_id + name.encode("utf-8"), datum.SerializeToString())
                    count += 1
                    if count % _COMMIT_EVERY == 0:
                        txn.commit()
                bar.update(len(numbered))
        txn.commit()
    finally:
        db.close()
        workers.close()
    return count


# ---------------------------------------------------------------------------------------------- means
def compute_image_mean(db_path, output_path=None, backend="lmdb") -> np.ndarray:
    """Caffe's compute_image_mean: the per-element mean of every Datum in the DB (encoded ones
    decoded as stored), accumulated in float32 record by record as Caffe does, as a 1 x C x H x W
    float32 array; written to ``output_path`` (legacy BlobProto) when given."""
    db = open_db(db_path, backend, "r")
    total = None
    count = 0
    try:
        with db.cursor() as cur, progress_bar("compute-image-mean", unit="record") as records:
            if not cur.seek_first():
                raise DataError(f"{db_path}: the DB is empty")
            while cur.valid:
                name = f"{db_path} key {cur.key!r}"
                item = datum_to_array(parse_datum(cur.value, name), color=None, name=name)
                if total is None:
                    total = np.zeros(item.shape, dtype=np.float32)
                elif item.shape != total.shape:
                    raise DataError(f"{name}: shape {item.shape} differs from the first record's {total.shape}")
                total += item.astype(np.float32)
                count += 1
                records.update()
                cur.next()
    finally:
        db.close()
    mean = (total / np.float32(count)).astype(np.float32)[None]
    if output_path is not None:
        write_mean_file(output_path, mean)
    return mean


# ---------------------------------------------------------------------------------------------- download
def download_mnist(folder, base_url: str = MNIST_URL, timeout: float = 60.0, overwrite: bool = False) -> list:
    """Download the four MNIST files (``<name>.gz`` under ``base_url``) into ``folder`` and store them
    decompressed (train-images-idx3-ubyte, ...), as Caffe's data/mnist/get_mnist.sh does. Files that
    are already there and valid are kept unless ``overwrite``. Returns their paths."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not base_url.endswith("/"):
        base_url += "/"
    paths = []
    for name in MNIST_FILES:
        target = folder / name
        if target.exists() and not overwrite:
            try:
                read_idx(target)
                paths.append(target)
                continue
            except IdxError:
                pass
        url = base_url + name + ".gz"
        fd, tmp = tempfile.mkstemp(prefix=name + ".", dir=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    with urllib.request.urlopen(url, timeout=timeout) as response, \
                            progress_bar(name + ".gz", total=_content_length(response), unit="B",
                                         unit_scale=True) as received:
                        with gzip.GzipFile(fileobj=CallbackIOWrapper(received.update, response, "read")) as unzipped:
                            shutil.copyfileobj(unzipped, out)
                except (urllib.error.URLError, OSError, EOFError) as exc:
                    raise DataError(f"downloading {url} failed: {exc}") from None
            try:
                read_idx(tmp)
            except IdxError as exc:
                raise DataError(f"{url} is not an IDX file: {exc}") from None
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        paths.append(target)
    counts = [len(read_idx(p)) for p in paths]
    if counts[0] != counts[1] or counts[2] != counts[3]:
        raise DataError(f"MNIST files disagree on the number of items: {dict(zip(MNIST_FILES, counts))}")
    return paths


def _content_length(response) -> int | None:
    """The download's size when the server says it (the progress bar's total), else None."""
    length = response.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


# ---------------------------------------------------------------------------------------------- digits
def digits_to_idx(folder, num_train: int = 1500) -> list:
    """scikit-learn's bundled 8 x 8 digits (1797 images, offline) as IDX files with MNIST's names:
    the first ``num_train`` as train-*, the rest as t10k-*. Pixels go from 0..16 to 0..255 uint8
    (round(v * 255 / 16)). Returns the four paths (MNIST_FILES order)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError('the digits data set comes with scikit-learn, an optional dependency: pip install '
                          '"netdef-trainer[digits]" (or pip install scikit-learn)') from None
    digits = load_digits()
    values = np.asarray(digits.images, dtype=np.int64)
    images = ((values * 255 + 8) // 16).astype(np.uint8)
    labels = np.asarray(digits.target, dtype=np.uint8)
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = (images[:num_train], labels[:num_train], images[num_train:], labels[num_train:])
    return [write_idx(folder / name, arr) for name, arr in zip(MNIST_FILES, arrays)]
