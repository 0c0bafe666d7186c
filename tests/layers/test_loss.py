"""Losses and metrics: Softmax, SoftmaxWithLoss, SigmoidCrossEntropyLoss, EuclideanLoss, HingeLoss,
MultinomialLogisticLoss, InfogainLoss, ContrastiveLoss, Accuracy, ArgMax."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.blob import Blob
from netdef.layers import loss as loss_module  # noqa: F401  (registers the types)
from netdef.layers.base import LayerError
from netdef.proto import netdef_pb2 as pb
from tests import helpers
from tests.helpers import build, check_gradients, layer_case_names, make_layer, parse_layer, run_caffe_case

PREFIXES = ("softmax", "sigmoid_ce_loss", "euclidean", "hinge", "multinomial", "infogain", "contrastive",
            "accuracy", "argmax")
CASES = layer_case_names(PREFIXES)




def rng(seed):
    return np.random.default_rng(seed)


def softmax(x, axis=1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def forward(text, bottoms, num_tops=1, dtype=np.float64):
    layer, bottom, top = build(parse_layer(text), bottoms, num_tops, dtype)
    layer.forward(bottom, top)
    return layer, bottom, top


def backward(layer, bottom, top, weight=1.0, propagate=None):
    top[0].diff = np.asarray(weight, dtype=top[0].dtype)
    if propagate is None:
        propagate = [True] + [False] * (len(bottom) - 1)
    layer.backward(top, propagate, bottom)
    return [np.array(b.diff) for b in bottom]


# ------------------------------------------------------------------------------------------- oracles
def test_oracle_cases_available():
    folder = helpers.shared_path("fixtures", "caffe-ref", "layers")
    assert folder.is_dir()
    for prefix in PREFIXES:
        assert any(n.startswith(prefix) for n in CASES), prefix
    assert len(CASES) >= 31, CASES


@pytest.mark.parametrize("name", CASES)
def test_caffe_oracle(name):
    run_caffe_case(name)


# ------------------------------------------------------------------------------------------- Softmax
@pytest.mark.parametrize("axis,shape", [(1, (2, 4, 3)), (2, (2, 3, 4)), (-1, (3, 5)), (0, (4, 2))])
def test_softmax_values_and_gradient(axis, shape):
    x = 3 * rng(1).standard_normal(shape)
    text = f'type: "Softmax" softmax_param {{ axis: {axis} }}'
    _, _, top = forward(text, [x])
    np.testing.assert_allclose(top[0].data, softmax(x, axis), rtol=1e-12)
    check_gradients(parse_layer(text), [x])


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1000.0, -1000.0], [-5000.0, 0.0, 5000.0]], dtype=np.float32)
    _, _, top = forward('type: "Softmax"', [x], dtype=np.float32)
    np.testing.assert_allclose(top[0].data, [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])


def test_softmax_in_place():
    x = rng(2).standard_normal((2, 3, 2))
    dy = rng(3).standard_normal((2, 3, 2))
    layer = make_layer(parse_layer('type: "Softmax"'))
    blob = Blob(x.shape, dtype=np.float64)
    blob.data[...] = x
    layer.setup_layer([blob], [blob])
    layer.forward([blob], [blob])
    y = softmax(x)
    np.testing.assert_allclose(blob.data, y)
    blob.diff = dy.copy()
    layer.backward([blob], [True], [blob])
    expected = (dy - (dy * y).sum(1, keepdims=True)) * y
    np.testing.assert_allclose(blob.diff, expected)


# ------------------------------------------------------------------------------------------- SoftmaxWithLoss
def manual_softmax_loss(x, labels, ignore=None, mode="VALID"):
    """Plain loops (independent of the layer's vectorized code)."""
    p = softmax(x, 1)
    n, c = x.shape[:2]
    p = p.reshape(n, c, -1)
    lab = labels.reshape(n, -1).astype(int)
    total, count = 0.0, 0
    grad = np.zeros_like(p)
    for i in range(n):
        for j in range(lab.shape[1]):
            if ignore is not None and lab[i, j] == ignore:
                continue
            total -= np.log(max(p[i, lab[i, j], j], np.finfo(np.float32).tiny))
            count += 1
            grad[i, :, j] = p[i, :, j]
            grad[i, lab[i, j], j] -= 1
    norm = {"FULL": n * lab.shape[1], "VALID": count, "BATCH_SIZE": n, "NONE": 1}[mode]
    norm = max(1, norm)
    return total / norm, grad.reshape(x.shape) / norm


SPATIAL_X = rng(10).standard_normal((2, 3, 2, 2))
SPATIAL_LABELS = np.array([[[0, 1], [2, 1]], [[1, 1], [0, 2]]], dtype=np.float64).reshape(2, 1, 2, 2)


@pytest.mark.parametrize("loss_param,mode,ignore", [
    ("", "VALID", None),
    ("loss_param { normalization: VALID }", "VALID", None),
    ("loss_param { normalization: FULL }", "FULL", None),
    ("loss_param { normalization: BATCH_SIZE }", "BATCH_SIZE", None),
    ("loss_param { normalization: NONE }", "NONE", None),
    ("loss_param { normalize: false }", "BATCH_SIZE", None),
    ("loss_param { normalize: true }", "VALID", None),
    ("loss_param { normalize: false normalization: FULL }", "FULL", None),
    ("loss_param { ignore_label: 1 }", "VALID", 1),
    ("loss_param { ignore_label: 1 normalization: FULL }", "FULL", 1),
    ("loss_param { ignore_label: 1 normalize: false }", "BATCH_SIZE", 1),
])
@pytest.mark.parametrize("label_shape", [(2, 1, 2, 2), (2, 2, 2)])
def test_softmax_loss_normalization(loss_param, mode, ignore, label_shape):
    text = f'type: "SoftmaxWithLoss" {loss_param}'
    labels = SPATIAL_LABELS.reshape(label_shape)
    layer, bottom, top = forward(text, [SPATIAL_X, labels])
    assert top[0].shape == ()
    expected, grad = manual_softmax_loss(SPATIAL_X, labels, ignore, mode)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)
    (dx, _) = backward(layer, bottom, top, weight=3.0)
    np.testing.assert_allclose(dx, 3.0 * grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("weight", [1.0, 2.0])
@pytest.mark.parametrize("text,x,labels", [
    ('type: "SoftmaxWithLoss"', rng(11).standard_normal((4, 5)), np.array([0, 4, 2, 2.0])),
    ('type: "SoftmaxWithLoss"', SPATIAL_X, SPATIAL_LABELS),
    ('type: "SoftmaxWithLoss" loss_param { ignore_label: 2 normalization: FULL }', SPATIAL_X, SPATIAL_LABELS),
    ('type: "SoftmaxWithLoss" loss_param { ignore_label: 0 }', SPATIAL_X, SPATIAL_LABELS),
    ('type: "SoftmaxWithLoss" softmax_param { axis: 2 }', rng(12).standard_normal((2, 3, 4)),
     np.array([[0, 3, 1], [2, 2, 0.0]])),
])
def test_softmax_loss_gradient(text, x, labels, weight):
    check_gradients(parse_layer(text), [x, labels], check_bottoms=[0], top_diffs=[weight])


def test_softmax_loss_second_top_is_probabilities():
    x = rng(13).standard_normal((3, 4))
    labels = np.array([1, 0, 3.0])
    layer, bottom, top = forward('type: "SoftmaxWithLoss"', [x, labels], num_tops=2)
    np.testing.assert_allclose(top[1].data, softmax(x))
    assert top[1].shape == x.shape
    check_gradients(parse_layer('type: "SoftmaxWithLoss"'), [x, labels], num_tops=2, check_bottoms=[0],
                    top_diffs=[1.0, 0.0])


def test_softmax_loss_all_ignored_gives_zero():
    x = rng(14).standard_normal((2, 3))
    layer, bottom, top = forward('type: "SoftmaxWithLoss" loss_param { ignore_label: 255 }', [x, np.array([255, 255.0])])
    assert float(top[0].data) == 0.0
    (dx, _) = backward(layer, bottom, top)
    assert np.all(dx == 0)


def test_softmax_loss_ignored_label_may_be_out_of_range_but_others_not():
    x = rng(15).standard_normal((3, 3))
    forward('type: "SoftmaxWithLoss" loss_param { ignore_label: -1 }', [x, np.array([0, -1, 2.0])])
    with pytest.raises(LayerError, match="out of range"):
        forward('type: "SoftmaxWithLoss"', [x, np.array([0, 3, 2.0])])
    with pytest.raises(LayerError, match="out of range"):
        forward('type: "SoftmaxWithLoss"', [x, np.array([0, -1, 2.0])])


def test_softmax_loss_clips_at_flt_min():
    x = np.array([[0.0, 200.0]], dtype=np.float32)  # p(class 0) underflows to 0 in float32
    _, _, top = forward('type: "SoftmaxWithLoss"', [x, np.array([0.0])], dtype=np.float32)
    np.testing.assert_allclose(top[0].data, -np.log(np.finfo(np.float32).tiny), rtol=1e-6)


def test_softmax_loss_label_count_mismatch():
    with pytest.raises(LayerError, match="number of labels"):
        forward('type: "SoftmaxWithLoss"', [np.zeros((2, 3, 2)), np.zeros((2, 3))])


def test_loss_layers_refuse_label_gradients():
    layer, bottom, top = forward('type: "SoftmaxWithLoss"', [np.zeros((2, 3)), np.array([0, 1.0])])
    assert layer.is_loss
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    with pytest.raises(LayerError, match="label"):
        backward(layer, bottom, top, propagate=[True, True])


# ------------------------------------------------------------------------------------------- SigmoidCrossEntropyLoss
def manual_sigmoid_ce(x, t, ignore=None, mode="BATCH_SIZE"):
    s = 1 / (1 + np.exp(-x))
    valid = np.ones(x.shape, bool) if ignore is None else t.astype(int) != ignore
    terms = -(t * np.log(s) + (1 - t) * np.log(1 - s))
    norm = {"FULL": x.size, "VALID": valid.sum(), "BATCH_SIZE": x.shape[0], "NONE": 1}[mode]
    norm = max(norm, 1)
    return (terms * valid).sum() / norm, (s - t) * valid / norm


@pytest.mark.parametrize("loss_param,mode,ignore", [
    ("", "BATCH_SIZE", None),
    ("loss_param { normalization: VALID }", "VALID", None),
    ("loss_param { normalization: FULL }", "FULL", None),
    ("loss_param { normalization: NONE }", "NONE", None),
    ("loss_param { normalize: true }", "VALID", None),
    ("loss_param { ignore_label: -1 normalization: VALID }", "VALID", -1),
    ("loss_param { ignore_label: -1 }", "BATCH_SIZE", -1),
])
def test_sigmoid_ce_values(loss_param, mode, ignore):
    x = rng(20).standard_normal((3, 4))
    t = rng(21).uniform(0, 1, (3, 4))
    if ignore is not None:
        t = np.where(rng(22).uniform(size=(3, 4)) < 0.3, -1.0, np.round(t))
    layer, bottom, top = forward(f'type: "SigmoidCrossEntropyLoss" {loss_param}', [x, t])
    expected, grad = manual_sigmoid_ce(x, t, ignore, mode)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)
    (dx, _) = backward(layer, bottom, top, weight=0.5)
    np.testing.assert_allclose(dx, 0.5 * grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("weight", [1.0, 2.0])
@pytest.mark.parametrize("loss_param", ["", "loss_param { ignore_label: -1 normalization: VALID }"])
def test_sigmoid_ce_gradient(loss_param, weight):
    x = 2 * rng(23).standard_normal((2, 3, 2))
    t = np.array([1, 0, -1, 1, 0, 1, 0, 0, -1, 1, 1, 0.0]).reshape(2, 3, 2)
    if not loss_param:
        t = rng(24).uniform(0, 1, (2, 3, 2))
    check_gradients(parse_layer(f'type: "SigmoidCrossEntropyLoss" {loss_param}'), [x, t], check_bottoms=[0],
                    top_diffs=[weight])


def test_sigmoid_ce_is_stable():
    x = np.array([[200.0, -200.0, 100.0, -100.0]], dtype=np.float32)
    t = np.array([[1.0, 0.0, 0.0, 1.0]], dtype=np.float32)
    layer, bottom, top = forward('type: "SigmoidCrossEntropyLoss"', [x, t], dtype=np.float32)
    np.testing.assert_allclose(top[0].data, 200.0, rtol=1e-6)
    (dx, _) = backward(layer, bottom, top)
    np.testing.assert_allclose(dx, [[0, 0, 1, -1]], atol=1e-6)


# ------------------------------------------------------------------------------------------- EuclideanLoss
@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_euclidean_gradient_both_bottoms(weight):
    a, b = rng(30).standard_normal((3, 2, 2)), rng(31).standard_normal((3, 4))
    check_gradients(parse_layer('type: "EuclideanLoss"'), [a, b], top_diffs=[weight])


def test_euclidean_values():
    a, b = rng(32).standard_normal((4, 3)), rng(33).standard_normal((4, 3))
    layer, bottom, top = forward('type: "EuclideanLoss"', [a, b])
    np.testing.assert_allclose(top[0].data, ((a - b) ** 2).sum() / 8)
    da, db = backward(layer, bottom, top, weight=2.0, propagate=[True, True])
    np.testing.assert_allclose(da, 2 * (a - b) / 4)
    np.testing.assert_allclose(db, -2 * (a - b) / 4)
    assert layer.allow_force_backward(1)


# ------------------------------------------------------------------------------------------- HingeLoss
def hinge_x(shape, seed):
    x = rng(seed).standard_normal(shape)
    # keep 1 - t*x away from the kink at 0 (|x| away from 1)
    near = np.abs(np.abs(x) - 1) < 0.05
    x[near] += 0.2
    return x


@pytest.mark.parametrize("weight", [1.0, 2.0])
@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_gradient(norm, weight):
    x = hinge_x((4, 3), 40)
    labels = np.array([0, 2, 1, 2.0])
    check_gradients(parse_layer(f'type: "HingeLoss" hinge_loss_param {{ norm: {norm} }}'), [x, labels],
                    check_bottoms=[0], top_diffs=[weight])


def test_hinge_values():
    x = np.array([[0.5, -2.0, 0.3], [2.0, 0.0, -0.5]])
    labels = np.array([0, 2.0])
    # row 0: label 0: 1-0.5 = .5; others 1+x: 0 (x=-2 -> max(0,-1)), 1.3. row 1: 3, 1, label: 1.5
    _, _, top = forward('type: "HingeLoss"', [x, labels])
    np.testing.assert_allclose(top[0].data, (0.5 + 0 + 1.3 + 3 + 1 + 1.5) / 2)
    _, _, top = forward('type: "HingeLoss" hinge_loss_param { norm: L2 }', [x, labels])
    np.testing.assert_allclose(top[0].data, (0.25 + 1.69 + 9 + 1 + 2.25) / 2)


# ------------------------------------------------------------------------------------------- MultinomialLogisticLoss
@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_multinomial_gradient(weight):
    p = softmax(rng(50).standard_normal((4, 3)))
    labels = np.array([2, 0, 1, 1.0])
    check_gradients(parse_layer('type: "MultinomialLogisticLoss"'), [p.reshape(4, 3, 1, 1), labels],
                    check_bottoms=[0], top_diffs=[weight])


def test_multinomial_values_and_clip():
    p = np.array([[0.2, 0.8], [0.0, 1.0]])
    layer, bottom, top = forward('type: "MultinomialLogisticLoss"', [p, np.array([1, 0.0])])
    np.testing.assert_allclose(top[0].data, (-np.log(0.8) - np.log(1e-20)) / 2)
    (dp, _) = backward(layer, bottom, top)
    np.testing.assert_allclose(dp, [[0, -1 / (2 * 0.8)], [-1 / (2 * 1e-20), 0]])


# ------------------------------------------------------------------------------------------- InfogainLoss
def write_blob_proto(path, array, legacy=False):
    blob = pb.BlobProto()
    if legacy:
        blob.num, blob.channels, blob.height, blob.width = (1, 1) + array.shape
    else:
        blob.shape.dim.extend(array.shape)
    blob.data.extend(array.ravel().tolist())
    path.write_bytes(blob.SerializeToString())
    return str(path)


def manual_infogain(x, labels, H, ignore=None):
    p = softmax(x, 1)
    lab = labels.astype(int)
    loss, count = 0.0, 0
    grad = np.zeros_like(x)
    for n in range(x.shape[0]):
        if ignore is not None and lab[n] == ignore:
            continue
        count += 1
        loss -= (H[lab[n]] * np.log(p[n])).sum()
        grad[n] = p[n] * H[lab[n]].sum() - H[lab[n]]
    return loss / max(count, 1), grad / max(count, 1)


@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_infogain_gradient_with_matrix_bottom(weight):
    x = rng(60).standard_normal((4, 3))
    labels = np.array([0, 2, 1, 2.0])
    H = rng(61).uniform(0, 1, (3, 3))
    check_gradients(parse_layer('type: "InfogainLoss"'), [x, labels, H], check_bottoms=[0], top_diffs=[weight])


@pytest.mark.parametrize("legacy", [False, True])
def test_infogain_from_source_file(tmp_path, legacy):
    x = rng(62).standard_normal((5, 4))
    labels = np.array([0, 3, 1, 1, 2.0])
    H = rng(63).uniform(0, 1, (4, 4))
    source = write_blob_proto(tmp_path / "H.binaryproto", H, legacy)
    text = f'type: "InfogainLoss" infogain_loss_param {{ source: "{source}" }}'
    layer, bottom, top = forward(text, [x, labels])
    expected, grad = manual_infogain(x, labels, H.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)
    (dx, _) = backward(layer, bottom, top)
    np.testing.assert_allclose(dx, grad, rtol=1e-12, atol=1e-15)
    check_gradients(parse_layer(text), [x, labels], check_bottoms=[0])


def test_infogain_identity_matches_softmax_loss_and_probability_top():
    x = rng(64).standard_normal((4, 3))
    labels = np.array([0, 2, 1, 2.0])
    _, _, top = forward('type: "InfogainLoss"', [x, labels, np.eye(3)], num_tops=2)
    _, _, ref = forward('type: "SoftmaxWithLoss"', [x, labels])
    np.testing.assert_allclose(top[0].data, ref[0].data, rtol=1e-12)
    np.testing.assert_allclose(top[1].data, softmax(x))


def test_infogain_ignore_label():
    x = rng(65).standard_normal((4, 3))
    labels = np.array([0, 2, 1, 2.0])
    H = rng(66).uniform(0, 1, (3, 3))
    layer, bottom, top = forward('type: "InfogainLoss" loss_param { ignore_label: 2 }', [x, labels, H])
    expected, grad = manual_infogain(x, labels, H, ignore=2)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)
    (dx, _, _) = backward(layer, bottom, top)
    np.testing.assert_allclose(dx, grad, rtol=1e-12, atol=1e-15)
    assert not layer.allow_force_backward(1) and not layer.allow_force_backward(2)


