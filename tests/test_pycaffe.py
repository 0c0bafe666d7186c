"""pycaffe's surface: NetSpec/layers/params, io (Transformer, load_image, oversample), Classifier,
forward_all, set_input_arrays, and pycaffe idioms that port by renaming ``caffe`` to ``netdef``."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import netdef
from netdef import layers as L
from netdef import params as P
from netdef.data.idx import read_idx
from netdef.proto import netdef_pb2 as pb
from tests.helpers import REPO, shared_path


# ============================================================================================ NetSpec
def lenet_spec(lmdb: str, batch: int) -> netdef.NetSpec:
    """Caffe's examples/01-learning-lenet.ipynb net, as pycaffe users write it."""
    n = netdef.NetSpec()
    n.data, n.label = L.Data(batch_size=batch, backend=P.Data.LMDB, source=lmdb,
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, weight_filler=dict(type="xavier"))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n


def test_netspec_writes_the_lenet_of_caffes_notebook():
    proto = lenet_spec("mnist_train_lmdb", 64).to_proto()
    assert [layer.name for layer in proto.layer] == ["data", "conv1", "pool1", "conv2", "pool2", "fc1", "relu1",
                                                     "score", "loss"]
    relu, score = proto.layer[6], proto.layer[7]
    assert list(relu.bottom) == ["fc1"] and list(relu.top) == ["fc1"]  # in place
    assert list(score.bottom) == ["fc1"]                                 # reads the in-place blob
    assert proto.layer[0].data_param.backend == pb.DataParameter.LMDB
    assert proto.layer[0].transform_param.scale == pytest.approx(1 / 255)
    assert proto.layer[2].pooling_param.pool == pb.PoolingParameter.MAX
    assert proto.layer[1].convolution_param.kernel_size == [5]  # a repeated field from one value
    assert proto.layer[1].convolution_param.weight_filler.type == "xavier"


def test_netspec_fields_lists_dicts_enum_names_and_automatic_names():
    n = netdef.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 8, 8]))
    conv = L.Convolution(n.data, num_output=4, kernel_size=3, pad=[1], param=[dict(lr_mult=1, decay_mult=1),
                         dict(lr_mult=2, decay_mult=0)], bias_filler=dict(type="constant", value=0.1))
    n.out = L.Pooling(conv, pool="AVE", global_pooling=True, include=[dict(phase=netdef.TEST)])
    proto = n.to_proto()
    assert [layer.name for layer in proto.layer] == ["data", "Convolution1", "out"]
    assert list(proto.layer[1].top) == ["Convolution1"] and list(proto.layer[2].bottom) == ["Convolution1"]
    assert [(p.lr_mult, p.decay_mult) for p in proto.layer[1].param] == [(1, 1), (2, 0)]
    assert proto.layer[1].convolution_param.bias_filler.value == pytest.approx(0.1)
    assert proto.layer[2].pooling_param.pool == pb.PoolingParameter.AVE
    assert proto.layer[2].include[0].phase == netdef.TEST
    assert proto.layer[0].input_param.shape[0].dim == [2, 3, 8, 8]
    # The text is a prototxt a Net builds from.
    net = netdef.Net(str(proto), netdef.TEST)
    assert net.blobs["out"].shape == (2, 4, 1, 1)


def test_netspec_several_tops_no_top_and_a_named_layer():
    n = netdef.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 6]))
    n.a, n.b = L.Slice(n.data, slice_param=dict(axis=1, slice_point=[2]), ntop=2)
    silence = L.Silence(n.b, ntop=0)
    assert isinstance(silence, netdef.netspec.Function)
    n.sum = L.Eltwise(n.a, n.a, operation="SUM", coeff=[1, 2], name="adder")
    proto = netdef.to_proto(n.sum, silence.tops[0] if silence.tops else n.b)
    names = [layer.name for layer in proto.layer]
    assert names[-1] == "adder" and "slice" not in names
    assert list(proto.layer[-1].eltwise_param.coeff) == [1, 2]


