"""JPEG decoding through libjpeg-turbo's TurboJPEG API (the ``simplejpeg`` package), where its pixels are
those of the Pillow path in image.py, bit for bit.

Why: TurboJPEG decodes straight into a BGR (or grey) array and ``simplejpeg`` releases the GIL for the
whole decode. Pillow's path also decodes with libjpeg-turbo, but then copies the pixels out of the
image under the GIL (``np.asarray`` goes through ``Image.tobytes``): on one thread TurboJPEG's decode
ran at 1.5-1.9x the rate of Pillow's path (benchmarks/README.md, "Seeded runs follow the load; data
threads at the process's priority; JPEG through TurboJPEG"), and it leaves the GIL to the other data
threads while it works. Both use the accurate integer DCT and libjpeg's default ("fancy")
chroma upsampling, so the pixels agree (tests/data/test_jpeg.py compares the two paths).

``decode_view`` takes only what it decodes exactly as Pillow's path does, and returns None for the
rest, which Pillow's path then decodes: not a JPEG; colour spaces other than YCbCr and grey (Pillow
inverts Adobe CMYK and YCCK its own way); an EXIF block (Caffe's OpenCV decode, and the Pillow path,
turn the image by its orientation tag; TurboJPEG does not read it); headers it cannot walk; any error
TurboJPEG reports, a truncated file among them, so that the message a user sees stays Pillow's;
images too large for Pillow (it refuses them, whatever netdef's own cap); ``simplejpeg`` not installed.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .item_buffers import BufferFor

try:
    import simplejpeg
except ImportError:  # pragma: no cover - a dependency; without it every image takes Pillow's path
    simplejpeg = None

_START_OF_IMAGE = b"\xff\xd8"
_START_OF_SCAN = 0xDA
_APP1 = 0xE1
_EXIF = b"Exif\x00\x00"
# Markers without a length field (restart markers, the start of the image, fill).
_STANDALONE = set(range(0xD0, 0xD9)) | {0x01}
_EXACT_SPACES = ("YCbCr", "Gray")


def available() -> bool:
    return simplejpeg is not None


def decode_view(data: bytes, color: bool | None, allowed_size: Callable[[tuple[int, int]], bool],
                buffer: BufferFor | None = None) -> np.ndarray | None:
    """The CHW uint8 image (BGR, or one grey channel) of JPEG ``data`` as image.decode_image_view gives it
    for ``color`` (True, False, None: OpenCV's IMREAD_COLOR, IMREAD_GRAYSCALE, IMREAD_UNCHANGED), a
    view of the decoded HWC array; None where Pillow's path must decode it (the module docstring).
    ``allowed_size((width, height))`` runs before any pixel is decoded: it raises for an image over
    netdef's cap and returns False for one this path leaves to Pillow. ``buffer(nbytes)``, when given,
    is the memory to decode into (item_buffers.py; None from it: fresh memory)."""
    if simplejpeg is None or data[:2] != _START_OF_IMAGE or _may_carry_exif(data):
        return None
    try:
        height, width, space, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if space not in _EXACT_SPACES or not allowed_size((width, height)):
        return None
    grey = color is False or (color is None and space == "Gray")
    into = buffer(height * width * (1 if grey else 3)) if buffer is not None else None
    try:
        hwc = simplejpeg.decode_jpeg(data, colorspace="GRAY" if grey else "BGR", fastdct=False, fastupsample=False,
                                     strict=True, buffer=into)
    except ValueError:
        return None
    return hwc.transpose(2, 0, 1)


def _may_carry_exif(data: bytes) -> bool:
    """Whether an APP1 Exif block comes before the first scan; True too where the headers cannot be
    walked (then Pillow decodes, as before this path existed)."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return True
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte before a marker
            at += 1
            continue
        if marker == _START_OF_SCAN:
            return False
        if marker in _STANDALONE:
            at += 2
            continue
        if marker == _APP1 and data[at + 4:at + 10] == _EXIF:
            return True
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return True
