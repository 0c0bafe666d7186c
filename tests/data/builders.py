"""Small real data files for the data-pipeline tests (LMDBs, image files, HDF5 files, list files)."""
from __future__ import annotations

import io
import pathlib

import numpy as np

from netdef.data.datum import array_to_datum
from netdef.data.db import open_db

CAFFE_MADE = ("fixtures", "caffe-ref", "caffe-made")


def write_lmdb(path, values: dict) -> pathlib.Path:
    """An LMDB holding ``values`` ({bytes key: bytes value})."""
    db = open_db(path, "lmdb", "w")
    txn = db.transaction()
    for key, value in values.items():
        txn.put(key, value)
    txn.commit()
    db.close()
    return pathlib.Path(path)


def indexed_items(n: int, shape=(1, 2, 3)) -> np.ndarray:
    """n uint8 items whose every pixel holds the item's index (mod 256)."""
    return (np.arange(n)[:, None, None, None] % 256 * np.ones((1,) + tuple(shape), dtype=np.int64)).astype(np.uint8)


def indexed_lmdb(path, n: int, shape=(1, 2, 3), random_pixels=False) -> pathlib.Path:
    """An LMDB of n raw Datums, keys "%08d", label = index; pixels = index (or random, seeded)."""
    items = indexed_items(n, shape)
    if random_pixels:
        items = np.random.default_rng(n).integers(0, 256, size=items.shape, dtype=np.uint8)
    return write_lmdb(path, {b"%08d" % i: array_to_datum(items[i], label=i).SerializeToString() for i in range(n)})


def write_images(folder, images, ext="png", labels=None) -> pathlib.Path:
    """Save HWC RGB (or HW grey) uint8 images as files img000.<ext>..., and a Caffe list file
    list.txt ("name label"); returns the list file's path."""
    from PIL import Image

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, img in enumerate(images):
        name = f"img{i:03d}.{ext}"
        Image.fromarray(np.asarray(img)).save(folder / name)
        lines.append(f"{name} {labels[i] if labels is not None else i}")
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    return folder / "list.txt"


def png_bytes(hwc: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(hwc).save(buf, format="PNG")
    return buf.getvalue()


def write_h5_files(folder, sizes, shape=(2, 3), start=0) -> pathlib.Path:
    """HDF5 files with datasets "data" (rows of ``shape``, value = global row index) and "label"
    (the index), ``sizes[i]`` rows in file i; returns the list file."""
    import h5py

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    index = start
    for i, rows in enumerate(sizes):
        ids = np.arange(index, index + rows)
        index += rows
        name = folder / f"part{i}.h5"
        with h5py.File(name, "w") as h5:
            h5["data"] = np.broadcast_to(ids.reshape((rows,) + (1,) * len(shape)), (rows,) + tuple(shape)).astype(np.float32)
            h5["label"] = ids.astype(np.int32)
        names.append(str(name))
    (folder / "files.txt").write_text("\n".join(names) + "\n")
    return folder / "files.txt"
