"""Datum <-> numpy, image decoding/encoding/resizing with OpenCV's conventions, and mean files, against
the Caffe-made files in ../shared/fixtures/caffe-ref/caffe-made and hand-made images."""
from __future__ import annotations

import io

import numpy as np
import pytest

from netdef.data import datum as D
from netdef.data.db import open_db
from netdef.data.image import (
    ImageError,
    decode_image,
    encode_image,
    read_image,
    read_image_list,
    resize,
)
from netdef.proto import netdef_pb2 as pb
from tests.data.builders import CAFFE_MADE, png_bytes
from tests.helpers import shared_path

PIL = pytest.importorskip("PIL.Image")


def made(*parts):
    return shared_path(*CAFFE_MADE, *parts)


# ---------------------------------------------------------------------------------------------- Datum
def test_raw_datum_bytes_match_convert_mnist_data():
    exp = np.load(made("mnist_test_expected.npz"))
    stored = exp["datum0_bytes"].tobytes()
    datum = D.parse_datum(stored)
    arr = D.datum_to_array(datum)
    assert arr.dtype == np.uint8 and arr.shape == (1, 28, 28)
    np.testing.assert_array_equal(arr, exp["first10"][0])
    # The same Datum built here serializes to Caffe's bytes.
    assert D.array_to_datum(exp["first10"][0], label=int(exp["labels"][0])).SerializeToString() == stored


def test_raw_datum_batch_joins_raw_items_and_declines_the_rest():
    rng = np.random.default_rng(3)
    items = [rng.integers(0, 256, (2, 3, 4), dtype=np.uint8) for _ in range(5)]
    datums = [D.array_to_datum(x, label=i) for i, x in enumerate(items)]
    batch = D.raw_datum_batch(datums)
    assert batch.dtype == np.uint8 and batch.shape == (5, 2, 3, 4)
    np.testing.assert_array_equal(batch, np.stack([D.datum_to_array(d) for d in datums]))
    # Anything datum_to_array must look at item by item (and name, when it is wrong): None.
    other_shape = D.array_to_datum(np.zeros((2, 4, 3), np.uint8))
    short = pb.Datum(channels=2, height=3, width=4, data=b"abc")
    float_item = D.array_to_datum(np.zeros((2, 3, 4), np.float32))
    encoded = D.encoded_datum(png_bytes(np.zeros((3, 4), np.uint8)))
    for odd in (other_shape, short, float_item, encoded):
        assert D.raw_datum_batch(datums[:2] + [odd]) is None
    assert D.raw_datum_batch([]) is None
    assert D.raw_datum_batch([pb.Datum(channels=0, height=3, width=4)]) is None


def test_float_datum_round_trip_and_size_checks():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    datum = D.array_to_datum(x, label=7)
    assert not datum.data and len(datum.float_data) == 24 and datum.label == 7
    np.testing.assert_array_equal(D.datum_to_array(datum), x)
    datum.float_data.append(1.0)
    with pytest.raises(D.DatumError, match="float_data holds 25"):
        D.datum_to_array(datum)
    bad = pb.Datum(channels=1, height=2, width=2, data=b"abc")
    with pytest.raises(D.DatumError, match="holds 3 bytes"):
        D.datum_to_array(bad, name="db key b'7'")
    with pytest.raises(D.DatumError, match="key 7: not a Datum"):
        D.parse_datum(b"\xff\xff\xff\xff", "key 7")
    with pytest.raises(ValueError):
        D.array_to_datum(np.zeros((2, 2)))


def test_encoded_datums_decode_to_caffe_bgr_chw():
    exp = np.load(made("color20_expected.npz"))
    db = open_db(made("color20_png_lmdb"))
    items = list(db.items())
    db.close()
    assert [k.decode() for k, _ in items] == list(exp["keys"])
    for i, (key, value) in enumerate(items):
        datum = D.parse_datum(value)
        assert datum.encoded and not datum.HasField("channels")
        np.testing.assert_array_equal(D.datum_to_array(datum), exp["caffe_bgr_chw"][i])
        np.testing.assert_array_equal(D.datum_to_array(datum, color=True), exp["caffe_bgr_chw"][i])
        gray = D.datum_to_array(datum, color=False)
        assert gray.shape == (1, 12, 16)
        # libpng's rgb_to_gray as OpenCV asks for it: weights 0.299/0.587 in 1/32768, truncated.
        r, g, b = (exp["rgb_hwc"][i][..., c].astype(np.int64) for c in range(3))
        np.testing.assert_array_equal(gray[0], (9797 * r + 19234 * g + 3737 * b) >> 15)
        raw = D.decode_datum(datum)
        assert not raw.encoded and raw.channels == 3 and raw.label == datum.label


