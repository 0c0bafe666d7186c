"""The ImageData layer: batches of the image files an image list names, as Caffe's ImageDataLayer reads them."""
from __future__ import annotations

import os

import numpy as np

from ...data.errors import IMAGE_EXTENSIONS, DataError, listed_name
from ...data.image import read_image_list, read_image_view
from ...data.item_buffers import BufferFor
from ...data.transform import DataTransformer
from ...files import InputFileError
from ..base import register_layer
from .source import DataSourceLayer


@register_layer("ImageData")
class ImageDataLayer(DataSourceLayer):
    """Batches of image files listed in ``image_data_param.source`` ("path label" per line; the
    label is after the last space), read as Caffe does (OpenCV's BGR order, bilinear resize to
    new_height x new_width when both are set, grey when ``is_color`` is false), transformed by
    ``transform_param``.

    top[0]: N x C x H x W the transformed images (C = 3, or 1 when not is_color).
    top[1]: N labels.
    ``shuffle`` shuffles the list at setup and again each time it has been read through;
    ``rand_skip`` > 0 starts at a random line in [0, rand_skip). Paths are root_folder + path.
    """

    exact_num_top = 2

    def open_source(self):
        p = self.layer_param.image_data_param
        source = self.resolve_path(p.source)
        if self.is_missing(source):
            raise self.error(f"cannot open image list image_data_param.source {p.source!r}: no such file "
                             f"(looked for {self.places_tried(p.source)})")
        self.source_name = source
        self.batch_size = int(p.batch_size)
        if (p.new_height > 0) != (p.new_width > 0):
            raise self.error("new_height and new_width must be set at the same time")
        try:
            entries = read_image_list(source)
        except InputFileError as exc:
            raise self.error(f"cannot open {exc}") from None
        names = [name for name, _ in entries]
        labels = [label for _, label in entries]
        if not names:
            raise self.error(f"image list {p.source!r} is empty")
        self.names = names
        self._root_folder = self._root()
        self.labels = np.asarray(labels, dtype=np.int64)
        self.num_records = len(names)
        try:
            self.transformer = DataTransformer(self._resolved_transform_param(), self.phase, self.dtype)
        except DataError as exc:
            raise self.error(str(exc)) from None

    def _root(self) -> str:
        """root_folder as the paths start with: found as data sources are (Layer.resolve_path), its
        trailing separator kept. Resolved once, at setup."""
        root = self.layer_param.image_data_param.root_folder
        if root:
            root = self.resolve_path(root) + (os.sep if root.endswith(("/", os.sep)) else "")
        return root

    def _path(self, i: int) -> str:
        root = self._root_folder
        path = root + self.names[i]
        # Caffe's root + name, or the name inside the folder when root lacks its separator and only
        # the joined path exists. (Only then is the file system asked: a data thread's every system
        # call is a turn of the GIL.) lexists: a link that leads nowhere (a loop) is the file meant;
        # opening it will say what is wrong.
        if root and not root.endswith(("/", os.sep)) and not os.path.lexists(path):
            joined = os.path.join(root, self.names[i])
            if os.path.lexists(joined):
                path = joined
        return path

    def _read(self, i: int, path: str, buffer: BufferFor | None = None) -> np.ndarray:
        p = self.layer_param.image_data_param
        try:
            return read_image_view(path, p.new_height, p.new_width, p.is_color, buffer)
        except DataError as exc:
            where = f"line {int(i) + 1} of {self.source_name}"
            if listed_name(self.names[int(i)], IMAGE_EXTENSIONS) is None:
                raise DataError(f"{where}: not a readable image's name (an image list holds 'path/image.png "
                                f"label' lines)") from None
            raise DataError(f"{exc} ({where})") from None

    def start_position(self):
        p = self.layer_param.image_data_param
        order = self._rng.permutation(self.num_records) if p.shuffle else None
        skip = int(self._rng.integers(0, p.rand_skip)) if p.rand_skip else 0
        if skip >= self.num_records:
            raise self.error(f"rand_skip drew {skip}: not enough images ({self.num_records}) to skip")
        return {"order": order, "j": skip}

    def check_position(self, pos) -> None:
        self._check_fields(pos, {"j": self.num_records})
        self._check_permutation(pos.get("order"), self.num_records, "order")

    def _ids(self, pos: dict, count: int):
        order, j = pos["order"], int(pos["j"])
        n_rec = self.num_records
        ids = []
        need = count
        while need:
            ids_at = np.arange if order is None else (lambda a, b, o=order: o[a:b])
            taken, j = self._scan(ids_at, j, n_rec, need)
            ids.append(order[taken] if order is not None else taken)
            need -= len(taken)
            if j >= n_rec:
                # Caffe reshuffles as soon as the last line has been read.
                j = 0
                if self.layer_param.image_data_param.shuffle:
                    order = self._rng.permutation(n_rec)
        return np.concatenate(ids), {"order": order, "j": j}

    def read_batch(self, pos):
        ids, new_pos = self._ids(pos, self.batch_size)
        paths = [self._path(int(i)) for i in ids]
        items = self.workers.map(lambda at: self._read(ids[at], paths[at], self.item_buffers.at(at)),
                                 range(len(ids)))
        data = self.transformer.transform_items(items, self._rng, paths, self.workers, self.allocate_batch)
        return [data, self.labels[ids].astype(self.dtype)], new_pos

    def top_shapes(self, pos):
        # Peek at the next image of this shard without drawing from the Generator.
        order, j = pos["order"], int(pos["j"])
        ids = order if order is not None else np.arange(self.num_records)
        taken, _ = self._scan(lambda a, b: ids[a:b], j, self.num_records, 1)
        if not len(taken):
            taken, _ = self._scan(lambda a, b: ids[a:b], 0, self.num_records, 1)
        first = ids[taken[0]]
        shape = self.transformer.output_shape(self._read(first, self._path(int(first))).shape)
        return [(self.batch_size,) + shape, (self.batch_size,)]
