"""The DB layer: LMDB reading (read-only, no lock), writing with map growth, key-ordered cursors;
LevelDB through plyvel when it is installed (a clear error otherwise)."""
from __future__ import annotations

import importlib
import os
import pathlib
import re
import subprocess
import sys

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


def test_lmdb_cursor_reads_a_record_when_asked_and_keeps_it_after_closing(tmp_path):
    records = {b"%08d" % i: b"value %d" % i for i in range(40)}
    db = open_db(write_lmdb(tmp_path / "db", records))
    with db.cursor() as cur:
        cur.seek_first()
        for _ in range(25):  # moves alone, as a data layer skipping the other ranks' records
            cur.next()
        assert cur.key == b"00000025" and cur.value == b"value 25"
        assert cur.seek(b"00000039") and cur.value == b"value 39"
    assert cur.key == b"00000039" and cur.value == b"value 39"  # the transaction has ended
    assert list(db.items()) == sorted(records.items())
    db.close()


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


# ------------------------------------------------------------------------------ damaged LMDB files
# Each case is read in a subprocess: a page read past the end of a mapped file is SIGBUS, which would
# kill the test run itself; a clean refusal exits with status 3 after printing the DBError.
READ_WHOLE_DB = """
import sys
from netdef.data.db import DBError, open_db
try:
    db = open_db(sys.argv[1])
    print(len(db), sum(len(value) for _, value in db.items()))
except DBError as exc:
    print(f"DBError: {exc}")
    sys.exit(3)
"""


def damaged_lmdb(tmp_path, damage) -> pathlib.Path:
    """An LMDB of 300 records of 1000 bytes (about 100 pages), then ``damage(data.mdb path, size)``."""
    rng = np.random.default_rng(5)
    path = write_lmdb(tmp_path / "db", {b"%08d" % i: rng.bytes(1000) for i in range(300)})
    data = path / "data.mdb"
    damage(data, data.stat().st_size)
    return path


def read_in_subprocess(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", READ_WHOLE_DB, str(path)], capture_output=True, text=True,
                          timeout=60)


def overwrite(data, offset: int, payload: bytes) -> None:
    with open(data, "r+b") as handle:
        handle.seek(offset)
        handle.write(payload)


def big_record_size_set_to_2_gib(tmp_path) -> pathlib.Path:
    """An LMDB with one record on overflow pages (key ``zz_big``) whose size, in its leaf node header
    (mn_lo, mn_hi: the first 4 of the 8 bytes right before the key), says 0x7fff0000: copying the value
    ran far past the map's end and was SIGSEGV (fuzz finding of the long run)."""
    rng = np.random.default_rng(5)
    records = {b"%08d" % i: rng.bytes(1000) for i in range(30)}
    records[b"zz_big"] = rng.bytes(20000)
    path = write_lmdb(tmp_path / "db", records)
    data = path / "data.mdb"
    key = data.read_bytes().index(b"zz_big")
    overwrite(data, key - 8, b"\x00\x00\xff\x7f")
    return path


def test_a_record_whose_size_runs_past_the_file_is_a_clear_error(tmp_path):
    path = big_record_size_set_to_2_gib(tmp_path)
    done = read_in_subprocess(path)
    assert done.returncode == 3, f"exit status {done.returncode} (negative: killed by a signal)\n{done.stderr}"
    assert "a record's value (2147418112 bytes) lies outside the database file (damaged)" in done.stdout
    assert str(path) in done.stdout


DAMAGES = {
    "truncated to a third": (lambda data, size: os.truncate(data, size // 3),
                             r"meta page 1 says pages up to \d+ of \d+ bytes are in use .*truncated\?"),
    "first meta page overwritten": (lambda data, size: overwrite(data, 0, b"\xff" * 64),
                                    "meta page 0 lacks LMDB's signature"),
    "not whole pages": (lambda data, size: overwrite(data, size, b"abc"),
                        r"is not a whole number of \d+-byte pages"),
    "shorter than a meta page": (lambda data, size: os.truncate(data, 100), "smaller than its meta pages"),
    # MDB_meta.mm_dbs[MAIN_DBI].md_entries (offset 120 of each meta page): len() failed with OverflowError.
    "record count past 2**63": (lambda data, size: [overwrite(data, meta + 120, b"\xff" * 8) for meta in (0, 4096)],
                                r"its meta page counts 18446744073709551615 records, more than its \d+-byte map"),
    "garbage in the middle": (lambda data, size: overwrite(data, 40 * 4096, np.random.default_rng(1).bytes(40960)),
                              r"LMDB .*db: reading failed: (CorruptedError|PageNotFoundError|BadValsizeError)"),
}


@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_damaged_lmdb_is_a_clear_error_not_a_signal(tmp_path, case):
    damage, message = DAMAGES[case]
    path = damaged_lmdb(tmp_path, damage)
    done = read_in_subprocess(path)
    assert done.returncode == 3, f"exit status {done.returncode} (negative: killed by a signal)\n{done.stderr}"
    assert re.search(message, done.stdout), done.stdout
    assert str(path) in done.stdout


def test_intact_lmdb_reads_whole_in_a_subprocess(tmp_path):
    done = read_in_subprocess(damaged_lmdb(tmp_path, lambda data, size: None))
    assert done.returncode == 0 and done.stdout.split() == ["300", "300000"]


def test_lmdb_data_file_that_is_a_fifo_is_refused(tmp_path):
    folder = tmp_path / "fifo_lmdb"
    folder.mkdir()
    os.mkfifo(folder / "data.mdb")
    with pytest.raises(DBError, match=r"LMDB .*fifo_lmdb: LMDB data file .*data.mdb: is a FIFO"):
        open_db(folder)
