"""Compiled float32 -> float16 encoding for the fp16 exchange rule (``fp16.py``).

NumPy's float32 -> float16 cast is scalar code in its builds without the vector instructions
for it, several times slower than the float16 -> float32 one: encoding was most of the rule's CPU
time (benchmarks/README.md, "The figures behind the solver's, the exchange's and the data's
choices"). This kernel multiplies by the message's power-of-two scale and rounds to float16
bits (IEEE round to nearest, ties to even; subnormals, infinities and NaNs included) in one pass,
without the GIL, so the communication thread does it while backprop runs.
``tests/comm/test_fp16.py`` compares it with NumPy's cast bit for bit.
"""
from __future__ import annotations

import numpy as np

from ..threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from numba import njit  # noqa: E402 (after the wait policy)


@njit(inline="always")
def _round_shift(value, shift):
    """``value >> shift`` rounded to nearest, ties to even (0 < shift < 32)."""
    kept = value >> shift
    dropped = value & ((np.uint32(1) << shift) - np.uint32(1))
    half = np.uint32(1) << (shift - np.uint32(1))
    if dropped > half or (dropped == half and (kept & np.uint32(1))):
        kept += np.uint32(1)
    return kept


@njit(nogil=True, cache=True)
def scaled_half_bits(values, scale, out):
    """``out[i]`` = the float16 bits of ``values[i] * scale`` (float32 product), for float32
    ``values`` and a uint16 ``out`` of the same length."""
    product = np.empty(1, dtype=np.float32)
    bits = product.view(np.uint32)
    for i in range(values.shape[0]):
        product[0] = values[i] * scale
        word = bits[0]
        sign = np.uint16((word >> np.uint32(16)) & np.uint32(0x8000))
        exponent = (word >> np.uint32(23)) & np.uint32(0xFF)
        mantissa = word & np.uint32(0x7FFFFF)
        if exponent == 0xFF:                       # inf, or nan (kept a quiet nan)
            out[i] = sign | np.uint16(0x7C00 if mantissa == 0 else 0x7E00)
        elif exponent >= 143:                      # 2^16 and above: beyond float16, inf
            out[i] = sign | np.uint16(0x7C00)
        elif exponent >= 113:                      # float16's normal range; a carry may round up to inf
            out[i] = sign | np.uint16((((exponent - np.uint32(112)) << np.uint32(10))) + _round_shift(mantissa, np.uint32(13)))
        elif exponent >= 102:                      # float16's subnormals (units of 2^-24)
            out[i] = sign | np.uint16(_round_shift(mantissa | np.uint32(0x800000), np.uint32(126) - exponent))
        else:                                      # under half the smallest subnormal: zero
            out[i] = sign
