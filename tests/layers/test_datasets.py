"""The file-backed data layers (Data, ImageData, HDF5Data, HDF5Output) built through netdef.Net: values
against the Caffe-made LMDBs, transforms, prefetching and its errors, sharding, exact resumption."""
from __future__ import annotations

import gc
import os
import re
import time

import numpy as np
import pytest

import netdef
import netdef.layers.datasets  # registers Data, ImageData, HDF5Data, HDF5Output
from netdef.data.datum import array_to_datum
from netdef.data.image import read_image, resize
from netdef.layers.datasets import DataSourceLayer
from netdef.proto import netdef_pb2 as pb
from tests.data.builders import (
    CAFFE_MADE,
    indexed_lmdb,
    write_h5_files,
    write_images,
    write_lmdb,
)
from tests.helpers import shared_path

pytest.importorskip("lmdb")
SCALE = np.float32(0.00390625)


def made(*parts):
    return str(shared_path(*CAFFE_MADE, *parts))


def data_net(source, batch_size, transform="", phase=netdef.TRAIN, extra="", tops=("data", "label"), seed=None):
    if seed is not None:
        netdef.set_random_seed(seed)
    top_lines = " ".join(f'top: "{t}"' for t in tops)
    return netdef.Net(f'''
        layer {{ name: "src" type: "Data" {top_lines}
          data_param {{ source: "{source}" batch_size: {batch_size} backend: LMDB {extra} }}
          transform_param {{ {transform} }} }}''', phase)


def image_net(source, batch_size, params="", transform="", phase=netdef.TRAIN, seed=None, prefetch=None):
    if seed is not None:
        netdef.set_random_seed(seed)
    pf = f"data_param {{ prefetch: {prefetch} }}" if prefetch is not None else ""
    return netdef.Net(f'''
        layer {{ name: "images" type: "ImageData" top: "data" top: "label"
          image_data_param {{ source: "{source}" batch_size: {batch_size} {params} }}
          transform_param {{ {transform} }} {pf} }}''', phase)


def hdf5_net(source, batch_size, shuffle=False, seed=None):
    if seed is not None:
        netdef.set_random_seed(seed)
    return netdef.Net(f'''
        layer {{ name: "h5" type: "HDF5Data" top: "data" top: "label"
          hdf5_data_param {{ source: "{source}" batch_size: {batch_size} shuffle: {str(shuffle).lower()} }} }}''',
                      netdef.TRAIN)


def batches(net, k, blobs=("data", "label")):
    out = []
    for _ in range(k):
        net.forward()
        out.append(tuple(net.blobs[b].data.copy() for b in blobs if b in net.blobs))
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


def source_layer(net) -> DataSourceLayer:
    return net.layers[0]


# ---------------------------------------------------------------------------------------------- Data
def test_data_reads_caffe_mnist_lmdb_and_wraps_around():
    exp = np.load(made("mnist_test_expected.npz"))
    net = data_net(made("mnist_test_lmdb"), 64, "scale: 0.00390625")
    assert net.blobs["data"].shape == (64, 1, 28, 28) and net.blobs["label"].shape == (64,)
    got = batches(net, 32)
    np.testing.assert_array_equal(got[0][0][:10], exp["first10"].astype(np.float32) * SCALE)
    labels = np.concatenate([b[1] for b in got])
    # 32 batches of 64 = 2048 records: all 2000 in key order, then the first 48 again.
    np.testing.assert_array_equal(labels, np.concatenate([exp["labels"], exp["labels"][:48]]).astype(np.float32))
    np.testing.assert_array_equal(got[31][0][15], exp["last"][0].astype(np.float32) * SCALE)
    assert got[0][0].dtype == np.float32
    # Data layers have no bottoms and no backward: a backward pass is harmless.
    net.backward()
    source_layer(net).close()


