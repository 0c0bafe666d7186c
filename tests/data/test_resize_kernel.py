"""The compiled bilinear resize (netdef/data/resize_kernel.py, behind ``image.resize``) gives the NumPy
reference's bytes, which tests/data/test_datum.py pins to OpenCV's."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.data.image import resize, resize_reference

SIZES = [((3, 300, 451), (256, 256)),   # an ImageNet-like original down to Caffe's 256 x 256
         ((3, 17, 9), (40, 33)),        # enlarged
         ((1, 64, 64), (7, 3)),         # shrunk a lot, one channel
         ((4, 5, 6), (5, 11)),          # rows kept, columns changed, BGRA
         ((3, 1, 1), (4, 6)),           # one pixel
         ((3, 8, 8), (1, 1))]


@pytest.mark.parametrize("shape, size", SIZES)
def test_the_kernel_gives_the_reference_s_bytes(shape, size):
    rng = np.random.default_rng(sum(shape) + sum(size))
    image = rng.integers(0, 256, shape, dtype=np.uint8)
    image[:, ::3] = 255  # saturated rows and columns: the clamp to 255 is exercised
    image[:, :, ::4] = 0
    got = resize(image, *size)
    assert got.dtype == np.uint8 and got.shape == (shape[0],) + size
    np.testing.assert_array_equal(got, resize_reference(image, *size))


def test_a_strided_view_of_decoded_pixels_resizes_like_a_copy():
    """What the data layers pass: the CHW view of a decoder's HWC array."""
    rng = np.random.default_rng(2)
    hwc = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    view = hwc.transpose(2, 0, 1)[::-1]
    np.testing.assert_array_equal(resize(view, 24, 30), resize_reference(np.ascontiguousarray(view), 24, 30))


def test_the_same_size_is_a_copy_and_other_types_are_refused():
    image = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    same = resize(image, 3, 4)
    assert same is not image
    np.testing.assert_array_equal(same, image)
    with pytest.raises(ValueError, match="uint8"):
        resize(image.astype(np.float32), 5, 5)
    with pytest.raises(ValueError, match="CHW"):
        resize(image[0], 5, 5)
