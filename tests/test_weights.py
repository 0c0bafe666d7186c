"""Weights files: Caffe's V2 and legacy V1 .caffemodel, Caffe's HDF5 weights, our own writes, and
the errors a mismatch gives."""
import numpy as np
import pytest

import netdef
from netdef.proto import io as proto_io
from netdef.proto import netdef_pb2 as pb
from netdef.weights import WeightsError
from tests.helpers import shared_path

ZOO_MNIST = ("fixtures", "zoo", "bvlc", "examples", "mnist")
ZOO_CIFAR = ("fixtures", "zoo", "bvlc", "examples", "cifar10")


def test_lenet_v2_caffemodel_loads_into_the_bvlc_definition():
    model = shared_path(*ZOO_MNIST, "lenet.prototxt")
    weights = shared_path("fixtures", "caffe-models", "lenet_iter_10000.caffemodel")
    net = netdef.Net(str(model), netdef.TEST, weights=str(weights))
    source = proto_io.read_binary(weights, pb.NetParameter)
    stored = {layer.name: layer.blobs for layer in source.layer if layer.blobs}
    assert set(stored) == {"conv1", "conv2", "ip1", "ip2"}
    for name, blobs in stored.items():
        for j, proto in enumerate(blobs):
            np.testing.assert_array_equal(net.params[name][j].data.ravel(), np.asarray(proto.data, np.float32))


@pytest.mark.parametrize("model,weights", [
    ("cifar10_quick.prototxt", "cifar10_quick_iter_5000.caffemodel"),
    ("cifar10_full.prototxt", "cifar10_full_iter_60000.caffemodel"),
    ("cifar10_full.prototxt", "cifar10_full_iter_70000.caffemodel"),
])
def test_legacy_v1_caffemodels_load_with_4d_dims(model, weights):
    path = shared_path("fixtures", "caffe-models", weights)
    source = proto_io.read_binary(path, pb.NetParameter)
    assert source.layers and not source.layer, "fixture should be a V1 file"
    net = netdef.Net(str(shared_path(*ZOO_CIFAR, model)), netdef.TEST, weights=str(path))
    v1 = {layer.name: layer.blobs for layer in source.layers if layer.blobs}
    for name, blobs in v1.items():
        for j, proto in enumerate(blobs):
            assert proto.HasField("num") and not proto.HasField("shape")
            np.testing.assert_array_equal(net.params[name][j].data.ravel(), np.asarray(proto.data, np.float32))
    # A loaded classifier gives a proper distribution.
    x = np.random.default_rng(0).uniform(-100, 100, (2, 3, 32, 32)).astype(np.float32)
    probs = net.forward(data=x)["prob"]
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_save_writes_a_v2_caffemodel_that_round_trips(tmp_path):
    model = shared_path(*ZOO_MNIST, "lenet.prototxt")
    net = netdef.Net(str(model), netdef.TEST)
    out = tmp_path / "saved.caffemodel"
    net.save(str(out))
    written = proto_io.read_binary(out, pb.NetParameter)
    assert written.layer and not written.layers
    conv1 = next(l for l in written.layer if l.name == "conv1")
    assert list(conv1.blobs[0].shape.dim) == [20, 1, 5, 5] and conv1.type == "Convolution"
    again = netdef.Net(str(model), netdef.TEST, weights=str(out))
    for name in net.params:
        for a, b in zip(net.params[name], again.params[name]):
            np.testing.assert_array_equal(a.data, b.data)
    assert not list(tmp_path.glob(".*tmp")), "no temporary file may remain"