@pytest.mark.parametrize("db", ["color20_raw_lmdb", "color20_png_lmdb"])
def test_data_reads_caffe_colour_lmdbs(db):
    exp = np.load(made("color20_expected.npz"))
    net = data_net(made(db), 20, f'scale: 0.5 mean_file: "{made("color20_mean.binaryproto")}"', phase=netdef.TEST)
    net.forward()
    want = (exp["caffe_bgr_chw"].astype(np.float32) - exp["mean_bgr"]) * np.float32(0.5)
    np.testing.assert_array_equal(net.blobs["data"].data, want)
    np.testing.assert_array_equal(net.blobs["label"].data, exp["labels"].astype(np.float32))
    # force_gray decodes the encoded PNGs as grey (one channel); raw Datums are left as they are.
    grey = data_net(made(db), 4, "force_gray: true", phase=netdef.TEST, tops=("data",))
    grey.forward()
    assert grey.blobs["data"].shape == ((4, 1, 12, 16) if db == "color20_png_lmdb" else (4, 3, 12, 16))


def test_data_crop_and_mirror():
    exp = np.load(made("color20_expected.npz"))
    centre = data_net(made("color20_raw_lmdb"), 20, "crop_size: 8", phase=netdef.TEST)
    centre.forward()
    np.testing.assert_array_equal(centre.blobs["data"].data, exp["caffe_bgr_chw"][:, :, 2:10, 4:12])
    net = data_net(made("color20_raw_lmdb"), 20, "crop_size: 8 mirror: true", seed=5)
    net.forward()
    out = net.blobs["data"].data
    seen_offsets, mirrored = set(), 0
    for i in range(20):
        img = exp["caffe_bgr_chw"][i].astype(np.float32)
        found = [(r, c, m) for r in range(5) for c in range(9) for m in (0, 1)
                 if np.array_equal(out[i], img[:, r:r + 8, c:c + 8][:, :, ::-1] if m else img[:, r:r + 8, c:c + 8])]
        assert len(found) == 1, f"item {i} is no crop of its image"
        seen_offsets.add(found[0][:2])
        mirrored += found[0][2]
    assert len(seen_offsets) > 5 and 0 < mirrored < 20


def test_prefetch_matches_reading_in_forward(tmp_path):
    db = indexed_lmdb(tmp_path / "db", 23, shape=(1, 6, 6), random_pixels=True)
    runs = []
    for prefetch in (0, 1, 4):
        net = data_net(db, 5, "crop_size: 4 mirror: true", extra=f"prefetch: {prefetch}", seed=9)
        runs.append(batches(net, 12))
        source_layer(net).close()
    assert_same(runs[0], runs[1])
    assert_same(runs[0], runs[2])
    # The labels show the key order and the wrap-around.
    np.testing.assert_array_equal(np.concatenate([b[1] for b in runs[0]]), np.arange(60) % 23)


def test_prefetching_runs_ahead_in_a_daemon_thread_and_stops(tmp_path):
    db = indexed_lmdb(tmp_path / "db", 50)
    net = data_net(db, 2, extra="prefetch: 3")
    layer = source_layer(net)
    net.forward()
    thread = layer._thread
    assert thread.daemon and thread.is_alive()
    deadline = time.time() + 5
    while layer._queue.qsize() < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert layer._queue.qsize() == 3  # three batches wait while the current one is used
    layer.close()
    assert not thread.is_alive() and layer._thread is None
    net.forward()  # restarts, from the next unconsumed batch
    np.testing.assert_array_equal(net.blobs["label"].data, [2, 3])
    thread = layer._thread
    del net, layer
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()  # a dropped net ends its prefetch thread


