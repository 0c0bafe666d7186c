"""What the file-backed data layers share (``DataSourceLayer``): prefetching, sharding, exact resumption.

- A background thread prepares the next ``data_param.prefetch`` batches (default 4; 0 reads in the
  forward pass itself) while the current one is used. Data and ImageData decode and transform the
  items of a batch on ``threads.data_threads()`` threads (``DataWorkers``), the preparing thread one
  of them; the batches are those of one thread, whatever the count. It is a daemon thread that holds no strong
  reference to the layer while it waits, so a dropped net stops it; ``close()`` stops it at once.
  An exception in it (a corrupt record, an unreadable image, a missing file) is raised by the
  forward() that would have consumed the batch, naming the layer and the DB key or file. When the
  tops live on a GPU, that thread writes each batch into pinned host memory and starts its copy to
  the device too, on a stream of its own (``staging.py``).
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
import queue
import threading
import weakref

import numpy as np

from ... import backend
from ...data.errors import DataError
from ...data.item_buffers import ItemBuffers
from ...data.workers import DataWorkers
from ...threads import data_threads
from ..base import DataSource, LayerError
from .staging import staging_for

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
            item = (layer.staging.stage(arrays), layer._snapshot())
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
    _stop = None  # the prefetch thread's stop event while it runs

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
        # Where each batch's items are decoded (reused batch after batch; item_buffers.py): read_batch
        # transforms a batch's items into the batch's own array before it decodes the next batch's.
        self.item_buffers = ItemBuffers()
        # Where each batch is written and how it reaches the tops' device (staging.py): fresh host
        # arrays on the CPU; on a GPU pinned buffers, copied to the device by the prefetch thread.
        self.staging = staging_for(top[0].array_module if top else np)
        self.allocate_batch = self.staging.allocate
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
            arrays = self.staging.stage(arrays).take()
        else:
            item = self._next_prefetched()
            if isinstance(item, _Failure):
                self._failure = item
                self.close()
                self._raise(item)
            staged, self._consumed = item
            arrays = staged.take()
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
        if self._stop is not None:
            self._stop.set()

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
