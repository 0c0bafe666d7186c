"""The Data layer: batches of Datums from an LMDB or LevelDB, as Caffe's DataLayer reads them."""
from __future__ import annotations

import os

import numpy as np

from ...data.datum import DatumError, datum_item, parse_datum, raw_datum_batch
from ...data.db import open_db
from ...data.errors import DataError
from ...data.item_buffers import BufferFor
from ...data.transform import DataTransformer
from ...proto import netdef_pb2 as pb
from ..base import register_layer
from .source import DataSourceLayer


@register_layer("Data")
class DataLayer(DataSourceLayer):
    """Batches of Datums from an LMDB or LevelDB (``data_param``), in key order, transformed by
    ``transform_param``.

    top[0]: N x C x H x W (N = batch_size; C x H x W of the first Datum of the batch, or C x crop x
            crop) the transformed items, (x - mean) * scale.
    top[1]: N, the Datums' labels (optional).
    After the last record, reading goes on from the first (Caffe restarts its cursor).
    ``rand_skip`` > 0 starts at a random record in [0, rand_skip).
    """

    min_top = 1
    max_top = 2

    def open_source(self):
        p = self.layer_param.data_param
        if not p.source:
            raise self.error("data_param.source (the DB path) is empty")
        source = self.resolve_path(p.source)
        if self.is_missing(source):
            raise self.error(f"data_param.source {p.source!r}: no such DB (looked for {self.places_tried(p.source)}); "
                             f"create it (netdef convert-mnist, convert-imageset) or correct the path")
        self.source_name = source
        self.batch_size = int(p.batch_size)
        backend_value = p.backend
        if not p.HasField("backend") and os.path.isfile(os.path.join(source, "data.mdb")):
            # The schema's default is LEVELDB (Caffe's); a folder that is plainly an LMDB is read as one.
            backend_value = pb.DataParameter.LMDB
        try:
            self.db = open_db(source, backend_value, "r")
            self.num_records = len(self.db)
            self.transformer = DataTransformer(self._resolved_transform_param(), self.phase, self.dtype)
        except DataError as exc:
            raise self.error(str(exc)) from None
        self.decode_color = self.transformer.decode_color
        if self.decode_color is None and p.force_encoded_color:
            self.decode_color = True

    def _key_at(self, index: int) -> bytes:
        with self.db.cursor() as cur:
            cur.seek_first()
            for _ in range(index):
                cur.next()
            return cur.key

    def start_position(self):
        skip = int(self._rng.integers(0, self.layer_param.data_param.rand_skip)) \
            if self.layer_param.data_param.rand_skip else 0
        index = skip % self.num_records
        return {"index": index, "key": self._key_at(index)}

    def check_position(self, pos) -> None:
        self._check_fields(pos, {"index": self.num_records - 1})
        key = pos.get("key")
        if not isinstance(key, bytes):
            raise self.error("restore_data_state: position field 'key' must be a record key (bytes)")
        # Checked here, so that a position that names no record is an error of the state being restored,
        # not one of the DB at the first batch. (That the key sits at ``index`` is not checked: it takes a
        # walk over the records before it.)
        try:
            with self.db.cursor() as cur:
                present = cur.seek(key)
        except DataError as exc:  # lmdb refuses an empty key, or one past its 511-byte limit
            raise self.error(f"restore_data_state: position field 'key': {exc}") from None
        if not present:
            raise self.error(f"restore_data_state: position field 'key' names record {key[:60]!r}, which "
                             f"{self.source_name} does not hold: the state was taken over another DB, or the "
                             f"DB changed since")

    def _records(self, pos: dict, count: int):
        """``count`` (key, value) pairs of this shard from ``pos``, and the position after them."""
        rank, n = self._shard
        keys, values = [], []
        with self.db.cursor() as cur:
            if not cur.seek(pos["key"]):
                raise DataError(f"{self.source_name}: record {pos['key']!r} (index {pos['index']}) is missing: "
                                f"the DB changed since this position was taken")
            index = int(pos["index"])
            while len(values) < count:
                if index % n == rank:
                    keys.append(cur.key)
                    values.append(cur.value)
                index += 1
                if not cur.next():
                    cur.seek_first()
                    index = 0
            return keys, values, {"index": index, "key": cur.key}

    def _record_name(self, key: bytes) -> str:
        return f"{self.source_name} key {key!r}"

    def _parse(self, key: bytes, value: bytes):
        try:
            return parse_datum(value)
        except DatumError:
            return parse_datum(value, self._record_name(key))  # fails again, now naming the record

    def _decode(self, key: bytes, value: bytes):
        name = self._record_name(key)
        datum = parse_datum(value, name)
        return datum_item(datum, color=self.decode_color, name=name), datum.label

    def _item(self, key: bytes, datum, buffer: BufferFor) -> np.ndarray:
        return datum_item(datum, color=self.decode_color, name=self._record_name(key), buffer=buffer)

    def read_batch(self, pos):
        keys, values, new_pos = self._records(pos, self.batch_size)
        datums = [self._parse(key, value) for key, value in zip(keys, values)]
        raw = raw_datum_batch(datums)
        if raw is not None:
            data = self.transformer(raw, self._rng, self.workers, self.allocate_batch)
        else:
            # Encoded or float items, or items of several shapes: one at a time, errors naming the record.
            items = self.workers.map(lambda at: self._item(keys[at], datums[at], self.item_buffers.at(at)),
                                     range(len(keys)))
            data = self.transformer.transform_items(items, self._rng, [self._record_name(k) for k in keys],
                                                    self.workers, self.allocate_batch)
        arrays = [data]
        if self.num_tops > 1:
            arrays.append(np.fromiter((datum.label for datum in datums), dtype=self.dtype, count=len(datums)))
        return arrays, new_pos

    def top_shapes(self, pos):
        keys, values, _ = self._records(pos, 1)
        arr, _ = self._decode(keys[0], values[0])
        shapes = [(self.batch_size,) + self.transformer.output_shape(arr.shape)]
        if self.num_tops > 1:
            shapes.append((self.batch_size,))
        return shapes
