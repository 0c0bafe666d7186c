"""Caffe's DataTransformer (``transform_param``), item by item straight into the batch.

For each item x (C x H x W, uint8 or float), Caffe computes

    y[c, h, w'] = (x[c, h_off + h, w_off + w] - mean[c, h_off + h, w_off + w]) * scale

with w' = w, or width - 1 - w when the item is mirrored; ``mean`` is the mean image (``mean_file``,
cropped at the same offsets) or ``mean_value`` per channel (one value is used for every channel), and
the arithmetic is in the output type (float32 normally): first the subtraction, then the product.

Random decisions, as Caffe: ``mirror`` flips each item with probability 1/2 in every phase (Caffe does
not look at the phase for mirroring); ``crop_size`` takes a random crop in TRAIN and the centre crop
(offsets (H - crop) // 2, (W - crop) // 2) in TEST. The draws come from the Generator passed in, so the
layer that owns it decides the sequence (and can save and restore it).

Each item is written into its row of the batch in one pass: the crop and the mirror are views (of the
item and of the mean image), and the subtraction reads the pixels, converts them and writes the row;
no per-item temporary and no gather. The draws for a batch come first (``plan``, in the calling
thread), so the items can then be transformed by several threads (``DataWorkers``) in any order
with the same result.

``force_color`` / ``force_gray`` only act on encoded items: they choose how images are decoded
(``decode_color``), as in Caffe.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..proto import netdef_pb2 as pb
from .datum import read_mean_file
from .errors import DataError
from .workers import SERIAL, DataWorkers


class TransformError(DataError):
    """An item that the transformation cannot take (too small for the crop, shape unlike the mean)."""


@dataclasses.dataclass
class ItemDecisions:
    """The random decisions for the items of a batch: ``mirror`` (bool per item) and the crop's
    ``h_off``, ``w_off`` (top-left corner per item; 0 without a crop)."""

    mirror: np.ndarray
    h_off: np.ndarray
    w_off: np.ndarray


class DataTransformer:
    """``DataTransformer(transform_param, phase, dtype)``; call it on a batch."""

    def __init__(self, param: pb.TransformationParameter | None = None, phase: int = pb.TRAIN,
                 dtype=np.float32):
        param = param if param is not None else pb.TransformationParameter()
        self.param = param
        self.phase = phase
        self.dtype = np.dtype(dtype).type
        self.scale = self.dtype(param.scale)
        self.mirror = bool(param.mirror)
        self.crop_size = int(param.crop_size)
        if param.force_color and param.force_gray:
            raise TransformError("cannot set both force_color and force_gray")
        self.mean_values = np.asarray(list(param.mean_value), dtype=self.dtype)
        self.mean = None
        if param.HasField("mean_file"):
            if len(param.mean_value):
                raise TransformError("cannot specify mean_file and mean_value at the same time")
            mean = read_mean_file(param.mean_file)
            if mean.ndim == 4:
                # Caffe reads the first item of a num x C x H x W mean blob.
                mean = mean[0]
            elif mean.ndim != 3:
                raise TransformError(f"mean file {param.mean_file} holds a blob of shape {mean.shape}; "
                                     f"a C x H x W (or 1 x C x H x W) mean image is needed")
            self.mean = np.ascontiguousarray(mean, dtype=self.dtype)

    # ------------------------------------------------------------------ decisions Caffe makes per item
    @property
    def decode_color(self) -> bool | None:
        """How encoded items are decoded: True (colour), False (grey) or None (as stored)."""
        if self.param.force_color:
            return True
        if self.param.force_gray:
            return False
        return None

    @property
    def needs_random(self) -> bool:
        return self.mirror or (self.phase == pb.TRAIN and self.crop_size > 0)

    def output_shape(self, shape) -> tuple:
        """The transformed shape of one C x H x W item (Caffe's InferBlobShape)."""
        c, h, w = (int(d) for d in shape)
        self.check(shape)
        if self.crop_size:
            return (c, self.crop_size, self.crop_size)
        return (c, h, w)

    def check(self, shape, name: str = "item") -> None:
        c, h, w = (int(d) for d in shape)
        if c <= 0:
            raise TransformError(f"{name}: has {c} channels")
        if self.crop_size and (h < self.crop_size or w < self.crop_size):
            raise TransformError(f"{name}: {h} x {w} is smaller than crop_size {self.crop_size}")
        if self.mean is not None and self.mean.shape != (c, h, w):
            raise TransformError(f"{name}: shape {(c, h, w)} differs from the mean image's {self.mean.shape} "
                                 f"(mean_file {self.param.mean_file})")
        if len(self.mean_values) not in (0, 1, c):
            raise TransformError(f"{name}: specify either 1 mean_value or as many as channels: {c} "
                                 f"(got {len(self.mean_values)})")

    # ------------------------------------------------------------------ random decisions, Caffe's order
    def _draw(self, n: int, h: int, w: int, rng) -> ItemDecisions:
        """The decisions for n items of one h x w shape: every mirror flag first, then every row
        offset, then every column offset (the order of the draws fixes the sequence for a seed)."""
        mirror = rng.integers(0, 2, size=n).astype(bool) if self.mirror else np.zeros(n, dtype=bool)
        crop = self.crop_size
        if crop and self.phase == pb.TRAIN:
            h_off = rng.integers(0, h - crop + 1, size=n)
            w_off = rng.integers(0, w - crop + 1, size=n)
        elif crop:
            h_off = np.full(n, (h - crop) // 2)
            w_off = np.full(n, (w - crop) // 2)
        else:
            h_off = np.zeros(n, dtype=np.int64)
            w_off = np.zeros(n, dtype=np.int64)
        return ItemDecisions(mirror, h_off, w_off)

    def plan(self, shapes, rng=None, names=None) -> tuple[ItemDecisions, tuple]:
        """Check the C x H x W ``shapes`` of a batch's items and draw their mirrors and crops; returns
        the decisions and the transformed item shape. The first item sets the output shape; the others
        must transform to it (with a crop they may be of other sizes). Items of equal shape draw
        together, groups in order of first appearance: the draws a batch of one shape made before
        transformation went item by item, so the same seed gives the same crops and mirrors."""
        if not shapes:
            raise TransformError("no items to transform")
        names = names if names is not None else [f"item {i}" for i in range(len(shapes))]
        for shape, name in zip(shapes, names):
            if len(shape) != 3:
                raise TransformError(f"{name}: expected C x H x W, got shape {tuple(shape)}")
        if self.needs_random and rng is None:
            raise TransformError("this transformation is random (mirror or a TRAIN crop): pass a Generator")
        groups: dict[tuple, list[int]] = {}
        for i, shape in enumerate(shapes):
            groups.setdefault(tuple(int(d) for d in shape), []).append(i)
        first = tuple(int(d) for d in shapes[0])
        out_shape = self.output_shape(first)
        if len(groups) == 1:
            return self._draw(len(shapes), first[1], first[2], rng), out_shape
        decisions = ItemDecisions(np.zeros(len(shapes), dtype=bool), np.zeros(len(shapes), dtype=np.int64),
                                  np.zeros(len(shapes), dtype=np.int64))
        for shape, idx in groups.items():
            self.check(shape, names[idx[0]])
            got = self.output_shape(shape)
            if got != out_shape:
                raise TransformError(f"{names[idx[0]]}: shape {shape} transforms to {got}, but the batch's first "
                                     f"item {names[0]} gave {out_shape} (items of one batch must agree)")
            drawn = self._draw(len(idx), shape[1], shape[2], rng)
            decisions.mirror[idx], decisions.h_off[idx], decisions.w_off[idx] = drawn.mirror, drawn.h_off, drawn.w_off
        return decisions, out_shape

    # ------------------------------------------------------------------ the transformation
    def transform_item(self, item: np.ndarray, out: np.ndarray, mirror: bool, h_off: int, w_off: int) -> None:
        """Write one C x H x W item (any strides: a view of the decoder's output will do) transformed
        into ``out`` (C x h x w, the item's row of the batch), in one pass: the crop and the mirror are
        views of the item and of the mean image, and the subtraction converts as it writes. (An
        N x C x H x W block of items with the same decisions works the same way.)"""
        c = item.shape[-3]
        oh, ow = out.shape[-2:]
        rows, cols = slice(h_off, h_off + oh), slice(w_off, w_off + ow)
        pixels = item[..., rows, cols]
        if self.mean is not None:
            mean = self.mean[:, rows, cols]
        elif len(self.mean_values):
            mean = self._channel_means(c)[:, None, None]
        else:
            mean = None
        if mirror:
            pixels = pixels[..., ::-1]
            if self.mean is not None:
                mean = mean[:, :, ::-1]
        # Each step in the output type, first the subtraction and then the product, as Caffe computes.
        if mean is not None:
            np.subtract(pixels, mean, out=out, dtype=self.dtype)
            if self.scale != 1:
                np.multiply(out, self.scale, out=out)
        elif self.scale != 1:
            np.multiply(pixels, self.scale, out=out, dtype=self.dtype)
        else:
            np.copyto(out, pixels, casting="unsafe")

    def _channel_means(self, channels: int) -> np.ndarray:
        # One mean_value serves every channel.
        return self.mean_values if len(self.mean_values) == channels else np.repeat(self.mean_values, channels)

    def __call__(self, batch: np.ndarray, rng: np.random.Generator | None = None, workers: DataWorkers = SERIAL,
                 allocate=np.empty) -> np.ndarray:
        """Transform an N x C x H x W batch of equally shaped items."""
        batch = np.asarray(batch)
        if batch.ndim != 4:
            raise TransformError(f"expected an N x C x H x W batch, got shape {batch.shape}")
        n, c, h, w = batch.shape
        self.check((c, h, w))
        if self.crop_size or self.mirror:
            return self.transform_items(batch, rng, workers=workers, allocate=allocate)
        # Neither crop nor mirror: the whole batch in one operation, the mean broadcast over it.
        out = allocate(batch.shape, self.dtype)
        self.transform_item(batch, out, False, 0, 0)
        return out

    def transform_items(self, items, rng: np.random.Generator | None = None, names=None,
                        workers: DataWorkers = SERIAL, allocate=np.empty) -> np.ndarray:
        """Transform a sequence of C x H x W items into one N x C x h x w batch (see ``plan``), each
        item written straight into its row of the batch by ``workers``; ``allocate(shape, dtype)``
        makes the batch's buffer (pinned host memory when the net runs on a GPU)."""
        decisions, out_shape = self.plan([np.shape(a) for a in items], rng, names)
        out = allocate((len(items),) + out_shape, self.dtype)

        def transform(i):
            self.transform_item(items[i], out[i], bool(decisions.mirror[i]), int(decisions.h_off[i]),
                                int(decisions.w_off[i]))

        workers.map(transform, range(len(items)))
        return out
