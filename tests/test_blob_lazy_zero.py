"""Deferred clearing of parameter gradients (Blob.defer_zero_diff): what every reader sees, and that the
gradients a net computes after it are bit for bit those after an eager clear."""
import numpy as np
import pytest

import netdef
from netdef.blob import Blob


def _blob_with_diff(values):
    blob = Blob(len(values), dtype=np.float32)
    blob.diff = np.asarray(values, np.float32)
    return blob


def test_a_deferred_clear_reads_as_zeros_and_keeps_the_array():
    blob = _blob_with_diff([1, 2, 3])
    array = blob.diff
    blob.defer_zero_diff()
    assert array[1] == 2                      # not written yet: the pass over memory is saved
    assert blob.diff is array and not array.any()


def test_accumulation_after_a_deferred_clear_overwrites_once_then_adds():
    blob = _blob_with_diff([1, 2, 3])
    blob.defer_zero_diff()
    array, overwrite = blob.diff_for_accumulation()
    assert overwrite and array[0] == 1        # stale: the caller writes every element
    array[...] = 5
    again, overwrite = blob.diff_for_accumulation()
    assert again is array and not overwrite   # a second gradient (shared parameter, iter_size) adds
    assert list(blob.diff) == [5, 5, 5]


@pytest.mark.parametrize("then", ["setter", "release", "eager zero", "reshape away"])
def test_anything_that_replaces_or_zeroes_the_diff_ends_the_deferral(then):
    blob = _blob_with_diff([1, 2, 3, 4])
    blob.defer_zero_diff()
    if then == "setter":
        blob.diff = np.full(4, 7, np.float32)
        expected = [7, 7, 7, 7]
    elif then == "release":
        blob.release_diff()
        expected = [0, 0, 0, 0]
    elif then == "eager zero":
        blob.zero_diff()
        expected = [0, 0, 0, 0]
    else:
        blob.reshape(5)
        blob.reshape(4)
        expected = [0, 0, 0, 0]
    assert blob.diff_for_accumulation()[1] is False
    assert list(blob.diff) == expected


def test_a_gradient_to_overwrite_keeps_its_array_and_ends_a_deferred_clear():
    blob = _blob_with_diff([1, 2, 3])
    array = blob.diff
    blob.defer_zero_diff()
    assert blob.diff_to_overwrite() is array and array[2] == 3   # no pass: the caller writes it all
    array[...] = 4
    assert list(blob.diff) == [4, 4, 4]                           # the clear does not come later
    blob.release_diff()
    fresh = blob.diff_to_overwrite()
    assert fresh is not array and fresh.shape == (3,) and blob.diff is fresh


def test_pooling_backward_writes_a_released_gradient_whole():
    """Pooling's backward takes its bottom's gradient to overwrite (not zeroed first): with the
    gradient released (every iteration of a training net) it is the gradient with it held as zeros."""
    net = netdef.Net("""
    layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } } }
    layer { name: "t" type: "Input" top: "t" input_param { shape { dim: 2 dim: 4 dim: 3 dim: 3 } } }
    layer { name: "c" type: "Convolution" bottom: "x" top: "c"
            convolution_param { num_output: 4 kernel_size: 2 weight_filler { type: "gaussian" std: 0.5 } } }
    layer { name: "p" type: "Pooling" bottom: "c" top: "p" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
    layer { name: "a" type: "Pooling" bottom: "p" top: "a" pooling_param { pool: AVE kernel_size: 2 stride: 1 } }
    layer { name: "loss" type: "EuclideanLoss" bottom: "a" bottom: "t" top: "loss" }
    force_backward: true
    """, netdef.TEST)
    rng = np.random.default_rng(3)
    net.blobs["x"].data[...] = rng.standard_normal(net.blobs["x"].shape)
    net.blobs["t"].data[...] = rng.standard_normal(net.blobs["t"].shape)
    gradients = []
    for before in (0.0, np.nan, None):  # held as zeros, held with values that must not survive, released
        for name in ("c", "p"):
            if before is None:
                net.blobs[name].release_diff()
            else:
                net.blobs[name].diff = np.full(net.blobs[name].shape, before, np.float32)
        net.forward()
        net.backward()
        gradients.append(net.params["c"][0].diff.copy())
        net.clear_param_diffs()
    assert gradients[0].any() and np.array_equal(gradients[0], gradients[1])
    assert np.array_equal(gradients[0], gradients[2])


def test_a_reshape_that_keeps_the_array_keeps_the_deferral():
    blob = _blob_with_diff([1, 2, 3, 4])
    blob.defer_zero_diff()
    blob.reshape(2, 2)
    assert blob.diff.shape == (2, 2) and not blob.diff.any()


def test_blobs_sharing_a_diff_array_are_zeroed_at_once():
    owner = _blob_with_diff([1, 2, 3, 4])
    other = Blob(2, 2, dtype=np.float32)
    other.share_diff(owner)
    view = other.diff
    for blob in (owner, other):
        view[...] = 9
        blob.defer_zero_diff()
        assert not view.any()                  # the other blob could not know of a deferral
        assert blob.diff_for_accumulation()[1] is False


