"""The direct convolution path (layers/direct.py, jit/direct_conv.py, jit/microkernels.py): Caffe's
convolution by definition and as the original Caffe computed its cases, its gradients numerically,
the column path's results, and the same bits whatever the thread count."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from netdef.layers import direct, jit
from netdef.layers import im2col as im2col_mod
from netdef.layers.im2col import Geometry
from netdef.layers.jit import microkernels
from tests.helpers import TEST, TRAIN, build, check_gradients, layer_case_names, parse_layer, run_caffe_case
from tests.layers.test_vision import CONV_GRAD_CONFIGS, NAIVE_CONFIGS, conv_text, naive_conv, two_passes

RNG = np.random.default_rng(20261125)


@pytest.fixture(autouse=True)
def every_convolution_direct(monkeypatch):
    """The tests' small convolutions take the direct path however few their taps (by default only
    MIN_TAPS or more per group do)."""
    monkeypatch.setattr(direct, "MIN_TAPS", 1)


def ids(fields):
    return ",".join(f"{k}={v}" for k, v in fields.items())


@pytest.mark.parametrize("fields,stride,pad,dil,group", NAIVE_CONFIGS)
def test_direct_matches_naive_reference(fields, stride, pad, dil, group):
    x = RNG.standard_normal((2, 6 if group == 3 else 3, 7, 8))
    kh = fields.get("kernel_h", fields.get("kernel_size"))
    kw = fields.get("kernel_w", fields.get("kernel_size"))
    w = RNG.standard_normal((fields["num_output"], x.shape[1] // group, kh, kw))
    b = RNG.standard_normal(fields["num_output"])
    layer, bottom, top = build(parse_layer(conv_text(**fields)), [x], 1, params=[w, b])
    assert layer.algorithm in ("direct", "pointwise")
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, naive_conv(x, w, b, stride, pad, dil, group), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fields", CONV_GRAD_CONFIGS, ids=ids)
def test_direct_gradients(fields):
    layer = check_gradients(parse_layer(conv_text(**fields)), [RNG.standard_normal((2, 4, 5, 6))])
    assert layer.algorithm in ("direct", "pointwise")


@pytest.mark.parametrize("name", layer_case_names(("conv_",)))
def test_caffe_conv_cases_on_the_direct_path(monkeypatch, name):
    """What the original Caffe computed for its convolution cases, forward and backward, on the
    direct path wherever it applies (the row path, which some of these shapes would take, off)."""
    monkeypatch.setattr(im2col_mod, "ROW_PRODUCTS", False)
    run_caffe_case(name)


# Shapes past one channel block (the kernels compute 32 float channels, 16 double on AVX-512), rows
# wider than one call's pixels, groups, dilation, both input gradients.
WIDE_CONFIGS = [
    (dict(num_output=70, kernel_size=3, pad=1), (2, 9, 30, 29)),
    (dict(num_output=36, kernel_size=5, pad=2, group=3), (3, 12, 11, 17)),
    (dict(num_output=33, kernel_size=3, dilation=2, pad=2), (2, 40, 9, 10)),
    (dict(num_output=40, kernel_size=5, stride=2, pad=1), (2, 5, 15, 14)),
    (dict(num_output=20, kernel_size=5), (3, 1, 16, 16)),  # a first layer: col2im's input gradient
    (dict(num_output=40, kernel_size=3, pad=1), (2, 8, 32, 32)),  # 4 KiB planes: blocked, then copied out
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fields,shape", WIDE_CONFIGS, ids=[ids(f) for f, _ in WIDE_CONFIGS])
def test_direct_matches_column_path(monkeypatch, fields, shape, dtype):
    """Two bottoms sharing the weights, two iterations (the weight gradient accumulates): outputs and
    every gradient as the column path's, to rounding."""
    text = parse_layer(conv_text(**fields))
    xs = [RNG.standard_normal(shape).astype(dtype) for _ in range(2)]
    layer, _, top = build(text, xs, 2, dtype=dtype)
    params = [p.data.copy() for p in layer.blobs]
    dys = [RNG.standard_normal(top[0].shape).astype(dtype) for _ in range(2)]

    def run(enabled):
        monkeypatch.setattr(direct, "ENABLED", enabled)
        lay, bot, tp = build(text, xs, 2, params=params, dtype=dtype)
        assert (lay.algorithm == "direct") == enabled
        return two_passes(lay, bot, tp, xs, dys)

    tolerance = 2e-5 if dtype == np.float32 else 1e-12
    for got, want in zip(run(True), run(False)):
        assert got.dtype == want.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * np.abs(want).max())