def test_corrupt_record_error_names_db_key_and_layer(tmp_path):
    values = {b"%08d" % i: array_to_datum(np.full((1, 2, 2), i, np.uint8), label=i).SerializeToString()
              for i in range(12)}
    values[b"00000006"] = b"\xff\xff\xff\xff garbage"
    values[b"00000010"] = array_to_datum(np.zeros((1, 2, 2), np.uint8)).SerializeToString()[:-3]
    db = write_lmdb(tmp_path / "bad", values)
    for prefetch in (0, 4):
        net = data_net(db, 4, extra=f"prefetch: {prefetch}")
        net.forward()  # records 0..3 are fine, although the prefetcher has already met record 6
        np.testing.assert_array_equal(net.blobs["label"].data, [0, 1, 2, 3])
        with pytest.raises(netdef.LayerError) as err:
            net.forward()
        message = str(err.value)
        assert "'src' (Data)" in message and str(db) in message and "b'00000006'" in message
        with pytest.raises(netdef.LayerError, match="00000006"):
            net.forward()  # stays failed
        source_layer(net).close()
    # A Datum that parses but whose data is shorter than channels x height x width.
    short = {b"%08d" % i: array_to_datum(np.zeros((1, 2, 2), np.uint8), label=i).SerializeToString() for i in range(3)}
    short[b"00000002"] = pb.Datum(channels=1, height=2, width=2, data=b"abc", label=2).SerializeToString()
    net = data_net(write_lmdb(tmp_path / "short", short), 1, extra="prefetch: 0")
    batches(net, 2)
    with pytest.raises(netdef.LayerError, match=r"b'00000002'.*holds 3 bytes"):
        net.forward()


def test_setup_errors_name_the_source(tmp_path):
    with pytest.raises(netdef.NetError, match="nothere"):
        data_net(tmp_path / "nothere", 4)
    write_lmdb(tmp_path / "empty", {})
    with pytest.raises(netdef.NetError, match="holds no records"):
        data_net(tmp_path / "empty", 4)
    db = indexed_lmdb(tmp_path / "db", 3)
    with pytest.raises(netdef.NetError, match="batch_size must be positive"):
        data_net(db, 0)
    with pytest.raises(netdef.NetError, match="cannot read mean file .*no_mean"):
        data_net(db, 1, f'mean_file: "{tmp_path / "no_mean"}"')


def test_legacy_data_param_transform_fields_and_default_backend(tmp_path):
    db = indexed_lmdb(tmp_path / "db", 4, shape=(1, 4, 4))
    # Old nets keep scale/crop_size in data_param and often omit the backend (LEVELDB by default):
    # the fields move to transform_param and a folder holding data.mdb is read as an LMDB.
    net = netdef.Net(f'''layer {{ name: "d" type: "Data" top: "data" top: "label"
        data_param {{ source: "{db}" batch_size: 4 scale: 0.5 crop_size: 2 }} }}''', netdef.TEST)
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, np.arange(4)[:, None, None, None] * np.ones((1, 1, 2, 2)) * 0.5)


# ---------------------------------------------------------------------------------------------- sharding
def epoch_labels(net, batches_per_epoch):
    return np.concatenate([b[1] for b in batches(net, batches_per_epoch)]).astype(int)


