"""Image decoding, encoding and resizing with Caffe's (that is, OpenCV's) conventions, on Pillow.

Arrays here are uint8 in CHW order; colour images have their channels in OpenCV's BGR order (BGRA
with alpha), as Caffe stores and feeds them. Three decoding modes mirror OpenCV's flags:

- ``color=True``  (``cv::IMREAD_COLOR``): always 3 channels, alpha dropped, grey replicated.
- ``color=False`` (``cv::IMREAD_GRAYSCALE``): always 1 channel.
- ``color=None``  (``cv::IMREAD_UNCHANGED``, Caffe's "native" decode of encoded Datums): the file's own
  channels (1, 3 or 4).

Decompression bombs: a small file can declare a huge image (a 79 KB PNG decodes to 891 MB). The
image's size is read from its header and checked before any pixel is decoded: at most
``max_image_pixels()`` pixels (width x height), by default 89,478,485, which is Pillow's own warning
threshold (a 9,459 x 9,459 image: far beyond any training image, 268 MB as BGR bytes). The
environment variable ``NETDEF_MAX_IMAGE_PIXELS`` sets another cap; above twice Pillow's threshold
Pillow itself refuses to open an image, whatever the cap.

``resize`` reproduces ``cv::resize(..., INTER_LINEAR)`` on 8-bit images, fixed-point arithmetic
included, so images resized by ``new_height``/``new_width`` match Caffe's.
"""
from __future__ import annotations

import io
import os
import re

import numpy as np

from ..environment import positive_count
from ..files import IMAGE_FILE_LIMIT, TEXT_LIST_LIMIT, InputFileError, read_input_file
from . import jpeg
from .errors import DataError
from .item_buffers import BufferFor


class ImageError(DataError):
    """An image that cannot be read, decoded or encoded; the message names it."""


MAX_PIXELS_VARIABLE = "NETDEF_MAX_IMAGE_PIXELS"
DEFAULT_MAX_PIXELS = 89_478_485


def max_image_pixels() -> int:
    """The most pixels (width x height) an image may have to be decoded: ``NETDEF_MAX_IMAGE_PIXELS``,
    else ``DEFAULT_MAX_PIXELS``."""
    return positive_count(MAX_PIXELS_VARIABLE, "pixels", DEFAULT_MAX_PIXELS)


def _check_pixels(size: tuple[int, int], name: str) -> None:
    width, height = size
    limit = max_image_pixels()
    if width * height > limit:
        raise ImageError(f"{name}: the image is {width} x {height} = {width * height} pixels, more than the "
                         f"{limit} netdef decodes (a decompression bomb?); set {MAX_PIXELS_VARIABLE} to allow "
                         f"larger images")


def _pil():
    try:
        from PIL import Image, ImageOps
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("reading images needs Pillow: pip install Pillow") from exc
    return Image, ImageOps


# ---------------------------------------------------------------------------------------------- colour
# libpng's rgb_to_gray weights as OpenCV asks for them (0.299, 0.587; libpng truncates them to 1/32768).
_PNG_GRAY = (9797, 19234, 32768 - 9797 - 19234)
# cv::cvtColor(BGR2GRAY) fixed-point weights (1/16384), used by OpenCV's other decoders.
_CV_GRAY = (4899, 9617, 1868)


def _rgb_to_gray(rgb: np.ndarray, png: bool) -> np.ndarray:
    r, g, b = (rgb[..., i].astype(np.int32) for i in range(3))
    if png:
        rc, gc, bc = _PNG_GRAY
        return ((rc * r + gc * g + bc * b) >> 15).astype(np.uint8)
    rc, gc, bc = _CV_GRAY
    return ((rc * r + gc * g + bc * b + (1 << 13)) >> 14).astype(np.uint8)


def _to_uint8(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == bool:
        return arr.astype(np.uint8) * 255
    if arr.dtype in (np.uint16, np.int32) or arr.dtype.kind in "ui":
        # 16-bit files: OpenCV's 8-bit reads keep the high byte (png_set_strip_16).
        return (np.clip(arr, 0, 65535).astype(np.uint32) >> 8).astype(np.uint8)
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8)


def _hwc(img, mode: str) -> np.ndarray:
    arr = np.asarray(img.convert(mode) if img.mode != mode else img)
    return arr if arr.ndim == 3 else arr[:, :, None]


def _pil_to_chw(img, color: bool | None, fmt: str) -> np.ndarray:
    """A loaded Pillow image as CHW uint8 in OpenCV's channel order for the given mode: a view of the
    HWC array Pillow gives (channels reordered and moved by strides, not copied)."""
    mode = img.mode
    has_alpha = mode in ("RGBA", "LA", "PA") or (mode in ("RGB", "P", "L") and "transparency" in img.info)
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        gray = _to_uint8(np.asarray(img))
        hwc = gray[:, :, None]
        if color:
            hwc = np.repeat(hwc, 3, axis=2)
        return hwc.transpose(2, 0, 1)
    if color is False:
        if mode in ("L", "1"):
            hwc = _hwc(img, "L")
        else:
            rgb = np.asarray(img.convert("RGB"))
            hwc = _rgb_to_gray(rgb, png=(fmt == "PNG"))[:, :, None]
        return hwc.transpose(2, 0, 1)
    if color is None and mode in ("L", "1"):
        # Grey stays one channel, even with a tRNS chunk (OpenCV's CV_8UC1 case).
        return _hwc(img, "L").transpose(2, 0, 1)
    if color is None and has_alpha:
        # OpenCV's IMREAD_UNCHANGED keeps alpha as a 4th channel (grey+alpha becomes BGRA too).
        rgba = _hwc(img, "RGBA")
        return rgba[:, :, [2, 1, 0, 3]].transpose(2, 0, 1)
    rgb = _hwc(img, "RGB")
    return rgb[:, :, ::-1].transpose(2, 0, 1)


