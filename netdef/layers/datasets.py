"""File-backed data layers: Data (LMDB/LevelDB of Datums), ImageData (an image list file), HDF5Data
(HDF5 files) and HDF5Output.

The three readers share ``DataSourceLayer``:

- A background thread prepares the next ``data_param.prefetch`` batches (default 4; 0 reads in the
  forward pass itself) while the current one is used. Data and ImageData decode and transform the
  items of a batch on ``threads.data_threads()`` threads (``DataWorkers``), the preparing thread one
  of them; the batches are those of one thread, whatever the count. It is a daemon thread that holds no strong
  reference to the layer while it waits, so a dropped net stops it; ``close()`` stops it at once.
  An exception in it (a corrupt record, an unreadable image, a missing file) is raised by the
  forward() that would have consumed the batch, naming the layer and the DB key or file.
- ``set_shard(rank, num_ranks)``: read only records i with i % num_ranks == rank (i: the record's
  index in the source's own order - key order, list order, or file list order and row), so that in
  one epoch no record is read by two ranks. Shuffling permutes the whole source with the layer's
  Generator and then reads the rank's records in that order.
- ``data_state()`` / ``restore_data_state(state)``: bytes that describe where the next batch that
  forward() will consume starts (not how far prefetching got), with the Generator's state (random
  crops, mirrors, shuffles) and the shuffle order. Restoring discards prefetched batches; the batches
  that follow are the ones an uninterrupted run would have produced.

The layer's Generator is seeded from ``netdef.backend.rng()`` at setup (``netdef.set_random_seed``
fixes it). Data layers have no bottoms and no backward pass.
"""
from __future__ import annotations

import atexit
import base64
import json
import os
import stat
import queue
import threading
import weakref

import numpy as np

from .. import backend
from ..data.datum import DatumError, datum_item, parse_datum, raw_datum_batch
from ..data.db import open_db
from ..data.hdf5 import check_dataset_fits, read_dataset
from ..data.errors import HDF5_EXTENSIONS, IMAGE_EXTENSIONS, DataError, listed_name
from ..data.image import read_image, read_image_list
from ..data.transform import DataTransformer
from ..data.workers import DataWorkers
from ..files import TEXT_LIST_LIMIT, InputFileError, check_file_name, check_input_file, read_input_file
from ..proto import netdef_pb2 as pb
from ..threads import data_threads, yield_cores_to_compute
from .base import DataSource, Layer, LayerError, register_layer

_STATE_MAGIC = b"netdef-data-state 1\n"


# ---------------------------------------------------------------------------------------------- state I/O
def _encode(obj):
    if isinstance(obj, np.ndarray):
        return {"__array__": obj.dtype.str, "shape": list(obj.shape),
                "b64": base64.b64encode(np.ascontiguousarray(obj).tobytes()).decode("ascii")}
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    return obj


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _decode(obj):
    if isinstance(obj, dict):
        if "__array__" in obj:
            raw = base64.b64decode(obj["b64"])
            return np.frombuffer(raw, dtype=np.dtype(obj["__array__"])).reshape(obj["shape"]).copy()
        if "__bytes__" in obj:
            return base64.b64decode(obj["__bytes__"])
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


class _Failure:
    """An exception raised while preparing a batch, carried to forward()."""

    def __init__(self, exc: BaseException):
        self.exc = exc


# Every running prefetch thread with its stop event, so that interpreter exit stops them first
# (a daemon thread killed in the middle of a read makes noise at shutdown).
_RUNNING: dict = {}


@atexit.register
def _stop_all() -> None:
    for thread, stop in list(_RUNNING.items()):
        stop.set()
    for thread in list(_RUNNING):
        thread.join(timeout=2)


def _producer(ref, stop: threading.Event, out: queue.Queue) -> None:
    yield_cores_to_compute()  # decode on what the layers' BLAS threads leave idle
    try:
        _produce(ref, stop, out)
    finally:
        _RUNNING.pop(threading.current_thread(), None)


def _produce(ref, stop: threading.Event, out: queue.Queue) -> None:
    """Prefetch loop. Holds the layer only while it prepares a batch, so a dropped layer ends it."""
    while not stop.is_set():
        layer = ref()
        if layer is None:
            return
        try:
            arrays, pos = layer.read_batch(layer._pos)
            layer._pos = pos
            item = (arrays, layer._snapshot())
        except BaseException as exc:
            item = _Failure(exc)
        del layer
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                break
            except queue.Full:
                if ref() is None:
                    return
        if isinstance(item, _Failure):
            return


