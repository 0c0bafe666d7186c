"""The ``fp16`` exchange rule: synchronous allreduce whose messages are float16 (Theano-MPI's asa16,
Horovod's fp16 compression), summed and accumulated in float32.

How the values travel and are summed. The multicolour trees of ``multicolor.py`` carry the
messages (MPI has no float16 sum, and a float16 sum would round at every addition): every rank adds
its children's partial sums to its own in float32, and only what crosses a link is float16. Each
message is block-scaled: its sender multiplies the values by a power of two 2^-e chosen from the
message's own largest magnitude m (e = floor(log2 m) - 14, so the largest scaled value lies in
[2^14, 2^15), below float16's 65504) and sends e as one more float16 element; the receiver
multiplies by 2^e in float32. Hence:

- no overflow, whatever the gradients' size: every message, partial sums included, is scaled to
  fit (an agreed scale from the max over ranks, with 1/N, would bound the sums too, but needs one
  more round trip per chunk before anything can be sent, and rescales small partial sums no better);
- a power of two changes no significant bit: a value that float16 holds exactly (after scaling)
  arrives exactly, so sums of such values equal the float32 exchange's;
- a message's rounding error is at most 2^-11 of its largest value; values under about 2^-28 of
  it lose bits and under about 2^-39 are lost (float16's subnormals), as in any float16 format.

Every rank ends with the same bytes: the root of each part rounds the sum to float16 once, keeps
the rounded values itself and sends exactly those down the tree.

The error is measured once, in the first iteration this process exchanges: the averaged gradients
against a float32 allreduce of the same gradients (relative L2 error, largest absolute error), logged.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from ..backend import to_host
from .buckets import Bucket
from .exchange import register_exchange
from .jit_half import scaled_half_bits
from .multicolor import MulticolorExchange, WireFormat

logger = logging.getLogger("netdef")

TARGET_EXPONENT = 14          # the largest scaled magnitude lies in [2^14, 2^15)
MIN_EXPONENT, MAX_EXPONENT = -126, 127   # scale factors 2^-e that float32 holds as normal numbers


def scale_exponent(values: np.ndarray) -> int:
    """e such that values * 2^-e fit float16 with the largest finite magnitude in [2^14, 2^15) (an inf
    or nan travels as itself); 0 when there is no finite value other than zero."""
    if values.size == 0:
        return 0
    largest = max(float(values.max()), -float(values.min()))
    if not math.isfinite(largest):  # rare: a diverged gradient; scale what is still finite
        finite = values[np.isfinite(values)]
        largest = float(np.abs(finite).max()) if finite.size else 0.0
    if largest == 0.0:
        return 0
    return int(min(max(math.frexp(largest)[1] - 1 - TARGET_EXPONENT, MIN_EXPONENT), MAX_EXPONENT))


class Float16Wire(WireFormat):
    """Block-scaled float16 messages: n scaled values and the exponent e (module docstring)."""

    def describe(self) -> str:
        return "float16 messages scaled by a power of two each, summed in float32"

    def message_buffer(self, count: int, dtype) -> np.ndarray:
        return np.empty(count + 1, dtype=np.float16)

    def encode(self, values: np.ndarray) -> np.ndarray:
        message = np.empty(values.size + 1, dtype=np.float16)
        exponent = scale_exponent(values)
        scaled_half_bits(np.ascontiguousarray(values, dtype=np.float32).reshape(-1), np.float32(2.0 ** -exponent),
                         message[:-1].view(np.uint16))
        message[-1] = exponent
        return message

    # NumPy's float16 -> float32 cast is fast; a multiply with dtype=float32 on the float16 array is
    # slower than the cast and a multiply in place (same section of benchmarks/README.md as jit_half.py's).
    def decode(self, message: np.ndarray, out: np.ndarray) -> None:
        np.copyto(out, message[:-1])
        np.multiply(out, out.dtype.type(2.0 ** int(message[-1])), out=out)

    def accumulate(self, out: np.ndarray, message: np.ndarray) -> None:
        values = message[:-1].astype(np.float32)
        np.multiply(values, np.float32(2.0 ** int(message[-1])), out=values)
        np.add(out, values, out=out, casting="same_kind")


def scale_exponent_where_they_lie(xp, values):
    """``scale_exponent`` of float32 ``values`` computed by their own array module ``xp`` and left there,
    a 0-d int32 array: on a GPU nothing waits for the device."""
    largest = xp.max(xp.where(xp.isfinite(values), xp.abs(values), values.dtype.type(0)))
    exponent = xp.clip(xp.frexp(largest)[1] - (1 + TARGET_EXPONENT), MIN_EXPONENT, MAX_EXPONENT)
    return xp.where(largest == 0, 0, exponent).astype(xp.int32)


class Float16DeviceWire(Float16Wire):
    """``Float16Wire``'s messages, the same bits, made and read by the array operations of ``xp``
    (CuPy where the trees run on a GPU, ``nccl_trees.py``): the scale, the casts and the scaled sums
    run as device kernels on the communication stream, and the host never reads a value. The scale
    multiplies in float32 and the cast rounds to nearest, ties to even, as the host's kernel does.
    Two differences CUDA makes, neither in a finite gradient's bits: a NaN is sent with CUDA's
    payload, not NumPy's, and CuPy's kernels flush float32 subnormals to zero, so a part whose every
    value is below float32's smallest normal number is sent as zeros."""

    def message_buffer(self, count: int, dtype):
        return self.xp.empty(count + 1, dtype=self.xp.float16)

    def _scale(self, exponent, dtype):
        """2^``exponent`` (a 0-d int32 array) as a 0-d array of ``dtype``: exact, and of that type
        whatever rules the module follows for a scalar beside an array."""
        return self.xp.ldexp(self.xp.ones((), dtype=dtype), exponent)

    def encode(self, values):
        xp = self.xp
        values = values.reshape(-1).astype(xp.float32, copy=False)
        exponent = scale_exponent_where_they_lie(xp, values)
        message = xp.empty(values.size + 1, dtype=xp.float16)
        message[:-1] = values * self._scale(-exponent, np.dtype(np.float32))
        message[-1:] = exponent  # exactly: float16 holds every integer of [-126, 127]
        return message

    def decode(self, message, out) -> None:
        xp = self.xp
        xp.copyto(out, message[:-1])
        xp.multiply(out, self._scale(message[-1].astype(xp.int32), out.dtype), out=out)

    def accumulate(self, out, message) -> None:
        xp = self.xp
        values = message[:-1].astype(xp.float32)
        xp.multiply(values, self._scale(message[-1].astype(xp.int32), np.dtype(np.float32)), out=values)
        xp.add(out, values, out=out)