NET = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 4 dim: 50 } } }
layer { name: "t" type: "Input" top: "t" input_param { shape { dim: 4 dim: OUT } } }
layer { name: "f1" type: "InnerProduct" bottom: "x" top: "f1" param { name: "w" } param { name: "b" }
        inner_product_param { num_output: 50 TRANSPOSE weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "f2" type: "InnerProduct" bottom: "f1" top: "f2" param { name: "w" } param { name: "b" }
        inner_product_param { num_output: 50 TRANSPOSE } }
layer { name: "big" type: "InnerProduct" bottom: "f2" top: "big"
        inner_product_param { num_output: OUT TRANSPOSE weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "big" bottom: "t" top: "loss" }
"""


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("out", [30, 90000])   # 90000 x 50 float32 = 18 MB: above the 16 MiB block
def test_gradients_after_a_deferred_clear_are_bit_identical(transpose, out):
    """Two passes (as iter_size 2) after each kind of clear, with a parameter shared by two layers (the
    first adds to what the second wrote) and an InnerProduct whose weights the blocked path sums."""
    text = NET.replace("OUT", str(out)).replace("TRANSPOSE", f"transpose: {str(transpose).lower()}")
    rng = np.random.default_rng(3)
    inputs = [dict(x=rng.standard_normal((4, 50)).astype(np.float32),
                   t=rng.standard_normal((4, out)).astype(np.float32)) for _ in range(2)]
    grads = {}
    for deferred in (False, True):
        netdef.set_random_seed(7)
        net = netdef.Net(text, netdef.TRAIN)
        for blob in net.learnable_params:
            blob.diff = np.full(blob.shape, 0.25, np.float32)   # stale values a clear must hide
        net.clear_param_diffs(deferred=deferred)
        for feed in inputs:
            net.forward(**feed)
            net.backward()
        grads[deferred] = [blob.diff.copy() for blob in net.learnable_params]
    for eager, lazy in zip(grads[False], grads[True]):
        assert eager.tobytes() == lazy.tobytes()


CONV_NET = """
layer { name: "t" type: "Input" top: "t" input_param { shape { dim: 3 dim: 12 dim: OUT dim: OUT } } }
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 3 dim: 20 dim: SIZE dim: SIZE } } }
layer { name: "direct" type: "Convolution" bottom: "x" top: "c1" param { name: "w" } param { name: "b" }
        convolution_param { num_output: 20 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "shared" type: "Convolution" bottom: "c1" top: "c2" param { name: "w" } param { name: "b" }
        convolution_param { num_output: 20 kernel_size: 3 pad: 1 } }
layer { name: "rows" type: "Convolution" bottom: "c2" top: "c3"
        convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "grouped" type: "Convolution" bottom: "c3" top: "c3g"
        convolution_param { num_output: 50 kernel_size: 3 pad: 1 group: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "pointwise" type: "Convolution" bottom: "c3g" top: "c4"
        convolution_param { num_output: 12 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "c4" bottom: "t" top: "loss" }
"""


@pytest.mark.parametrize("size", [12, 40])   # 40: the pointwise products per sample, not stacked
def test_convolution_gradients_after_a_deferred_clear_are_bit_identical(size):
    """The direct weight gradient (two layers sharing their filters: the second adds to what the first
    wrote; a grouped layer), the row path's (LeNet's conv2 shape: its weight gradient direct) and the
    pointwise one write the gradient right after a deferred clear: the same bits as adding it to zeros;
    over two passes (iter_size 2) the sum of each pass's gradient."""
    text = CONV_NET.replace("SIZE", str(size)).replace("OUT", str(size - 4))
    rng = np.random.default_rng(5)
    inputs = [dict(x=rng.standard_normal((3, 20, size, size)).astype(np.float32),
                   t=rng.standard_normal((3, 12, size - 4, size - 4)).astype(np.float32)) for _ in range(2)]
    grads, algorithms = {}, {}
    for deferred in (False, True, "each"):
        netdef.set_random_seed(7)
        net = netdef.Net(text, netdef.TRAIN)
        for blob in net.learnable_params:
            blob.diff = np.full(blob.shape, 0.25, np.float32)
        net.clear_param_diffs(deferred=deferred is True)
        grads[deferred] = [np.zeros(blob.shape, np.float32) for blob in net.learnable_params]
        for feed in inputs:
            if deferred == "each":   # each pass's gradient alone, summed here: the reference
                net.clear_param_diffs(deferred=True)
            net.forward(**feed)
            net.backward()
            if deferred == "each":
                for total, blob in zip(grads[deferred], net.learnable_params):
                    total += blob.diff
        if deferred != "each":
            grads[deferred] = [blob.diff.copy() for blob in net.learnable_params]
        algorithms[deferred] = {name: net.layer_dict[name].algorithm_summary() for name in ("direct", "rows", "grouped", "pointwise")}
    for eager, lazy, each in zip(grads[False], grads[True], grads["each"]):
        assert eager.tobytes() == lazy.tobytes()
        np.testing.assert_allclose(lazy, each, rtol=1e-4, atol=1e-4 * np.abs(each).max())
    assert algorithms[True]["direct"].startswith("direct/") and algorithms[True]["pointwise"] == "pointwise"
    assert algorithms[True]["grouped"].startswith("direct/"), algorithms
    assert algorithms[True]["rows"].startswith("direct/rows") or size != 12, algorithms
