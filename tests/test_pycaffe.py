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


# ============================================================================================ caffe_pb2
def test_caffe_pb2_is_pycaffes_protobuf_module():
    """``from caffe.proto import caffe_pb2`` ports as ``from netdef.proto import caffe_pb2``: Caffe's
    messages and enum values (Phase TRAIN = 0, TEST = 1 in caffe.proto), reading Caffe's files."""
    from google.protobuf import text_format

    from netdef.proto import caffe_pb2

    assert caffe_pb2.TRAIN == 0 and caffe_pb2.TEST == 1
    assert caffe_pb2.SolverParameter.SGD == 0 and caffe_pb2.PoolingParameter.MAX == 0
    net = caffe_pb2.NetParameter()
    text_format.Merge((REPO / "models" / "lenet" / "lenet_train_test.prototxt").read_text(), net)
    assert net.name == "LeNet" and net.layer[0].include[0].phase == caffe_pb2.TRAIN
    mean = caffe_pb2.BlobProto.FromString(
        shared_path("fixtures", "caffe-ref", "caffe-made", "mnist_test_mean.binaryproto").read_bytes())
    assert (mean.num, mean.channels, mean.height, mean.width) == (1, 1, 28, 28) and len(mean.data) == 784


# ============================================================================================ module functions
def test_layer_type_list_is_the_sorted_registry():
    types = netdef.layer_type_list()
    assert types == sorted(types) and len(types) == len(set(types))
    assert {"Convolution", "Data", "Input", "InnerProduct", "Python", "SoftmaxWithLoss"} <= set(types)
    assert all(isinstance(name, str) for name in types)


def test_timer_measures_from_start_to_stop(caplog):
    import time

    timer = netdef.Timer()
    with caplog.at_level("WARNING", logger="netdef"):
        assert timer.ms == 0.0  # never started: 0, with Caffe's warning
    assert "Timer has never been run before reading time." in caplog.text
    timer.start()
    time.sleep(0.03)
    timer.stop()
    first = timer.ms
    assert 30 <= first < 1000 and isinstance(first, float)
    time.sleep(0.01)
    timer.stop()                   # stopping a stopped timer changes nothing
    assert timer.ms == first
    timer.start()                  # a new start measures afresh...
    timer.start()                  # ...and starting a running timer does not restart it
    time.sleep(0.01)
    running = timer.ms             # reading a running timer stops it
    assert 10 <= running < first
    time.sleep(0.01)
    assert timer.ms == running


@pytest.fixture
def restored_log():
    import logging

    from netdef import logs

    logger = logging.getLogger(logs.LOGGER_NAME)
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


def test_init_log_and_log_write_glog_lines_to_stderr(capsys, restored_log):
    netdef.init_log()
    netdef.log("hello from a script")
    line = capsys.readouterr().err.strip()
    assert line.startswith("I") and line.endswith("] hello from a script")
    assert line[1:5].isdigit() and " pycaffe.py:" in line          # Immmdd hh:mm:ss.uuuuuu pid file:line]
    netdef.init_log(1)                                               # glog WARNING and up
    netdef.log("info is below the threshold")
    assert capsys.readouterr().err == ""
    netdef.init_log(0, False)                                        # glog to its files: ERROR and up on stderr
    netdef.log("info goes to glog's files")
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="0 \\(INFO\\) to 3 \\(FATAL\\), got 4"):
        netdef.init_log(4)


def test_set_mode_gpu_without_a_usable_gpu_says_why_and_what_to_do():
    """pycaffe's set_device(id) then set_mode_gpu(): GPU 99 is on no machine, so this always fails, and
    says so where it is asked (not at the first allocation, as CUDA's error), naming the remedy."""
    netdef.set_device(99)
    try:
        with pytest.raises(RuntimeError) as error:
            netdef.set_mode_gpu()
        message = str(error.value)
        assert message.startswith("set_mode_gpu / set_device('gpu', 99): no usable GPU, ")
        assert message.endswith("; netdef.set_mode_cpu() runs on the CPU")
        assert netdef.backend.device() == "cpu"   # nothing half switched
    finally:
        netdef.set_device(0)
        netdef.set_mode_cpu()


