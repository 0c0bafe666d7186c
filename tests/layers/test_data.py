"""Input, DummyData, MemoryData and Parameter layers."""
from __future__ import annotations

import numpy as np
import pytest

from netdef import backend
from netdef.blob import Blob
from netdef.layers import data as data_module  # noqa: F401  (registers the types)
from netdef.layers.base import LayerError
from tests import helpers
from tests.helpers import build, check_gradients, default_dtype, layer_case_names, make_layer, parse_layer, run_caffe_case

CASES = layer_case_names(("parameter_layer",))




def setup(text, num_tops, dtype=np.float32):
    with default_dtype(dtype):
        layer = make_layer(parse_layer(text))
        top = [Blob(dtype=dtype, name=f"y{i}") for i in range(num_tops)]
        layer.setup_layer([], top)
    return layer, top


# ------------------------------------------------------------------------------------------- Input
def test_input_one_shape_per_top():
    layer, top = setup('type: "Input" input_param { shape { dim: 2 dim: 3 } shape { dim: 4 } }', 2)
    assert [t.shape for t in top] == [(2, 3), (4,)]
    assert layer.min_top == 1 and layer.exact_num_bottom == 0


def test_input_one_shape_shared():
    _, top = setup('type: "Input" input_param { shape { dim: 1 dim: 3 dim: 5 dim: 5 } }', 3)
    assert [t.shape for t in top] == [(1, 3, 5, 5)] * 3


def test_input_reshape_keeps_user_shape_and_forward_keeps_data():
    layer, top = setup('type: "Input" input_param { shape { dim: 2 dim: 3 } }', 1)
    top[0].reshape(5, 3)
    top[0].data[...] = 7
    layer.reshape([], top)
    layer.forward([], top)
    assert top[0].shape == (5, 3)
    assert np.all(top[0].data == 7)


def test_input_without_shape_leaves_tops():
    _, top = setup('type: "Input"', 2)
    assert [t.shape for t in top] == [(), ()]


def test_input_wrong_number_of_shapes():
    with pytest.raises(LayerError, match="once per top"):
        setup('type: "Input" input_param { shape { dim: 1 } shape { dim: 2 } }', 3)


# ------------------------------------------------------------------------------------------- DummyData
def test_dummy_default_is_constant_zero():
    layer, top = setup('type: "DummyData" dummy_data_param { shape { dim: 2 dim: 3 } }', 1)
    assert top[0].shape == (2, 3)
    assert np.all(top[0].data == 0)


def test_dummy_constant_filled_once_at_setup():
    layer, top = setup('type: "DummyData" dummy_data_param { shape { dim: 2 dim: 3 } '
                       'data_filler { type: "constant" value: 1.5 } }', 1)
    assert np.all(top[0].data == 1.5)
    top[0].data[...] = -1  # Caffe never refills a constant top
    layer.forward([], top)
    assert np.all(top[0].data == -1)


def test_dummy_random_refilled_each_forward():
    backend.set_random_seed(0)
    layer, top = setup('type: "DummyData" dummy_data_param { shape { dim: 50 } '
                       'data_filler { type: "uniform" min: 2 max: 3 } }', 1)
    layer.forward([], top)
    first = np.array(top[0].data)
    layer.forward([], top)
    second = np.array(top[0].data)
    assert np.all((first >= 2) & (first <= 3)) and np.all((second >= 2) & (second <= 3))
    assert not np.array_equal(first, second)


def test_dummy_fillers_per_top_and_legacy_shape():
    text = ('type: "DummyData" dummy_data_param { num: 2 channels: 3 channels: 1 height: 4 width: 5 '
            'data_filler { type: "constant" value: 2 } data_filler { type: "gaussian" std: 0.1 } }')
    layer, top = setup(text, 2)
    assert [t.shape for t in top] == [(2, 3, 4, 5), (2, 1, 4, 5)]
    assert np.all(top[0].data == 2)
    layer.forward([], top)
    assert np.all(top[0].data == 2)
    assert 0 < np.std(top[1].data) < 0.5


def test_dummy_one_filler_shared_by_tops():
    text = ('type: "DummyData" dummy_data_param { shape { dim: 3 } shape { dim: 2 dim: 2 } '
            'data_filler { type: "constant" value: 4 } }')
    _, top = setup(text, 2)
    assert [t.shape for t in top] == [(3,), (2, 2)]
    assert np.all(top[0].data == 4) and np.all(top[1].data == 4)