def test_infogain_needs_a_matrix():
    with pytest.raises(LayerError, match="source"):
        forward('type: "InfogainLoss"', [np.zeros((2, 3)), np.zeros(2)])
    with pytest.raises(LayerError, match="infogain matrix"):
        forward('type: "InfogainLoss"', [np.zeros((2, 3)), np.zeros(2), np.eye(2)])


# ------------------------------------------------------------------------------------------- ContrastiveLoss
def contrastive_inputs(seed):
    a = 0.3 * rng(seed).standard_normal((4, 3, 1, 1))
    b = 0.3 * rng(seed + 1).standard_normal((4, 3, 1, 1))
    sim = np.array([1, 0, 0, 1.0]).reshape(4, 1, 1, 1)
    return a, b, sim


@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_contrastive_legacy_gradient(weight):
    a, b, sim = contrastive_inputs(70)
    check_gradients(parse_layer('type: "ContrastiveLoss" contrastive_loss_param { margin: 1 legacy_version: true }'),
                    [a, b, sim], check_bottoms=[0, 1], top_diffs=[weight])


@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_contrastive_gradient(weight):
    # Caffe divides by (d + 1e-4) instead of d for dissimilar pairs, hence the looser tolerance.
    a, b, sim = contrastive_inputs(72)
    check_gradients(parse_layer('type: "ContrastiveLoss" contrastive_loss_param { margin: 2 }'),
                    [a, b, sim], check_bottoms=[0, 1], top_diffs=[weight], rtol=1e-3)


