"""Datum <-> numpy, and mean files (BlobProto), with Caffe's layouts.

A Datum holds one item: ``channels``, ``height``, ``width`` and either raw uint8 pixels in ``data``
(CHW, colour channels in BGR order), or ``float_data``, or - with ``encoded`` set - the bytes of an image
file in ``data`` and no shape fields (the shape comes from decoding). pycaffe's ``caffe.io`` helpers
``array_to_datum`` / ``datum_to_array`` / ``blobproto_to_array`` / ``array_to_blobproto`` have the same
names and behaviour here.
"""
from __future__ import annotations

import os

import numpy as np
from google.protobuf.message import DecodeError

from ..files import IMAGE_FILE_LIMIT, PROTOBUF_LIMIT, InputFileError, read_input_file
from ..proto import netdef_pb2 as pb
from .errors import DataError
from .image import decode_image_view, encode_image, read_image
from .item_buffers import BufferFor


class DatumError(DataError):
    """A Datum that does not describe a valid item (size mismatch, undecodable image...)."""


# ---------------------------------------------------------------------------------------------- Datum
def parse_datum(value: bytes, name: str = "record") -> pb.Datum:
    """A Datum from its serialized bytes; DatumError naming ``name`` when they do not parse."""
    datum = pb.Datum()
    try:
        datum.ParseFromString(bytes(value))
    except (DecodeError, ValueError, TypeError) as exc:
        raise DatumError(f"{name}: not a Datum ({exc or 'protobuf parse error'})") from None
    return datum


def datum_to_array(datum: pb.Datum, color: bool | None = None, name: str = "Datum") -> np.ndarray:
    """The item a Datum holds as a C x H x W array: uint8 for ``data``, float32 for ``float_data``.

    Encoded Datums are decoded (BGR order): ``color`` None keeps the image's own channels (Caffe's
    DecodeDatumToCVMatNative), True forces 3 channels, False forces 1 (DecodeDatumToCVMat).
    """
    return np.ascontiguousarray(datum_item(datum, color, name))


def datum_item(datum: pb.Datum, color: bool | None = None, name: str = "Datum",
               buffer: BufferFor | None = None) -> np.ndarray:
    """``datum_to_array``, except that a decoded image may be a strided view of the decoder's pixels
    (what the data layers' transformer reads: it copies as it crops), in ``buffer``'s memory when it is
    given (item_buffers.py)."""
    if datum.encoded:
        return decode_image_view(datum.data, color=color, name=name, buffer=buffer)
    c, h, w = datum.channels, datum.height, datum.width
    count = c * h * w
    if c <= 0 or h <= 0 or w <= 0:
        raise DatumError(f"{name}: Datum has shape channels {c} x height {h} x width {w}; all must be positive")
    if len(datum.data):
        if len(datum.data) != count:
            raise DatumError(f"{name}: Datum data holds {len(datum.data)} bytes but channels x height x width "
                             f"= {c} x {h} x {w} = {count}")
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(c, h, w)
    if len(datum.float_data) != count:
        raise DatumError(f"{name}: Datum float_data holds {len(datum.float_data)} values but channels x height x "
                         f"width = {c} x {h} x {w} = {count}")
    return np.asarray(datum.float_data, dtype=np.float32).reshape(c, h, w)


def raw_datum_batch(datums) -> np.ndarray | None:
    """The items of raw uint8 Datums of one shape as one N x C x H x W uint8 array (a single copy of
    their bytes, where ``datum_to_array`` one by one and a stack make two and a Python step per
    item); None when some Datum is encoded, holds float_data, has another shape than the first or
    a ``data`` whose size does not match its shape (``datum_to_array`` then says which is wrong)."""
    if not datums:
        return None
    first = datums[0]
    shape = (first.channels, first.height, first.width)
    count = shape[0] * shape[1] * shape[2]
    if min(shape) <= 0:
        return None
    for datum in datums:
        if datum.encoded or (datum.channels, datum.height, datum.width) != shape or len(datum.data) != count:
            return None
    return np.frombuffer(b"".join([datum.data for datum in datums]), dtype=np.uint8).reshape((len(datums),) + shape)


def array_to_datum(arr, label=None) -> pb.Datum:
    """pycaffe's ``caffe.io.array_to_datum``: a C x H x W array to a Datum (uint8 arrays go to
    ``data``, anything else to ``float_data``); ``label`` is set when given."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise ValueError(f"Incorrect array shape {arr.shape}: a Datum holds C x H x W arrays")
    datum = pb.Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in arr.shape)
    if arr.dtype == np.uint8:
        datum.data = np.ascontiguousarray(arr).tobytes()
    else:
        datum.float_data.extend(arr.astype(np.float32).ravel().tolist())
    if label is not None:
        datum.label = int(label)
    return datum


def image_to_datum(image: np.ndarray, label: int | None = None) -> pb.Datum:
    """Caffe's CVMatToDatum: a decoded CHW uint8 image to a raw Datum. Unlike ``array_to_datum`` it
    sets ``encoded`` to false explicitly, as Caffe does (so the bytes match convert_imageset's)."""
    image = np.asarray(image)
    if image.ndim != 3 or image.dtype != np.uint8:
        raise ValueError(f"image_to_datum expects a CHW uint8 image, got {image.shape} {image.dtype}")
    datum = pb.Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in image.shape)
    datum.data = np.ascontiguousarray(image).tobytes()
    datum.encoded = False
    if label is not None:
        datum.label = int(label)
    return datum


