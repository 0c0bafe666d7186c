"""DataTransformer against a per-pixel transcription of Caffe's DataTransformer::Transform loops, with
the same random decisions; plus the phase rules and the checks Caffe makes."""
from __future__ import annotations

import numpy as np
import pytest

from netdef.data.datum import write_mean_file
from netdef.data.transform import DataTransformer, TransformError
from netdef.proto import netdef_pb2 as pb
from tests.helpers import shared_path


def param(**fields) -> pb.TransformationParameter:
    p = pb.TransformationParameter()
    for key, value in fields.items():
        if key == "mean_value":
            p.mean_value.extend(value)
        else:
            setattr(p, key, value)
    return p


def caffe_loops(batch, p, phase, mirror, h_off, w_off, mean=None):
    """Caffe's Transform(datum) loop nest for each item, given its mirror flag and offsets."""
    n, c, h, w = batch.shape
    crop = p.crop_size
    oh, ow = (crop, crop) if crop else (h, w)
    out = np.zeros((n, c, oh, ow), np.float32)
    mv = list(p.mean_value) * (c if len(p.mean_value) == 1 else 1)
    scale = np.float32(p.scale)
    for i in range(n):
        ho, wo = (h_off[i], w_off[i]) if crop else (0, 0)
        for ch in range(c):
            for y in range(oh):
                for x in range(ow):
                    src = (ch, ho + y, wo + x)
                    xi = ow - 1 - x if mirror[i] else x
                    v = np.float32(batch[i][src])
                    if mean is not None:
                        v = np.float32(v - mean[src])
                    elif mv:
                        v = np.float32(v - np.float32(mv[ch]))
                    out[i, ch, y, xi] = np.float32(v * scale)
    return out


