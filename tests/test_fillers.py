"""Caffe's fillers: each one's distribution, bounds and fan computations."""
import math

import numpy as np
import pytest
from google.protobuf import text_format

from netdef.blob import Blob
from netdef.fillers import fill
from netdef.proto import netdef_pb2 as pb


def filled(text, shape, seed=0, dtype=np.float32):
    blob = Blob(shape, dtype=dtype)
    fill(blob, text_format.Parse(text, pb.FillerParameter()), np.random.default_rng(seed))
    return np.asarray(blob.data, dtype=np.float64)


def test_constant_default_is_zero_and_value_is_used():
    assert not filled("", (3, 4)).any()
    assert (filled('type: "constant" value: 2.5', (3, 4)) == 2.5).all()


def test_uniform_bounds():
    v = filled('type: "uniform" min: -2 max: 3', (200, 50))
    assert v.min() >= -2 and v.max() <= 3
    assert abs(v.mean() - 0.5) < 0.05


def test_gaussian_moments_and_sparse_fraction():
    v = filled('type: "gaussian" mean: 1 std: 2', (400, 100))
    assert abs(v.mean() - 1) < 0.03 and abs(v.std() - 2) < 0.03
    sparse = filled('type: "gaussian" std: 1 sparse: 10', (40, 2000))
    # Each weight survives with probability sparse / num_outputs = 10 / 40.
    assert abs((sparse != 0).mean() - 0.25) < 0.01


def test_positive_unitball_rows_sum_to_one():
    v = filled('type: "positive_unitball"', (5, 3, 2, 2))
    assert (v >= 0).all()
    np.testing.assert_allclose(v.reshape(5, -1).sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("norm,n", [("FAN_IN", 3 * 5 * 5), ("FAN_OUT", 20 * 5 * 5), ("AVERAGE", (75 + 500) / 2)])
def test_xavier_and_msra_scale_with_the_fan(norm, n):
    shape = (20, 3, 5, 5)
    xavier = filled(f'type: "xavier" variance_norm: {norm}', shape, seed=1)
    bound = math.sqrt(3.0 / n)
    assert np.abs(xavier).max() <= bound + 1e-6
    assert np.abs(xavier).max() > 0.95 * bound
    msra = filled(f'type: "msra" variance_norm: {norm}', (200, 3, 5, 5) if norm == "FAN_IN" else shape, seed=2)
    n_msra = n if norm != "FAN_IN" else 75
    assert abs(msra.std() - math.sqrt(2.0 / n_msra)) < 0.05 * math.sqrt(2.0 / n_msra)


def test_bilinear_kernel_is_the_upsampling_kernel():
    v = filled('type: "bilinear"', (2, 1, 4, 4))
    axis = np.array([0.25, 0.75, 0.75, 0.25])
    np.testing.assert_allclose(v[1, 0], np.outer(axis, axis))
    odd = filled('type: "bilinear"', (1, 1, 3, 3))
    np.testing.assert_allclose(odd[0, 0], np.outer([0.5, 1, 0.5], [0.5, 1, 0.5]))


def test_unknown_filler_is_named():
    with pytest.raises(ValueError, match="unknown filler type 'nope'"):
        filled('type: "nope"', (2, 2))


def test_same_seed_same_values():
    a = filled('type: "xavier"', (10, 10), seed=7)
    b = filled('type: "xavier"', (10, 10), seed=7)
    np.testing.assert_array_equal(a, b)