def test_contrastive_values():
    a = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    b = np.array([[3.0, 4.0], [0.3, 0.4], [0.6, 0.8]])  # distances 5, 0.5, 1
    sim = np.array([1, 0, 0.0])
    _, _, top = forward('type: "ContrastiveLoss" contrastive_loss_param { margin: 1 }', [a, b, sim])
    np.testing.assert_allclose(top[0].data, (25 + 0.25 + 0) / 6)
    _, _, top = forward('type: "ContrastiveLoss" contrastive_loss_param { margin: 1 legacy_version: true }', [a, b, sim])
    np.testing.assert_allclose(top[0].data, (25 + 0.75 + 0) / 6)
    layer = make_layer(parse_layer('type: "ContrastiveLoss"'))
    assert layer.allow_force_backward(0) and layer.allow_force_backward(1) and not layer.allow_force_backward(2)


# ------------------------------------------------------------------------------------------- Accuracy
def accuracy(text, scores, labels, num_tops=1):
    _, _, top = forward(f'type: "Accuracy" {text}', [np.asarray(scores, float), np.asarray(labels, float)], num_tops)
    return [np.array(t.data) for t in top]


def test_accuracy_ties_count_against():
    scores = [[1.0, 1.0, 0.0],   # label 0 ties with class 1: not top-1, top-2
              [0.0, 2.0, 2.0],   # label 2 ties with class 1: not top-1
              [3.0, 1.0, 2.0],   # label 0 strictly best
              [0.5, 0.5, 0.5]]   # all tie: label 1 has 2 "better": only top-3
    labels = [0, 2, 0, 1]
    (top1,) = accuracy("", scores, labels)
    assert top1 == pytest.approx(1 / 4)
    (top2,) = accuracy("accuracy_param { top_k: 2 }", scores, labels)
    assert top2 == pytest.approx(3 / 4)
    (top3,) = accuracy("accuracy_param { top_k: 3 }", scores, labels)
    assert top3 == pytest.approx(1.0)


