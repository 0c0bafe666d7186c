"""Scratch: temporaries shared by the layers of one net (netdef/layers/scratch.py)."""
import numpy as np

import netdef
from netdef.layers import scratch as scratch_module
from netdef.layers.scratch import Scratch


def test_one_buffer_per_name_grown_to_the_largest_request():
    scratch = Scratch()
    small = scratch.get("a", (2, 3), np.float32, np)
    big = scratch.get("a", (4, 5), np.float64, np)
    again = scratch.get("a", (3, 2), np.float32, np)
    assert big.shape == (4, 5) and big.dtype == np.float64
    assert np.shares_memory(big, again) and not np.shares_memory(small, big)
    assert scratch.nbytes == 4 * 5 * 8
    other = scratch.get("b", (3,), np.float32, np)
    assert not np.shares_memory(other, again)


def test_a_request_made_again_gets_its_view_until_the_buffer_is_replaced():
    scratch = Scratch()
    first = scratch.get("a", (2, 3), np.float32, np)
    assert scratch.get("a", [2, 3], np.float32, np) is first
    assert scratch.get("a", (3, 2), np.float32, np) is not first
    grown = scratch.get("a", (40, 5), np.float32, np)  # a new buffer: the old views are not handed out
    again = scratch.get("a", (2, 3), np.float32, np)
    assert again is not first and np.shares_memory(again, grown) and not np.shares_memory(again, first)
    assert scratch.nbytes == 40 * 5 * 4


def test_the_views_kept_per_name_are_bounded():
    scratch = Scratch()
    scratch.get("a", (1000,), np.float32, np)
    for size in range(1, 3 * scratch_module.VIEWS_KEPT):  # a net fed inputs of ever new sizes
        view = scratch.get("a", (size,), np.float32, np)
        assert view.shape == (size,) and scratch.get("a", (size,), np.float32, np) is view
    assert len(scratch._views["a"]) <= scratch_module.VIEWS_KEPT


def test_fill_and_clear_apply_on_every_call():
    scratch = Scratch()
    scratch.get("a", (4,), np.float32, np)[...] = 7
    assert (scratch.get("a", (4,), np.float32, np, clear=True) == 0).all()
    scratch.get("a", (4,), np.float32, np)[...] = 7
    assert (scratch.get("a", (4,), np.float32, np, fill=2.5) == 2.5).all()


CONVS = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 5 kernel_size: 5 pad: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "c3" type: "Convolution" bottom: "c2" top: "c3" loss_weight: 1
        convolution_param { num_output: 4 kernel_size: 3 stride: 2 weight_filler { type: "gaussian" std: 0.3 } } }
force_backward: true
"""


def test_a_nets_layers_share_one_scratch_and_compute_what_private_ones_do():
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 9)).astype(np.float32)
    results = []
    for shared in (True, False):
        netdef.set_random_seed(4)
        net = netdef.Net(CONVS, netdef.TRAIN)
        if not shared:
            for layer in net.layers:
                layer.share_scratch(Scratch())
        assert (len({id(layer.scratch) for layer in net.layers}) == 1) == shared
        for _ in range(2):
            net.clear_param_diffs()
            net.forward(x=x)
            net.backward()
        results.append([net.blobs["c3"].data.copy(), net.blobs["x"].diff.copy()] +
                       [net.params[name][0].diff.copy() for name in ("c1", "c2", "c3")])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