@pytest.mark.parametrize("num_ranks", [2, 3])
def test_shards_cover_every_record_once_per_epoch(tmp_path, num_ranks):
    n = 30
    db = indexed_lmdb(tmp_path / "db", n)
    (tmp_path / "imgs").mkdir()
    lst = write_images(tmp_path / "imgs", [np.full((2, 2), i, np.uint8) for i in range(n)])
    h5 = write_h5_files(tmp_path / "h5", [7, 11, 12])
    per_rank = n // num_ranks
    for kind in ("data", "image", "hdf5"):
        seen = []
        for rank in range(num_ranks):
            if kind == "data":
                net = data_net(db, 5, seed=rank)
            elif kind == "image":
                net = image_net(lst, 5, f'root_folder: "{tmp_path / "imgs"}/" shuffle: true is_color: false', seed=rank)
            else:
                net = hdf5_net(h5, 5, shuffle=True, seed=rank)
            source_layer(net).set_shard(rank, num_ranks)
            first = epoch_labels(net, per_rank // 5)
            second = epoch_labels(net, per_rank // 5)
            assert len(set(first)) == per_rank and all(first % num_ranks == rank)
            assert set(second) == set(first)  # the next epoch reads the same records
            seen.extend(first)
            source_layer(net).close()
        assert sorted(seen) == list(range(n)), kind


def test_shard_checks(tmp_path):
    net = data_net(indexed_lmdb(tmp_path / "db", 2), 1)
    layer = source_layer(net)
    with pytest.raises(netdef.LayerError, match="rank"):
        layer.set_shard(2, 2)
    with pytest.raises(netdef.LayerError, match="too few"):
        layer.set_shard(2, 3)
    layer.set_shard(1, 3)
    np.testing.assert_array_equal(epoch_labels(net, 3), [1, 1, 1])
    state = layer.data_state()
    layer.set_shard(0, 3)
    with pytest.raises(netdef.LayerError, match="shard 1 of 3"):
        layer.restore_data_state(state)


def test_uneven_shard_of_odd_size(tmp_path):
    db = indexed_lmdb(tmp_path / "db", 31)
    shares = []
    for rank in range(3):
        net = data_net(db, 1, extra="prefetch: 2")
        source_layer(net).set_shard(rank, 3)
        count = len(range(rank, 31, 3))
        labels = epoch_labels(net, count)
        np.testing.assert_array_equal(labels, np.arange(rank, 31, 3))
        shares.append(labels)
        source_layer(net).close()
    assert sorted(np.concatenate(shares)) == list(range(31))


# ---------------------------------------------------------------------------------------------- resumption
def check_resumption(make, k=5, m=7):
    """Consume k batches, save the state, consume m more (the reference); then a new net (another
    seed) restores the state and must give the same m batches, as must the first net rewound."""
    net = make(123)
    batches(net, k)
    state = source_layer(net).data_state()
    reference = batches(net, m)
    fresh = make(999)
    source_layer(fresh).restore_data_state(state)
    assert_same(batches(fresh, m), reference)
    source_layer(net).restore_data_state(state)  # rewinding discards what was prefetched
    assert_same(batches(net, m), reference)
    # A different seed without the state gives other batches (the check can fail).
    other = make(999)
    batches(other, k)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(batches(other, m), reference))
    for n in (net, fresh, other):
        source_layer(n).close()


def test_resume_data_with_random_crop_mirror_and_rand_skip(tmp_path):
    db = indexed_lmdb(tmp_path / "db", 17, shape=(2, 6, 6), random_pixels=True)
    check_resumption(lambda seed: data_net(db, 3, "crop_size: 4 mirror: true scale: 0.5",
                                           extra="rand_skip: 10", seed=seed))


def test_resume_image_data_with_shuffle_crop_mirror(tmp_path):
    rng = np.random.default_rng(0)
    lst = write_images(tmp_path / "imgs", [rng.integers(0, 256, (7, 9, 3), dtype=np.uint8) for _ in range(11)])
    check_resumption(lambda seed: image_net(lst, 3, f'root_folder: "{tmp_path / "imgs"}/" shuffle: true',
                                            "crop_size: 5 mirror: true", seed=seed), k=4, m=9)


def test_resume_hdf5_with_shuffle(tmp_path):
    h5 = write_h5_files(tmp_path / "h5", [5, 8, 3])
    check_resumption(lambda seed: hdf5_net(h5, 4, shuffle=True, seed=seed), k=3, m=10)


def test_resume_right_after_setup_and_in_sync_mode(tmp_path):
    rng = np.random.default_rng(1)
    lst = write_images(tmp_path / "imgs", [rng.integers(0, 256, (6, 6, 3), dtype=np.uint8) for _ in range(5)])
    make = lambda seed, pf=None: image_net(lst, 2, f'root_folder: "{tmp_path / "imgs"}/" shuffle: true',
                                           "crop_size: 4 mirror: true", seed=seed, prefetch=pf)
    net = make(1)
    state = source_layer(net).data_state()
    reference = batches(net, 6)
    for pf in (0, 2):
        other = make(2, pf)
        source_layer(other).restore_data_state(state)
        assert_same(batches(other, 6), reference)
    with pytest.raises(netdef.LayerError, match="bad header"):
        source_layer(net).restore_data_state(b"junk")
    hdf = hdf5_net(write_h5_files(tmp_path / "h5", [3]), 1)
    with pytest.raises(netdef.LayerError, match="ImageData layer"):
        source_layer(hdf).restore_data_state(state)


def test_seed_fixes_the_sequence(tmp_path):
    db = indexed_lmdb(tmp_path / "db", 9, shape=(1, 5, 5), random_pixels=True)
    a = batches(data_net(db, 4, "crop_size: 3 mirror: true", seed=3), 4)
    b = batches(data_net(db, 4, "crop_size: 3 mirror: true", seed=3), 4)
    c = batches(data_net(db, 4, "crop_size: 3 mirror: true", seed=4), 4)
    assert_same(a, b)
    assert any(not np.array_equal(x[0], y[0]) for x, y in zip(a, c))


# ---------------------------------------------------------------------------------------------- ImageData
def test_image_data_values_resize_and_grey(tmp_path):
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (10, 14, 3), dtype=np.uint8) for _ in range(4)]
    lst = write_images(tmp_path / "imgs", images, labels=[3, 1, 4, 1])
    root = f'root_folder: "{tmp_path / "imgs"}/"'
    net = image_net(lst, 4, root, "scale: 2", phase=netdef.TEST)
    net.forward()
    want = np.stack([im[..., ::-1].transpose(2, 0, 1) for im in images]).astype(np.float32) * 2
    np.testing.assert_array_equal(net.blobs["data"].data, want)
    np.testing.assert_array_equal(net.blobs["label"].data, [3, 1, 4, 1])
    small = image_net(lst, 2, root + " new_height: 5 new_width: 6 is_color: false", phase=netdef.TEST)
    small.forward()
    assert small.blobs["data"].shape == (2, 1, 5, 6)
    for i in range(2):
        grey = read_image(tmp_path / "imgs" / f"img{i:03d}.png", is_color=False)
        np.testing.assert_array_equal(small.blobs["data"].data[i], resize(grey, 5, 6))
    # The root folder without its trailing slash still finds the files.
    plain = image_net(lst, 1, f'root_folder: "{tmp_path / "imgs"}"', phase=netdef.TEST)
    plain.forward()
    with pytest.raises(netdef.NetError, match="new_height and new_width"):
        image_net(lst, 1, root + " new_height: 5")


