"""A small key-value DB layer over LMDB (``lmdb``) and LevelDB (``plyvel``, optional), as Caffe's
``db::DB`` / ``Cursor`` / ``Transaction``.

Keys and values are bytes; iteration is in key order (bytewise). Readers open LMDB read-only with
locking off, so read-only folders (fixtures, shared datasets) work and nothing is written into them.
Writers buffer puts in a Transaction and write them on ``commit()``; an LMDB whose map is full is
grown (doubled) and the commit retried, as Caffe's LMDBTransaction does.

LMDB maps its data file into memory, and a page read beyond the end of a truncated file kills the
process with SIGBUS, which no exception handler sees. So before opening an LMDB for reading, the data
file's two meta pages are checked (see ``check_lmdb_data_file``) and the map is bounded by the file's
size: every page LMDB may then touch lies inside the file, and a damaged page reference becomes
lmdb's PageNotFoundError. Every lmdb exception is raised as a DBError naming the database.

    db = open_db("examples/mnist/mnist_train_lmdb")           # read
    with db.cursor() as cur:
        cur.seek_first()
        while cur.valid:
            use(cur.key, cur.value)
            cur.next()
    out = open_db("new_lmdb", mode="w")                       # create (must not exist)
    txn = out.transaction(); txn.put(b"00000000", value); txn.commit(); out.close()
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import struct
import threading
import weakref

import numpy as np

from ..files import InputFileError, check_file_name, check_input_file, missing_reason
from .errors import DataError


class DBError(DataError):
    """A DB that cannot be opened, read or written; the message names its path."""


def backend_name(backend) -> str:
    """``"lmdb"`` or ``"leveldb"`` from a name (any case) or a DataParameter.DB value."""
    if isinstance(backend, int) and not isinstance(backend, bool):
        from ..proto import netdef_pb2 as pb

        names = {pb.DataParameter.LMDB: "lmdb", pb.DataParameter.LEVELDB: "leveldb"}
        if backend not in names:
            raise DBError(f"unknown DB backend {backend}")
        return names[backend]
    name = str(backend).lower()
    if name not in ("lmdb", "leveldb"):
        raise DBError(f"unknown DB backend {backend!r} (use lmdb or leveldb)")
    return name


def open_db(path, backend="lmdb", mode: str = "r"):
    """Open a DB. ``mode``: ``"r"`` read, ``"w"`` create a new one (the path must not exist, as
    Caffe's NEW mode), ``"a"`` open for writing, creating it if needed."""
    name = backend_name(backend)
    if mode not in ("r", "w", "a"):
        raise ValueError(f"open_db: mode must be 'r', 'w' or 'a', not {mode!r}")
    path = os.fspath(path)
    try:
        check_file_name(path, f"{name} database")
    except InputFileError as exc:
        raise DBError(str(exc)) from None
    if mode == "w" and os.path.exists(path):
        raise DBError(f"{path} already exists: remove it first or choose another output path")
    if name == "lmdb":
        return LMDB(path, mode)
    return LevelDB(path, mode)


class Cursor:
    """Iterates a DB in key order. ``valid`` is False past the last record."""

    key: bytes
    value: bytes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        pass


class Transaction:
    """Buffers puts; ``commit()`` writes them all."""

    def __init__(self, db):
        self._db = db
        self._items: list[tuple[bytes, bytes]] = []

    def put(self, key: bytes, value: bytes) -> None:
        self._items.append((bytes(key), bytes(value)))

    def commit(self) -> None:
        if self._items:
            self._db._write(self._items)
        self._items = []

    def __len__(self) -> int:
        return len(self._items)


class _Shared:
    """One open handle per folder and process: LMDB forbids opening an environment twice in a
    process (py-lmdb refuses it) and LevelDB locks its folder, so every DB object on a folder shares
    one handle. ``users`` counts the live DB objects. A handle is only closed by the thread that
    opens or closes a DB object, never from a garbage-collection finalizer, so no other thread can
    lose it while reading."""

    def __init__(self, handle, readonly: bool):
        self.handle = handle
        self.readonly = readonly
        self.users = 0


_OPEN: dict = {}
_OPEN_LOCK = threading.RLock()


def _release(shared: _Shared) -> None:
    shared.users -= 1


@atexit.register
def _close_all() -> None:
    # Close the handles while the interpreter is whole (LevelDB's background thread and lmdb's
    # maps are better ended before module teardown).
    with _OPEN_LOCK:
        for shared in list(_OPEN.values()):
            try:
                shared.handle.close()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        _OPEN.clear()


class _DB:
    path: str
    writable: bool
    kind = ""
    _shared = None

    def _acquire(self, readonly: bool, opener):
        """The shared handle for ``self.path`` (``opener()`` makes one when none is open)."""
        key = (self.kind, os.path.realpath(self.path))
        with _OPEN_LOCK:
            shared = _OPEN.get(key)
            if shared is not None and shared.users <= 0:
                # Nobody uses it: reopen, so that a DB rewritten since is seen afresh.
                shared.handle.close()
                del _OPEN[key]
                shared = None
            if shared is not None and shared.readonly != readonly:
                raise DBError(f"{self.path}: this DB is already open in this process "
                              f"{'read-only' if shared.readonly else 'for writing'}; close it first")
            if shared is None:
                shared = _Shared(opener(), readonly)
                _OPEN[key] = shared
            shared.users += 1
        self._key = key
        self._shared = shared
        self._finalizer = weakref.finalize(self, _release, shared)
        return shared.handle

    def close(self) -> None:
        """Release the handle (closed when no other DB object of this process uses it)."""
        shared = self._shared
        if shared is None:
            return
        with _OPEN_LOCK:
            self._finalizer()  # the one release, now
            if shared.users <= 0 and _OPEN.get(self._key) is shared:
                shared.handle.close()
                del _OPEN[self._key]
        self._shared = None
        self._closed()

    def _closed(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def transaction(self) -> Transaction:
        if not self.writable:
            raise DBError(f"{self.path}: opened read-only; open_db(..., mode='w' or 'a') to write")
        return Transaction(self)

    def put(self, key: bytes, value: bytes) -> None:
        """Write one record now (a one-put transaction)."""
        txn = self.transaction()
        txn.put(key, value)
        txn.commit()

    def items(self):
        """(key, value) pairs in key order."""
        with self.cursor() as cur:
            cur.seek_first()
            while cur.valid:
                yield cur.key, cur.value
                cur.next()

    def keys(self):
        for key, _ in self.items():
            yield key


# ---------------------------------------------------------------------------------------------- LMDB
def _lmdb():
    try:
        import lmdb
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DBError("LMDB support needs the lmdb package: pip install lmdb") from exc
    return lmdb


# The meta pages that begin an LMDB data file (LMDB 0.9's MDB_page header and MDB_meta, 64-bit):
_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_DATA_VERSION = 1
_P_META = 0x08
_FLAGS_AT = 10           # MDB_page.mp_flags (uint16)
_MAGIC_AT = 16           # MDB_meta.mm_magic, mm_version (uint32 each)
_PAGE_SIZE_AT = 40       # mm_dbs[FREE_DBI].md_pad holds the page size (uint32)
_LAST_PAGE_AT = 136      # mm_last_pg, mm_txnid (uint64 each)
_META_BYTES = 152
_MIN_PAGE_SIZE = 512


def check_lmdb_data_file(data_path: str, db_path: str) -> int:
    """The size of an LMDB data file that can be mapped safely; a DBError naming ``db_path`` otherwise.

    Checks what LMDB would trust without checking: a regular file, two meta pages with LMDB's magic
    and version, a sane page size that divides the file size, and that the last page either meta page
    claims in use lies inside the file (a truncated file fails this: reading past it is SIGBUS)."""
    try:
        check_input_file(data_path, "LMDB data file")
    except InputFileError as exc:
        raise DBError(f"LMDB {db_path}: {exc}") from None
    size = os.path.getsize(data_path)
    bad = f"LMDB {db_path}: {data_path} is not a usable LMDB data file"
    with open(data_path, "rb") as handle:
        first = handle.read(_META_BYTES)
        if len(first) < _META_BYTES:
            raise DBError(f"{bad}: {size} bytes, smaller than its meta pages")
        page_size = struct.unpack_from("<I", first, _PAGE_SIZE_AT)[0]
        if page_size < _MIN_PAGE_SIZE or page_size & (page_size - 1):
            page_size = 0  # reported below with the magic check of the first page
        handle.seek(page_size)
        second = handle.read(_META_BYTES) if page_size else b""
    for index, page in enumerate((first, second)):
        if len(page) < _META_BYTES:
            raise DBError(f"{bad}: {size} bytes, too short for its second meta page (truncated?)")
        flags = struct.unpack_from("<H", page, _FLAGS_AT)[0]
        magic, version = struct.unpack_from("<II", page, _MAGIC_AT)
        if not flags & _P_META or magic != _LMDB_MAGIC or not page_size:
            raise DBError(f"{bad}: meta page {index} lacks LMDB's signature (not an LMDB, or damaged)")
        if version != _LMDB_DATA_VERSION:
            raise DBError(f"{bad}: meta page {index} has LMDB data version {version}, netdef reads version "
                          f"{_LMDB_DATA_VERSION}")
        last_page = struct.unpack_from("<Q", page, _LAST_PAGE_AT)[0]
        if (last_page + 1) * page_size > size:
            raise DBError(f"{bad}: it is {size} bytes but its meta page {index} says pages up to {last_page} "
                          f"of {page_size} bytes are in use ({(last_page + 1) * page_size} bytes): truncated?")
    if size % page_size:
        raise DBError(f"{bad}: {size} bytes is not a whole number of {page_size}-byte pages (truncated?)")
    return size


@contextlib.contextmanager
def _lmdb_errors(path: str, doing: str):
    """lmdb's exceptions (CorruptedError, PageNotFoundError, BadValsizeError...) as DBErrors naming the DB."""
    lmdb = _lmdb()
    try:
        yield
    except lmdb.Error as exc:
        raise DBError(f"LMDB {path}: {doing} failed: {type(exc).__name__}: {exc}") from None


class _MapBounds:
    """Where a read-only environment's file is mapped, so that a record is copied out only when it
    lies inside.

    lmdb hands back a record as a pointer into the map and a size read from the page; a damaged size
    (or overflow page number) points past the map's end, and copying it killed the process with SIGSEGV
    before Python saw anything (fuzz finding, issue 11). Read as buffers (``begin(buffers=True)``: no
    copy), a record's address and size are checked first. lmdb does not say where it mapped the file
    (``info()["map_addr"]`` is the address a fixed map asked for, 0 here), so the bounds come from
    the process's own memory map (/proc/self/maps); where that is not readable nothing is checked."""

    def __init__(self, data_path: str, db_path: str, checked: bool = True):
        self.path = db_path
        self.start = self.end = None
        if not checked:
            return
        target = os.path.realpath(data_path)
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
                spans = [line.split()[0].split("-") for line in maps if line.rstrip("\n").endswith(" " + target)]
        except OSError:
            return
        if spans:
            self.start = min(int(a, 16) for a, _ in spans)
            self.end = max(int(b, 16) for _, b in spans)

    # LMDB 0.9's leaf node (the version py-lmdb bundles): an 8-byte header (mn_lo, mn_hi: the value's
    # size; mn_flags; mn_ksize) right before the key, then the value, or for F_BIGDATA the number of
    # its first overflow page, whose 16-byte header precedes the value.
    NODE_HEADER = struct.Struct("<HHHH")
    F_BIGDATA = 0x01
    PAGE_HEADER = 16

    def record_key(self, key_buffer, page_size: int) -> bytes:
        """The key of the record whose key lmdb placed at ``key_buffer``, copied once it is known to lie
        in the map, and after checking that the value's extent, read from the record's node, lies in
        the map too: py-lmdb copies (or touches) the value as soon as it is asked for it, past any
        check of ours. The record's address is taken once for both checks (taking it builds a ctypes
        object each time, and a data layer reads thousands of records per second)."""
        size = len(key_buffer)
        if self.start is None or not size:
            return bytes(key_buffer)
        key_at = np.frombuffer(key_buffer, dtype=np.uint8).ctypes.data
        if key_at < self.start or key_at + size > self.end:
            raise DBError(f"LMDB {self.path}: a record's key ({size} bytes) lies outside the database file (damaged)")
        self._check_value(key_at, size, page_size)
        return bytes(key_buffer)

    def _check_value(self, key_at: int, key_size: int, page_size: int) -> None:
        if key_at - self.NODE_HEADER.size < self.start:
            raise DBError(f"LMDB {self.path}: a record's node lies outside the database file (damaged)")
        lo, hi, flags, _ = self.NODE_HEADER.unpack(ctypes.string_at(key_at - self.NODE_HEADER.size,
                                                                    self.NODE_HEADER.size))
        size = lo | (hi << 16)
        if flags & self.F_BIGDATA:
            if key_at + key_size + 8 > self.end:
                raise DBError(f"LMDB {self.path}: a record's node lies outside the database file (damaged)")
            (page,) = struct.unpack("<Q", ctypes.string_at(key_at + key_size, 8))
            value_at = self.start + page * page_size + self.PAGE_HEADER
        else:
            value_at = key_at + key_size
        if value_at < self.start or value_at + size > self.end:
            raise DBError(f"LMDB {self.path}: a record's value ({size} bytes) lies outside the database file "
                          f"(damaged)")


class _LmdbCursor(Cursor):
    """``key`` and ``value`` are read (checked and copied) when first asked for after a move, so
    that a reader skipping records (a data layer reading its shard) pays only for the moves."""

    def __init__(self, db: LMDB):
        if db._env is None:
            raise DBError(f"{db.path}: the DB is closed")
        self._db = db  # keeps the environment in use while the cursor lives
        self._path = db.path
        self._bounds = db._bounds
        self._lmdb_error = _lmdb().Error
        with _lmdb_errors(self._path, "starting a read"):
            self._page_size = int(db._env.stat()["psize"])
            self._txn = db._env.begin(write=False, buffers=True)
            self._cur = self._txn.cursor()
        self.valid = False
        self._record = (b"", b"")

    def _failed(self, exc) -> DBError:
        return DBError(f"LMDB {self._path}: reading failed: {type(exc).__name__}: {exc}")

    def _move(self, move, *args) -> bool:
        # try/except rather than _lmdb_errors: a context manager costs more than the move itself.
        try:
            self.valid = bool(move(*args))
        except self._lmdb_error as exc:
            raise self._failed(exc) from None
        self._record = None
        return self.valid

    def _read(self) -> tuple[bytes, bytes]:
        if self._record is None:
            if not self.valid:
                self._record = (b"", b"")
                return self._record
            try:
                key = self._bounds.record_key(self._cur.key(), self._page_size)
                self._record = (key, bytes(self._cur.value()))  # its extent checked just above
            except self._lmdb_error as exc:
                raise self._failed(exc) from None
        return self._record

    @property
    def key(self) -> bytes:
        return self._read()[0]

    @property
    def value(self) -> bytes:
        return self._read()[1]

    def seek_first(self) -> bool:
        return self._move(self._cur.first)

    def seek(self, key: bytes) -> bool:
        """Position at exactly ``key``; False (and not valid) when it is absent."""
        return self._move(self._cur.set_key, bytes(key))

    def seek_range(self, key: bytes) -> bool:
        """Position at the first key >= ``key``."""
        return self._move(self._cur.set_range, bytes(key))

    def next(self) -> bool:
        return self._move(self._cur.next)

    def close(self) -> None:
        if self._txn is not None:
            try:
                self._read()  # the current record stays readable after the transaction ends
            except DBError:
                self.valid, self._record = False, (b"", b"")
            self._txn.abort()
            self._txn = None
        self._db = None


class LMDB(_DB):
    """An LMDB environment folder (or a single data file)."""

    kind = "lmdb"

    INITIAL_MAP_SIZE = 1 << 24

    def __init__(self, path: str, mode: str = "r"):
        lmdb = _lmdb()
        self.path = path
        self.writable = mode != "r"
        self._env = None
        subdir = not os.path.isfile(path)
        if mode == "r" and not os.path.exists(path):
            raise DBError(f"{path}: no such LMDB ({missing_reason(path, 'the folder does not exist')})")

        def opener():
            try:
                if mode == "r":
                    data_path = os.path.join(path, "data.mdb") if subdir else path
                    if subdir and not os.path.exists(data_path):
                        raise DBError(f"{path}: not an LMDB (the folder has no data.mdb)")
                    # A map no larger than the file: LMDB then refuses pages past it (see the module's doc).
                    size = check_lmdb_data_file(data_path, path)
                    return lmdb.open(path, subdir=subdir, readonly=True, lock=False, map_size=size)
                return lmdb.open(path, subdir=subdir, map_size=self.INITIAL_MAP_SIZE, create=True)
            except lmdb.Error as exc:
                raise DBError(f"{path}: cannot open LMDB ({type(exc).__name__}: {exc})") from None

        self._env = self._acquire(mode == "r", opener)
        # A file written here is netdef's own, and its map moves as it grows: only reads are checked.
        self._bounds = _MapBounds(os.path.join(path, "data.mdb") if subdir else path, path, checked=not self.writable)

    def __len__(self) -> int:
        with _lmdb_errors(self.path, "counting records"):
            entries, map_size = int(self._env.stat()["entries"]), int(self._env.info()["map_size"])
        # The count is read from a meta page as is: a damaged one can say anything (past 2**63, len()
        # itself fails). Every record takes more than a byte of the map (the whole file, when reading).
        if entries > map_size:
            raise DBError(f"LMDB {self.path}: its meta page counts {entries} records, more than its "
                          f"{map_size}-byte map can hold (damaged)")
        return entries

    def get(self, key: bytes) -> bytes | None:
        # Through a cursor: its move checks the record's extent before lmdb reads the value.
        with self.cursor() as cur:
            return cur.value if cur.seek(key) else None

    def cursor(self) -> _LmdbCursor:
        return _LmdbCursor(self)

    def _write(self, items) -> None:
        lmdb = _lmdb()
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in items:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:
                # Caffe's LMDBTransaction::DoubleMapSize: grow and redo the whole transaction.
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
            except lmdb.Error as exc:
                raise DBError(f"{self.path}: LMDB write failed ({exc})") from None

    def _closed(self) -> None:
        self._env = None


# ---------------------------------------------------------------------------------------------- LevelDB
def _plyvel():
    try:
        import plyvel
    except ImportError:
        raise DBError('LevelDB support needs the plyvel package (pip install "netdef-trainer[leveldb]"); or convert '
                      'the data to LMDB (backend: LMDB)') from None
    return plyvel


class _LevelCursor(Cursor):
    def __init__(self, db: LevelDB):
        if db._db is None:
            raise DBError(f"{db.path}: the DB is closed")
        self._owner = db  # keeps the handle in use while the cursor lives
        self._it = db._db.raw_iterator()
        self.valid = False
        self.key = b""
        self.value = b""

    def _load(self) -> bool:
        self.valid = bool(self._it.valid())
        if self.valid:
            self.key, self.value = self._it.key(), self._it.value()
        else:
            self.key, self.value = b"", b""
        return self.valid

    def seek_first(self) -> bool:
        self._it.seek_to_first()
        return self._load()

    def seek(self, key: bytes) -> bool:
        self._it.seek(bytes(key))
        if self._load() and self.key != bytes(key):
            self.valid, self.key, self.value = False, b"", b""
        return self.valid

    def seek_range(self, key: bytes) -> bool:
        self._it.seek(bytes(key))
        return self._load()

    def next(self) -> bool:
        self._it.next()
        return self._load()

    def close(self) -> None:
        if self._it is not None:
            self._it.close()
            self._it = None
        self._owner = None


class LevelDB(_DB):
    """A LevelDB folder, through plyvel (Caffe's options: 256 MB write buffer, 64 KB blocks)."""

    kind = "leveldb"

    def __init__(self, path: str, mode: str = "r"):
        plyvel = _plyvel()
        self.path = path
        self.writable = mode != "r"
        self._db = None
        if mode == "r" and not os.path.exists(path):
            raise DBError(f"{path}: no such LevelDB ({missing_reason(path, 'the folder does not exist')})")

        def opener():
            try:
                if mode == "r":
                    return plyvel.DB(path, create_if_missing=False, max_open_files=100)
                return plyvel.DB(path, create_if_missing=True, error_if_exists=(mode == "w"),
                                 write_buffer_size=268435456, block_size=65536, max_open_files=100)
            except plyvel.Error as exc:
                raise DBError(f"{path}: cannot open LevelDB ({exc})") from None

        self._db = self._acquire(mode == "r", opener)
        self._count = None

    def __len__(self) -> int:
        # LevelDB keeps no count; one pass over the keys, remembered while nothing is written.
        if self._count is None:
            self._count = sum(1 for _ in self._db.iterator(include_value=False))
        return self._count

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(bytes(key))

    def cursor(self) -> _LevelCursor:
        return _LevelCursor(self)

    def _write(self, items) -> None:
        plyvel = _plyvel()
        try:
            with self._db.write_batch() as batch:
                for key, value in items:
                    batch.put(key, value)
        except plyvel.Error as exc:
            raise DBError(f"{self.path}: LevelDB write failed ({exc})") from None
        self._count = None

    def _closed(self) -> None:
        self._db = None
