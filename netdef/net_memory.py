"""What a whole net will hold, checked against memory once its shapes are known and before its blobs'
arrays exist.

Each top is checked when its layer is set up (``Blob.check_fits``), but a net whose every blob fits
can still need more than the machine has in all (LeNet at batch 200,000: 24 GB); the kernel then kills
the process part-way through the first iteration, possibly another user's process with it. The tops'
arrays are made lazily, at the first forward, so the sum can be checked at the end of the build:

- every distinct blob's values (tops and parameters; an in-place top is its bottom's blob);
- in a TRAIN net, the gradient of every blob that backward will write (tops of the layers that run
  backward, learnable parameters).

The layers' temporaries (im2col buffers, a layer's scratch) come on top and are checked one by one
when made; the message says the sum is a lower bound.
"""
from __future__ import annotations

import numpy as np

from . import memory

#: The largest blobs a refusal names, so that the user sees where the memory goes.
NAMED_BLOBS = 3


def planned_blob_bytes(blobs) -> list[tuple[str, int]]:
    """[(name, bytes)] over distinct blobs, largest first, from ``blobs``: (name, Blob, whether it will
    hold a gradient too) for every blob of the net, shared and in-place blobs repeated."""
    planned: dict[int, tuple[str, int]] = {}
    for name, blob, with_gradient in blobs:
        held = blob.count * np.dtype(blob.dtype).itemsize * (2 if with_gradient else 1)
        earlier_name, earlier = planned.get(id(blob), (name, 0))
        planned[id(blob)] = (earlier_name, max(earlier, held))
    return sorted(planned.values(), key=lambda item: -item[1])


def check_net_fits(source: str, blobs, training: bool) -> None:
    """Raise BlobTooLargeError naming ``source``, the total and the largest blobs when ``blobs`` (as
    for ``planned_blob_bytes``) could not all be allocated now."""
    planned = planned_blob_bytes(blobs)
    total = sum(size for _, size in planned)
    available, bound = memory.available_bytes()
    if total <= available:
        return
    what = "values and gradients" if training else "values"
    largest = ", ".join(f"{name!r} {_gib(size)}" for name, size in planned[:NAMED_BLOBS])
    raise memory.BlobTooLargeError(
        f"{source}: the net's blobs need at least {total} bytes ({_gib(total)}, {what}, before the "
        f"layers' temporaries), more than {bound}; the largest: {largest} (a smaller batch_size or input "
        f"shape makes them smaller)")


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