def test_image_data_shuffles_every_epoch(tmp_path):
    lst = write_images(tmp_path / "imgs", [np.full((2, 2), i, np.uint8) for i in range(12)])
    net = image_net(lst, 4, f'root_folder: "{tmp_path / "imgs"}/" shuffle: true is_color: false', seed=0)
    epochs = [epoch_labels(net, 3) for _ in range(3)]
    for e in epochs:
        assert sorted(e) == list(range(12))
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    assert not np.array_equal(epochs[0], np.arange(12))
    # The pixels follow their labels.
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data[:, 0, 0, 0], net.blobs["label"].data)


def test_image_data_missing_file_error_names_it(tmp_path):
    lst = write_images(tmp_path / "imgs", [np.zeros((3, 3), np.uint8)] * 3)
    (tmp_path / "imgs" / "img001.png").unlink()
    net = image_net(lst, 1, f'root_folder: "{tmp_path / "imgs"}/"')
    net.forward()
    with pytest.raises(netdef.LayerError, match=r"'images' \(ImageData\).*img001\.png.*line 2"):
        net.forward()
    with pytest.raises(netdef.NetError, match="cannot open image list"):
        image_net(tmp_path / "nolist.txt", 1)


# ---------------------------------------------------------------------------------------------- HDF5
def test_hdf5_data_reads_files_in_order(tmp_path):
    h5 = write_h5_files(tmp_path / "h5", [3, 4])
    net = hdf5_net(h5, 5)
    assert net.blobs["data"].shape == (5, 2, 3) and net.blobs["label"].shape == (5,)
    got = batches(net, 3)
    labels = np.concatenate([b[1] for b in got])
    np.testing.assert_array_equal(labels, np.arange(15) % 7)
    np.testing.assert_array_equal(got[0][0][:, 0, 0], labels[:5])
    assert got[0][1].dtype == np.float32


