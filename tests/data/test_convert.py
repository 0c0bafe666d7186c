"""The converters against the Caffe-made LMDBs and mean files (byte for byte), IDX writing, the MNIST
downloader (against a local HTTP server) and the scikit-learn digits."""
from __future__ import annotations

import functools
import gzip
import http.server
import re
import threading
import warnings

import numpy as np
import pytest

from netdef.data import convert as C
from netdef.data.datum import datum_to_array, parse_datum, read_mean_file
from netdef.data.db import open_db
from netdef.data.errors import DataError
from netdef.data.idx import read_idx
from netdef.data.image import read_image, resize
from tests.data.builders import CAFFE_MADE, write_images
from tests.helpers import shared_path

pytest.importorskip("lmdb")


def made(*parts):
    return shared_path(*CAFFE_MADE, *parts)


def entries(path, backend="lmdb"):
    db = open_db(path, backend)
    out = list(db.items())
    db.close()
    return out


# ---------------------------------------------------------------------------------------------- IDX
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("name", ["x.idx", "x.idx.gz"])
def test_write_idx_round_trip(tmp_path, dtype, name):
    arr = (np.arange(24).reshape(2, 3, 4) * 3 - 20).astype(dtype)
    path = C.write_idx(tmp_path / name, arr)
    back = read_idx(path)
    assert back.shape == arr.shape and back.dtype.kind == np.dtype(dtype).kind
    np.testing.assert_array_equal(back, arr)
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"
        assert C.write_idx(tmp_path / "again.gz", arr).read_bytes() == path.read_bytes()  # deterministic
    with pytest.raises(ValueError):
        C.write_idx(tmp_path / "bad", np.zeros(3, np.uint32))


# ---------------------------------------------------------------------------------------------- MNIST
def test_convert_mnist_equals_caffe_made_lmdb(tmp_path):
    images = read_idx(shared_path("data", "mnist", "t10k-images-idx3-ubyte.gz"))[8000:]
    labels = read_idx(shared_path("data", "mnist", "t10k-labels-idx1-ubyte.gz"))[8000:]
    C.write_idx(tmp_path / "images-idx3-ubyte.gz", images)
    C.write_idx(tmp_path / "labels-idx1-ubyte", labels)
    n = C.convert_mnist(tmp_path / "images-idx3-ubyte.gz", tmp_path / "labels-idx1-ubyte", tmp_path / "db")
    assert n == 2000
    ours, caffe = entries(tmp_path / "db"), entries(made("mnist_test_lmdb"))
    assert len(ours) == len(caffe) == 2000
    for (k1, v1), (k2, v2) in zip(ours, caffe):
        assert k1 == k2 and v1 == v2
    with pytest.raises(DataError, match="already exists"):
        C.convert_mnist(tmp_path / "images-idx3-ubyte.gz", tmp_path / "labels-idx1-ubyte", tmp_path / "db")


def test_convert_mnist_checks_its_inputs(tmp_path):
    C.write_idx(tmp_path / "i", np.zeros((3, 2, 2), np.uint8))
    C.write_idx(tmp_path / "l", np.zeros(2, np.uint8))
    with pytest.raises(DataError, match="3 images but .* 2 labels"):
        C.convert_mnist(tmp_path / "i", tmp_path / "l", tmp_path / "db")
    with pytest.raises(DataError, match="not an MNIST image file"):
        C.convert_mnist(tmp_path / "l", tmp_path / "l", tmp_path / "db2")


def test_convert_mnist_leveldb_when_plyvel_is_there(tmp_path):
    pytest.importorskip("plyvel")
    C.write_idx(tmp_path / "i", np.arange(12, dtype=np.uint8).reshape(3, 2, 2))
    C.write_idx(tmp_path / "l", np.array([1, 2, 3], np.uint8))
    C.convert_mnist(tmp_path / "i", tmp_path / "l", tmp_path / "ldb", backend="leveldb")
    got = entries(tmp_path / "ldb", "leveldb")
    assert [k for k, _ in got] == [b"00000000", b"00000001", b"00000002"]
    assert parse_datum(got[2][1]).label == 3