def test_hdf5_weights_written_by_caffe_load(tmp_path):
    pytest.importorskip("h5py")
    folder = shared_path("fixtures", "caffe-ref", "solvers")
    expected = np.load(folder / "snapshot_expected.npz")
    net = netdef.Net(str(folder / "solver_net.prototxt"), netdef.TRAIN,
                     weights=str(folder / "snap_sgd_hdf5_iter_3.caffemodel.h5"))
    prefix = [k for k in expected.files if k.startswith("snap_sgd_hdf5") and k.endswith("/w")][0][:-2]
    np.testing.assert_array_equal(net.params["ip"][0].data, expected[prefix + "/w"])
    np.testing.assert_array_equal(net.params["ip"][1].data, expected[prefix + "/b"])
    binary = netdef.Net(str(folder / "solver_net.prototxt"), netdef.TRAIN,
                        weights=str(folder / "snap_sgd_binaryproto_iter_3.caffemodel"))
    np.testing.assert_array_equal(binary.params["ip"][0].data, net.params["ip"][0].data)
    # and our HDF5 writer round-trips in Caffe's layout: the same groups and datasets as Caffe's file
    out = tmp_path / "ours.caffemodel.h5"
    net.save_hdf5(str(out))
    import h5py
    with h5py.File(out, "r") as ours, h5py.File(folder / "snap_sgd_hdf5_iter_3.caffemodel.h5", "r") as caffes:
        assert _hdf5_layout(ours) == _hdf5_layout(caffes)
        assert set(ours["data"]) == {"input", "ip", "loss"}  # a group for every layer, as Caffe
        np.testing.assert_array_equal(ours["data/ip/0"][...], expected[prefix + "/w"])
    again = netdef.Net(str(folder / "solver_net.prototxt"), netdef.TRAIN, weights=str(out))
    np.testing.assert_array_equal(again.params["ip"][1].data, expected[prefix + "/b"])


def _hdf5_layout(handle):
    """{name: (shape, dtype) for a dataset, None for a group} of every object in an HDF5 file."""
    import h5py
    layout = {}
    handle.visititems(lambda name, obj: layout.__setitem__(
        name, (obj.shape, obj.dtype) if isinstance(obj, h5py.Dataset) else None))
    return layout


def test_shape_mismatch_names_file_layer_and_shapes(tmp_path):
    text = """
    layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "fc" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 4 } }
    """
    net = netdef.Net(text, netdef.TEST)
    path = tmp_path / "four.caffemodel"
    net.save(str(path))
    other = netdef.Net(text.replace("num_output: 4", "num_output: 5"), netdef.TEST)
    with pytest.raises(WeightsError, match=r"four\.caffemodel: cannot copy param 0 of layer 'fc'.*\(4, 3\).*\(5, 3\)"):
        other.copy_from(str(path))
    no_bias = netdef.Net(text.replace("num_output: 4", "num_output: 4 bias_term: false"), netdef.TEST)
    with pytest.raises(WeightsError, match=r"layer 'fc' has 2 blobs in the file but 1 in the net"):
        no_bias.copy_from(str(path))
    with pytest.raises(WeightsError, match="no such weights file"):
        net.copy_from(str(tmp_path / "missing.caffemodel"))


def test_layers_absent_from_the_net_are_ignored(tmp_path):
    big = """
    layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "fc" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 4 } }
    layer { name: "fc2" type: "InnerProduct" bottom: "y" top: "z" inner_product_param { num_output: 2 } }
    """
    path = tmp_path / "big.caffemodel"
    full = netdef.Net(big, netdef.TEST)
    full.save(str(path))
    small = netdef.Net(big.split('layer { name: "fc2"')[0], netdef.TEST, weights=str(path))
    np.testing.assert_array_equal(small.params["fc"][0].data, full.params["fc"][0].data)