def test_hdf5_output_then_hdf5_data_round_trip(tmp_path):
    import h5py

    out = tmp_path / "out.h5"
    net = netdef.Net(f'''
        layer {{ name: "in" type: "Input" top: "data" top: "label"
                 input_param {{ shape {{ dim: 4 dim: 2 dim: 3 dim: 2 }} shape {{ dim: 4 }} }} }}
        layer {{ name: "out" type: "HDF5Output" bottom: "data" bottom: "label"
                 hdf5_output_param {{ file_name: "{out}" }} }}''', netdef.TEST)
    rng = np.random.default_rng(3)
    x1, y1 = rng.standard_normal((4, 2, 3, 2)).astype(np.float32), np.arange(4, dtype=np.float32)
    x2, y2 = rng.standard_normal((4, 2, 3, 2)).astype(np.float32), np.arange(4, 8, dtype=np.float32)
    net.forward(data=x1, label=y1)
    with h5py.File(out, "r") as h5:
        assert h5["data"].shape == (4, 2, 3, 2) and h5["label"].shape == (4, 1, 1, 1)  # Caffe's 4-axis shapes
        np.testing.assert_array_equal(h5["data"][...], x1)
    net.forward(data=x2, label=y2)  # appended
    (tmp_path / "list.txt").write_text(f"{out}\n")
    reader = hdf5_net(tmp_path / "list.txt", 8)
    reader.forward()
    np.testing.assert_array_equal(reader.blobs["data"].data, np.concatenate([x1, x2]))
    np.testing.assert_array_equal(reader.blobs["label"].data.reshape(8), np.concatenate([y1, y2]))


def hdf5_output_net(out):
    return netdef.Net(f'''
        layer {{ name: "in" type: "Input" top: "data" top: "label"
                 input_param {{ shape {{ dim: 2 dim: 3 }} shape {{ dim: 2 }} }} }}
        layer {{ name: "out" type: "HDF5Output" bottom: "data" bottom: "label"
                 hdf5_output_param {{ file_name: "{out}" }} }}''', netdef.TEST)


def test_hdf5_output_writes_nothing_until_the_first_forward(tmp_path):
    out = tmp_path / "features.h5"
    net = hdf5_output_net(out)
    assert not out.exists()
    net.forward(data=np.ones((2, 3), np.float32), label=np.zeros(2, np.float32))
    assert out.exists()


def test_hdf5_output_replaces_only_its_own_files(tmp_path):
    import h5py

    out = tmp_path / "features.h5"
    hdf5_output_net(out).forward(data=np.ones((2, 3), np.float32), label=np.zeros(2, np.float32))
    before = out.read_bytes()
    second = hdf5_output_net(out)  # building the net leaves the earlier output as it was
    assert out.read_bytes() == before
    second.forward(data=np.full((2, 3), 7, np.float32), label=np.ones(2, np.float32))
    with h5py.File(out, "r") as h5:
        np.testing.assert_array_equal(h5["data"][...].reshape(2, 3), np.full((2, 3), 7))  # replaced, not appended


@pytest.mark.parametrize("kind", ["text file", "foreign HDF5", "fifo"])
def test_hdf5_output_refuses_to_destroy_other_files(tmp_path, kind):
    import h5py

    target = tmp_path / "precious"
    if kind == "text file":
        target.write_text("my notes\n")
        reason = "not an HDF5 file"
    elif kind == "foreign HDF5":
        write_h5_files(tmp_path / "h5", [3])
        target = tmp_path / "h5" / "part0.h5"
        reason = "an HDF5 file that netdef's HDF5Output did not write"
    else:
        os.mkfifo(target)
        reason = "not a regular file"
    before = None if kind == "fifo" else target.read_bytes()
    with pytest.raises(netdef.NetError, match=rf"layer 'out' \(HDF5Output\).*refusing to replace {target}: it exists "
                                              rf"and is {re.escape(reason)}.*remove it or choose another"):
        hdf5_output_net(target)
    if before is not None:
        assert target.read_bytes() == before
    if kind == "foreign HDF5":
        with h5py.File(target, "r") as h5:
            assert h5["data"].shape[0] == 3


