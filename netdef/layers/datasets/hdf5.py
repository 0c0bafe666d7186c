"""The HDF5 layers: HDF5Data (batches of rows from the HDF5 files a list names) and HDF5Output (a net's
blobs written to an HDF5 file), as Caffe's."""
from __future__ import annotations

import os
import stat

import numpy as np

from ... import backend
from ...data.errors import HDF5_EXTENSIONS, DataError, listed_name
from ...data.hdf5 import check_dataset_fits, read_dataset
from ...files import TEXT_LIST_LIMIT, InputFileError, check_file_name, check_input_file, read_input_file
from ..base import Layer, register_layer
from .source import DataSourceLayer


def _h5py():
    try:
        import h5py
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("HDF5 layers need h5py: pip install h5py") from exc
    return h5py


@register_layer("HDF5Data")
class HDF5DataLayer(DataSourceLayer):
    """Batches of rows from HDF5 files listed (one path per line) in ``hdf5_data_param.source``.

    top[i]: N x D1 x ... the rows of the dataset named like top i (e.g. "data": N x C x H x W,
            "label": N), converted to the blobs' float type; every file holds every dataset, with
            the same number of rows and the same row shape.
    Files are read in list order, rows in file order; with ``shuffle`` the file order is shuffled
    at setup and each time all files have been read, and each file's rows are shuffled when the file
    is started. No transformation (Caffe refuses transform_param here).
    """

    min_top = 1

    def open_source(self):
        h5py = _h5py()
        p = self.layer_param.hdf5_data_param
        if self.layer_param.HasField("transform_param"):
            raise self.error("HDF5Data does not transform data: remove transform_param")
        source = self.resolve_path(p.source)
        if self.is_missing(source):
            raise self.error(f"cannot open the HDF5 file list hdf5_data_param.source {p.source!r}: no such file "
                             f"(looked for {self.places_tried(p.source)})")
        self.source_name = source
        self.batch_size = int(p.batch_size)
        self.datasets = list(self.layer_param.top)
        try:
            files = read_input_file(source, "HDF5Data source list", TEXT_LIST_LIMIT).decode("utf-8").split()
        except InputFileError as exc:
            raise self.error(f"failed to open {exc}") from None
        except UnicodeDecodeError as exc:
            raise self.error(f"HDF5Data source list {source}: not UTF-8 text (at byte {exc.start})") from None
        if not files:
            raise self.error(f"must have at least 1 HDF5 filename listed in {p.source}")
        base = os.path.dirname(p.source)
        self.files = []
        for f in files:
            # Caffe opens the paths as written (relative to the working directory); a path relative
            # to the list file is accepted too.
            # lexists: a link that leads nowhere is the file meant; opening it will say what is wrong.
            if not os.path.lexists(f) and not os.path.isabs(f) and os.path.lexists(os.path.join(base, f)):
                f = os.path.join(base, f)
            self.files.append(f)
        rows, shapes = [], None
        for line, f in enumerate(self.files, 1):
            if not os.path.lexists(f) and listed_name(f, HDF5_EXTENSIONS) is None:
                raise self.error(f"entry {line} of {source}: no such file, nor an HDF5 file's name (the source "
                                 f"list holds one path/file.h5 per line)")
            try:
                check_input_file(f, "HDF5 file")
                with h5py.File(f, "r") as h5:
                    file_rows, file_shapes = None, []
                    for name in self.datasets:
                        if name not in h5:
                            raise self.error(f"HDF5 file {f} has no dataset {name!r} (tops name the datasets)")
                        ds = h5[name]
                        if ds.ndim < 1 or ds.dtype.kind not in "biuf":
                            raise self.error(f"HDF5 file {f}: dataset {name!r} must be numeric with at least "
                                             f"1 axis, got {ds.dtype} {ds.shape}")
                        if file_rows is None:
                            file_rows = ds.shape[0]
                        elif ds.shape[0] != file_rows:
                            raise self.error(f"HDF5 file {f}: dataset {name!r} has {ds.shape[0]} rows, "
                                             f"{self.datasets[0]!r} has {file_rows}")
                        # A file can declare far more than it holds: refused here, before any read.
                        check_dataset_fits(ds, f, self.dtype)
                        file_shapes.append(tuple(ds.shape[1:]))
            except OSError as exc:
                raise self.error(f"failed opening HDF5 file {f} ({exc})") from None
            if shapes is None:
                shapes = file_shapes
            elif file_shapes != shapes:
                raise self.error(f"HDF5 file {f}: row shapes {file_shapes} differ from {shapes} in {self.files[0]}")
            rows.append(file_rows)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.rows)[:-1]])
        self.row_shapes = shapes
        self.num_records = int(self.rows.sum())
        self._cache = (None, None)

    def _row_perm(self, file_index: int):
        if not self.layer_param.hdf5_data_param.shuffle:
            return None
        return self._rng.permutation(int(self.rows[file_index]))

    def start_position(self):
        shuffle = self.layer_param.hdf5_data_param.shuffle
        files = self._rng.permutation(len(self.files)) if shuffle else None
        first = int(files[0]) if files is not None else 0
        return {"files": files, "f": 0, "rows": self._row_perm(first), "r": 0}

    def _file_data(self, fi: int):
        if self._cache[0] != fi:
            h5py = _h5py()
            path = self.files[fi]
            try:
                check_input_file(path, "HDF5 file")
                with h5py.File(path, "r") as h5:
                    arrays = [read_dataset(h5[name], path, self.dtype) for name in self.datasets]
            except (OSError, KeyError, InputFileError) as exc:
                raise DataError(f"failed reading HDF5 file {path} ({exc})") from None
            self._cache = (fi, arrays)
        return self._cache[1]

    def check_position(self, pos) -> None:
        self._check_fields(pos, {"f": len(self.files) - 1})
        self._check_permutation(pos.get("files"), len(self.files), "files")
        current = int(pos["files"][pos["f"]]) if pos.get("files") is not None else pos["f"]
        self._check_fields(pos, {"r": int(self.rows[current])})
        self._check_permutation(pos.get("rows"), int(self.rows[current]), "rows")
        if self.layer_param.hdf5_data_param.shuffle != (pos.get("rows") is not None):
            raise self.error("restore_data_state: position field 'rows' does not match hdf5_data_param.shuffle")

    def read_batch(self, pos):
        files, f, rows, r = pos["files"], int(pos["f"]), pos["rows"], int(pos["r"])
        n_files = len(self.files)
        parts = [[] for _ in self.datasets]
        need = self.batch_size
        while need:
            fi = int(files[f]) if files is not None else f
            count = int(self.rows[fi])
            offset = int(self.offsets[fi])
            perm = rows
            taken, r = self._scan(lambda a, b: offset + (perm[a:b] if perm is not None else np.arange(a, b)),
                                  r, count, need)
            if len(taken):
                data = self._file_data(fi)
                picked = rows[taken] if rows is not None else taken
                for part, arr in zip(parts, data):
                    part.append(arr[picked])
            need -= len(taken)
            if r >= count:
                r = 0
                f += 1
                if f == n_files:
                    f = 0
                    if files is not None:
                        files = self._rng.permutation(n_files)
                rows = self._row_perm(int(files[f]) if files is not None else f)
        arrays = [np.concatenate(p) for p in parts]
        return arrays, {"files": files, "f": f, "rows": rows, "r": r}

    def top_shapes(self, pos):
        return [(self.batch_size,) + tuple(s) for s in self.row_shapes]


