"""The layer contract's data-source abilities (``DataSource``) and ``Net.data_sources()``."""
from __future__ import annotations

import numpy as np
import pytest

import netdef
from netdef.layers.base import DataSource, LayerError


class Counter(netdef.DataSource):
    """top[0]: (2 x 1) the next two counts, from rank's offset, stepping by the number of ranks."""

    def setup(self, bottom, top):
        self.next, self.step, self.closed = 0, 1, False

    def reshape(self, bottom, top):
        top[0].reshape(2, 1)

    def forward(self, bottom, top):
        top[0].data[:, 0] = [self.next, self.next + self.step]
        self.next += 2 * self.step

    def set_shard(self, rank, num_ranks):
        self.next, self.step = rank, num_ranks
        return True

    def data_state(self):
        return str(self.next).encode()

    def restore_data_state(self, state):
        self.next = int(state)

    def close(self):
        self.closed = True


NET = '''
name: "sources"
layer { name: "counts" type: "Python" top: "counts" python_param { module: "tests.layers.test_base" layer: "Counter" } }
layer { name: "input" type: "Input" top: "x" input_param { shape { dim: 2 dim: 1 } } }
layer { name: "dummy" type: "DummyData" top: "d" dummy_data_param { shape { dim: 2 dim: 1 } } }
layer { name: "sum" type: "Eltwise" bottom: "counts" bottom: "d" top: "sum" }
'''


def test_net_lists_its_data_sources_and_their_abilities():
    net = netdef.Net(NET, netdef.TRAIN)
    sources = net.data_sources()
    assert [layer.name for layer in sources] == ["counts"]  # Input and DummyData are not data sources
    counter = sources[0]
    assert counter.set_shard(1, 3) is True
    net.forward()
    assert net.blobs["counts"].data[:, 0].tolist() == [1, 4]
    state = counter.data_state()
    net.forward()
    counter.restore_data_state(state)
    net.forward()
    assert net.blobs["counts"].data[:, 0].tolist() == [7, 10]


def test_default_abilities_mean_not_able():
    class Plain(DataSource):
        def reshape(self, bottom, top):
            pass

    layer = Plain(netdef.proto_pb2.LayerParameter(name="plain", type="Plain"))
    assert layer.set_shard(0, 2) is False
    assert layer.data_state() is None
    layer.close()
    with pytest.raises(LayerError, match="'plain'.*saves no state"):
        layer.restore_data_state(b"x")
    assert not isinstance(np.zeros(1), DataSource)


def test_solver_close_closes_data_sources(tmp_path):
    net_path = tmp_path / "net.prototxt"
    net_path.write_text(NET + 'layer { name: "loss" type: "EuclideanLoss" bottom: "sum" bottom: "x" top: "loss" }\n')
    solver = netdef.get_solver(f'net: "{net_path}" base_lr: 0.1 lr_policy: "fixed" max_iter: 1 solver_mode: CPU')
    counter = solver.net.data_sources()[0]
    solver.close()
    assert counter.closed