@pytest.mark.parametrize("make, message", [
    (lambda: L.Convolution(L.Input(shape=dict(dim=[1])), kernel=3), "ConvolutionParameter has no field 'kernel'"),
    (lambda: L.Pooling(L.Input(shape=dict(dim=[1])), pool="BIGGEST"), "'BIGGEST' is not a value of PoolMethod"),
    (lambda: L.Convolution(L.Input(shape=dict(dim=[1])), weight_filler="xavier"), "a message is given as a dict"),
    (lambda: L.Silence(L.Input(shape=dict(dim=[1])), axis=1, ntop=1), "no parameter message of its own"),
])
def test_netspec_errors_name_the_layer_and_field(make, message):
    n = netdef.NetSpec()
    n.top = make()
    with pytest.raises(netdef.NetSpecError, match=message):
        n.to_proto()


def test_params_give_enum_values():
    assert P.Pooling.MAX == pb.PoolingParameter.MAX and P.Pooling.AVE == pb.PoolingParameter.AVE
    assert P.Eltwise.PROD == pb.EltwiseParameter.PROD
    with pytest.raises(AttributeError, match="no enum value"):
        P.Pooling.BIGGEST


def test_netspec_net_trains_like_the_prototxt_it_writes(tmp_path):
    """A net written with NetSpec is the same net as its prototxt: same losses from the same seed."""
    n = netdef.NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[8, 1, 6, 6]), dict(dim=[8])],
                                  data_filler=[dict(type="gaussian", std=1), dict(type="uniform", min=0, max=3)], ntop=2)
    n.ip = L.InnerProduct(n.data, num_output=4, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.ip, n.label)
    path = tmp_path / "net.prototxt"
    path.write_text(str(n.to_proto()))
    results = []
    for source in (str(path), n.to_proto()):
        netdef.set_random_seed(3)
        net = netdef.Net(source, netdef.TRAIN)
        results.append((net.forward_backward(), net.params["ip"][0].data.copy(), net.params["ip"][0].diff.copy()))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][2], results[1][2])


# ============================================================================================ io
def test_load_image_is_rgb_in_0_1(tmp_path):
    pixels = np.zeros((4, 5, 3), np.uint8)
    pixels[..., 0] = 255          # red
    pixels[1, 2] = (10, 20, 30)
    Image.fromarray(pixels).save(tmp_path / "x.png")
    image = netdef.io.load_image(str(tmp_path / "x.png"))
    assert image.shape == (4, 5, 3) and image.dtype == np.float32
    np.testing.assert_allclose(image[0, 0], [1, 0, 0])
    np.testing.assert_allclose(image[1, 2], np.array([10, 20, 30]) / 255, rtol=1e-6)
    grey = netdef.io.load_image(str(tmp_path / "x.png"), color=False)
    assert grey.shape == (4, 5, 1)


def test_resize_image_bilinear_by_hand():
    image = np.array([[0, 1], [2, 3]], np.float32)[:, :, None]
    same = netdef.io.resize_image(image, (2, 2))
    np.testing.assert_array_equal(same, image)
    up = netdef.io.resize_image(image, (4, 4))[:, :, 0]
    # Pixel centres: output row 1 sits at input 0.25, row 2 at 0.75 (edges clamp).
    np.testing.assert_allclose(up[0], [0, 0.25, 0.75, 1])
    np.testing.assert_allclose(up[:, 0], [0, 0.5, 1.5, 2])
    # (0.25, 0.25): 0.75*0.75*0 + 0.75*0.25*1 + 0.25*0.75*2 + 0.25*0.25*3
    np.testing.assert_allclose(up[1, 1], 0.75, rtol=1e-6)
    np.testing.assert_allclose(netdef.io.resize_image(image, (1, 1))[0, 0, 0], 1.5)


