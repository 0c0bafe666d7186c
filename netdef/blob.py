"""Blob: an N-d array of values (``data``) and of gradients (``diff``), as in Caffe.

Both arrays belong to the current array module and are allocated lazily on first access, so a net can
be built (shapes only) without touching memory. Rules layers follow:
- A layer may replace a top's ``data`` (``top.data = y``) or a bottom's ``diff`` with a new array of the
  blob's shape; ``Blob`` checks the shape and casts to the blob's dtype.
- Parameter blobs are only ever updated in place (``+=``, ``[...] =``): shared parameters and the
  gradient exchange hold views of them.
- The solver clears parameter gradients lazily (``defer_zero_diff``): the array keeps its stale values
  and reading ``diff`` zeroes it first, while a layer that adds a gradient may ask
  ``diff_for_accumulation`` and, right after a clear, write the gradient instead of adding it to zeros
  (InnerProduct and Convolution do: between them, nearly every parameter of the zoo's nets). An
  iteration of AlexNet then does not write zeros over 244 MB of gradients only to read them back
  (benchmarks/README.md, issue 7). Blobs whose diff another blob shares (``share_diff``) are always
  zeroed at once: the other blob could not know.
"""
from __future__ import annotations

import math

import numpy as np

from . import backend, memory
from .memory import BlobTooLargeError  # noqa: F401 - raised by Blob, and imported from here by callers


def _as_shape(shape) -> tuple:
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        shape = tuple(shape[0])
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"blob dimensions must be non-negative, got {shape}")
    return shape


