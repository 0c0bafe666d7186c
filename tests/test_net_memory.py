"""The whole net's memory is checked before its blobs are allocated (issue 32, class 2)."""
import resource

import pytest

import netdef
from netdef.memory import available_bytes
from netdef.net import NetError
from netdef.net_memory import planned_blob_bytes

# LeNet's layers behind an Input; force_backward gives every top a gradient in a TRAIN net.
LENET = """
force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: %d dim: 1 dim: 28 dim: 28 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 500 } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 } }
"""
CONV1_BYTES_PER_IMAGE = 20 * 24 * 24 * 4


def test_a_net_whose_blobs_fit_one_by_one_but_not_together_is_refused_before_allocating():
    available, _ = available_bytes()
    # conv1, the largest top, takes two thirds of what may be allocated: every top fits on its own,
    # and the net's values and gradients together need about three times as much.
    batch = available * 2 // 3 // CONV1_BYTES_PER_IMAGE
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with pytest.raises(NetError) as error:
        netdef.Net(LENET % batch, netdef.TRAIN)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before < 100 * 2**20
    message = str(error.value)
    assert message.startswith("<prototxt string>: the net's blobs need at least ")
    assert " GiB, values and gradients, before the layers' temporaries), more than " in message
    assert "; the largest: 'conv1' " in message and "'conv2' " in message


def test_the_sum_counts_each_blob_once_and_gradients_only_in_training():
    net = netdef.Net(LENET % 2, netdef.TRAIN)
    planned = dict(planned_blob_bytes(net._blobs_to_hold()))
    # ip1 is computed in place by relu1: one blob; conv1's values and gradient.
    assert planned["conv1"] == 2 * 2 * CONV1_BYTES_PER_IMAGE
    assert list(planned).count("ip1") == 1
    test_net = netdef.Net(LENET % 2, netdef.TEST)
    assert dict(planned_blob_bytes(test_net._blobs_to_hold()))["conv1"] == 2 * CONV1_BYTES_PER_IMAGE