def test_direct_input_gradient_choice():
    """The direct forward of the padded top gradient where it costs at most DIRECT_INPUT_GRADIENT_ABOVE
    times col2im's product; col2im for strides, shrinking maps and a first layer's few channels."""
    def choice(channels, size, kernel, stride=1, pad=0):
        geom = Geometry((kernel, kernel), (stride, stride), (pad, pad), (1, 1))
        return direct.input_gradient(geom, channels, 1, (size, size), geom.conv_out((size, size)), np.float32)

    assert choice(32, 16, 5, pad=2) == "direct"     # CIFAR-10 conv2
    assert choice(64, 56, 3, pad=1) == "direct"     # ResNet's 3x3
    assert choice(16, 28, 5, pad=2) == "direct"     # 16 channels computed as 32: twice col2im's
    assert choice(20, 12, 5) == "col2im"            # LeNet conv2: 144 / 64 cells, 20 channels as 32
    assert choice(3, 32, 5, pad=2) == "col2im"      # 3 channels computed as 32
    assert choice(64, 15, 3, stride=2) == "col2im"


def test_row_path_where_it_beats_the_direct_one():
    """Where the row-product path applies, it takes the backward of narrow outputs (under 5 wide) of a TRAIN
    net, and the input gradient of the convolutions whose direct input gradient would be col2im's (their
    forward and weight gradient stay direct); the direct path the rest (and everything the rows cannot)."""
    def algorithm(channels, size, phase=TRAIN, **fields):
        layer, _, _ = build(parse_layer(conv_text(**fields), phase), [np.zeros((1, channels, size, size), np.float32)],
                            1, dtype=np.float32)
        return layer.algorithm_summary()

    assert algorithm(32, 16, num_output=32, kernel_size=5, pad=2) == "direct/direct"   # CIFAR-10 conv2
    assert algorithm(20, 12, num_output=50, kernel_size=5) == "direct/rows-col2im"     # LeNet conv2
    assert algorithm(20, 12, TEST, num_output=50, kernel_size=5) == "direct/col2im"  # forward only
    assert algorithm(512, 7, num_output=512, kernel_size=3, pad=1) == "direct/direct"  # ResNet's 7 x 7
    assert algorithm(128, 4, num_output=128, kernel_size=3, pad=1) == "direct+rows/convolution"  # narrow
    assert algorithm(128, 4, TEST, num_output=128, kernel_size=3, pad=1) == "direct/direct"  # forward only
    assert algorithm(512, 7, TEST, num_output=512, kernel_size=3, pad=1) == "direct/direct"  # forward only
    assert algorithm(512, 7, num_output=512, kernel_size=3, pad=1, group=2) == "direct/direct"  # no rows
    assert algorithm(3, 32, num_output=32, kernel_size=5, pad=2) == "direct/col2im"    # CIFAR-10 conv1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_weight_gradient_beside_the_row_input_gradient(monkeypatch, dtype):
    """LeNet's conv2 in a TRAIN net: the direct forward and weight gradient, the row path's col2im input
    gradient. Two bottoms sharing the weights, two iterations: every result as the column path's, to
    rounding; and its gradients numerically."""
    fields = dict(num_output=50, kernel_size=5)
    text = parse_layer(conv_text(**fields))
    xs = [RNG.standard_normal((3, 20, 12, 12)).astype(dtype) for _ in range(2)]
    layer, _, top = build(text, xs, 2, dtype=dtype)
    assert layer.algorithm_summary() == "direct/rows-col2im"
    params = [p.data.copy() for p in layer.blobs]
    dys = [RNG.standard_normal(top[0].shape).astype(dtype) for _ in range(2)]

    def run(combined):
        monkeypatch.setattr(direct, "ENABLED", combined)
        monkeypatch.setattr(im2col_mod, "ROW_PRODUCTS", combined)
        lay, bot, tp = build(text, xs, 2, params=params, dtype=dtype)
        assert lay.algorithm_summary() == ("direct/rows-col2im" if combined else "columns")
        return two_passes(lay, bot, tp, xs, dys)

    tolerance = 2e-5 if dtype == np.float32 else 1e-12
    for got, want in zip(run(True), run(False)):
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * np.abs(want).max())
    monkeypatch.setattr(direct, "ENABLED", True)
    monkeypatch.setattr(im2col_mod, "ROW_PRODUCTS", True)
    # 5 x 5 over 9 x 9: the direct input gradient would cost 81/25 of col2im's on any vector width
    checked = check_gradients(parse_layer(conv_text(num_output=5, kernel_size=5)), [RNG.standard_normal((2, 22, 9, 9))])
    assert checked.algorithm_summary() == "direct/rows-col2im"