def test_hdf5_output_rechecks_at_the_first_forward(tmp_path):
    out = tmp_path / "late.txt"
    net = hdf5_output_net(out)
    out.write_text("appeared after setup\n")
    with pytest.raises(netdef.LayerError, match="not an HDF5 file"):
        net.forward(data=np.ones((2, 3), np.float32), label=np.zeros(2, np.float32))
    assert out.read_text() == "appeared after setup\n"


def test_hdf5_errors(tmp_path):
    import h5py

    h5 = write_h5_files(tmp_path / "h5", [2, 2])
    with pytest.raises(netdef.NetError, match="no dataset 'weights'"):
        netdef.Net(f'''layer {{ name: "h" type: "HDF5Data" top: "weights"
            hdf5_data_param {{ source: "{h5}" batch_size: 1 }} }}''', netdef.TRAIN)
    with pytest.raises(netdef.NetError, match="does not transform"):
        netdef.Net(f'''layer {{ name: "h" type: "HDF5Data" top: "data"
            hdf5_data_param {{ source: "{h5}" batch_size: 1 }} transform_param {{ scale: 2 }} }}''', netdef.TRAIN)
    (tmp_path / "missing.txt").write_text(str(tmp_path / "gone.h5"))
    with pytest.raises(netdef.NetError, match="gone.h5"):
        hdf5_net(tmp_path / "missing.txt", 1)
    with h5py.File(tmp_path / "h5" / "part1.h5", "a") as f:
        del f["label"]
        f["label"] = np.arange(3)
    with pytest.raises(netdef.NetError, match="part1.h5.*3 rows"):
        hdf5_net(h5, 1)


def test_data_reads_leveldb_when_plyvel_is_there(tmp_path):
    pytest.importorskip("plyvel")
    from netdef.data.convert import convert_mnist, write_idx

    write_idx(tmp_path / "i", np.arange(5 * 4, dtype=np.uint8).reshape(5, 2, 2))
    write_idx(tmp_path / "l", np.arange(5, dtype=np.uint8))
    convert_mnist(tmp_path / "i", tmp_path / "l", tmp_path / "ldb", backend="leveldb")
    make = lambda: netdef.Net(f'''layer {{ name: "d" type: "Data" top: "data" top: "label"
        data_param {{ source: "{tmp_path / "ldb"}" batch_size: 3 backend: LEVELDB }} }}''', netdef.TEST)
    train, test = make(), make()  # two readers of one LevelDB in one process
    for net in (train, test):
        np.testing.assert_array_equal(epoch_labels(net, 2), [0, 1, 2, 3, 4, 0])
    np.testing.assert_array_equal(train.blobs["data"].data[0, 0], [[12, 13], [14, 15]])


# --------------------------------------------------------------- other files' contents stay out
SECRET = "root:x:0:0:secret-token:/root:/bin/bash"


@pytest.mark.parametrize("layer", ["ImageData", "HDF5Data"])
def test_a_list_that_is_not_a_list_is_not_quoted(tmp_path, layer):
    """source may name any file (a model from elsewhere: /etc/passwd): its lines must not reach the message."""
    other = tmp_path / "passwd"
    other.write_text(SECRET + "\n" + SECRET.replace("root", "daemon") + "\n")
    param = ("image_data_param" if layer == "ImageData" else "hdf5_data_param")
    with pytest.raises(netdef.NetError) as info:
        netdef.Net(f'''layer {{ name: "src" type: "{layer}" top: "data" top: "label"
                   {param} {{ source: "{other}" batch_size: 1 }} }}''', netdef.TRAIN)
    message = str(info.value)
    assert "secret-token" not in message and "/bin/bash" not in message
    assert re.search(rf"(line|entry) 1 of {re.escape(str(other))}", message)