def test_solver_count_and_nccl_give_one_process_answers():
    assert netdef.solver_count() == 1 and netdef.solver_rank() == 0 and netdef.has_nccl() is False
    netdef.set_solver_count(1)
    netdef.set_solver_rank(0)
    netdef.set_multiprocess(False)
    for call in (lambda: netdef.set_solver_count(4), lambda: netdef.set_solver_rank(1),
                 lambda: netdef.set_multiprocess(True)):
        with pytest.raises(ValueError, match="mpiexec -n N netdef train SOLVER"):
            call()
    assert netdef.solver_count() == 1
    with pytest.raises(RuntimeError, match="has_nccl\\(\\) is False.*mpiexec"):
        netdef.NCCL.new_uid()
    with pytest.raises(RuntimeError, match="has_nccl\\(\\) is False"):
        netdef.NCCL(None, "uid")


# ============================================================================================ io blob vectors
def test_blob_proto_vector_strings_round_trip():
    from netdef.proto import caffe_pb2

    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([0.5, -1.25], np.float32)]
    serialized = netdef.io.arraylist_to_blobprotovector_str(arrays)
    vector = caffe_pb2.BlobProtoVector.FromString(serialized)  # what Caffe's reader sees
    assert [list(b.shape.dim) for b in vector.blobs] == [[2, 3], [2]]
    assert list(vector.blobs[1].data) == [0.5, -1.25]
    back = netdef.io.blobprotovector_str_to_arraylist(serialized)
    assert len(back) == 2 and all(b.dtype == np.float32 for b in back)
    np.testing.assert_array_equal(back[0], arrays[0])
    np.testing.assert_array_equal(back[1], arrays[1])
    assert netdef.io.blobprotovector_str_to_arraylist(b"") == []
    with pytest.raises(ValueError, match="not a serialized BlobProtoVector"):
        netdef.io.blobprotovector_str_to_arraylist(b"\xff\xff\xff")


