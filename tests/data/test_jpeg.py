"""JPEGs through TurboJPEG (netdef/data/jpeg.py) give the Pillow path's pixels bit for bit, and what it
does not decode exactly that way goes to Pillow."""
from __future__ import annotations

import io

import numpy as np
import pytest

from netdef.data import jpeg
from netdef.data.image import ImageError, decode_image_view, decode_with_pillow

pytestmark = pytest.mark.skipif(not jpeg.available(), reason="simplejpeg (TurboJPEG) is not installed")

Image = pytest.importorskip("PIL.Image")


def _picture(height: int, width: int, seed: int) -> np.ndarray:
    """Something like a photograph: smooth gradients, edges and noise (JPEG's usual content)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width, 1), y * 255 / max(height, 1), (x + y) % 97 * 2.6], axis=-1)
    base[(x - width / 2) ** 2 + (y - height / 2) ** 2 < (min(height, width) / 3) ** 2] = (30, 200, 90)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def _jpeg(pixels: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", **options)
    return out.getvalue()


CASES = {
    "4:2:0": dict(shape=(256, 256), options=dict(quality=90, subsampling=2)),
    "4:2:2 odd size": dict(shape=(33, 47), options=dict(quality=75, subsampling=1)),
    "4:4:4": dict(shape=(64, 80), options=dict(quality=95, subsampling=0)),
    "progressive": dict(shape=(120, 90), options=dict(quality=85, progressive=True)),
    "low quality": dict(shape=(61, 29), options=dict(quality=20)),
    "one pixel": dict(shape=(1, 1), options=dict()),
    "restart markers": dict(shape=(96, 96), options=dict(quality=80, restart_marker_blocks=2)),
}


@pytest.mark.parametrize("color", [True, False, None])
@pytest.mark.parametrize("case", sorted(CASES))
def test_turbojpeg_gives_pillows_pixels(case, color):
    spec = CASES[case]
    data = _jpeg(_picture(*spec["shape"], seed=len(case)), **spec["options"])
    fast = jpeg.decode_view(data, color, lambda size: True)
    assert fast is not None, "this JPEG should take the TurboJPEG path"
    slow = decode_with_pillow(data, color)
    assert fast.shape == slow.shape and fast.dtype == np.uint8
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(decode_image_view(data, color), slow)


@pytest.mark.parametrize("color", [True, False, None])
def test_grey_jpegs_too(color):
    data = _jpeg(_picture(50, 70, seed=3)[..., 1])
    fast = jpeg.decode_view(data, color, lambda size: True)
    assert fast is not None and fast.shape[0] == (3 if color else 1)
    np.testing.assert_array_equal(fast, decode_with_pillow(data, color))


def test_an_exif_orientation_is_left_to_pillow_which_turns_the_image():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    data = _jpeg(_picture(40, 60, seed=5), exif=exif.tobytes())
    assert jpeg.decode_view(data, True, lambda size: True) is None
    turned = decode_image_view(data, True)
    assert turned.shape == (3, 60, 40)
    np.testing.assert_array_equal(turned, decode_with_pillow(data, True))


def test_cmyk_and_other_formats_are_left_to_pillow():
    cmyk = io.BytesIO()
    Image.fromarray(_picture(20, 30, seed=1)).convert("CMYK").save(cmyk, "JPEG")
    assert jpeg.decode_view(cmyk.getvalue(), True, lambda size: True) is None
    png = io.BytesIO()
    Image.fromarray(_picture(20, 30, seed=1)).save(png, "PNG")
    assert jpeg.decode_view(png.getvalue(), True, lambda size: True) is None


def test_a_truncated_jpeg_fails_with_pillows_message():
    data = _jpeg(_picture(64, 64, seed=2))
    assert jpeg.decode_view(data[:len(data) // 2], True, lambda size: True) is None
    with pytest.raises(ImageError, match="record 7: cannot decode image"):
        decode_image_view(data[:len(data) // 2], True, name="record 7")


def test_the_pixel_cap_is_checked_from_the_header_before_decoding(monkeypatch):
    data = _jpeg(_picture(64, 64, seed=4))
    monkeypatch.setenv("NETDEF_MAX_IMAGE_PIXELS", "1000")
    with pytest.raises(ImageError, match="the image is 64 x 64 = 4096 pixels, more than the 1000 netdef decodes"):
        decode_image_view(data, True, name="big.jpg")