@pytest.mark.parametrize("param,message", [
    ("shape { dim: 1 } num: 1 channels: 1 height: 1 width: 1", "both shape and legacy"),
    ("shape { dim: 1 } shape { dim: 1 } shape { dim: 1 }", "number of shapes"),
    ("num: 1 num: 1 num: 1 channels: 1 height: 1 width: 1", "num"),
    ("shape { dim: 1 } data_filler { } data_filler { } data_filler { }", "data fillers"),
    ("", "no shape"),
])
def test_dummy_errors(param, message):
    with pytest.raises(LayerError, match=message):
        setup(f'type: "DummyData" dummy_data_param {{ {param} }}', 2)


# ------------------------------------------------------------------------------------------- MemoryData
MEMORY = 'type: "MemoryData" memory_data_param { batch_size: 2 channels: 1 height: 2 width: 3 }'


def test_memory_data_batches_and_wraps():
    layer, top = setup(MEMORY, 2)
    assert top[0].shape == (2, 1, 2, 3) and top[1].shape == (2,)
    data = np.arange(6 * 6, dtype=np.float32).reshape(6, 1, 2, 3)
    labels = np.arange(6, dtype=np.float32) * 10
    layer.set_input_arrays(data, labels)
    seen = []
    for _ in range(4):
        layer.reshape([], top)
        layer.forward([], top)
        seen.append((np.array(top[0].data), np.array(top[1].data)))
    for k, (d, l) in enumerate(seen):
        start = (2 * k) % 6
        np.testing.assert_array_equal(d, data[start:start + 2])
        np.testing.assert_array_equal(l, labels[start:start + 2])
    assert top[0].dtype == np.float32 and top[1].dtype == np.float32


def test_memory_data_labels_4d_ints_and_later_changes_visible():
    layer, top = setup(MEMORY, 2)
    data = np.zeros((2, 1, 2, 3))
    labels = np.array([3, 4]).reshape(2, 1, 1, 1)
    layer.set_input_arrays(data, labels)
    data[1] = 5  # referenced, not copied, as Caffe
    layer.forward([], top)
    np.testing.assert_array_equal(top[1].data, [3, 4])
    assert np.all(top[0].data[1] == 5)
    top[0].data[...] = -1  # the top is a copy: the user's array is untouched
    assert np.all(data[1] == 5)


def test_memory_data_set_input_restarts_and_batch_size():
    layer, top = setup(MEMORY, 2)
    data = np.arange(4 * 6, dtype=np.float32).reshape(4, 1, 2, 3)
    layer.set_input_arrays(data, np.arange(4))
    layer.forward([], top)
    layer.set_input_arrays(data, np.arange(4))
    layer.forward([], top)
    np.testing.assert_array_equal(top[1].data, [0, 1])
    layer.set_batch_size(4)
    layer.forward([], top)
    assert top[0].shape == (4, 1, 2, 3)
    np.testing.assert_array_equal(top[1].data, [2, 3, 0, 1])
    np.testing.assert_array_equal(top[0].data, data[[2, 3, 0, 1]])
    layer.forward([], top)
    np.testing.assert_array_equal(top[1].data, [2, 3, 0, 1])


@pytest.mark.parametrize("data_shape,labels_shape,message", [
    ((3, 1, 2, 3), (3,), "multiple of batch size"),
    ((4, 2, 2, 3), (4,), "shape"),
    ((4, 6), (4,), "shape"),
    ((4, 1, 2, 3), (2,), "same first dimension"),
    ((4, 1, 2, 3), (4, 2), "one value per item"),
])
def test_memory_data_checks(data_shape, labels_shape, message):
    layer, _ = setup(MEMORY, 2)
    with pytest.raises(LayerError, match=message):
        layer.set_input_arrays(np.zeros(data_shape), np.zeros(labels_shape))


def test_memory_data_needs_arrays_and_params():
    layer, top = setup(MEMORY, 2)
    with pytest.raises(LayerError, match="set_input_arrays"):
        layer.forward([], top)
    with pytest.raises(LayerError, match="positive"):
        setup('type: "MemoryData" memory_data_param { batch_size: 2 channels: 1 height: 2 }', 2)
    with pytest.raises(LayerError, match="2 top"):
        setup(MEMORY, 1)


