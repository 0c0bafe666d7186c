"""Scratch memory that the layers of one net share: temporaries that live only inside one layer call.

Each layer keeping its own temporaries between calls (its ``Workspace``) saves allocations and page
faults, but every layer then holds its largest temporaries for the life of the net: ResNet-50's
convolutions at batch 8 held 728 MiB that way. Layers run one at a time, so a temporary that no
layer reads after its call returns can live in one buffer per name, shared by the net's layers and
grown to the largest request. A layer must not keep a scratch array (or a view of it) past the call
that got it, and never relies on what it held before: anything that must outlive a call, or whose
contents are set up once (a zero border written only when the array is created), stays in the
layer's own ``Workspace``.
"""
from __future__ import annotations

import math

import numpy as np

from .. import backend, memory


VIEWS_KEPT = 64  # views of one buffer kept to hand out again (Scratch.get)


class Scratch:
    """``get(key, shape, dtype, xp, clear=False, fill=None)``: an array of that shape viewing the
    buffer named ``key`` (the Workspace signature); its contents are whatever the last user left,
    unless ``clear`` (zeros) or ``fill`` is given, which are applied on every call."""

    def __init__(self):
        self._buffers: dict = {}
        #: How many buffers have been made so far: a change means one was replaced (or added), and
        #: a CUDA graph recorded before may still read the old one (netdef/net_graphs.py).
        self.generation = 0
        # The views of each buffer handed out so far, by (shape, dtype, array module): a net asks for
        # the same ones at every forward (MobileNet v2 at batch 1: about 70 a forward), and cutting a
        # view anew took a few microseconds each. Dropped with the buffer when it is replaced, and
        # when a name has VIEWS_KEPT of them (a net fed inputs of ever new sizes).
        self._views: dict = {}

    def get(self, key, shape, dtype, xp, clear=False, fill=None):
        shape = tuple(shape)
        views = self._views.get(key)
        array = None if views is None else views.get((shape, dtype, xp))
        if array is None:
            array = self._new_view(key, shape, dtype, xp)
        if fill is not None or clear:
            array.fill(0 if fill is None else fill)
        return array

    def _new_view(self, key, shape: tuple, dtype, xp):
        sizes = tuple(int(d) for d in shape)
        itemsize = np.dtype(dtype).itemsize
        nbytes = math.prod(sizes) * itemsize
        buffer = self._buffers.get(key)
        if buffer is None or buffer.nbytes < nbytes or backend.get_array_module(buffer) is not xp:
            if xp is np:  # the net names the layer (netdef/memory.py says why before allocating)
                memory.check_fits(nbytes, f"scratch array {key!r} of shape {sizes}")
            buffer = xp.empty(max(nbytes, 1), dtype=np.uint8)
            self._buffers[key] = buffer
            self.generation += 1
            self._views[key] = {}
        array = buffer[:nbytes].view(dtype).reshape(sizes)
        views = self._views[key]
        if len(views) >= VIEWS_KEPT:
            views.clear()
        views[(shape, dtype, xp)] = array
        return array

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())