# -------------------------------------------------------------------------------------------- HDF5, shared params
SHARED = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "first" type: "InnerProduct" bottom: "x" top: "a"
  param { name: "shared_w" } param { name: "first_b" }
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } } }
layer { name: "relu" type: "ReLU" bottom: "a" top: "a" }
layer { name: "second" type: "InnerProduct" bottom: "x" top: "b"
  param { name: "shared_w" }
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } } }
"""


def _shared_net(seed):
    netdef.set_random_seed(seed)
    return netdef.Net(SHARED, netdef.TEST)


def test_hdf5_stores_a_shared_param_once_under_its_owner(tmp_path):
    h5py = pytest.importorskip("h5py")
    net = _shared_net(1)
    assert net.params["second"][0] is net.params["first"][0]  # the premise: one blob, two layers
    for j, blob in enumerate(net.learnable_params):
        blob.diff[...] = j + 1  # distinct gradients, so /diff can be checked
    path = tmp_path / "shared.caffemodel.h5"
    net.save_hdf5(str(path), write_diff=True)
    with h5py.File(path, "r") as handle:
        # A group for every layer, the inserted Split too, as Caffe.
        assert sorted(handle["data"]) == ["first", "relu", "second", "x", "x_x_0_split"]
        assert sorted(handle["data/first"]) == ["0", "1"]
        assert sorted(handle["data/second"]) == ["1"]  # its weight belongs to "first"
        assert len(handle["data/x"]) == 0 and len(handle["data/relu"]) == 0
        assert handle["data/first/0"].dtype == np.float32 and handle["data/first/0"].shape == (4, 3)
        np.testing.assert_array_equal(handle["data/first/0"][()], net.params["first"][0].data)
        np.testing.assert_array_equal(handle["data/second/1"][()], net.params["second"][1].data)
        # Caffe writes the gradient of every parameter, shared or not.
        assert sorted(handle["diff/second"]) == ["0", "1"]
        np.testing.assert_array_equal(handle["diff/second/0"][()], net.params["first"][0].diff)

    loaded = _shared_net(2)
    assert not np.array_equal(loaded.params["first"][0].data, net.params["first"][0].data)
    loaded.copy_from(str(path))
    for name in ("first", "second"):
        for a, b in zip(loaded.params[name], net.params[name]):
            np.testing.assert_array_equal(a.data, b.data)
    assert loaded.params["second"][0] is loaded.params["first"][0]  # still shared after loading
    assert not list(tmp_path.glob(".*tmp")), "no temporary file may remain"


def test_hdf5_missing_owned_param_and_shape_mismatch_are_weights_errors(tmp_path):
    h5py = pytest.importorskip("h5py")
    net = _shared_net(1)
    path = tmp_path / "shared.caffemodel.h5"
    net.save_hdf5(str(path))
    with h5py.File(path, "r+") as handle:
        del handle["data/first/1"]  # "first" owns its bias: it must be there
    with pytest.raises(WeightsError, match=r"shared\.caffemodel\.h5: .*layer 'first': param 1 is missing"):
        _shared_net(2).copy_from(str(path))

    net.save_hdf5(str(path))
    with h5py.File(path, "r+") as handle:
        weights = handle["data/first/0"][()]
        del handle["data/first/0"]
        handle["data/first/0"] = weights.T.copy()  # same count, other shape: Caffe refuses it
    with pytest.raises(WeightsError, match=r"cannot copy param 0 of layer 'first'.*\(3, 4\).*\(4, 3\)"):
        _shared_net(2).copy_from(str(path))

    net.save_hdf5(str(path))
    with h5py.File(path, "r+") as handle:
        handle["data/first/2"] = np.zeros(4, np.float32)
    with pytest.raises(WeightsError, match=r"incompatible number of blobs for layer 'first': 3 in the file, 2"):
        _shared_net(2).copy_from(str(path))

    with h5py.File(path, "w") as handle:
        handle["weights"] = np.zeros(3)
    with pytest.raises(WeightsError, match="no /data group"):
        _shared_net(2).copy_from(str(path))


def test_hdf5_layers_absent_from_the_net_are_ignored(tmp_path):
    pytest.importorskip("h5py")
    net = _shared_net(1)
    path = tmp_path / "shared.caffemodel.h5"
    net.save_hdf5(str(path))
    smaller = netdef.Net(SHARED.split('layer { name: "second"')[0], netdef.TEST)
    smaller.copy_from(str(path))
    for a, b in zip(smaller.params["first"], net.params["first"]):
        np.testing.assert_array_equal(a.data, b.data)