def test_accuracy_ignore_and_per_class():
    scores = [[2.0, 1.0, 0.0], [0.0, 1.0, 2.0], [0.0, 3.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    labels = [0, 1, 1, 2, 2]
    acc, per_class = accuracy("", scores, labels, num_tops=2)
    assert acc == pytest.approx(3 / 5)
    np.testing.assert_allclose(per_class, [1.0, 0.5, 0.5])
    acc, per_class = accuracy("accuracy_param { ignore_label: 1 }", scores, labels, num_tops=2)
    assert acc == pytest.approx(2 / 3)
    np.testing.assert_allclose(per_class, [1.0, 0.0, 0.5])  # ignored class reads 0 (no sample)


def test_accuracy_absent_class_and_empty():
    acc, per_class = accuracy("", [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]], [0, 0], num_tops=2)
    assert acc == pytest.approx(0.5)
    np.testing.assert_allclose(per_class, [0.5, 0, 0, 0])
    (acc,) = accuracy("accuracy_param { ignore_label: 0 }", [[1.0, 0.0]], [0])
    assert acc == 0.0


def test_accuracy_spatial_axis():
    scores = rng(80).standard_normal((2, 3, 4))  # classes on axis 2
    labels = rng(81).integers(0, 4, (2, 3)).astype(float)
    (acc,) = accuracy("accuracy_param { axis: 2 }", scores, labels)
    expected = np.mean(scores.argmax(2) == labels)
    assert acc == pytest.approx(expected)
    (acc,) = accuracy("accuracy_param { axis: -1 }", scores, labels)
    assert acc == pytest.approx(expected)


def test_accuracy_checks():
    with pytest.raises(LayerError, match="top_k"):
        accuracy("accuracy_param { top_k: 4 }", [[1.0, 0.0, 0.0]], [0])
    with pytest.raises(LayerError, match="out of range"):
        accuracy("", [[1.0, 0.0, 0.0]], [3])
    layer, bottom, top = forward('type: "Accuracy"', [np.eye(2), np.array([0, 1.0])])
    assert not layer.is_loss


# ------------------------------------------------------------------------------------------- ArgMax
def argmax(text, x):
    _, _, top = forward(f'type: "ArgMax" {text}', [np.asarray(x, float)])
    return np.array(top[0].data)


def test_argmax_shapes_and_values():
    x = rng(90).standard_normal((3, 2, 5))
    flat = x.reshape(3, -1)
    order = np.argsort(-flat, axis=1)
    out = argmax("", x)
    assert out.shape == (3, 1, 1)
    np.testing.assert_array_equal(out[:, 0, 0], order[:, 0])
    out = argmax("argmax_param { top_k: 3 out_max_val: true }", x)
    assert out.shape == (3, 2, 3)
    np.testing.assert_array_equal(out[:, 0], order[:, :3])
    np.testing.assert_allclose(out[:, 1], np.take_along_axis(flat, order[:, :3], 1))
    out = argmax("argmax_param { top_k: 2 }", x.reshape(3, 2, 5, 1))
    assert out.shape == (3, 1, 2, 1)
    np.testing.assert_array_equal(out[:, 0, :, 0], order[:, :2])


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_argmax_axis(axis):
    x = rng(91).standard_normal((3, 4, 5))
    out = argmax(f"argmax_param {{ axis: {axis} top_k: 2 }}", x)
    order = np.take(np.argsort(-x, axis=axis), [0, 1], axis=axis)
    np.testing.assert_array_equal(out, order)
    vals = argmax(f"argmax_param {{ axis: {axis} top_k: 2 out_max_val: true }}", x)
    np.testing.assert_allclose(vals, np.take_along_axis(x, order, axis))


def test_argmax_ties_prefer_larger_index():
    x = [[1.0, 3.0, 3.0, 0.0, 3.0]]
    np.testing.assert_array_equal(argmax("argmax_param { top_k: 4 }", x)[0, 0], [4, 2, 1, 0])
    np.testing.assert_array_equal(argmax("argmax_param { axis: 1 top_k: 2 }", x)[0], [4, 2])


def test_argmax_checks():
    with pytest.raises(LayerError, match="top_k"):
        argmax("argmax_param { top_k: 4 }", np.zeros((2, 3)))
    with pytest.raises(LayerError, match="top_k"):
        argmax("argmax_param { axis: 0 top_k: 3 }", np.zeros((2, 3)))