def decode_image(data: bytes, color: bool | None = None, name: str = "image") -> np.ndarray:
    """Decode encoded image bytes (PNG, JPEG, ... anything Pillow reads) to CHW uint8, BGR.

    ``color``: True (3 channels), False (1 channel) or None (the file's own channels), as OpenCV's
    IMREAD_COLOR / IMREAD_GRAYSCALE / IMREAD_UNCHANGED. ``name`` goes into error messages.
    """
    return np.ascontiguousarray(decode_image_view(data, color, name))


def decode_image_view(data: bytes, color: bool | None = None, name: str = "image",
                      buffer: BufferFor | None = None) -> np.ndarray:
    """``decode_image`` without its last copy: the CHW image as a strided view of the decoded HWC
    pixels. The data layers' transformer reads it as it crops (one pass over the pixels less). JPEGs
    that TurboJPEG decodes to the same pixels go through it (jpeg.py: faster, and without the GIL),
    into ``buffer``'s memory when it is given (item_buffers.py)."""
    fast = jpeg.decode_view(data, color, lambda size: _within_caps(size, name), buffer)
    return fast if fast is not None else decode_with_pillow(data, color, name)


def _within_caps(size: tuple[int, int], name: str) -> bool:
    """Raise for an image over netdef's cap; False for one Pillow refuses to open (left to Pillow, whose
    refusal is the error users get)."""
    _check_pixels(size, name)
    Image, _ = _pil()
    return Image.MAX_IMAGE_PIXELS is None or size[0] * size[1] <= 2 * Image.MAX_IMAGE_PIXELS


def decode_with_pillow(data: bytes, color: bool | None = None, name: str = "image") -> np.ndarray:
    """``decode_image_view`` by Pillow alone, for every format it reads."""
    Image, ImageOps = _pil()
    try:
        img = Image.open(io.BytesIO(bytes(data)))  # reads the header only
        _check_pixels(img.size, name)
        if color is False and img.format == "JPEG" and img.mode in ("RGB", "YCbCr"):
            # libjpeg's grey output is the Y plane, which is what OpenCV's IMREAD_GRAYSCALE reads.
            img.draft("L", img.size)
        img.load()
        fmt = (img.format or "").upper()
        if color is not None:
            # OpenCV applies the EXIF orientation except with IMREAD_UNCHANGED.
            img = ImageOps.exif_transpose(img)
        return _pil_to_chw(img, color, fmt)
    except ImageError:
        raise
    except Exception as exc:  # Pillow raises many types (OSError, SyntaxError, ValueError...)
        raise ImageError(f"{name}: cannot decode image ({type(exc).__name__}: {exc})") from None


def read_image(path, height: int = 0, width: int = 0, is_color: bool = True) -> np.ndarray:
    """Caffe's ReadImageToCVMat: read an image file as CHW uint8 (BGR when ``is_color``, else 1
    grey channel), resized to height x width with bilinear interpolation when both are > 0."""
    return np.ascontiguousarray(read_image_view(path, height, width, is_color))


def read_image_view(path, height: int = 0, width: int = 0, is_color: bool = True,
                    buffer: BufferFor | None = None) -> np.ndarray:
    """``read_image`` without its last copy: unresized, the CHW image may be a strided view of the
    decoded pixels (``decode_image_view``, into ``buffer``'s memory when given), which ImageData's
    transformer reads as it crops."""
    path = os.fspath(path)
    try:
        raw = read_input_file(path, "image", IMAGE_FILE_LIMIT)
    except InputFileError as exc:
        raise ImageError(str(exc)) from None
    img = decode_image_view(raw, color=bool(is_color), name=path, buffer=buffer)
    if height > 0 and width > 0:
        return resize(img, height, width)  # reads the view; its result is a new array
    return img


# ---------------------------------------------------------------------------------------------- resize
_COEF_BITS = 11
_COEF_SCALE = 1 << _COEF_BITS


