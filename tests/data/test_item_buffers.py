"""Each batch position keeps one decode buffer (netdef/data/item_buffers.py), and a JPEG decoded into one
is the image the decoder gives in fresh memory."""
from __future__ import annotations

import io

import numpy as np
import pytest

from netdef.data import jpeg
from netdef.data.image import decode_image_view
from netdef.data.item_buffers import ItemBuffers


def test_each_position_keeps_one_buffer_grown_to_its_largest_item():
    buffers = ItemBuffers(max_bytes=1000)
    first = buffers.at(0)(100)
    assert first.dtype == np.uint8 and first.nbytes == 100
    assert buffers.at(0)(60) is first, "a smaller item reuses the position's buffer"
    grown = buffers.at(0)(300)
    assert grown.nbytes == 300 and grown is not first
    assert buffers.at(0)(200) is grown
    other = buffers.at(1)(200)
    assert not np.shares_memory(other, grown), "two positions of a batch never share memory"
    assert buffers.held_bytes() == 500


def test_items_over_the_cap_get_fresh_memory():
    buffers = ItemBuffers(max_bytes=1000)
    assert buffers.at(0)(1001) is None
    assert buffers.held_bytes() == 0


@pytest.mark.skipif(not jpeg.available(), reason="simplejpeg (TurboJPEG) is not installed")
@pytest.mark.parametrize("color", [True, False])
def test_a_jpeg_decoded_into_a_position_s_buffer_is_the_same_image_in_that_memory(color):
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(4)
    pixels = np.clip(rng.normal(128, 40, (30, 41, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    data = out.getvalue()
    buffers = ItemBuffers()
    fresh = decode_image_view(data, color)
    for _ in range(2):  # the second decode reuses the memory of the first
        into = decode_image_view(data, color, buffer=buffers.at(3))
        np.testing.assert_array_equal(into, fresh)
        assert np.shares_memory(into, buffers.at(3)(1))