def test_image_to_datum_matches_convert_imageset_raw_bytes():
    exp = np.load(made("color20_expected.npz"))
    db = open_db(made("color20_raw_lmdb"))
    for i, (key, value) in enumerate(db.items()):
        assert D.image_to_datum(exp["caffe_bgr_chw"][i], int(exp["labels"][i])).SerializeToString() == value
    db.close()


def test_encode_datum_round_trip():
    x = np.random.default_rng(1).integers(0, 256, (3, 5, 6), dtype=np.uint8)
    enc = D.encode_datum(D.array_to_datum(x, label=3), "png")
    assert enc.encoded and enc.label == 3 and enc.data[:8] == b"\x89PNG\r\n\x1a\n"
    np.testing.assert_array_equal(D.datum_to_array(enc), x)
    with pytest.raises(D.DatumError):
        D.encode_datum(D.array_to_datum(x.astype(np.float32)))


# ---------------------------------------------------------------------------------------------- images
def test_decode_modes_channels_and_order():
    rng = np.random.default_rng(2)
    rgba = rng.integers(0, 256, (4, 5, 4), dtype=np.uint8)
    data = png_bytes(rgba)
    native = decode_image(data)
    assert native.shape == (4, 4, 5)  # IMREAD_UNCHANGED keeps alpha: BGRA
    np.testing.assert_array_equal(native, rgba[..., [2, 1, 0, 3]].transpose(2, 0, 1))
    np.testing.assert_array_equal(decode_image(data, True), rgba[..., 2::-1].transpose(2, 0, 1))
    grey = rng.integers(0, 256, (4, 5), dtype=np.uint8)
    g = png_bytes(grey)
    np.testing.assert_array_equal(decode_image(g), grey[None])
    np.testing.assert_array_equal(decode_image(g, True), np.repeat(grey[None], 3, 0))
    with pytest.raises(ImageError, match="my.png: cannot decode"):
        decode_image(b"not an image", name="my.png")


