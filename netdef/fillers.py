"""Caffe's weight fillers: fill a Blob's data from a FillerParameter.

Values are drawn on the host from netdef's random generator (so a seed fixes them on CPU and GPU
alike) and then moved to the blob's device.
"""
from __future__ import annotations

import math

import numpy as np

from . import backend
from .proto import netdef_pb2 as pb

_Norm = pb.FillerParameter


def _fans(shape: tuple) -> tuple[int, int]:
    # Caffe: fan_in = count / num, fan_out = count / channels (weights are num_output x fan_in ...).
    count = math.prod(shape)
    fan_in = count // shape[0]
    fan_out = count // shape[1] if len(shape) > 1 else count
    return fan_in, fan_out


def _variance_n(shape: tuple, norm: int) -> float:
    fan_in, fan_out = _fans(shape)
    if norm == _Norm.AVERAGE:
        return (fan_in + fan_out) / 2.0
    if norm == _Norm.FAN_OUT:
        return float(fan_out)
    return float(fan_in)


def _bilinear(shape: tuple) -> np.ndarray:
    if len(shape) != 4 or shape[2] != shape[3]:
        raise ValueError(f"bilinear filler needs a 4-D blob with square kernels, got shape {shape}")
    size = shape[3]
    f = math.ceil(size / 2.0)
    c = (size - 1) / (2.0 * f)
    axis = 1 - np.abs(np.arange(size) / f - c)
    kernel = np.outer(axis, axis)
    return np.broadcast_to(kernel, shape).copy()


def _uniform(rng, low, high, shape, dtype):
    # Drawing in the blob's precision halves the time and memory of filling a large float32 layer.
    values = rng.random(size=shape, dtype=dtype)
    values *= dtype(high - low)
    values += dtype(low)
    return values


def _normal(rng, mean, std, shape, dtype):
    values = rng.standard_normal(size=shape, dtype=dtype)
    values *= dtype(std)
    values += dtype(mean)
    return values


def make_values(shape: tuple, param: pb.FillerParameter, rng: np.random.Generator | None = None,
                dtype=np.float64) -> np.ndarray:
    """A host array of ``shape`` and ``dtype`` (float32 or float64) filled as ``param`` says."""
    rng = rng or backend.rng()
    dtype = np.dtype(dtype).type
    kind = param.type
    if kind == "constant":
        return np.full(shape, param.value, dtype=dtype)
    if kind == "uniform":
        return _uniform(rng, param.min, param.max, shape, dtype)
    if kind == "gaussian":
        values = _normal(rng, param.mean, param.std, shape, dtype)
        if param.sparse >= 0:
            # Caffe keeps each weight with probability sparse / num_outputs (num_outputs = shape[0]).
            if len(shape) < 1:
                raise ValueError("sparse gaussian filler needs a blob with at least one axis")
            keep = min(1.0, param.sparse / float(shape[0]))
            values *= rng.random(size=shape) < keep
        return values
    if kind == "positive_unitball":
        values = _uniform(rng, 0.0, 1.0, shape, dtype)
        rows = values.reshape(shape[0], -1)
        rows /= rows.sum(axis=1, keepdims=True)
        return rows.reshape(shape)
    if kind == "xavier":
        scale = math.sqrt(3.0 / _variance_n(shape, param.variance_norm))
        return _uniform(rng, -scale, scale, shape, dtype)
    if kind == "msra":
        std = math.sqrt(2.0 / _variance_n(shape, param.variance_norm))
        return _normal(rng, 0.0, std, shape, dtype)
    if kind == "bilinear":
        return _bilinear(shape).astype(dtype)
    raise ValueError(f"unknown filler type {kind!r} (known: constant, uniform, gaussian, positive_unitball, xavier, msra, bilinear)")


def fill(blob, param: pb.FillerParameter, rng: np.random.Generator | None = None) -> None:
    """Fill ``blob.data`` in place as ``param`` says."""
    dtype = blob.dtype if np.dtype(blob.dtype) in (np.float32, np.float64) else np.float64
    values = make_values(tuple(blob.shape), param, rng, dtype)
    blob.data[...] = backend.to_device(values, like=blob.data)