def _batches(layer, top, count):
    out = []
    for _ in range(count):
        layer.forward([], top)
        out.append(np.array(top[1].data))
    return out


def test_memory_data_state_restores_the_next_batch():
    data = np.arange(6 * 6, dtype=np.float32).reshape(6, 1, 2, 3)
    labels = np.arange(6, dtype=np.float32)
    layer, top = setup(MEMORY, 2)
    layer.set_input_arrays(data, labels)
    _batches(layer, top, 2)
    state = layer.data_state()
    assert isinstance(state, bytes)
    expected = _batches(layer, top, 3)  # wraps around after the third batch

    fresh, fresh_top = setup(MEMORY, 2)
    fresh.set_input_arrays(data, labels)  # the arrays first: setting them rewinds
    fresh.restore_data_state(state)
    got = _batches(fresh, fresh_top, 3)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got[0], [4, 5])  # not the first batch


def test_memory_data_restore_checks_the_state():
    layer, top = setup(MEMORY, 2)
    layer.restore_data_state(layer.data_state())  # position 0 without arrays: nothing to restore
    data = np.zeros((4, 1, 2, 3), dtype=np.float32)
    layer.set_input_arrays(data, np.arange(4))
    layer.forward([], top)
    at_item_2 = layer.data_state()
    unset, _ = setup(MEMORY, 2)
    with pytest.raises(LayerError, match="call set_input_arrays first"):
        unset.restore_data_state(at_item_2)
    short, _ = setup(MEMORY, 2)
    short.set_input_arrays(data[:2], np.arange(2))
    with pytest.raises(LayerError, match="item 2, but the arrays hold 2 items"):
        short.restore_data_state(at_item_2)
    with pytest.raises(LayerError, match="not a MemoryData state"):
        layer.restore_data_state(b"junk")


# ------------------------------------------------------------------------------------------- Parameter
def test_parameter_oracle_available():
    helpers.shared_path("fixtures", "caffe-ref", "layers", "parameter_layer.npz")
    assert CASES == ["parameter_layer"]


@pytest.mark.parametrize("name", CASES)
def test_caffe_oracle(name):
    run_caffe_case(name)


PARAMETER = 'type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }'


def test_parameter_forward_backward_adds():
    layer, top = setup(PARAMETER, 1, np.float64)
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (2, 3)
    assert np.all(layer.blobs[0].data == 0)
    value = np.arange(6.0).reshape(2, 3)
    layer.blobs[0].data[...] = value
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data, value)
    top[0].data[...] = 0  # an in-place consumer must not change the parameter
    np.testing.assert_array_equal(layer.blobs[0].data, value)
    dy = np.ones((2, 3))
    top[0].diff = dy
    layer.blobs[0].diff[...] = 0
    layer.backward(top, [], [])
    layer.backward(top, [], [])
    np.testing.assert_array_equal(layer.blobs[0].diff, 2 * dy)
    layer.param_propagate_down = [False]
    layer.backward(top, [], [])
    np.testing.assert_array_equal(layer.blobs[0].diff, 2 * dy)


def test_parameter_gradient():
    check_gradients(parse_layer(PARAMETER), [], params=[np.random.default_rng(0).standard_normal((2, 3))])


def test_parameter_keeps_loaded_blob_and_checks_shape():
    with default_dtype(np.float64):
        layer = make_layer(parse_layer(PARAMETER))
        loaded = Blob((2, 3), dtype=np.float64)
        loaded.data[...] = 5
        layer.blobs = [loaded]
        top = [Blob(dtype=np.float64)]
        layer.setup_layer([], top)
        assert layer.blobs[0] is loaded
        layer.forward([], top)
        assert np.all(top[0].data == 5)
        layer = make_layer(parse_layer(PARAMETER))
        layer.blobs = [Blob((3, 2), dtype=np.float64)]
        with pytest.raises(LayerError, match="shape"):
            layer.setup_layer([], [Blob(dtype=np.float64)])


def test_data_layers_take_no_bottoms():
    with pytest.raises(LayerError, match="bottom"):
        build(parse_layer(PARAMETER), [np.zeros(2)], 1)
