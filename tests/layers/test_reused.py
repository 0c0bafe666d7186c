"""ReusedArrays: large arrays kept from call to call, never one that overlaps an input; small ones fresh."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.layers.reused import ReusedArrays


@pytest.fixture
def keep_all(monkeypatch):
    monkeypatch.setattr(ReusedArrays, "KEEP_FROM_BYTES", 0)


def test_small_arrays_are_fresh_large_ones_kept():
    arrays = ReusedArrays()
    small = np.zeros(16, np.float32)
    assert arrays.get("top", small) is not arrays.get("top", small)
    large = np.broadcast_to(np.float32(0), (ReusedArrays.KEEP_FROM_BYTES // 4,))
    first = arrays.get("top", large)
    assert first.shape == large.shape and first.dtype == np.float32 and first.flags.c_contiguous
    assert arrays.get("top", large) is first


def test_the_same_array_comes_back(keep_all):
    arrays = ReusedArrays()
    like = np.zeros((2, 3), np.float32)
    first = arrays.get("top", like)
    assert first.shape == (2, 3) and first.dtype == np.float32
    assert arrays.get("top", like) is first
    assert arrays.get("diff", like) is not first  # one per name
    assert arrays.get("mask", like, dtype=np.int32).dtype == np.int32


def test_an_array_overlapping_an_input_is_not_given_out(keep_all):
    arrays = ReusedArrays()
    like = np.zeros(5)
    first = arrays.get("top", like)
    second = arrays.get("top", like, avoid=(first,))
    assert second is not first and not np.may_share_memory(first, second)
    # The two take turns when the input is each time the last output (a data layer writing into it).
    assert arrays.get("top", like, avoid=(second,)) is first
    assert arrays.get("top", like, avoid=(first[1:3], None)) is second
    third = arrays.get("top", like, avoid=(first, second))
    assert third is not first and third is not second
    assert len(arrays._kept["top"]) == ReusedArrays.KEPT_PER_NAME


def test_a_new_shape_or_dtype_gets_a_new_array(keep_all):
    arrays = ReusedArrays()
    first = arrays.get("top", np.zeros((2, 3)))
    other = arrays.get("top", np.zeros((3, 2)))
    assert other.shape == (3, 2) and other is not first
    assert arrays.get("top", np.zeros((3, 2), np.float32)).dtype == np.float32
    assert arrays.get("top", np.zeros((1,)), shape=(4, 4)).shape == (4, 4)