def test_direct_results_do_not_depend_on_the_thread_count():
    """Every output and gradient element is one sum in a fixed order: one thread and all of them give
    the same bits (what exact resume and the distributed equivalence rest on)."""
    text = parse_layer(conv_text(num_output=40, kernel_size=3, pad=1))
    x = RNG.standard_normal((5, 24, 13, 14)).astype(np.float32)
    layer, _, top = build(text, [x], 1, dtype=np.float32)
    params = [p.data.copy() for p in layer.blobs]
    dy = RNG.standard_normal(top[0].shape).astype(np.float32)

    def run(threads):
        previous = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            lay, bot, tp = build(text, [x], 1, params=params, dtype=np.float32)
            lay.forward(bot, tp)
            tp[0].diff = dy
            lay.backward(tp, [True], bot)
            return [tp[0].data.copy(), bot[0].diff.copy()] + [p.diff.copy() for p in lay.blobs]
        finally:
            numba.set_num_threads(previous)

    for one, many in zip(run(1), run(numba.config.NUMBA_NUM_THREADS)):
        np.testing.assert_array_equal(one, many)


@pytest.mark.parametrize("block_rows, chunk_bytes", [(1, 16 << 10), (3, 1 << 10), (8, 16 << 10), (8, 64 << 10)])
def test_direct_results_do_not_depend_on_the_blocking(monkeypatch, block_rows, chunk_bytes):
    """Rows per work item and taps per weight chunk are tuning only: the same bits as 4 rows and 32 KiB."""
    text = parse_layer(conv_text(num_output=40, kernel_size=3, pad=1))
    x = RNG.standard_normal((3, 30, 13, 14)).astype(np.float32)
    layer, _, top = build(text, [x], 1, dtype=np.float32)
    params = [p.data.copy() for p in layer.blobs]
    dy = RNG.standard_normal(top[0].shape).astype(np.float32)

    def run(rows, chunk):
        monkeypatch.setattr(direct, "BLOCK_ROWS", rows)
        monkeypatch.setattr(direct, "TAP_CHUNK_BYTES", chunk)
        lay, bot, tp = build(text, [x], 1, params=params, dtype=np.float32)
        assert lay.algorithm == "direct"
        lay.forward(bot, tp)
        tp[0].diff = dy
        lay.backward(tp, [True], bot)
        return [tp[0].data.copy(), bot[0].diff.copy()] + [p.diff.copy() for p in lay.blobs]

    for reference, got in zip(run(4, 32 << 10), run(block_rows, chunk_bytes)):
        np.testing.assert_array_equal(reference, got)