# ---------------------------------------------------------------------------------------------- base
class DataSourceLayer(DataSource):
    """Base of the layers that read batches from files, with prefetching, sharding and exact
    resumption (see the module docstring). Subclasses implement:

    - ``open_source()``: read parameters, open the source, set ``self.num_records`` and
      ``self.batch_size``; raise ``self.error(...)`` for bad definitions.
    - ``start_position() -> dict``: where reading starts (may draw from ``self._rng``: shuffles,
      rand_skip).
    - ``read_batch(pos) -> (arrays, new_pos)``: the batch at ``pos`` for the shard ``self._shard``,
      one array per top, and the position after it. It must not modify ``pos``; it draws randomness
      from ``self._rng`` only. Errors should name the DB key or file.
    - ``top_shapes(pos) -> list[tuple]``: the top shapes (for setup), without consuming randomness.
    - ``source_name``: the path in messages and states.
    """

    exact_num_bottom = 0
    num_records = 0
    batch_size = 0
    source_name = ""

    # ------------------------------------------------------------------ setup
    def setup(self, bottom, top):
        # A seed drawn from the global generator: netdef.set_random_seed fixes the whole sequence.
        self._rng = np.random.default_rng(int(backend.rng().integers(0, 2**63 - 1)))
        self._shard = (0, 1)
        self._shard_set = False
        self._thread = None
        self._stop = None
        self._queue = None
        self._failure = None
        self.dtype = top[0].dtype if top else backend.default_dtype()
        self.prefetch = int(self.layer_param.data_param.prefetch)
        self.worker_threads = self._guarded(data_threads)
        self._workers = None
        # Where each batch is written: a fresh host array, since the top blob keeps the array it is
        # given. The seam for a GPU run's pinned (page-locked) buffers, whose copy to the device can
        # overlap compute; such an allocator must not reuse a buffer that a blob may still hold.
        self.allocate_batch = np.empty
        self.num_tops = len(top)
        self.open_source()
        if self.batch_size <= 0:
            raise self.error("batch_size must be positive")
        if self.num_records <= 0:
            raise self.error(f"{self.source_name}: holds no records")
        self._pos = self.start_position()
        self._consumed = self._snapshot()
        for blob, shape in zip(top, self._guarded(self.top_shapes, self._pos)):
            blob.reshape(shape)

    def reshape(self, bottom, top):
        """Nothing: forward() shapes the tops like each batch (Caffe's prefetching layers too)."""

    @property
    def workers(self) -> DataWorkers:
        """The threads that decode and transform this layer's items (started on first use)."""
        if self._workers is None:
            self._workers = DataWorkers(self.worker_threads, name=f"netdef-data-{self.name}")
        return self._workers

    def _guarded(self, fn, *args):
        try:
            return fn(*args)
        except LayerError:
            raise
        except (DataError, OSError, ValueError, KeyError) as exc:
            raise self.error(str(exc)) from None

    # ------------------------------------------------------------------ snapshots
    def _snapshot(self) -> dict:
        return {"pos": self._pos, "rng": self._rng.bit_generator.state, "shard": list(self._shard)}

    def _apply(self, snap: dict) -> None:
        self._pos = snap["pos"]
        self._rng.bit_generator.state = snap["rng"]
        self._shard = tuple(int(v) for v in snap["shard"])
        self._consumed = snap

    # ------------------------------------------------------------------ forward
    def forward(self, bottom, top):
        if self._failure is not None:
            self._raise(self._failure)
        if self.prefetch <= 0:
            try:
                arrays, pos = self.read_batch(self._pos)
            except BaseException as exc:
                self._failure = _Failure(exc)
                self._raise(self._failure)
            self._pos = pos
            self._consumed = self._snapshot()
        else:
            item = self._next_prefetched()
            if isinstance(item, _Failure):
                self._failure = item
                self.close()
                self._raise(item)
            arrays, self._consumed = item
        for blob, arr in zip(top, arrays):
            if tuple(blob.shape) != arr.shape:
                blob.reshape(arr.shape)
            blob.data = arr

    def _raise(self, failure: _Failure):
        exc = failure.exc
        if isinstance(exc, (DataError, OSError, ValueError, KeyError, IndexError, LayerError)):
            message = str(exc)
            prefix = f"layer {self.name!r} ({self.type}): "
            raise LayerError(message if message.startswith(prefix) else prefix + message) from exc
        raise exc

    def _next_prefetched(self):
        if self._thread is None:
            self._start()
        while True:
            try:
                return self._queue.get(timeout=0.5)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    return _Failure(RuntimeError(f"{self.source_name}: the prefetch thread stopped unexpectedly"))

    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=max(1, self.prefetch))
        self._thread = threading.Thread(target=_producer, args=(weakref.ref(self), self._stop, self._queue),
                                        name=f"netdef-prefetch-{self.name}", daemon=True)
        _RUNNING[self._thread] = self._stop
        self._thread.start()

    def close(self) -> None:
        """Stop prefetching and discard prefetched batches; the next forward() goes on from the
        next unconsumed batch."""
        thread, stop, q = self._thread, self._stop, self._queue
        if thread is not None:
            stop.set()
            while thread.is_alive():
                try:
                    while True:
                        q.get_nowait()
                except queue.Empty:
                    pass
                thread.join(timeout=0.05)
        self._thread = self._stop = self._queue = None
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        # The producer ran ahead; rewind it (and the Generator) to what forward() consumed.
        self._apply(self._consumed)

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    # ------------------------------------------------------------------ sharding
    def set_shard(self, rank: int, num_ranks: int) -> bool:
        """Read only the records i with i % num_ranks == rank from the next batch on (call it before
        the first forward). Prefetched batches are discarded."""
        rank, num_ranks = int(rank), int(num_ranks)
        if num_ranks < 1 or not 0 <= rank < num_ranks:
            raise self.error(f"set_shard: need 0 <= rank < num_ranks, got rank {rank}, num_ranks {num_ranks}")
        if rank >= self.num_records:
            raise self.error(f"set_shard: {self.source_name} holds {self.num_records} records, too few for "
                             f"rank {rank} of {num_ranks}")
        self.close()
        snap = dict(self._consumed, shard=[rank, num_ranks])
        self._apply(snap)
        self._shard_set = True
        self._failure = None
        return True

    # ------------------------------------------------------------------ resumption
    def data_state(self) -> bytes:
        """Where the next batch forward() consumes starts, with the random state: bytes for
        ``restore_data_state``."""
        doc = {"type": self.type, "source": self.source_name, "records": int(self.num_records),
               "batch_size": int(self.batch_size), **self._consumed}
        return _STATE_MAGIC + json.dumps(_encode(doc), separators=(",", ":")).encode("utf-8")

    def restore_data_state(self, state: bytes) -> None:
        """Continue from a ``data_state()``: prefetched batches are discarded and the following
        batches are those of the run that saved the state."""
        state = bytes(state)
        if not state.startswith(_STATE_MAGIC):
            raise self.error("restore_data_state: not a data layer state (bad header)")
        try:
            doc = _decode(json.loads(state[len(_STATE_MAGIC):].decode("utf-8")))
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
            raise self.error(f"restore_data_state: corrupt state ({exc})") from None
        if not isinstance(doc, dict):
            raise self.error("restore_data_state: corrupt state (not a mapping)")
        if doc.get("type") != self.type:
            raise self.error(f"restore_data_state: the state is of a {doc.get('type')} layer")
        if doc.get("records") != self.num_records:
            raise self.error(f"restore_data_state: the state was saved over {doc.get('records')} records but "
                             f"{self.source_name} holds {self.num_records}")
        shard = self._checked_shard(doc.get("shard"))
        self.check_position(doc.get("pos"))
        if self._shard_set and shard != tuple(self._shard):
            raise self.error(f"restore_data_state: the state is for shard {shard[0]} of {shard[1]}, but "
                             f"set_shard chose {self._shard[0]} of {self._shard[1]}")
        self.close()
        try:
            backend.set_generator_state(self._rng, doc.get("rng"))
        except ValueError as exc:
            raise self.error(f"restore_data_state: the random state (rng) is not a valid "
                             f"{type(self._rng.bit_generator).__name__} state ({exc})") from None
        self._apply({"pos": doc["pos"], "rng": doc.get("rng"), "shard": list(shard)})
        self._failure = None

    def _checked_shard(self, shard) -> tuple[int, int]:
        """The saved (rank, ranks), once known to be a shard of these records."""
        if not (isinstance(shard, list) and len(shard) == 2 and all(_is_int(v) for v in shard)):
            raise self.error(f"restore_data_state: the shard must be [rank, ranks], got {shard!r:.80}")
        rank, ranks = shard
        if ranks < 1 or not 0 <= rank < ranks:
            raise self.error(f"restore_data_state: the shard says rank {rank} of {ranks}; need 0 <= rank < ranks")
        if rank >= self.num_records:
            raise self.error(f"restore_data_state: the shard says rank {rank}, but {self.source_name} holds only "
                             f"{self.num_records} records")
        return rank, ranks

    def check_position(self, pos) -> None:
        """Raise this layer's error unless ``pos`` is a position ``read_batch`` can start from (a
        restored state's): the subclasses know what their positions hold."""
        raise NotImplementedError

    def _check_fields(self, pos, fields: dict) -> None:
        """``pos`` is a dict whose ``fields`` are ints in [0, bound] (bound: the value in ``fields``)."""
        if not isinstance(pos, dict):
            raise self.error(f"restore_data_state: the position must be a mapping, got {type(pos).__name__}")
        for name, bound in fields.items():
            value = pos.get(name)
            if not _is_int(value) or not 0 <= value <= bound:
                raise self.error(f"restore_data_state: position field {name!r} must be an integer in [0, {bound}], "
                                 f"got {value!r:.80}")

    def _check_permutation(self, order, size: int, name: str) -> None:
        """``order`` is None or a permutation of range(size)."""
        if order is None:
            return
        if not (isinstance(order, np.ndarray) and order.ndim == 1 and order.size == size
                and np.issubdtype(order.dtype, np.integer)
                and np.array_equal(np.sort(order), np.arange(size))):
            raise self.error(f"restore_data_state: position field {name!r} must be a permutation of {size} indices")

    # ------------------------------------------------------------------ helpers for subclasses
    def _scan(self, ids_at, start: int, stop: int, need: int):
        """Positions in [start, stop) of the first ``need`` records of this shard, and the position
        after the last one taken (``stop`` when there are fewer). ``ids_at(a, b)`` gives the record
        ids at positions a..b-1; it is asked for growing windows, never for the whole rest."""
        rank, n = self._shard
        taken, got, pos, chunk = [], 0, start, max(need * n, 16)
        while got < need and pos < stop:
            end = min(stop, pos + chunk)
            if n > 1:
                sel = np.flatnonzero(np.asarray(ids_at(pos, end)) % n == rank)
            else:
                sel = np.arange(end - pos)
            sel = sel[:need - got] + pos
            taken.append(sel)
            got += len(sel)
            pos = end
            chunk *= 2
        taken = np.concatenate(taken) if taken else np.empty(0, dtype=np.int64)
        return taken, (int(taken[-1]) + 1 if got == need else stop)

    # Subclass hooks.
    def _resolved_transform_param(self):
        """transform_param with its mean_file found as data sources are (see Layer.resolve_path)."""
        param = type(self.layer_param.transform_param)()
        param.CopyFrom(self.layer_param.transform_param)
        if param.HasField("mean_file"):
            param.mean_file = self.resolve_path(param.mean_file)
        return param

    def open_source(self) -> None:
        raise NotImplementedError

    def start_position(self) -> dict:
        raise NotImplementedError

    def read_batch(self, pos: dict):
        raise NotImplementedError

    def top_shapes(self, pos: dict) -> list:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------- Data
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

    def _item(self, record) -> np.ndarray:
        key, datum = record
        return datum_item(datum, color=self.decode_color, name=self._record_name(key))

    def read_batch(self, pos):
        keys, values, new_pos = self._records(pos, self.batch_size)
        datums = [self._parse(key, value) for key, value in zip(keys, values)]
        raw = raw_datum_batch(datums)
        if raw is not None:
            data = self.transformer(raw, self._rng, self.workers, self.allocate_batch)
        else:
            # Encoded or float items, or items of several shapes: one at a time, errors naming the record.
            items = self.workers.map(self._item, zip(keys, datums))
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