@register_layer("HDF5Output")
class HDF5OutputLayer(Layer):
    """Writes its bottoms to ``hdf5_output_param.file_name`` as datasets "data" and "label".

    bottom[0]: N x C x H x W, stored as dataset "data" (num x channels x height x width, Caffe's
               legacy 4-axis shape).
    bottom[1]: N x ..., stored as dataset "label" (also as num x channels x height x width).
    No tops; no backward. Each forward appends its N rows to both datasets; Caffe writes one batch
    only (a second forward fails there), so a one-batch run gives Caffe's file.

    A definition from elsewhere must not destroy the user's files, so unlike Caffe (which truncates the
    file at setup) nothing is written until the first forward, and an existing file is replaced only
    when it is an HDF5 file that this layer wrote (it carries the root attribute ``netdef_hdf5_output``)
    or is empty. Anything else (a non-HDF5 file, someone's HDF5 data set, a FIFO or device) is refused
    at setup, naming the file: the user removes it or chooses another ``file_name``.
    """

    exact_num_bottom = 2
    exact_num_top = 0
    #: Root attribute of the files this layer writes: the mark that lets a later run replace them.
    OUTPUT_MARK = "netdef_hdf5_output"

    def setup(self, bottom, top):
        self.file_name = self.layer_param.hdf5_output_param.file_name
        if not self.file_name:
            raise self.error("hdf5_output_param.file_name is empty")
        self._check_replaceable()
        self.rows_written = 0

    def _check_replaceable(self) -> None:
        """Raise unless ``file_name`` is absent, empty, or an HDF5 file that this layer wrote."""
        path = self.file_name
        try:
            check_file_name(path, "hdf5_output_param.file_name")
        except InputFileError as exc:
            raise self.error(str(exc)) from None
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self.error(f"cannot check the output file {path} before writing it ({exc.strerror})") from None
        refusal = f"refusing to replace {path}: it exists and is "
        remedy = "; remove it or choose another hdf5_output_param.file_name"
        if not stat.S_ISREG(info.st_mode):
            raise self.error(refusal + "not a regular file" + remedy)
        if info.st_size == 0:
            return
        h5py = _h5py()
        if not h5py.is_hdf5(path):
            raise self.error(refusal + "not an HDF5 file" + remedy)
        try:
            with h5py.File(path, "r") as h5:
                marked = bool(h5.attrs.get(self.OUTPUT_MARK, False))
        except OSError as exc:
            raise self.error(refusal + f"an HDF5 file that cannot be opened ({exc})" + remedy) from None
        if not marked:
            raise self.error(refusal + "an HDF5 file that netdef's HDF5Output did not write (a data set?)" + remedy)

    def reshape(self, bottom, top):
        """Nothing: no tops."""

    def forward(self, bottom, top):
        h5py = _h5py()
        data_blob, label_blob = bottom
        if data_blob.num != label_blob.num:
            raise self.error(f"data blob and label blob must have the same batch size: {data_blob.num} vs "
                             f"{label_blob.num}")
        arrays = {}
        for name, blob in (("data", data_blob), ("label", label_blob)):
            legacy = (blob.num, blob.channels, blob.height, blob.width)
            arrays[name] = np.asarray(backend.to_host(blob.data)).reshape(legacy)
        if self.rows_written == 0:
            self._check_replaceable()  # again: the file may have appeared since setup
        try:
            with h5py.File(self.file_name, "w" if self.rows_written == 0 else "a") as h5:
                h5.attrs[self.OUTPUT_MARK] = 1
                for name, arr in arrays.items():
                    if name not in h5:
                        h5.create_dataset(name, data=arr, maxshape=(None,) + arr.shape[1:], chunks=True)
                        continue
                    ds = h5[name]
                    if ds.shape[1:] != arr.shape[1:]:
                        raise self.error(f"{self.file_name}: dataset {name!r} holds rows of shape {ds.shape[1:]}, "
                                         f"this batch has {arr.shape[1:]}")
                    start = ds.shape[0]
                    ds.resize(start + arr.shape[0], axis=0)
                    ds[start:] = arr
        except OSError as exc:
            raise self.error(f"failed writing HDF5 file {self.file_name} ({exc})") from None
        self.rows_written += data_blob.num
