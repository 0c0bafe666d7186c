"""Decompression bombs (issue 11, fault 10): an image's size is checked from its header before any
pixel is decoded. The bomb is a real PNG: 1-bit grey, 10,000 x 10,000 pixels, about 12 KB on disk."""
from __future__ import annotations

import resource
import struct
import time
import zlib

import numpy as np
import pytest

from netdef.data.image import DEFAULT_MAX_PIXELS, ImageError, decode_image, read_image
from tests.data.builders import png_bytes

SIDE = 10_000  # 100 million pixels, more than the default cap


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def bomb_png(side: int = SIDE) -> bytes:
    """A valid PNG of side x side black 1-bit pixels: each row is a filter byte and side/8 zero bytes."""
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # bit depth 1, greyscale
    rows = zlib.compress(bytes(side * (1 + (side + 7) // 8)), 9)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", rows) + _chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    path = tmp_path_factory.mktemp("bomb") / "bomb.png"
    path.write_bytes(bomb_png())
    return path


def test_the_bomb_is_small_on_disk_and_huge_decoded(bomb):
    assert bomb.stat().st_size < 100_000
    assert SIDE * SIDE > DEFAULT_MAX_PIXELS


def test_a_bomb_is_refused_before_decoding(bomb):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.raises(ImageError, match=rf"{bomb}: the image is 10000 x 10000 = 100000000 pixels, more than "
                                         rf"the {DEFAULT_MAX_PIXELS} netdef decodes .*NETDEF_MAX_IMAGE_PIXELS"):
        read_image(bomb)
    assert time.perf_counter() - start < 2
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 50_000, f"decoding began: the peak grew by {grown_kib} KiB"


def test_the_cap_comes_from_the_environment(monkeypatch):
    small = png_bytes(np.zeros((20, 30, 3), dtype=np.uint8))
    assert decode_image(small, name="small.png").shape == (3, 20, 30)
    monkeypatch.setenv("NETDEF_MAX_IMAGE_PIXELS", "599")
    with pytest.raises(ImageError, match=r"record 7: the image is 30 x 20 = 600 pixels, more than the 599"):
        decode_image(small, name="record 7")
    monkeypatch.setenv("NETDEF_MAX_IMAGE_PIXELS", "600")
    assert decode_image(small).shape == (3, 20, 30)


@pytest.mark.parametrize("value", ["lots", "0", "-5"])
def test_a_bad_cap_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("NETDEF_MAX_IMAGE_PIXELS", value)
    with pytest.raises(ValueError, match=r"environment variable NETDEF_MAX_IMAGE_PIXELS"):
        decode_image(png_bytes(np.zeros((2, 2, 3), dtype=np.uint8)))


def test_the_command_line_names_the_bomb_without_a_raw_warning(bomb, tmp_path):
    """convert-imageset skips an image it cannot read, as Caffe's does, with one line naming it."""
    import subprocess
    import sys

    from tests.comm.fixtures import REPO

    (tmp_path / "list.txt").write_text(f"{bomb.name} 0\n")
    run = subprocess.run([sys.executable, "-m", "netdef.cli", "convert-imageset", f"{bomb.parent}/", "list.txt", "db"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    named = [line for line in run.stderr.splitlines() if f"{bomb}: the image is 10000 x 10000" in line]
    assert len(named) == 1, run.stderr
    assert "Processed 0 files" in run.stderr
    assert "Warning" not in run.stderr and "Traceback" not in run.stderr