# ---------------------------------------------------------------------------------------------- ImageData
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
        self.labels = np.asarray(labels, dtype=np.int64)
        self.num_records = len(names)
        try:
            self.transformer = DataTransformer(self._resolved_transform_param(), self.phase, self.dtype)
        except DataError as exc:
            raise self.error(str(exc)) from None

    def _path(self, i: int) -> str:
        root = self.layer_param.image_data_param.root_folder
        if root:
            root = self.resolve_path(root) + (os.sep if root.endswith(("/", os.sep)) else "")
        path = root + self.names[i]
        # lexists: a link that leads nowhere (a loop) is the file meant; opening it will say what is wrong.
        if root and not os.path.lexists(path) and not root.endswith(("/", os.sep)):
            joined = os.path.join(root, self.names[i])
            if os.path.lexists(joined):
                path = joined
        return path

    def _read(self, i: int) -> np.ndarray:
        p = self.layer_param.image_data_param
        path = self._path(int(i))
        try:
            return read_image(path, p.new_height, p.new_width, p.is_color)
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
        items = self.workers.map(self._read, ids)
        names = [self._path(int(i)) for i in ids]
        data = self.transformer.transform_items(items, self._rng, names, self.workers, self.allocate_batch)
        return [data, self.labels[ids].astype(self.dtype)], new_pos

    def top_shapes(self, pos):
        # Peek at the next image of this shard without drawing from the Generator.
        order, j = pos["order"], int(pos["j"])
        ids = order if order is not None else np.arange(self.num_records)
        taken, _ = self._scan(lambda a, b: ids[a:b], j, self.num_records, 1)
        if not len(taken):
            taken, _ = self._scan(lambda a, b: ids[a:b], 0, self.num_records, 1)
        first = ids[taken[0]]
        shape = self.transformer.output_shape(self._read(first).shape)
        return [(self.batch_size,) + shape, (self.batch_size,)]


# ---------------------------------------------------------------------------------------------- HDF5Data
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


# ---------------------------------------------------------------------------------------------- HDF5Output
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