def test_row_blocks_shrink_until_every_thread_has_work():
    geom = Geometry((3, 3), (1, 1), (1, 1), (1, 1))

    def rows(num, hw, threads):
        conv = direct.DirectConvolution(geom, num, 512, 512, 1, (hw, hw), (hw, hw), np.float32)
        return direct.block_rows(conv.forward_dir, threads)

    # 512 outputs in blocks of the kernels' vector width: 16 blocks on AVX-512, 32 on AVX2
    blocks = -(-512 // microkernels.shape_for(np.dtype(np.float32)).channels)
    assert direct.MIN_ITEMS_PER_THREAD == 4
    assert rows(2, 56, 2) == direct.BLOCK_ROWS == 8
    # One row block of 8 rows gives `blocks` items of the 4 * blocks wanted; 2 rows, 4 row blocks.
    assert rows(1, 7, blocks) == 2
    assert rows(1, 14, 4 * blocks) == 1  # 14 row blocks of 1 row: still fewer than wanted
    assert rows(8, 7, blocks) == 8


def test_direct_only_where_it_applies(monkeypatch):
    monkeypatch.setattr(direct, "MIN_TAPS", 32)
    planes = (32, 32)  # 4 KiB of float32: blocked sums, copied out
    assert direct.usable(np.float32, 2, 1, 3, (5, 5), planes)      # CIFAR-10's first layer: 75 taps
    assert direct.usable(np.float64, 2, 2, 16, (3, 3), planes)     # 8 channels per group: 72 taps
    assert not direct.usable(np.float32, 2, 1, 3, (3, 3), planes)  # 27 taps: the column path
    assert not direct.usable(np.float32, 2, 1, 3, (3, 3), (224, 224))  # VGG's first layer
    assert direct.usable(np.float32, 2, 1, 3, (3, 3), (113, 113))  # SqueezeNet's: written in place
    assert direct.usable(np.float32, 2, 1, 1, (5, 5), (24, 24))    # LeNet's: 25 taps
    assert not direct.usable(np.float64, 2, 1, 3, (3, 3), (32, 32))  # 8 KiB float64 planes too
    assert not direct.usable(np.float32, 2, 1, 64, (1, 1), planes)  # 1x1: a matrix product
    assert not direct.usable(np.float16, 2, 1, 8, (5, 5), planes)
    assert not direct.usable(np.float32, 3, 1, 8, (5, 5), planes)   # 3-D convolutions: the column path
    assert not direct.usable(np.float32, 2, 8, 8, (5, 5), planes)   # depthwise: its own kernels
    monkeypatch.setattr(jit, "ENABLED", False)
    assert not direct.usable(np.float32, 2, 1, 8, (5, 5), planes)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_microkernels_compute_their_sums(dtype):
    """One call of each kernel family on hand-made operands: the taps kernels' block of outputs from
    zero into partial sums, and from partial sums, with the bias, into NCHW rows (the channels past
    ``valid`` untouched); the pixels kernel's accumulation onto what dw held."""
    kernels = microkernels.kernels_for(np.dtype(dtype))
    block = kernels.shape.channels
    width, taps, stride = 3, 4, 2
    x = RNG.standard_normal(64).astype(dtype)
    off = np.array([0, 5, 9, 20], np.int64)
    wt = RNG.standard_normal((taps, block)).astype(dtype)
    sums = np.array([sum(x[off[t] + j * stride] * wt[t] for t in range(taps)) for j in range(width)])
    tolerance = 1e-5 if dtype == np.float32 else 1e-13  # FMA rounding against NumPy's, with cancellation

    def close(got, want):
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * np.abs(want).max())

    part = np.full((width, block), np.nan, dtype)
    zero_to_blocked = int(kernels.taps[microkernels.TAPS_VARIANTS.index(("zero", "blocked")), width - 1])
    microkernels.call_address(zero_to_blocked, x.ctypes.data, wt.ctypes.data, part.ctypes.data, off.ctypes.data,
                              taps, stride, 0, 0, 0, 0)
    close(part, sums)

    plane, valid = 7, block - 3
    part = RNG.standard_normal((width, block)).astype(dtype)
    bias = RNG.standard_normal(block).astype(dtype)
    y = np.full((block, plane), np.nan, dtype)
    partial_to_nchw = int(kernels.taps[microkernels.TAPS_VARIANTS.index(("partial", "nchw")), width - 1])
    microkernels.call_address(partial_to_nchw, x.ctypes.data, wt.ctypes.data, part.ctypes.data, off.ctypes.data,
                              taps, stride, y[:, 2:].ctypes.data, plane, valid, bias.ctypes.data)
    close(y[:valid, 2:2 + width], (part + sums + bias).T[:valid])
    assert np.isnan(y[valid:]).all() and np.isnan(y[:, :2]).all() and np.isnan(y[:, 2 + width:]).all()

    rows, cols, row_stride = 2, 3, 11
    dy = RNG.standard_normal((rows, cols, block)).astype(dtype)
    dw = RNG.standard_normal((taps, block)).astype(dtype)
    start = dw.copy()
    microkernels.call_address(int(kernels.pixels[taps - 1]), x.ctypes.data, dy.ctypes.data, dw.ctypes.data,
                              off.ctypes.data, rows, cols, stride, row_stride, cols * block)
    close(dw, start + np.array([sum(x[off[t] + r * row_stride + p * stride] * dy[r, p]
                                    for r in range(rows) for p in range(cols)) for t in range(taps)]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("groups, per_group, height, width", [
    (1, 20, 9, 7),    # a partial channel tile and 63 cells: a partial cell tile
    (2, 40, 16, 16),  # groups, a second channel block, whole tiles of cells
    (1, 3, 11, 13),   # fewer channels than a tile
], ids=["tails", "groups", "narrow"])
def test_layout_changes_move_every_value_and_add_the_bias(dtype, groups, per_group, height, width):
    """to_blocks and from_blocks (tiles of the transpose kernel, their tails one value at a time)
    against NumPy's reshapes: the values, zeros past a group's channels, the bias added (and +0
    where there is none, as every element gets the same addition)."""
    from netdef.layers.jit import direct_conv

    kernels = microkernels.kernels_for(np.dtype(dtype))
    block, lanes = kernels.shape.channels, kernels.shape.lanes
    blocks = -(-per_group // block)
    y = RNG.standard_normal((3, groups * per_group, height, width)).astype(dtype)
    y.reshape(-1)[:2] = [-0.0, 0.0]
    blocked = np.full((3, groups, blocks, height, width, block), np.nan, dtype)
    direct_conv.to_blocks(y, blocked, kernels.transpose[0], lanes)
    padded = np.zeros((3, groups, blocks * block, height, width), dtype)
    padded[:, :, :per_group] = y.reshape(3, groups, per_group, height, width)
    expected = padded.reshape(3, groups, blocks, block, height, width).transpose(0, 1, 2, 4, 5, 3)
    assert np.array_equal(blocked, expected) and np.array_equal(np.signbit(blocked), np.signbit(expected))
    for bias in (RNG.standard_normal(groups * per_group).astype(dtype), np.empty(0, dtype)):
        back = np.full_like(y, np.nan)
        direct_conv.from_blocks(blocked, bias, back, kernels.transpose[1], lanes)
        shift = bias if bias.size else np.zeros(y.shape[1], dtype)
        assert np.array_equal(back, y + shift[:, None, None])
        assert np.array_equal(np.signbit(back), np.signbit(y + shift[:, None, None]))  # -0 + 0 is +0
