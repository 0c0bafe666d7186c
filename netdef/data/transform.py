"""Caffe's DataTransformer (``transform_param``), vectorized over a batch.

For each item x (C x H x W, uint8 or float), Caffe computes

    y[c, h, w'] = (x[c, h_off + h, w_off + w] - mean[c, h_off + h, w_off + w]) * scale

with w' = w, or width - 1 - w when the item is mirrored; ``mean`` is the mean image (``mean_file``,
cropped at the same offsets) or ``mean_value`` per channel (one value is used for every channel), and
the arithmetic is in the output type (float32 normally): first the subtraction, then the product.

Random decisions, as Caffe: ``mirror`` flips each item with probability 1/2 in every phase (Caffe does
not look at the phase for mirroring); ``crop_size`` takes a random crop in TRAIN and the centre crop
(offsets (H - crop) // 2, (W - crop) // 2) in TEST. The draws come from the Generator passed in, so the
layer that owns it decides the sequence (and can save and restore it).

``force_color`` / ``force_gray`` only act on encoded items: they choose how images are decoded
(``decode_color``), as in Caffe.
"""
from __future__ import annotations

import numpy as np

from ..proto import netdef_pb2 as pb
from .datum import read_mean_file
from .errors import DataError


class TransformError(DataError):
    """An item that the transformation cannot take (too small for the crop, shape unlike the mean)."""


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

    # ------------------------------------------------------------------ the transformation
    def __call__(self, batch: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Transform an N x C x H x W batch of equally shaped items."""
        batch = np.asarray(batch)
        if batch.ndim != 4:
            raise TransformError(f"expected an N x C x H x W batch, got shape {batch.shape}")
        n, c, h, w = batch.shape
        self.check((c, h, w))
        if self.needs_random and rng is None:
            raise TransformError("this transformation is random (mirror or a TRAIN crop): pass a Generator")
        mirror = rng.integers(0, 2, size=n).astype(bool) if self.mirror else np.zeros(n, dtype=bool)
        crop = self.crop_size
        if crop and self.phase == pb.TRAIN:
            h_off = rng.integers(0, h - crop + 1, size=n)
            w_off = rng.integers(0, w - crop + 1, size=n)
        elif crop:
            h_off = np.full(n, (h - crop) // 2)
            w_off = np.full(n, (w - crop) // 2)
        oh, ow = (crop, crop) if crop else (h, w)

        if not crop and not mirror.any():
            x = batch  # the arithmetic below converts it to the output type as it goes
            mean = self.mean[None] if self.mean is not None else None
        else:
            if not crop:
                h_off = np.zeros(n, dtype=np.int64)
                w_off = np.zeros(n, dtype=np.int64)
            rows = h_off[:, None] + np.arange(oh)                       # N x oh
            cols = w_off[:, None] + np.arange(ow)                       # N x ow
            # A mirrored item reads its (cropped) columns right to left; the mean follows the pixels.
            cols = np.where(mirror[:, None], cols[:, ::-1], cols)
            ri = rows[:, None, :, None]
            ci = cols[:, None, None, :]
            chan = np.arange(c)[None, :, None, None]
            x = batch[np.arange(n)[:, None, None, None], chan, ri, ci].astype(self.dtype, copy=False)
            mean = self.mean[chan, ri, ci] if self.mean is not None else None
        # One new array, each step in the output type (``dtype=``: the items are converted first, as
        # astype would, then subtracted and scaled; the same values as step by step).
        if mean is None and len(self.mean_values):
            mv = self.mean_values if len(self.mean_values) == c else np.repeat(self.mean_values, c)
            mean = mv[None, :, None, None]
        if mean is not None:
            out = np.subtract(x, mean, dtype=self.dtype)
            if self.scale != 1:
                out *= self.scale
        elif self.scale != 1:
            out = np.multiply(x, self.scale, dtype=self.dtype)
        else:
            out = np.array(x, dtype=self.dtype)
        return np.ascontiguousarray(out)

    def transform_items(self, items, rng: np.random.Generator | None = None, names=None) -> np.ndarray:
        """Transform a list of C x H x W items into one N x C x h x w batch, Caffe's way: the first
        item sets the output shape; the others must transform to it (with a crop they may be of other
        sizes). Items of equal shape are transformed together."""
        if not items:
            raise TransformError("no items to transform")
        names = names if names is not None else [f"item {i}" for i in range(len(items))]
        shapes = [tuple(np.shape(a)) for a in items]
        for shape, name in zip(shapes, names):
            if len(shape) != 3:
                raise TransformError(f"{name}: expected C x H x W, got shape {shape}")
        out_shape = self.output_shape(shapes[0])
        groups: dict[tuple, list[int]] = {}
        for i, shape in enumerate(shapes):
            groups.setdefault(shape, []).append(i)
        if len(groups) == 1:
            return self(np.stack(items), rng)
        out = np.empty((len(items),) + out_shape, dtype=self.dtype)
        for shape, idx in groups.items():
            self.check(shape, names[idx[0]])
            got = self.output_shape(shape)
            if got != out_shape:
                raise TransformError(f"{names[idx[0]]}: shape {shape} transforms to {got}, but the batch's first "
                                     f"item {names[0]} gave {out_shape} (items of one batch must agree)")
            out[idx] = self(np.stack([items[i] for i in idx]), rng)
        return out
