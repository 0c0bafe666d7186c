"""The DB layer: LMDB reading (read-only, no lock), writing with map growth, key-ordered cursors;
LevelDB through plyvel when it is installed (a clear error otherwise)."""
from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from netdef.data.db import LMDB, DBError, backend_name, open_db
from netdef.proto import netdef_pb2 as pb
from tests.data.builders import CAFFE_MADE, write_lmdb
from tests.helpers import shared_path

pytest.importorskip("lmdb")


def test_read_caffe_lmdb_read_only_in_key_order():
    path = shared_path(*CAFFE_MADE, "mnist_test_lmdb")
    before = {p: os.stat(path / p).st_mtime_ns for p in os.listdir(path)}
    exp = np.load(shared_path(*CAFFE_MADE, "mnist_test_expected.npz"))
    db = open_db(path)
    assert len(db) == 2000
    keys = list(db.keys())
    assert keys[0] == exp["key_first"].item() and keys[-1] == exp["key_last"].item()
    assert keys == sorted(keys) and len(keys) == 2000
    assert db.get(b"00000000") == exp["datum0_bytes"].tobytes()
    assert db.get(b"nope") is None
    with db.cursor() as cur:
        assert cur.seek(b"00001999") and cur.key == b"00001999"
        assert not cur.next() and not cur.valid
        assert cur.seek_range(b"00000010x") and cur.key == b"00000011"
        assert not cur.seek(b"00000010x")
    with pytest.raises(DBError, match="read-only"):
        db.transaction()
    db.close()
    assert {p: os.stat(path / p).st_mtime_ns for p in os.listdir(path)} == before


def test_write_read_and_map_growth(tmp_path, monkeypatch):
    # A tiny first map forces the commit to grow it several times.
    monkeypatch.setattr(LMDB, "INITIAL_MAP_SIZE", 1 << 16)
    db = open_db(tmp_path / "db", "lmdb", "w")
    value = bytes(range(256)) * 64  # 16 KiB
    txn = db.transaction()
    for i in (5, 3, 40, 1):
        txn.put(b"k%03d" % i, value + bytes([i]))
    assert len(txn) == 4
    txn.commit()
    for i in range(100, 140):
        db.put(b"k%03d" % i, value)
    assert db._env.info()["map_size"] > 1 << 16
    db.close()
    db = open_db(tmp_path / "db")
    assert len(db) == 44
    keys = list(db.keys())
    assert keys[:4] == [b"k001", b"k003", b"k005", b"k040"]
    assert db.get(b"k040") == value + bytes([40])
    db.close()
    with pytest.raises(DBError, match="already exists"):
        open_db(tmp_path / "db", "lmdb", "w")
    # "a" reopens for more writes.
    db = open_db(tmp_path / "db", "lmdb", "a")
    db.put(b"k000", b"x")
    assert len(db) == 45
    db.close()


def test_errors_name_the_path(tmp_path):
    with pytest.raises(DBError, match="nothere"):
        open_db(tmp_path / "nothere")
    with pytest.raises(DBError, match="unknown DB backend"):
        open_db(tmp_path, "rocksdb")
    assert backend_name(pb.DataParameter.LMDB) == "lmdb" and backend_name("LevelDB") == "leveldb"


def test_empty_db_iterates_nothing(tmp_path):
    write_lmdb(tmp_path / "e", {})
    db = open_db(tmp_path / "e")
    assert len(db) == 0 and list(db.items()) == []
    db.close()


def test_leveldb_round_trip_or_clear_error(tmp_path):
    try:
        importlib.import_module("plyvel")
    except ImportError:
        with pytest.raises(DBError, match="plyvel"):
            open_db(tmp_path / "ldb", "leveldb", "w")
        return
    db = open_db(tmp_path / "ldb", "leveldb", "w")
    txn = db.transaction()
    for i in (2, 0, 1):
        txn.put(b"%08d" % i, b"v%d" % i)
    txn.commit()
    db.close()
    db = open_db(tmp_path / "ldb", "leveldb")
    assert len(db) == 3 and list(db.items()) == [(b"%08d" % i, b"v%d" % i) for i in range(3)]
    with db.cursor() as cur:
        assert cur.seek(b"00000001") and cur.value == b"v1"
        assert not cur.seek(b"00000001x")
    db.close()