def test_a_missing_image_with_an_image_name_is_still_named(tmp_path):
    lst = write_images(tmp_path / "imgs", [np.zeros((3, 3), np.uint8)])
    with open(lst, "a") as handle:
        handle.write("gone.png 0\n")
    net = image_net(lst, 2, f'root_folder: "{tmp_path / "imgs"}/"')
    with pytest.raises(netdef.LayerError, match=r"gone\.png: no such file \(line 2 of"):
        net.forward()


# ---------------------------------------------------------------------------------------------- threads
def test_batches_on_several_data_threads_equal_those_of_one(tmp_path, monkeypatch):
    """Real JPEGs in an encoded LMDB (convert-imageset) and in an image list, decoded and transformed
    (random crop, mirror, mean image) on 1 and on 3 threads: the same batches for the same seed."""
    from netdef.data.convert import compute_image_mean, convert_imageset

    rng = np.random.default_rng(5)
    sizes = [(12, 12)] * 9 + [(14, 13)] * 4  # ImageData items of two sizes: two groups of draws
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    lst = write_images(tmp_path / "imgs", images, ext="jpg")
    root = f"{tmp_path / 'imgs'}/"
    db = tmp_path / "db"
    convert_imageset(root, lst, db, resize_height=12, resize_width=12, encoded=True, encode_type="jpg")
    compute_image_mean(db, tmp_path / "mean.binaryproto")
    transform = f'crop_size: 9 mirror: true mean_file: "{tmp_path / "mean.binaryproto"}" scale: 0.5'
    runs = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("NETDEF_DATA_THREADS", threads)
        data = data_net(db, 5, transform, seed=11)
        images_net = image_net(lst, 5, f'root_folder: "{root}" shuffle: true', "crop_size: 9 mirror: true "
                               "mean_value: 100 mean_value: 110 mean_value: 120", seed=11)
        assert source_layer(data).worker_threads == int(threads)
        runs[threads] = (batches(data, 6), batches(images_net, 6))
        source_layer(data).close()
        source_layer(images_net).close()
    assert_same(runs["1"][0], runs["3"][0])
    assert_same(runs["1"][1], runs["3"][1])
    assert runs["1"][0][0][0].shape == (5, 3, 9, 9)
    monkeypatch.setenv("NETDEF_DATA_THREADS", "none")
    with pytest.raises(netdef.NetError, match="NETDEF_DATA_THREADS='none': expected a positive number"):
        data_net(db, 5)


def test_items_decoded_into_reused_buffers_are_each_file_s_own_pixels(tmp_path, monkeypatch):
    """A batch's items are decoded into memory that the same position of the next batch reuses
    (item_buffers.py): over several batches, with 7 JPEGs in batches of 3 (each position meets
    every file) on 2 threads, every row is its own file's pixels less the mean, nothing of another."""
    monkeypatch.setenv("NETDEF_DATA_THREADS", "2")
    rng = np.random.default_rng(8)
    images = [rng.integers(0, 256, (10, 11, 3), dtype=np.uint8) for _ in range(7)]
    lst = write_images(tmp_path / "imgs", images, ext="jpg")
    root = tmp_path / "imgs"
    names = [line.split()[0] for line in open(lst)]
    net = image_net(lst, 3, f'root_folder: "{root}/"', "mean_value: 100 mean_value: 110 mean_value: 120")
    layer = source_layer(net)
    means = np.array([100, 110, 120], np.float32)[:, None, None]
    for batch in range(5):
        net.forward()
        for row in range(3):
            name = names[(3 * batch + row) % len(names)]
            expected = read_image(root / name).astype(np.float32) - means
            np.testing.assert_array_equal(net.blobs["data"].data[row], expected)
    assert layer.item_buffers.held_bytes() == 3 * 10 * 11 * 3, "one buffer per batch position, reused"
    layer.close()