# ============================================================================================ Net underscore names
UNDERSCORE_NET = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "target" type: "Input" top: "target" input_param { shape { dim: 2 dim: 2 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 }
                              bias_filler { type: "gaussian" std: 1 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "out"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "target" top: "loss" loss_weight: 2 }
"""


def test_net_underscore_names_number_blobs_as_caffe():
    net = netdef.Net(UNDERSCORE_NET, netdef.TRAIN)
    assert net._blob_names == ["data", "target", "ip1", "out", "loss"]
    assert net._blobs[2] is net.blobs["ip1"] and len(net._blobs) == 5
    assert net._layer_names == ["data", "target", "ip1", "relu1", "ip2", "loss"]
    assert net._inputs == [0, 1] and net._outputs == [4]
    assert [net._blob_names[i] for i in net._inputs] == net.inputs == ["data", "target"]
    assert [net._blob_names[i] for i in net._outputs] == net.outputs == ["loss"]
    assert net._bottom_ids(2) == [0] and net._top_ids(2) == [2]
    assert net._bottom_ids(3) == [2] and net._top_ids(3) == [2]     # in place: the same blob
    assert net._bottom_ids(5) == [3, 1] and net._top_ids(5) == [4]
    assert net._blob_loss_weights == [0, 0, 0, 0, 2]


def test_net_forward_and_backward_between_layers_by_index():
    net = netdef.Net(UNDERSCORE_NET, netdef.TRAIN)
    x = np.array([[1, -2, 0.5], [0, 1, 3]], np.float32)
    t = np.array([[1, 0], [0, 1]], np.float32)
    net.blobs["data"].data[...] = x
    net.blobs["target"].data[...] = t
    w1, b1 = (p.data for p in net.params["ip1"])
    w2 = net.params["ip2"][0].data
    b2 = net.params["ip2"][1].data
    assert net._forward(0, 3) == 0.0                    # data..relu1: no loss yet
    hidden = np.maximum(x @ w1.T + b1, 0)
    np.testing.assert_allclose(net.blobs["ip1"].data, hidden, rtol=1e-5, atol=1e-6)
    out = hidden @ w2.T + b2
    loss = net._forward(4, 5)                           # ip2 and the loss: 2 * sum((out - t)^2) / 2 / 2
    np.testing.assert_allclose(loss, 2 * ((out - t) ** 2).sum() / 4, rtol=1e-5)
    net._backward(5, 4)                                 # loss and ip2 only: ip1's gradient stays untouched
    np.testing.assert_allclose(net.params["ip2"][0].diff, (2 * (out - t) / 2).T @ hidden, rtol=1e-4, atol=1e-5)
    assert not net.params["ip1"][0].diff.any()


def test_net_batch_splits_rows_and_pads_the_last_batch():
    net = deploy_net(batch=2)
    rows = np.arange(15, dtype=np.float32).reshape(5, 3)
    batches = list(net._batch({"data": rows}))
    assert len(batches) == 3
    np.testing.assert_array_equal(batches[1]["data"], rows[2:4])
    np.testing.assert_array_equal(batches[2]["data"], [rows[4], [0, 0, 0]])


def test_load_hdf5_reads_caffes_hdf5_weights_and_save_hdf5_round_trips(tmp_path):
    folder = shared_path("fixtures", "caffe-ref", "solvers")
    model = str(folder / "solver_net.prototxt")
    from_binary = netdef.Net(model, netdef.TEST, weights=str(folder / "snap_sgd_binaryproto_iter_3.caffemodel"))
    from_hdf5 = netdef.Net(model, netdef.TEST)
    from_hdf5.load_hdf5(str(folder / "snap_sgd_hdf5_iter_3.caffemodel.h5"))
    expected = np.load(folder / "snapshot_expected.npz")
    np.testing.assert_array_equal(from_hdf5.params["ip"][0].data, expected["snap_sgd_hdf5/w"])
    np.testing.assert_array_equal(from_hdf5.params["ip"][1].data, expected["snap_sgd_hdf5/b"])
    np.testing.assert_array_equal(from_binary.params["ip"][0].data, expected["snap_sgd_binaryproto/w"])
    from_hdf5.save_hdf5(str(tmp_path / "again.caffemodel.h5"))
    fresh = netdef.Net(model, netdef.TEST)
    fresh.load_hdf5(str(tmp_path / "again.caffemodel.h5"))
    np.testing.assert_array_equal(fresh.params["ip"][0].data, expected["snap_sgd_hdf5/w"])


# ============================================================================================ Solver
def _solver(tmp_path, policy: str) -> netdef.Solver:
    (tmp_path / "net.prototxt").write_text(UNDERSCORE_NET)
    (tmp_path / "solver.prototxt").write_text(f'net: "{tmp_path / "net.prototxt"}"\nbase_lr: 0.1\n{policy}\n'
                                              f'max_iter: 10\ndisplay: 0\nsnapshot_after_train: false\n')
    return netdef.get_solver(str(tmp_path / "solver.prototxt"))


def test_solver_lr_is_the_rate_of_the_current_iteration(tmp_path):
    """step policy, base 0.1, gamma 0.5, stepsize 2: iterations 0 and 1 at 0.1, 2 and 3 at 0.05."""
    solver = _solver(tmp_path, 'lr_policy: "step" gamma: 0.5 stepsize: 2')
    assert solver.lr == np.float32(0.1)               # before the first step: iteration 0's
    solver.step(1)
    assert solver.iter == 1 and solver.lr == np.float32(0.1)
    solver.step(1)
    assert solver.iter == 2 and solver.lr == np.float32(0.05)   # the rate iteration 2 will apply
    assert solver.lr == np.float32(0.05)              # reading it advances nothing
    solver.step(2)
    assert solver.lr == np.float32(0.025)


def test_solver_share_weights_makes_a_net_follow_training(tmp_path):
    solver = _solver(tmp_path, 'lr_policy: "fixed"')
    deploy = netdef.Net(UNDERSCORE_NET, netdef.TEST)
    solver.share_weights(deploy)
    assert deploy.params["ip2"][0] is solver.net.params["ip2"][0]
    before = np.array(solver.net.params["ip2"][0].data)
    solver.net.blobs["data"].data[...] = 1
    solver.step(1)
    assert not np.array_equal(deploy.params["ip2"][0].data, before)
    np.testing.assert_array_equal(deploy.params["ip2"][0].data, solver.net.params["ip2"][0].data)


# ============================================================================================ Detector
def _detector_files(tmp_path):
    n = netdef.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 4, 4]))
    n.score = L.InnerProduct(n.data, num_output=3, weight_filler=dict(type="gaussian", std=1))
    (tmp_path / "deploy.prototxt").write_text(str(n.to_proto()))
    netdef.set_random_seed(5)
    netdef.Net(str(tmp_path / "deploy.prototxt"), netdef.TEST).save(str(tmp_path / "w.caffemodel"))
    pixels = np.random.default_rng(2).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "image.png")
    return str(tmp_path / "deploy.prototxt"), str(tmp_path / "w.caffemodel"), str(tmp_path / "image.png")


def test_detector_scores_each_window_in_order(tmp_path):
    model, weights, image_path = _detector_files(tmp_path)
    mean = np.array([0.1, 0.2, 0.3], np.float32)
    detector = netdef.Detector(model, weights, mean=mean, raw_scale=2, channel_swap=(2, 1, 0))
    windows = [np.array([0, 0, 4, 4]), np.array([1, 2, 5, 6]), np.array([0, 0, 6, 6])]
    detections = detector.detect_windows([(image_path, windows[:2]), (image_path, windows[2:])])
    assert [d["filename"] for d in detections] == [image_path] * 3
    assert [d["window"] is w for d, w in zip(detections, windows)] == [True] * 3
    image = netdef.io.load_image(image_path)
    w = detector.params["score"][0].data
    for d, (y0, x0, y1, x1) in zip(detections, windows):
        window = netdef.io.resize_image(image[y0:y1, x0:x1], (4, 4))   # warped to the input size
        expected_input = window.transpose(2, 0, 1)[::-1] * 2 - mean[:, None, None]
        np.testing.assert_allclose(d["prediction"], w @ expected_input.ravel(), rtol=1e-4, atol=1e-4)


def test_detector_context_pad_grows_the_window_and_fills_outside_with_the_mean(tmp_path):
    """Crop size 4, context_pad 1: the window is scaled by 4 / (4 - 2) = 2 about its centre.
    (1,1,2,2) grows to rows/columns 0..4, all inside: the crop is image[0:4, 0:4].
    (0,0,1,1) grows to -1..3: one row and column (1 * 4/5, rounded) of mean, then image[0:3, 0:3]."""
    model, weights, image_path = _detector_files(tmp_path)
    mean = np.array([0.1, 0.2, 0.3], np.float32)
    detector = netdef.Detector(model, weights, mean=mean, raw_scale=2, channel_swap=(2, 1, 0), context_pad=1)
    image = netdef.io.load_image(image_path)
    np.testing.assert_allclose(detector.crop(image, np.array([1, 1, 2, 2])), image[0:4, 0:4])
    corner = detector.crop(image, np.array([0, 0, 1, 1]))
    assert corner.shape == (4, 4, 3)
    np.testing.assert_allclose(corner[1:, 1:], image[0:3, 0:3])
    # The mean in image space: channels un-swapped (B,G,R -> R,G,B) and divided by the raw scale...
    np.testing.assert_allclose(corner[0, :], np.tile([0.15, 0.1, 0.05], (4, 1)), rtol=1e-6)
    np.testing.assert_allclose(corner[:, 0], np.tile([0.15, 0.1, 0.05], (4, 1)), rtol=1e-6)
    # ...so that the net sees zeros there.
    np.testing.assert_allclose(detector.transformer.preprocess("data", corner)[:, 0, :], 0, atol=1e-6)
    plain = netdef.Detector(model, weights)
    np.testing.assert_array_equal(plain.crop(image, np.array([1, 2, 3, 5])), image[1:3, 2:5])
