"""The compiled LRN kernels (layers/jit/lrn.py) against their NumPy twins (vision.lrn_across_* and
lrn_within_* with jit.ENABLED off): the scale to the bit, the power (beta 3/4 by square roots, any
other by pow), top and bottom gradient to rounding; windows wider than the channels or the plane,
spatial sizes over one work item; the same bits whatever the thread count; numerical gradients of
the LRN layer on both paths."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from netdef.layers import jit, vision
from netdef.layers.jit import lrn as kernels
from tests.helpers import check_gradients
from tests.layers.test_vision import lrn_text, normal

CASES = [  # size, (N, C, H, W)
    (5, (2, 7, 3, 4)),
    (3, (2, 2, 5, 5)),
    (1, (1, 3, 2, 3)),
    (7, (2, 4, 4, 4)),        # wider than the channels (and the plane)
    (5, (2, 6, 30, 25)),      # 750 cells: two work items per sample across channels
    (3, (1, 5, 2, 9)),
]
IDS = [f"n{size}-{'x'.join(map(str, shape))}" for size, shape in CASES]
REGIONS = {
    "across": (lambda x, size, beta: vision.lrn_across_forward(x, size, 0.02, beta, 1.5), vision.lrn_across_backward),
    "within": (lambda x, size, beta: vision.lrn_within_forward(x, size, 0.3, beta), vision.lrn_within_backward),
}
ALPHA = {"across": 0.02, "within": 0.3}


@pytest.fixture(params=[True, False], ids=["compiled", "reference"])
def compiled(request, monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", request.param)
    return request.param


def normalized(region, size, beta, x, dy):
    forward, backward = REGIONS[region]
    y, scale, power = forward(x, size, beta)
    return y, scale, power, backward(x, y, scale, power, dy, size, ALPHA[region], beta)


@pytest.mark.parametrize("beta", [0.75, 1.3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("region", sorted(REGIONS))
@pytest.mark.parametrize("size,shape", CASES, ids=IDS)
def test_lrn_kernels_match_reference(monkeypatch, region, size, shape, dtype, beta):
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    calls = []
    for name in ("across_forward", "across_backward", "within_forward", "within_backward"):
        kernel = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *args, _k=kernel, _n=name: (calls.append(_n), _k(*args))[1])
    y, scale, power, dx = normalized(region, size, beta, x, dy)
    assert calls == [f"{region}_forward", f"{region}_backward"]
    monkeypatch.setattr(jit, "ENABLED", False)
    ref_y, ref_scale, ref_power, ref_dx = normalized(region, size, beta, x, dy)
    assert len(calls) == 2
    np.testing.assert_array_equal(scale, ref_scale)
    tol = 2e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(power, ref_power, rtol=tol)
    np.testing.assert_allclose(y, ref_y, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, ref_dx, rtol=tol, atol=tol * np.abs(ref_dx).max())
    assert y.dtype == scale.dtype == power.dtype == dx.dtype == dtype


@pytest.mark.parametrize("region", sorted(REGIONS))
def test_lrn_kernels_same_bits_for_any_thread_count(region):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 16, 20, 30)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    threads = numba.get_num_threads()
    results = []
    try:
        for count in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(count)
            results.append(normalized(region, 5, 0.75, x, dy))
    finally:
        numba.set_num_threads(threads)
    for a, b in zip(*results):
        assert a.tobytes() == b.tobytes()


def test_lrn_kernels_take_contiguous_numpy_arrays_only(monkeypatch):
    calls = []
    monkeypatch.setattr(kernels, "within_forward", lambda *args: calls.append("within_forward"))
    x = normal(2, 6, 4, 5)
    vision.lrn_within_forward(x, 3, 0.3, 0.75)
    assert calls == ["within_forward"]
    view = x[:, ::2]
    y, scale, power = vision.lrn_within_forward(view, 3, 0.3, 0.75)  # not contiguous: NumPy
    np.testing.assert_allclose(y, view * scale ** -0.75)
    monkeypatch.setattr(jit, "ENABLED", False)
    vision.lrn_within_forward(x, 3, 0.3, 0.75)
    assert calls == ["within_forward"]


@pytest.mark.parametrize("fields", [
    dict(local_size=5, alpha=0.6, beta=0.75, k=2),
    dict(local_size=3, alpha=0.9, beta=1.3, k=1),
    dict(norm_region="WITHIN_CHANNEL", local_size=3, alpha=0.6, beta=0.75),
    dict(norm_region="WITHIN_CHANNEL", local_size=5, alpha=0.9, beta=0.4),
], ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_lrn_gradients_on_both_paths(compiled, fields):
    check_gradients(lrn_text(**fields), [normal(2, 4, 3, 4)])
