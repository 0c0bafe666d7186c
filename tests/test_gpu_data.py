"""A data layer whose tops live on a GPU (netdef/layers/datasets/staging.py): the prefetch thread
writes each batch into pinned host memory and copies it to the device on a stream of its own. The
batches must be the CPU's, bit for bit, in order, however fast they are taken, with and without
prefetching and after a restore. Skips without a GPU, saying why."""
from __future__ import annotations

import numpy as np
import pytest

import netdef
from netdef import backend
from netdef.data.datum import array_to_datum
from tests.data.builders import write_lmdb
from tests.helpers import gpu_missing, gpu_settings

MISSING = gpu_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"no GPU: {MISSING}")

NET = """
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ crop_size: 8 mirror: true scale: 0.5 mean_value: 10 mean_value: 20 mean_value: 30 }}
  data_param {{ source: "{source}" batch_size: 5 backend: LMDB prefetch: {prefetch} }} }}
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_data")
    items = np.random.default_rng(3).integers(0, 256, size=(23, 3, 12, 12), dtype=np.uint8)
    write_lmdb(folder / "lmdb", {b"%08d" % i: array_to_datum(items[i], label=i).SerializeToString() for i in range(23)})
    return folder


def batches(folder, prefetch: int, count: int, restore_after: int | None = None) -> list:
    path = folder / f"net_{prefetch}.prototxt"
    path.write_text(NET.format(source=folder / "lmdb", prefetch=prefetch))
    netdef.set_random_seed(5)
    net = netdef.Net(str(path), netdef.TRAIN)
    layer = net.layers[0]
    out, state = [], None
    for i in range(count):
        if restore_after is not None and i == restore_after:
            state = layer.data_state()
        net.forward()
        out.append((backend.to_host(net.blobs["data"].data).copy(), backend.to_host(net.blobs["label"].data).copy()))
    if state is not None:
        layer.restore_data_state(state)
        for _ in range(count - restore_after):
            net.forward()
            out.append((backend.to_host(net.blobs["data"].data).copy(), backend.to_host(net.blobs["label"].data).copy()))
    layer.close()
    return out


@pytest.mark.parametrize("prefetch", [0, 4])
def test_gpu_batches_are_the_cpus(source, prefetch):
    expected = batches(source, prefetch, 12, restore_after=7)
    with gpu_settings():
        got = batches(source, prefetch, 12, restore_after=7)
        path = source / "probe.prototxt"
        path.write_text(NET.format(source=source / "lmdb", prefetch=prefetch))
        net = netdef.Net(str(path), netdef.TRAIN)
        net.forward()
        assert backend.get_array_module(net.blobs["data"].data) is not np
        net.layers[0].close()
    assert len(got) == len(expected) == 17
    for (data, label), (want_data, want_label) in zip(got, expected):
        np.testing.assert_array_equal(data, want_data)
        np.testing.assert_array_equal(label, want_label)


def test_staged_batches_survive_buffer_reuse():
    """Many batches staged back to back and taken in order, while the compute stream is kept busy:
    a pinned or device buffer reused before its copy or its last reader ended would show here."""
    import cupy

    from netdef.layers.datasets.staging import staging_for

    with gpu_settings():
        staging = staging_for(cupy)
        busy = cupy.ones((2048, 2048), dtype=cupy.float32)
        staged = []
        for i in range(40):
            host = staging.allocate((64, 1024), np.float32)
            host[...] = i
            staged.append(staging.stage([host]))
            del host
            busy = busy @ busy / 2048  # queue work on the compute stream between stagings
        for i, batch in enumerate(staged):
            (device,) = batch.take()
            total = device.sum()  # on the compute stream, after the wait for the copy
            assert float(total) == i * 64 * 1024, i
