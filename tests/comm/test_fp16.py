"""The fp16 rule's wire format (fp16.py): block scaling by powers of two, exactness for values
float16 holds, no overflow with large gradients, float32 accumulation, and the error probe. The
rule under MPI is in test_mpi.py."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.comm.communicator import Communicator
from netdef.comm.fp16 import ErrorProbe, Float16Wire, scale_exponent
from netdef.comm.jit_half import scaled_half_bits

WIRE = Float16Wire()


def round_trip(values):
    message = WIRE.encode(values)
    assert message.dtype == np.float16 and message.size == values.size + 1
    out = np.empty_like(values)
    WIRE.decode(message, out)
    return message, out


@pytest.mark.parametrize("largest, exponent", [(1.0, -14), (1.5, -14), (2.0, -13), (65504.0, 1), (3e38, 113),
                                               (2.0 ** -20, -34), (1e-40, -126)])
def test_the_largest_value_is_scaled_into_2_14_to_2_15(largest, exponent):
    values = np.array([0.25 * largest, -largest, 0.0], dtype=np.float32)
    assert scale_exponent(values) == exponent
    if exponent > -126:  # above float32's normal range, the scale factor is at its bound
        assert 2 ** 14 <= np.float64(largest) * 2.0 ** -exponent < 2 ** 15


def test_zeros_are_not_scaled_and_infinities_travel_beside_scaled_finite_values():
    assert scale_exponent(np.zeros(4, np.float32)) == 0 and scale_exponent(np.zeros(0, np.float32)) == 0
    values = np.array([1000.0, np.inf, -2.0, np.nan], dtype=np.float32)
    assert scale_exponent(values) == scale_exponent(values[:1])
    _, out = round_trip(values)
    assert out[1] == np.inf and np.isnan(out[3]) and out[2] == -2.0
    assert out[0] == 1000.0


def test_values_float16_holds_travel_exactly_at_any_scale():
    base = np.arange(-1024, 1024, dtype=np.float32)  # 11 significant bits at most
    for power in (-60, -10, 0, 10, 60):
        values = base * np.float32(2.0 ** power)
        _, out = round_trip(values)
        assert (out == values).all()


def test_large_gradients_do_not_overflow_and_keep_float16_precision():
    rng = np.random.default_rng(0)
    for magnitude in (1e5, 1e20, 3e38):
        values = (rng.uniform(-1, 1, 1000) * magnitude).astype(np.float32)
        message, out = round_trip(values)
        assert np.isfinite(message).all() and np.isfinite(out).all()
        assert np.abs(out - values).max() <= 2.0 ** -11 * np.abs(values).max()


def test_the_compiled_encoding_rounds_as_numpys_cast_bit_for_bit():
    rng = np.random.default_rng(1)
    patterns = rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([0.0, 65504, 65519.99, 65520, 1e30, np.inf, np.nan, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26,
                      2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -11), 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11], dtype=np.float32)
    values = np.concatenate([patterns, edges, -edges])
    got = np.empty(values.size, dtype=np.uint16)
    scaled_half_bits(values, np.float32(1.0), got)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = values.astype(np.float16)
    nan = np.isnan(expected)
    assert (np.isnan(got.view(np.float16)) == nan).all()
    assert (got[~nan] == expected.view(np.uint16)[~nan]).all()


def test_partial_sums_accumulate_in_float32():
    out = np.ones(3, dtype=np.float32)
    WIRE.accumulate(out, WIRE.encode(np.full(3, 2.0 ** -20, dtype=np.float32)))
    # A float16 sum would round 1 + 2^-20 back to 1 (11 significant bits); float32 keeps it.
    assert (out == np.float32(1 + 2.0 ** -20)).all()


def test_the_probe_measures_the_error_of_the_average():
    probe = ErrorProbe()
    exact = np.array([3.0, -4.0, 0.0], dtype=np.float32)
    probe.before = {1: exact[:2].copy(), 0: exact[2:].copy()}
    probe.after = {1: np.array([3.0, -4.5], dtype=np.float32), 0: np.array([0.0], dtype=np.float32)}
    assert probe.complete(2) and not probe.complete(3)
    relative, largest_error, largest = probe.measure(Communicator())  # one rank: the allreduce is the identity
    assert relative == pytest.approx(0.5 / 5.0) and largest_error == pytest.approx(0.5) and largest == 4.0