def test_oversample_is_corners_centre_and_mirrors():
    image = np.arange(5 * 6, dtype=np.float32).reshape(5, 6, 1)
    crops = netdef.io.oversample([image, image + 100], (3, 4))
    assert crops.shape == (20, 3, 4, 1)
    np.testing.assert_array_equal(crops[0], image[0:3, 0:4])
    np.testing.assert_array_equal(crops[1], image[0:3, 2:6])
    np.testing.assert_array_equal(crops[2], image[2:5, 0:4])
    np.testing.assert_array_equal(crops[3], image[2:5, 2:6])
    np.testing.assert_array_equal(crops[4], image[1:4, 1:5])
    for k in range(5):
        np.testing.assert_array_equal(crops[5 + k], crops[k][:, ::-1])
    np.testing.assert_array_equal(crops[10], image[0:3, 0:4] + 100)


def test_transformer_preprocess_and_deprocess():
    rng = np.random.default_rng(0)
    image = rng.random((6, 7, 3), dtype=np.float32)
    t = netdef.io.Transformer({"data": (1, 3, 6, 7)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    t.set_mean("data", np.array([104, 117, 123], np.float32))
    t.set_input_scale("data", 0.5)
    out = t.preprocess("data", image)
    assert out.shape == (3, 6, 7) and out.dtype == np.float32
    expected = (image.transpose(2, 0, 1)[::-1] * 255 - np.array([104, 117, 123], np.float32)[:, None, None]) * 0.5
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(t.deprocess("data", out), image, atol=1e-5)
    # Another input size: resized to the input's H x W first.
    assert t.preprocess("data", rng.random((12, 14, 3))).shape == (3, 6, 7)
    with pytest.raises(netdef.io.TransformerError, match="mean shape"):
        t.set_mean("data", np.zeros((3, 5, 5)))
    with pytest.raises(netdef.io.TransformerError, match="not one of"):
        t.set_raw_scale("image", 1)


# ============================================================================================ Net helpers
def deploy_net(batch: int) -> netdef.Net:
    n = netdef.NetSpec()
    n.data = L.Input(shape=dict(dim=[batch, 3]))
    n.out = L.InnerProduct(n.data, num_output=2, weight_filler=dict(type="gaussian", std=1),
                           bias_filler=dict(type="constant", value=0.5))
    proto = n.to_proto()
    proto.force_backward = True  # a NetParameter field: set on the proto NetSpec makes
    return netdef.Net(proto, netdef.TEST)


def test_forward_all_batches_pads_and_trims():
    net = deploy_net(batch=4)
    data = np.random.default_rng(1).standard_normal((10, 3)).astype(np.float32)
    out = net.forward_all(data=data)["out"]
    w, b = net.params["out"][0].data, net.params["out"][1].data
    assert out.shape == (10, 2)
    np.testing.assert_allclose(out, data @ w.T + b, rtol=1e-5, atol=1e-6)


def test_forward_backward_all_returns_the_input_diffs():
    net = deploy_net(batch=4)
    data = np.ones((6, 3), np.float32)
    top_diff = np.ones((6, 2), np.float32)
    outputs, diffs = net.forward_backward_all(data=data, out=top_diff)
    assert outputs["out"].shape == (6, 2)
    np.testing.assert_allclose(diffs["data"], np.tile(net.params["out"][0].data.sum(0), (6, 1)), rtol=1e-5)


def test_set_input_arrays_feeds_memory_data(tmp_path):
    n = netdef.NetSpec()
    n.data, n.label = L.MemoryData(batch_size=2, channels=1, height=1, width=3, ntop=2)
    net = netdef.Net(n.to_proto(), netdef.TEST)
    data = np.arange(12, dtype=np.float32).reshape(4, 1, 1, 3)
    net.set_input_arrays(data, np.arange(4, dtype=np.float32))
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, data[:2])
    np.testing.assert_array_equal(net.blobs["label"].data.ravel(), [0, 1])
    with pytest.raises(netdef.NetError, match="first layer is a MemoryData layer"):
        deploy_net(2).set_input_arrays(data, np.zeros(4, np.float32))


# ============================================================================================ pycaffe idioms
def _mnist_pngs(tmp_path, count: int):
    images = read_idx(shared_path("data", "mnist", "t10k-images-idx3-ubyte.gz"))[:count]
    labels = read_idx(shared_path("data", "mnist", "t10k-labels-idx1-ubyte.gz"))[:count]
    paths = []
    for i, image in enumerate(images):
        path = tmp_path / f"digit{i}.png"
        Image.fromarray(image).save(path)
        paths.append(str(path))
    return images, labels, paths


def test_classifying_images_with_the_real_lenet_weights(tmp_path):
    """pycaffe's classification example: load images, Classifier with the preprocessing Caffe's LeNet
    was trained with (pixels / 256), predict. Same probabilities as a direct forward, right digits."""
    weights = shared_path("fixtures", "caffe-models", "lenet_iter_10000.caffemodel")
    images, labels, paths = _mnist_pngs(tmp_path, 30)
    classifier = netdef.Classifier(str(REPO / "models" / "lenet" / "lenet.prototxt"), str(weights),
                                   raw_scale=255, input_scale=0.00390625)
    inputs = [netdef.io.load_image(p, color=False) for p in paths]
    probabilities = classifier.predict(inputs, oversample=False)
    assert probabilities.shape == (30, 10)
    assert (probabilities.argmax(1) == labels).mean() >= 29 / 30
    direct = netdef.Net(str(REPO / "models" / "lenet" / "lenet.prototxt"), netdef.TEST, weights=str(weights))
    expected = direct.forward_all(data=images[:, None].astype(np.float32) * np.float32(0.00390625))["prob"]
    np.testing.assert_allclose(probabilities, expected, rtol=1e-4, atol=1e-6)
    # Ten crops of a 28 x 28 input from 28 x 28 images are ten times the same image, mirrored half the time.
    averaged = classifier.predict(inputs[:4], oversample=True)
    assert averaged.shape == (4, 10) and (averaged.argmax(1) == labels[:4]).all()


def test_net_surgery_copies_parameters_between_nets(tmp_path):
    """pycaffe's net surgery: copy the trained LeNet's parameters into a net of another structure
    (its fully connected ip1 cast as a convolution), layer by layer through net.params."""
    weights = shared_path("fixtures", "caffe-models", "lenet_iter_10000.caffemodel")
    lenet = netdef.Net(str(REPO / "models" / "lenet" / "lenet.prototxt"), netdef.TEST, weights=str(weights))
    text = (REPO / "models" / "lenet" / "lenet.prototxt").read_text()
    conv_text = text.replace('name: "ip1"\n  type: "InnerProduct"', 'name: "ip1-conv"\n  type: "Convolution"')
    conv_text = conv_text.replace("inner_product_param { num_output: 500 }",
                                  "convolution_param { num_output: 500 kernel_size: 4 }")
    assert conv_text != text
    path = tmp_path / "fully_conv.prototxt"
    path.write_text(conv_text)
    fully_conv = netdef.Net(str(path), netdef.TEST)
    for name in lenet.params:
        target = "ip1-conv" if name == "ip1" else name
        for source_blob, target_blob in zip(lenet.params[name], fully_conv.params[target]):
            target_blob.data.flat = source_blob.data.flat
    images = read_idx(shared_path("data", "mnist", "t10k-images-idx3-ubyte.gz"))[:64, None].astype(np.float32) / 256
    np.testing.assert_allclose(fully_conv.forward(data=images)["prob"].reshape(64, 10),
                               lenet.forward(data=images)["prob"], rtol=1e-4, atol=1e-6)
