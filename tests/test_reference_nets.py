"""Whole nets against what the original Caffe computed with real trained weights: every blob, every
diff and every parameter gradient of LeNet and CIFAR-10 full, and LeNet's accuracy on the 10,000 real
MNIST test images."""
import numpy as np
import pytest

import netdef
from netdef.data.idx import read_idx
from tests.helpers import compare_with_caffe_blobs, shared_path


def _compare_whole_net(prefix, weights, rtol, atol):
    ref = np.load(shared_path("fixtures", "caffe-ref", f"{prefix}_blobs.npz"))
    model = shared_path("fixtures", "caffe-ref", f"{prefix}_train_test.prototxt")
    deploy = shared_path("fixtures", "caffe-ref", f"{prefix}.prototxt")
    net = netdef.Net(str(model), netdef.TRAIN, weights=str(weights))
    for key in ref.files:
        if key.startswith("param/"):
            _, layer, i = key.split("/")
            np.testing.assert_array_equal(net.params[layer][int(i)].data, ref[key], err_msg=key)
    compare_with_caffe_blobs(net, ref, rtol, atol)
    deploy_net = netdef.Net(str(deploy), netdef.TEST, weights=str(weights))
    probs = deploy_net.forward(data=ref["input"])["prob"]
    np.testing.assert_allclose(probs, ref["blob/prob"], rtol=1e-4, atol=1e-6)


def test_lenet_every_blob_diff_and_gradient_matches_caffe():
    weights = shared_path("fixtures", "caffe-models", "lenet_iter_10000.caffemodel")
    _compare_whole_net("lenet", weights, rtol=1e-3, atol=1e-5)


def test_cifar10_full_v1_weights_every_blob_diff_and_gradient_matches_caffe():
    weights = shared_path("fixtures", "caffe-models", "cifar10_full_iter_60000.caffemodel")
    _compare_whole_net("cifar10_full", weights, rtol=1e-3, atol=1e-5)


def test_lenet_classifies_the_mnist_test_set_as_caffe_does():
    """Caffe: accuracy = 0.9911, loss = 0.0290041 on all 10,000 t10k images (batch 100)."""
    images = read_idx(shared_path("data", "mnist", "t10k-images-idx3-ubyte.gz"))
    labels = read_idx(shared_path("data", "mnist", "t10k-labels-idx1-ubyte.gz"))
    model = shared_path("fixtures", "caffe-ref", "lenet_train_test.prototxt")
    weights = shared_path("fixtures", "caffe-models", "lenet_iter_10000.caffemodel")
    net = netdef.Net(str(model), netdef.TEST, weights=str(weights))
    batch = 100
    accuracies, losses = [], []
    for start in range(0, len(images), batch):
        x = images[start:start + batch, None].astype(np.float32) * np.float32(0.00390625)
        y = labels[start:start + batch].astype(np.float32)
        out = net.forward(data=x, label=y)
        accuracies.append(float(out["accuracy"]))
        losses.append(float(out["loss"]))
    assert np.mean(accuracies) == pytest.approx(0.9911, abs=1e-6)
    assert np.mean(losses) == pytest.approx(0.0290041, rel=1e-4)