# ---------------------------------------------------------------------------------------------- imagesets
def test_convert_imageset_encoded_and_raw_equal_caffe(tmp_path):
    root = str(made("color20_png")) + "/"
    lst = made("color20_png", "list.txt")
    assert C.convert_imageset(root, lst, tmp_path / "png", encoded=True, encode_type="png") == 20
    assert entries(tmp_path / "png") == entries(made("color20_png_lmdb"))
    # No encode_type: guessed from the extension, so the files are stored unchanged too.
    C.convert_imageset(root, lst, tmp_path / "guess", encoded=True)
    assert entries(tmp_path / "guess") == entries(made("color20_png_lmdb"))
    C.convert_imageset(root, lst, tmp_path / "raw")
    assert entries(tmp_path / "raw") == entries(made("color20_raw_lmdb"))


def test_convert_imageset_resize_gray_reencode_shuffle(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (9, 11, 3), dtype=np.uint8) for _ in range(5)]
    lst = write_images(tmp_path / "imgs", images)
    root = str(tmp_path / "imgs") + "/"
    C.convert_imageset(root, lst, tmp_path / "small", resize_height=4, resize_width=6, gray=True, check_size=True)
    got = entries(tmp_path / "small")
    assert [k for k, _ in got] == [b"%08d_img%03d.png" % (i, i) for i in range(5)]
    for i, (_, v) in enumerate(got):
        arr = datum_to_array(parse_datum(v))
        np.testing.assert_array_equal(arr, resize(read_image(tmp_path / "imgs" / f"img{i:03d}.png", is_color=False), 4, 6))
    # Encoded with a resize: re-encoded (PNG is lossless, so it decodes to the resized image).
    C.convert_imageset(root, lst, tmp_path / "enc", resize_height=4, resize_width=6, encoded=True)
    for i, (_, v) in enumerate(entries(tmp_path / "enc")):
        d = parse_datum(v)
        assert d.encoded and d.data != (tmp_path / "imgs" / f"img{i:03d}.png").read_bytes()
        np.testing.assert_array_equal(datum_to_array(d), resize(read_image(tmp_path / "imgs" / f"img{i:03d}.png"), 4, 6))
    # encode_type jpg on PNG files: re-encoded as JPEG.
    C.convert_imageset(root, lst, tmp_path / "jpg", encode_type="jpg")
    assert all(parse_datum(v).data[:2] == b"\xff\xd8" for _, v in entries(tmp_path / "jpg"))
    # Shuffle: the same records under permuted line numbers.
    C.convert_imageset(root, lst, tmp_path / "shuf", shuffle=True)
    keys = [k.decode() for k, _ in entries(tmp_path / "shuf")]
    assert sorted(k[9:] for k in keys) == [f"img{i:03d}.png" for i in range(5)]


def test_convert_imageset_skips_unreadable_and_checks_size(tmp_path, caplog):
    rng = np.random.default_rng(1)
    lst = write_images(tmp_path / "imgs", [rng.integers(0, 256, (4, 4, 3), dtype=np.uint8),
                                           rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)])
    with open(lst, "a") as handle:
        handle.write("missing.png 1\n")
    root = str(tmp_path / "imgs") + "/"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a logged message, not a Python warning
        assert C.convert_imageset(root, lst, tmp_path / "a") == 2
    assert re.search(rf"Skipping line 3 of {re.escape(str(lst))}: image .*missing.png: no such file", caplog.text)
    with pytest.raises(DataError, match="incorrect data field size"):
        C.convert_imageset(root, lst, tmp_path / "b", check_size=True)