def decisions(p, phase, n, h, w, seed):
    """The draws DataTransformer makes, in its order: mirror flags, then row and column offsets."""
    rng = np.random.default_rng(seed)
    mirror = rng.integers(0, 2, size=n).astype(bool) if p.mirror else np.zeros(n, bool)
    crop = p.crop_size
    if crop and phase == pb.TRAIN:
        return mirror, rng.integers(0, h - crop + 1, size=n), rng.integers(0, w - crop + 1, size=n)
    return mirror, np.full(n, (h - crop) // 2), np.full(n, (w - crop) // 2)


CASES = [
    dict(scale=0.5),
    dict(mean_value=[10.5]),
    dict(mean_value=[1, 2, 3], scale=2.0),
    dict(crop_size=3),
    dict(crop_size=4, mirror=True, mean_value=[7], scale=0.25),
    dict(mirror=True),
    dict(crop_size=5, mirror=True, scale=0.00390625),
]


@pytest.mark.parametrize("fields", CASES)
@pytest.mark.parametrize("phase", [pb.TRAIN, pb.TEST])
def test_matches_caffe_loops(fields, phase):
    p = param(**fields)
    batch = np.random.default_rng(0).integers(0, 256, (6, 3, 5, 7), dtype=np.uint8)
    got = DataTransformer(p, phase)(batch, np.random.default_rng(11))
    mirror, h_off, w_off = decisions(p, phase, 6, 5, 7, 11)
    np.testing.assert_array_equal(got, caffe_loops(batch, p, phase, mirror, h_off, w_off))
    assert got.dtype == np.float32


def test_mean_file_is_cropped_and_mirrored_with_the_pixels(tmp_path):
    rng = np.random.default_rng(1)
    mean = rng.uniform(0, 255, (1, 2, 6, 6)).astype(np.float32)
    write_mean_file(tmp_path / "mean.binaryproto", mean)
    batch = rng.integers(0, 256, (8, 2, 6, 6), dtype=np.uint8)
    for phase in (pb.TRAIN, pb.TEST):
        p = param(mean_file=str(tmp_path / "mean.binaryproto"), crop_size=4, mirror=True, scale=0.5)
        got = DataTransformer(p, phase)(batch, np.random.default_rng(3))
        mirror, h_off, w_off = decisions(p, phase, 8, 6, 6, 3)
        np.testing.assert_array_equal(got, caffe_loops(batch, p, phase, mirror, h_off, w_off, mean[0]))


def test_caffe_mean_file_fixture():
    mean_path = shared_path("fixtures", "caffe-ref", "caffe-made", "color20_mean.binaryproto")
    exp = np.load(shared_path("fixtures", "caffe-ref", "caffe-made", "color20_expected.npz"))
    t = DataTransformer(param(mean_file=str(mean_path), scale=0.1), pb.TEST)
    got = t(exp["caffe_bgr_chw"])
    np.testing.assert_array_equal(got, (exp["caffe_bgr_chw"].astype(np.float32) - exp["mean_bgr"]) * np.float32(0.1))


def test_phase_rules():
    batch = np.arange(2 * 1 * 6 * 6, dtype=np.float32).reshape(2, 1, 6, 6)
    # TEST crops the centre; no Generator is needed when nothing is random.
    test = DataTransformer(param(crop_size=2), pb.TEST)
    assert not test.needs_random
    np.testing.assert_array_equal(test(batch), batch[:, :, 2:4, 2:4])
    # TRAIN crops at random: over many items every offset shows up.
    train = DataTransformer(param(crop_size=4), pb.TRAIN)
    many = np.broadcast_to(batch[:1], (200, 1, 6, 6))
    corners = {float(v) for v in train(many, np.random.default_rng(0))[:, 0, 0, 0]}
    assert corners == {float(batch[0, 0, r, c]) for r in range(3) for c in range(3)}
    with pytest.raises(TransformError, match="Generator"):
        train(batch)
    # Mirroring is random in both phases (Caffe's do_mirror = mirror() && Rand(2), whatever the phase).
    for phase in (pb.TRAIN, pb.TEST):
        out = DataTransformer(param(mirror=True), phase)(many, np.random.default_rng(1))
        flipped = (out[:, 0, 0, 0] == batch[0, 0, 0, 5]).mean()
        assert 0.35 < flipped < 0.65


def test_checks_caffe_makes(tmp_path):
    with pytest.raises(TransformError, match="force_color and force_gray"):
        DataTransformer(param(force_color=True, force_gray=True))
    write_mean_file(tmp_path / "m", np.zeros((1, 1, 4, 4), np.float32))
    with pytest.raises(TransformError, match="mean_file and mean_value"):
        DataTransformer(param(mean_file=str(tmp_path / "m"), mean_value=[1]))
    t = DataTransformer(param(mean_file=str(tmp_path / "m")))
    with pytest.raises(TransformError, match="differs from the mean image"):
        t(np.zeros((1, 1, 5, 5), np.uint8))
    with pytest.raises(TransformError, match="1 mean_value or as many as channels: 3"):
        DataTransformer(param(mean_value=[1, 2]))(np.zeros((1, 3, 2, 2), np.uint8))
    with pytest.raises(TransformError, match="smaller than crop_size 3"):
        DataTransformer(param(crop_size=3), pb.TEST).output_shape((1, 2, 5))
    assert DataTransformer(param(force_gray=True)).decode_color is False
    assert DataTransformer(param(force_color=True)).decode_color is True
    assert DataTransformer(param()).decode_color is None


def test_transform_items_of_several_sizes():
    rng = np.random.default_rng(2)
    items = [rng.integers(0, 256, (1, h, w), dtype=np.uint8) for h, w in [(4, 4), (5, 6), (4, 4), (7, 5)]]
    t = DataTransformer(param(crop_size=3), pb.TEST)
    out = t.transform_items(items)
    assert out.shape == (4, 1, 3, 3)
    for got, item in zip(out, items):
        h, w = item.shape[1:]
        np.testing.assert_array_equal(got, item[:, (h - 3) // 2:(h - 3) // 2 + 3, (w - 3) // 2:(w - 3) // 2 + 3])
    with pytest.raises(TransformError, match="b.png"):
        DataTransformer(param()).transform_items(items[:2], names=["a.png", "b.png"])


@pytest.mark.parametrize("phase", [pb.TRAIN, pb.TEST])
def test_several_threads_write_the_batch_of_one(tmp_path, phase):
    # Items of two sizes (two groups of draws), strided views as the decoder gives them, a mean image.
    from netdef.data.workers import SERIAL, DataWorkers

    rng = np.random.default_rng(4)
    write_mean_file(tmp_path / "mean", rng.uniform(0, 255, (1, 3, 9, 9)).astype(np.float32))
    p = param(crop_size=5, mirror=True, scale=0.5, mean_value=[3, 4, 5])
    hwc = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(9, 9), (7, 8)] * 10]
    items = [im[:, :, ::-1].transpose(2, 0, 1) for im in hwc]
    workers = DataWorkers(3, name="test-transform")
    for p in (p, param(mean_file=str(tmp_path / "mean"), mirror=True, crop_size=5)):
        t = DataTransformer(p, phase)
        same_size = items[::2]
        serial = t.transform_items(same_size, np.random.default_rng(7))
        parallel = t.transform_items(same_size, np.random.default_rng(7), workers=workers)
        np.testing.assert_array_equal(parallel, serial)
        # The batch of equal items equals the batch transformation of their stack (the draws agree).
        np.testing.assert_array_equal(serial, t(np.stack(same_size), np.random.default_rng(7)))
        # Another seed mirrors (and in TRAIN crops) otherwise: the comparisons above can fail.
        assert not np.array_equal(serial, t.transform_items(same_size, np.random.default_rng(8), workers=SERIAL))
    t = DataTransformer(param(crop_size=5, mirror=True, mean_value=[3, 4, 5]), phase)
    np.testing.assert_array_equal(t.transform_items(items, np.random.default_rng(9), workers=workers),
                                  t.transform_items(items, np.random.default_rng(9)))
    workers.close()
