"""benchmarks/overlap.py --zoo: a zoo net in place of the small model (issue 30's ResNet-50 case)."""
import numpy as np
import pytest

import netdef
from tests.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def overlap():
    with benchmark_module("overlap") as module:
        yield module


def test_a_zoo_net_reads_constant_dummy_data_of_the_batch_asked_for(overlap):
    spec = {"zoo": "squeezenet", "batch": 2}
    net = netdef.Net(overlap.net_text(spec), netdef.TRAIN)
    data = net.layers[0]
    assert data.type == "DummyData" and net.blobs["data"].shape == (2, 3, 227, 227)
    assert [layer.type for layer in net.layers].count("DummyData") == 1
    loss = net.forward_range()
    assert np.all(net.blobs["data"].data == 0.5) and np.all(net.blobs["label"].data == 3)
    assert np.isfinite(loss)


def test_without_zoo_the_small_model_takes_its_fully_connected_sizes(overlap):
    net = netdef.Net(overlap.net_text({"batch": 3, "fc6": 16, "fc7": 8}), netdef.TRAIN)
    assert net.params["fc6"][0].shape == (16, 4096) and net.params["fc7"][0].shape == (8, 16)
    assert net.blobs["data"].shape == (3, 3, 32, 32)