def test_jpeg_decoding_matches_pillow_and_grey_is_the_luma_plane():
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PIL.fromarray(rgb).save(buf, format="JPEG", quality=90)
    decoded = np.asarray(PIL.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    np.testing.assert_array_equal(decode_image(buf.getvalue(), True), decoded[..., ::-1].transpose(2, 0, 1))
    grey = decode_image(buf.getvalue(), False)
    assert grey.shape == (1, 16, 24)
    # libjpeg's grey output is Y; within rounding of BT.601 luma of the colour decode.
    luma = decoded @ np.array([0.299, 0.587, 0.114])
    assert np.abs(grey[0] - luma).max() <= 3


def test_encode_image_formats():
    x = np.random.default_rng(4).integers(0, 256, (3, 6, 7), dtype=np.uint8)
    for ext in ("png", "PNG", "bmp"):
        np.testing.assert_array_equal(decode_image(encode_image(x, ext)), x)
    jpg = encode_image(x, "jpg")
    assert jpg[:2] == b"\xff\xd8"
    assert decode_image(jpg).shape == (3, 6, 7)
    np.testing.assert_array_equal(decode_image(encode_image(x[:1], "png")), x[:1])
    with pytest.raises(ImageError, match="no such format"):
        encode_image(x, "nosuchformat")


# OpenCV 5.0's cv2.resize(img, (w, h), interpolation=INTER_LINEAR) on this image (run once, pasted).
_IMG = np.array([[139, 74, 229, 241, 169], [65, 6, 160, 149, 106], [38, 175, 188, 205, 175],
                 [229, 98, 249, 10, 148]], dtype=np.uint8)
_CV_7x3 = [[117, 229, 193], [91, 204, 167], [50, 165, 126], [64, 174, 153], [91, 192, 179], [149, 227, 132],
           [185, 249, 102]]
_CV_2x9 = [[102, 81, 47, 108, 195, 195, 188, 157, 138], [134, 134, 136, 173, 219, 157, 113, 143, 162]]


def test_resize_matches_opencv_inter_linear():
    np.testing.assert_array_equal(resize(_IMG[None], 7, 3)[0], _CV_7x3)
    np.testing.assert_array_equal(resize(_IMG[None], 2, 9)[0], _CV_2x9)
    # Halving: the rounded mean of each 2 x 2 block.
    x = np.random.default_rng(5).integers(0, 256, (3, 8, 6), dtype=np.uint8)
    blocks = x.reshape(3, 4, 2, 3, 2).astype(np.int64).sum((2, 4))
    np.testing.assert_array_equal(resize(x, 4, 3), (blocks + 2) >> 2)
    same = resize(x, 8, 6)
    np.testing.assert_array_equal(same, x)
    assert same is not x
    # Doubling a constant image keeps it constant.
    np.testing.assert_array_equal(resize(np.full((1, 3, 3), 77, np.uint8), 6, 6), 77)


def test_read_image_and_list(tmp_path):
    rgb = np.random.default_rng(6).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    PIL.fromarray(rgb).save(tmp_path / "a b.png")
    img = read_image(tmp_path / "a b.png")
    np.testing.assert_array_equal(img, rgb[..., ::-1].transpose(2, 0, 1))
    np.testing.assert_array_equal(read_image(tmp_path / "a b.png", 3, 4), resize(img, 3, 4))
    assert read_image(tmp_path / "a b.png", 3, 0).shape == (3, 6, 8)  # both sizes needed to resize
    assert read_image(tmp_path / "a b.png", is_color=False).shape == (1, 6, 8)
    with pytest.raises(ImageError, match="missing.png"):
        read_image(tmp_path / "missing.png")
    (tmp_path / "list.txt").write_text("a b.png 3\n\nsub/c.jpg -2\nnolabel\n")
    assert read_image_list(tmp_path / "list.txt") == [("a b.png", 3), ("sub/c.jpg", -2), ("nolabel", 0)]


# ---------------------------------------------------------------------------------------------- means
def test_mean_files_read_and_write_legacy(tmp_path):
    exp_m = np.load(made("mnist_test_expected.npz"))
    exp_c = np.load(made("color20_expected.npz"))
    mnist = D.read_mean_file(made("mnist_test_mean.binaryproto"))
    color = D.read_mean_file(made("color20_mean.binaryproto"))
    assert mnist.shape == (1, 1, 28, 28) and mnist.dtype == np.float32
    np.testing.assert_array_equal(mnist, exp_m["mean"])
    np.testing.assert_array_equal(color, exp_c["mean_bgr"])
    assert abs(float(mnist.mean()) - 36.265915) < 1e-4
    out = tmp_path / "m.binaryproto"
    D.write_mean_file(out, color)
    assert out.read_bytes() == made("color20_mean.binaryproto").read_bytes()
    blob = pb.BlobProto.FromString(out.read_bytes())
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 3, 12, 16) and not blob.HasField("shape")
    D.write_mean_file(out, color[0])  # C x H x W gets num 1
    np.testing.assert_array_equal(D.read_mean_file(out), color)


def test_blobproto_shape_forms(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    blob = D.array_to_blobproto(x)
    assert list(blob.shape.dim) == [2, 3]
    np.testing.assert_array_equal(D.blobproto_to_array(blob), x)
    legacy = D.array_to_blobproto(x, legacy=True)
    assert D.blobproto_to_array(legacy).shape == (1, 1, 2, 3)
    bad = pb.BlobProto(num=1, channels=1, height=2, width=2, data=[1.0])
    with pytest.raises(D.DataError, match="holds 1 values"):
        D.blobproto_to_array(bad)
    with pytest.raises(D.DataError, match="cannot read mean file"):
        D.read_mean_file(tmp_path / "nope.binaryproto")
