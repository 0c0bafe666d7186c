"""A CPU data layer's batches reuse the memory of earlier ones only once nothing refers to them
(netdef/layers/datasets/staging.py, HostStaging)."""
from __future__ import annotations

import gc

import numpy as np

from netdef.layers.datasets.staging import REUSED_BATCH_BYTES, SPARE_BATCHES, HostStaging

SHAPE = (4, 3, 64, 64)  # 196,608 bytes of float32: reused only when the threshold allows
assert np.prod(SHAPE) * 4 < REUSED_BATCH_BYTES, "the small case must stay under the threshold"
LARGE = (8, 3, 128, 128)  # 1.5 MiB of float32


def test_a_batch_s_memory_is_reused_once_the_batch_and_every_view_of_it_are_gone():
    staging = HostStaging()
    first = staging.allocate(LARGE, np.float32)
    assert first.shape == LARGE and first.dtype == np.float32 and first.flags.writeable and first.flags.c_contiguous
    first[:] = 1
    row = first[2]  # a view a user keeps
    address = first.__array_interface__["data"][0]
    del first
    gc.collect()
    second = staging.allocate(LARGE, np.float32)
    assert not np.shares_memory(second, row), "memory a kept view reads was handed out again"
    second[:] = 2
    assert (row == 1).all()
    del row
    gc.collect()
    third = staging.allocate(LARGE, np.float32)
    assert third.__array_interface__["data"][0] == address, "the released memory is the next batch's"


def test_small_batches_come_from_the_allocator_and_few_spares_are_kept():
    staging = HostStaging()
    small = staging.allocate(SHAPE, np.float32)
    assert small.base is None, "a small batch is an array of its own"
    batches = [staging.allocate(LARGE, np.float32) for _ in range(SPARE_BATCHES + 3)]
    del batches
    gc.collect()
    assert staging.spare_bytes() == SPARE_BATCHES * 4 * int(np.prod(LARGE))