class ErrorProbe:
    """The fp16 exchange's error in one iteration: the packed gradients (``before``) and the
    summed ones (``after``) of every bucket, compared with a float32 allreduce of the former."""

    def __init__(self):
        self.before: dict[int, np.ndarray] = {}
        self.after: dict[int, np.ndarray] = {}

    def complete(self, count: int) -> bool:
        return len(self.after) == count

    def measure(self, comm) -> tuple[float, float, float]:
        """(relative L2 error, largest absolute error, largest magnitude) of the averaged gradient;
        a collective call (one blocking allreduce of every gradient)."""
        order = sorted(self.before)
        reference = np.concatenate([to_host(self.before[i]).astype(np.float32) for i in order])
        exchanged = np.concatenate([to_host(self.after[i]).astype(np.float32) for i in order])
        comm.allreduce(reference)
        reference /= comm.size
        exchanged /= comm.size
        difference = exchanged - reference
        norm = float(np.linalg.norm(reference))
        relative = float(np.linalg.norm(difference)) / norm if norm > 0 else float(np.linalg.norm(difference))
        return relative, float(np.abs(difference).max(initial=0.0)), float(np.abs(reference).max(initial=0.0))


@register_exchange("fp16")
class Fp16Exchange(MulticolorExchange):
    """Synchronous data parallelism as ``multicolor``, with float16 messages (module docstring). The
    first exchanged iteration's error against float32 is measured and logged."""

    def __init__(self, comm, net, options=None, measurements=None, clock=time.perf_counter, seed: int = 0):
        super().__init__(comm, net, options, measurements, clock, seed)
        self._probe: ErrorProbe | None = ErrorProbe() if comm.size > 1 else None
        self.measured_error: tuple[float, float, float] | None = None

    @classmethod
    def wire_for(cls, xp) -> WireFormat:
        return Float16Wire() if xp is np else Float16DeviceWire(xp)

    def start_bucket(self, bucket: Bucket) -> None:
        if self._probe is not None:
            self._probe.before[bucket.index] = self.reduction.copy_of(bucket.buffer)
        super().start_bucket(bucket)

    def unpack_bucket(self, bucket: Bucket) -> None:
        if self._probe is not None:
            # The sum is complete here (its end was seen): copied on the compute stream, ahead of the
            # update that follows there (on the reduction's stream it could run after the update).
            self._probe.after[bucket.index] = bucket.buffer.copy()
        super().unpack_bucket(bucket)

    def after_update(self, iteration: int) -> None:
        # Here every rank has unpacked every bucket and starts no exchange until the next iteration's
        # first gradient: the blocking allreduce below comes after the same collectives everywhere.
        super().after_update(iteration)
        probe = self._probe
        if probe is None or self.buckets is None or not probe.complete(len(self.buckets)):
            return
        self._probe = None
        self.measured_error = probe.measure(self.comm)
        relative, largest_error, largest = self.measured_error
        if self.comm.rank == 0:
            logger.info("fp16 exchange error (first exchanged iteration, averaged gradient against a float32 "
                        "allreduce of the same gradients): relative L2 %.3g, largest absolute %.3g (largest "
                        "magnitude %.3g)", relative, largest_error, largest)