def _linear_taps(src: int, dst: int, clamp: bool):
    # OpenCV: scale = 1 / (dst / src); f = (float)((d + 0.5) * scale - 0.5); s = floor(f); f -= s.
    scale = 1.0 / (dst / src)
    f = ((np.arange(dst, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = (f - s.astype(np.float32)).astype(np.float32)
    if clamp:
        # Columns outside the image take the border pixel with weight 1 (rows are clamped later).
        low = s < 0
        f[low], s[low] = 0, 0
        high = s >= src - 1
        f[high], s[high] = 0, src - 1
    w0 = np.rint((np.float32(1) - f) * np.float32(_COEF_SCALE)).astype(np.int32)
    w1 = np.rint(f * np.float32(_COEF_SCALE)).astype(np.int32)
    return s, w0, w1


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``cv::resize(img, Size(width, height), 0, 0, INTER_LINEAR)`` for CHW uint8 images, by the
    compiled kernel (resize_kernel.py): the bytes of ``resize_reference``."""
    image, same = _checked_for_resize(image, height, width)
    if same:
        return image.copy()
    from .resize_kernel import resize_bilinear  # numba loads with the first resize, not with netdef

    xs, ax0, ax1 = _linear_taps(image.shape[2], width, clamp=True)
    ys, by0, by1 = _linear_taps(image.shape[1], height, clamp=False)
    out = np.empty((image.shape[0], height, width), dtype=np.uint8)
    resize_bilinear(image, xs, ax0, ax1, ys, by0, by1, out)
    return out


def resize_reference(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``resize`` in NumPy: the reference the kernel is tested against."""
    image, same = _checked_for_resize(image, height, width)
    if same:
        return image.copy()
    c, h, w = image.shape
    xs, ax0, ax1 = _linear_taps(w, width, clamp=True)
    ys, by0, by1 = _linear_taps(h, height, clamp=False)
    src = image.astype(np.int32)
    # Horizontal pass in 11-bit fixed point, then the vertical pass with OpenCV's rounding.
    rows = src[:, :, xs] * ax0 + src[:, :, np.minimum(xs + 1, w - 1)] * ax1
    r0 = rows[:, np.clip(ys, 0, h - 1), :] >> 4
    r1 = rows[:, np.clip(ys + 1, 0, h - 1), :] >> 4
    out = (((by0[:, None] * r0) >> 16) + ((by1[:, None] * r1) >> 16) + 2) >> 2
    return np.clip(out, 0, 255).astype(np.uint8)


def _checked_for_resize(image, height: int, width: int) -> tuple[np.ndarray, bool]:
    """The image as an array, and whether it already has the size asked for; raises for what
    neither resize takes."""
    image = np.asarray(image)
    if image.ndim != 3:
        raise ValueError(f"resize expects a CHW image, got shape {image.shape}")
    if image.shape[1:] == (height, width):
        return image, True
    if image.dtype != np.uint8:
        raise ValueError(f"resize expects uint8 pixels, got {image.dtype}")
    return image, False


# ---------------------------------------------------------------------------------------------- encode
def _pil_format(ext: str) -> str:
    Image, _ = _pil()
    Image.init()
    ext = ext.lower().lstrip(".")
    fmt = Image.registered_extensions().get("." + ext)
    if fmt is None:
        raise ImageError(f"cannot encode images as {ext!r}: Pillow knows no such format")
    return fmt


def encode_image(image: np.ndarray, ext: str) -> bytes:
    """``cv::imencode("." + ext, img)``: CHW uint8 (BGR/BGRA colour or 1 grey channel) to file bytes.
    JPEG uses OpenCV's default quality 95."""
    Image, _ = _pil()
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[0] not in (1, 3, 4) or image.dtype != np.uint8:
        raise ImageError(f"cannot encode an array of shape {image.shape} and type {image.dtype} as an image "
                         f"(CHW uint8 with 1, 3 or 4 channels needed)")
    hwc = image.transpose(1, 2, 0)
    if image.shape[0] == 1:
        img = Image.fromarray(np.ascontiguousarray(hwc[:, :, 0]), "L")
    elif image.shape[0] == 3:
        img = Image.fromarray(np.ascontiguousarray(hwc[:, :, ::-1]), "RGB")
    else:
        img = Image.fromarray(np.ascontiguousarray(hwc[:, :, [2, 1, 0, 3]]), "RGBA")
    fmt = _pil_format(ext)
    options = {}
    if fmt == "JPEG":
        options["quality"] = 95
        if img.mode == "RGBA":
            img = img.convert("RGB")
    elif fmt == "PNG":
        options["compress_level"] = 1
    buf = io.BytesIO()
    try:
        img.save(buf, format=fmt, **options)
    except Exception as exc:
        raise ImageError(f"cannot encode image as {ext!r}: {exc}") from None
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------- lists
def _atoi(text: str) -> int:
    # C's atoi: optional whitespace and sign, then digits; anything else reads as 0.
    m = re.match(r"\s*([+-]?\d+)", text)
    return int(m.group(1)) if m else 0


def read_image_list(path) -> list[tuple[str, int]]:
    """A Caffe image list file: "path label" per line, split at the LAST space (names may hold
    spaces); the label is read as C's atoi does. Blank lines are skipped."""
    out = []
    raw = read_input_file(path, "image list", TEXT_LIST_LIMIT)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"image list {os.fspath(path)}: not UTF-8 text (at byte {exc.start})") from None
    for line in text.splitlines():
        if not line.strip():
            continue
        cut = line.rfind(" ")
        out.append((line[:cut] if cut >= 0 else line, _atoi(line[cut + 1:])))
    return out