class Blob:
    """Holds ``data`` and ``diff`` of one shape. ``Blob(2, 3)`` or ``Blob((2, 3))``."""

    def __init__(self, *shape, dtype=None, name: str = ""):
        self.name = name
        self.dtype = np.dtype(dtype or backend.default_dtype()).type
        self._shape = _as_shape(shape) if shape else ()
        self._data = None
        self._diff = None
        self._diff_zero_pending = False  # defer_zero_diff: the array holds stale values until read
        self._diff_shared = False        # another Blob holds this diff array (share_diff)
        self._xp = backend.xp()

    @property
    def array_module(self):
        """NumPy or CuPy: where this blob's arrays live (the device current when it was made)."""
        return self._xp

    # ------------------------------------------------------------------ shape
    @property
    def shape(self) -> tuple:
        return self._shape

    def reshape(self, *shape) -> None:
        """Set a new shape; the contents are kept when the element count is unchanged."""
        if len(shape) == 1 and type(shape[0]) is tuple and shape[0] == self._shape:
            return  # the layers' reshape at every forward, mostly (a tuple: an array would compare per element)
        new_shape = _as_shape(shape)
        if new_shape == self._shape:
            return
        same_count = math.prod(new_shape) == math.prod(self._shape)
        self._data = self._data.reshape(new_shape) if (same_count and self._data is not None) else None
        self._diff = self._diff.reshape(new_shape) if (same_count and self._diff is not None) else None
        self._diff_zero_pending = self._diff_zero_pending and self._diff is not None
        self._shape = new_shape

    def reshape_like(self, other: "Blob") -> None:
        self.reshape(other.shape)

    @property
    def count(self) -> int:
        return math.prod(self._shape)

    def count_range(self, start: int, end: int | None = None) -> int:
        return math.prod(self._shape[start:end])

    @property
    def num_axes(self) -> int:
        return len(self._shape)

    def canonical_axis(self, axis: int) -> int:
        """Caffe's CanonicalAxisIndex: negative axes count from the end; out of range is an error."""
        n = len(self._shape)
        if not -n <= axis < max(n, 1):
            raise IndexError(f"axis {axis} out of range for blob {self.name!r} of shape {self._shape}")
        return axis + n if axis < 0 else axis

    def _legacy(self, index: int) -> int:
        # Caffe's LegacyShape: missing leading axes read as 1 for blobs of fewer than four axes.
        if len(self._shape) > 4:
            raise ValueError(f"blob {self.name!r} has {len(self._shape)} axes; num/channels/height/width need <= 4")
        if index >= len(self._shape):
            return 1
        return self._shape[index]

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    # ------------------------------------------------------------------ contents
    def check_fits(self) -> None:
        """Raise BlobTooLargeError, naming this blob, when its array could not be allocated now (on the
        CPU: netdef/memory.py)."""
        if self._xp is np:
            memory.check_fits(self.count * np.dtype(self.dtype).itemsize,
                              f"blob {self.name!r} of shape {self._shape}" if self.name else
                              f"a parameter blob of shape {self._shape}")

    def _fresh(self):
        self.check_fits()
        return self._xp.zeros(self._shape, dtype=self.dtype)

    def _checked(self, value, what: str):
        module = backend.get_array_module(value)
        if module is not self._xp:
            value = backend.to_device(value, like=self._xp.empty(0))
        arr = self._xp.asarray(value, dtype=self.dtype)
        if arr.shape != self._shape:
            if arr.size == self.count:
                arr = arr.reshape(self._shape)
            else:
                raise ValueError(f"blob {self.name!r}: {what} of shape {arr.shape} does not fit shape {self._shape}")
        return arr

    @property
    def data(self):
        if self._data is None:
            self._data = self._fresh()
        return self._data

    @data.setter
    def data(self, value) -> None:
        self._data = self._checked(value, "data")

    @property
    def diff(self):
        if self._diff is None:
            self._diff = self._fresh()
        elif self._diff_zero_pending:
            self._diff[...] = 0
        self._diff_zero_pending = False
        return self._diff

    @diff.setter
    def diff(self, value) -> None:
        self._diff = self._checked(value, "diff")
        self._diff_zero_pending = False

    def diff_for_accumulation(self):
        """(array, overwrite) for a layer that adds a gradient into this blob's diff. ``overwrite`` is
        True right after ``defer_zero_diff``: the array holds stale values, and the caller must write
        every element (the gradient itself, which is what adding it to zeros gives); else it adds."""
        if self._diff is None or not self._diff_zero_pending:
            return self.diff, False
        self._diff_zero_pending = False
        return self._diff, True

    def diff_to_overwrite(self):
        """The gradient's array for a layer whose backward writes every element of it (Pooling's, which
        sets its bottom's gradient as Caffe's does, not adds to it): the array as it is (a pending
        clear dropped), or, where there is none (released, or never made), a new one whose values are
        arbitrary, not zeros: the pass that zeroes it would be overwritten at once (LeNet's pool1
        input gradient, 2.9 MB at batch 64, at every iteration)."""
        if self._diff is None:
            self.check_fits()
            self._diff = self._xp.empty(self._shape, dtype=self.dtype)
        self._diff_zero_pending = False
        return self._diff

    @property
    def diff_is_shared(self) -> bool:
        """Whether another Blob holds this blob's diff array (``share_diff``): it must stay that array."""
        return self._diff_shared

    def keep_diff_in(self, home) -> None:
        """Make ``home`` (an array of this blob's count and dtype, of its array module) the gradient's
        array from now on, holding the gradient's values (a pending clear stays pending): the
        gradient exchange sums the gradients where backward writes them."""
        if self._diff_shared:
            raise ValueError(f"blob {self.name!r}: its diff is shared with another blob and must stay where it is")
        if home.size != self.count or home.dtype != self.dtype:
            raise ValueError(f"blob {self.name!r}: a diff of {self.count} {self.dtype} values cannot live in "
                             f"{home.size} {home.dtype} values")
        home = home.reshape(self._shape)
        home[...] = 0 if self._diff is None else self._diff
        self._diff = home

    def bound_arrays(self) -> tuple:
        """(data array, diff array, whether the diff's clear is pending) as the blob holds them now,
        None for an array not made yet: what ``rebind`` puts back (a replayed CUDA graph wrote into
        these arrays, netdef/net_graphs.py)."""
        return self._data, self._diff, self._diff_zero_pending

    def rebind(self, arrays: tuple) -> None:
        """Hold the arrays ``bound_arrays`` returned again, as they are (no check, no copy)."""
        self._data, self._diff, self._diff_zero_pending = arrays

    def release_diff(self) -> None:
        """Free the gradient's memory; reading ``diff`` later gives zeros again."""
        self._diff = None
        self._diff_zero_pending = False

    @property
    def has_data(self) -> bool:
        return self._data is not None

    def share_data(self, other: "Blob") -> None:
        """Make this blob's data the same array as ``other``'s (same count, own shape)."""
        if other.count != self.count:
            raise ValueError(f"cannot share data of {other.name!r} {other.shape} with {self.name!r} {self.shape}")
        self._data = other.data.reshape(self._shape)

    def share_diff(self, other: "Blob") -> None:
        if other.count != self.count:
            raise ValueError(f"cannot share diff of {other.name!r} {other.shape} with {self.name!r} {self.shape}")
        self._diff = other.diff.reshape(self._shape)
        self._diff_zero_pending = False
        self._diff_shared = other._diff_shared = True

    def zero_diff(self) -> None:
        if self._diff is not None:
            self._diff[...] = 0
        self._diff_zero_pending = False

    def defer_zero_diff(self) -> None:
        """``zero_diff`` without the pass over memory: the next read of ``diff`` zeroes the array, and
        the next ``diff_for_accumulation`` lets its caller overwrite it. A reference to the array
        taken before keeps the stale values until then: the solver's own clearing uses this, where
        every reader goes through ``diff``; ``zero_diff`` is the one for callers that hold views."""
        if self._diff is None:
            return
        if self._diff_shared:
            self._diff[...] = 0
        else:
            self._diff_zero_pending = True

    def astype(self, dtype) -> None:
        """Change the element type, converting contents (used for float64 gradient checks)."""
        self.dtype = np.dtype(dtype).type
        if self._data is not None:
            self._data = self._data.astype(self.dtype)
        if self._diff is not None:
            self._diff = self._diff.astype(self.dtype)

    def __repr__(self) -> str:
        return f"Blob({self.name!r}, shape={self._shape})"