def encoded_datum(data: bytes, label: int | None = None) -> pb.Datum:
    """Caffe's ReadFileToDatum: image file bytes stored unchanged, ``encoded`` true, no shape."""
    datum = pb.Datum()
    datum.data = bytes(data)
    if label is not None:
        datum.label = int(label)
    datum.encoded = True
    return datum


def encode_datum(datum: pb.Datum, ext: str = "png") -> pb.Datum:
    """A raw Datum (uint8 data) re-stored as an encoded one (``cv::imencode("." + ext)``)."""
    image = datum_to_array(datum)
    if image.dtype != np.uint8:
        raise DatumError("only uint8 Datums can be encoded as images (float_data cannot)")
    out = encoded_datum(encode_image(image, ext))
    if datum.HasField("label"):
        out.label = datum.label
    return out


def decode_datum(datum: pb.Datum, color: bool | None = None) -> pb.Datum:
    """Caffe's DecodeDatumNative (``color`` None) / DecodeDatum: an encoded Datum as a raw one; raw
    Datums are returned unchanged."""
    if not datum.encoded:
        return datum
    out = image_to_datum(datum_to_array(datum, color=color))
    if datum.HasField("label"):
        out.label = datum.label
    return out


def _match_ext(filename: str, encoding: str) -> bool:
    # Caffe's matchExt: the extension (after the last '.') case-insensitively; jpg also matches jpeg.
    p = filename.rfind(".")
    ext = (filename[p + 1:] if p >= 0 else filename).lower()
    encoding = encoding.lower()
    return ext == encoding or (encoding == "jpg" and ext == "jpeg")


def read_image_to_datum(filename, label: int, height: int = 0, width: int = 0, is_color: bool = True,
                        encoding: str = "") -> pb.Datum:
    """Caffe's ReadImageToDatum. Without ``encoding``: the decoded (and resized) image as a raw
    Datum. With it: the file's own bytes when there is no resize and the extension matches, else
    the image re-encoded as ``encoding``."""
    filename = os.fspath(filename)
    image = read_image(filename, height, width, is_color)
    if encoding:
        if (image.shape[0] == 3) == bool(is_color) and not height and not width and _match_ext(filename, encoding):
            return encoded_datum(read_input_file(filename, "image", IMAGE_FILE_LIMIT), label)
        return encoded_datum(encode_image(image, encoding), label)
    return image_to_datum(image, label)


# ---------------------------------------------------------------------------------------------- means
def blobproto_to_array(blob: pb.BlobProto, return_diff: bool = False) -> np.ndarray:
    """pycaffe's ``caffe.io.blobproto_to_array``: the values of a BlobProto, shaped by the legacy
    num x channels x height x width when any of them is set (Caffe's Blob::FromProto prefers them),
    else by ``shape`` (float32; float64 for double_data)."""
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        shape = (blob.num, blob.channels, blob.height, blob.width)
    else:
        shape = tuple(int(d) for d in blob.shape.dim)
    values = (blob.double_diff or blob.diff) if return_diff else (blob.double_data or blob.data)
    dtype = np.float64 if (blob.double_diff if return_diff else blob.double_data) else np.float32
    arr = np.asarray(values, dtype=dtype)
    if arr.size != int(np.prod(shape)):
        raise DataError(f"BlobProto holds {arr.size} values but its shape is {shape}")
    return arr.reshape(shape)


def array_to_blobproto(arr, diff=None, legacy: bool = False) -> pb.BlobProto:
    """pycaffe's ``caffe.io.array_to_blobproto`` (``shape`` message). ``legacy=True`` writes
    num/channels/height/width instead (at most 4 axes; missing leading axes are 1), as Caffe's
    compute_image_mean does."""
    arr = np.asarray(arr)
    blob = pb.BlobProto()
    if legacy:
        if arr.ndim > 4:
            raise ValueError(f"the legacy BlobProto layout holds at most 4 axes, got shape {arr.shape}")
        dims = (1,) * (4 - arr.ndim) + tuple(int(d) for d in arr.shape)
        blob.num, blob.channels, blob.height, blob.width = dims
    else:
        blob.shape.dim.extend(int(d) for d in arr.shape)
    blob.data.extend(arr.astype(np.float32).ravel().tolist())
    if diff is not None:
        blob.diff.extend(np.asarray(diff, dtype=np.float32).ravel().tolist())
    return blob


def read_mean_file(path) -> np.ndarray:
    """A mean .binaryproto as an array (1 x C x H x W for compute_image_mean's files)."""
    path = os.fspath(path)
    try:
        raw = read_input_file(path, "mean file", PROTOBUF_LIMIT)
    except InputFileError as exc:
        raise DataError(f"cannot read {exc}") from None
    blob = pb.BlobProto()
    try:
        blob.ParseFromString(raw)
    except DecodeError as exc:
        raise DataError(f"mean file {path} is not a BlobProto ({exc})") from None
    try:
        return blobproto_to_array(blob)
    except DataError as exc:
        raise DataError(f"mean file {path}: {exc}") from None


def write_mean_file(path, mean) -> None:
    """Write a mean array as compute_image_mean does: a BlobProto in the legacy layout."""
    with open(os.fspath(path), "wb") as handle:
        handle.write(array_to_blobproto(mean, legacy=True).SerializeToString())