def test_convert_imageset_on_several_threads_writes_the_db_of_one(tmp_path, caplog):
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (int(rng.integers(6, 20)), int(rng.integers(6, 20)), 3), dtype=np.uint8)
              for _ in range(40)]
    lst = write_images(tmp_path / "imgs", images, ext="jpg")
    lines = lst.read_text().splitlines()
    lines[7] = "missing.jpg 7"
    lines[30] = "absent.jpg 30"
    lst.write_text("\n".join(lines) + "\n")
    root = str(tmp_path / "imgs") + "/"
    dbs = {}
    for threads in (1, 3):
        caplog.clear()
        count = C.convert_imageset(root, lst, tmp_path / f"db{threads}", resize_height=8, resize_width=9,
                                   encode_type="jpg", threads=threads)
        assert count == 38
        # The skipped lines are logged in list order, whichever thread read them.
        assert re.findall(r"Skipping line (\d+)", caplog.text) == ["8", "31"]
        dbs[threads] = entries(tmp_path / f"db{threads}")
    assert dbs[1] == dbs[3] and len(dbs[1]) == 38


# ---------------------------------------------------------------------------------------------- means
@pytest.mark.parametrize("db,mean", [("mnist_test_lmdb", "mnist_test_mean.binaryproto"),
                                     ("color20_png_lmdb", "color20_mean.binaryproto"),
                                     ("color20_raw_lmdb", "color20_mean.binaryproto")])
def test_compute_image_mean_equals_caffe(tmp_path, db, mean):
    got = C.compute_image_mean(made(db), tmp_path / "mean.binaryproto")
    np.testing.assert_array_equal(got, read_mean_file(made(mean)))
    assert (tmp_path / "mean.binaryproto").read_bytes() == made(mean).read_bytes()


# ---------------------------------------------------------------------------------------------- download
@pytest.fixture()
def http_folder(tmp_path):
    """A local HTTP server (127.0.0.1) serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(www)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield www, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_download_mnist_from_a_local_server(tmp_path, http_folder):
    www, url = http_folder
    rng = np.random.default_rng(2)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
              "train-labels-idx1-ubyte": rng.integers(0, 10, 6, dtype=np.uint8),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, 3, dtype=np.uint8)}
    for name, arr in arrays.items():
        C.write_idx(www / (name + ".gz"), arr)
    paths = C.download_mnist(tmp_path / "mnist", url)
    assert [p.name for p in paths] == list(C.MNIST_FILES)
    for path in paths:
        np.testing.assert_array_equal(read_idx(path), arrays[path.name])
        assert path.read_bytes()[:2] == b"\x00\x00"  # stored decompressed, as get_mnist.sh does
    # Present and valid: kept (the server's copies are gone now).
    for name in arrays:
        (www / (name + ".gz")).unlink()
    assert C.download_mnist(tmp_path / "mnist", url) == paths
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz"):
        C.download_mnist(tmp_path / "other", url)
    assert not list((tmp_path / "other").iterdir())  # no partial files left
    (www / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(b"garbage"))
    with pytest.raises(DataError, match="not an IDX file"):
        C.download_mnist(tmp_path / "other", url)


# ---------------------------------------------------------------------------------------------- digits
def test_digits_to_idx(tmp_path):
    datasets = pytest.importorskip("sklearn.datasets")
    paths = C.digits_to_idx(tmp_path)
    train_x, train_y, test_x, test_y = (read_idx(p) for p in paths)
    assert [p.name for p in paths] == list(C.MNIST_FILES)
    assert train_x.shape == (1500, 8, 8) and test_x.shape == (297, 8, 8) and train_x.dtype == np.uint8
    assert train_y.shape == (1500,) and test_y.shape == (297,)
    digits = datasets.load_digits()
    np.testing.assert_array_equal(np.concatenate([train_y, test_y]), digits.target)
    all_x = np.concatenate([train_x, test_x]).astype(np.float64)
    np.testing.assert_allclose(all_x, digits.images * 255 / 16, atol=0.5)
    assert all_x.max() == 255 and all_x.min() == 0
    # The same converter as MNIST takes them.
    assert C.convert_mnist(paths[2], paths[3], tmp_path / "db") == 297
