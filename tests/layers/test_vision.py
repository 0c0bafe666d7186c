"""Vision layers: Convolution, Deconvolution, Im2col, Pooling, LRN, SPP.

Numerical gradient checks (float64), Caffe's oracle cases, a naive direct convolution, hand-computed
pooling cases, and the CPU fast paths (batch chunks, full-width columns, pooling plane blocks)
against their plain counterparts."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from netdef import backend
from netdef.blob import Blob
from netdef.layers import LayerError
from netdef.layers import direct
from netdef.layers import im2col as im2col_mod
from netdef.layers import jit
from netdef.layers import pool2d
from netdef.layers import vision
from netdef.layers.convolution import columns
from netdef.layers.convolution import rows as rows_mod
from tests.helpers import (TEST, TRAIN, build, check_gradients, layer_case_names, parse_layer,
                           run_caffe_case, shared_path)

RNG = np.random.default_rng(20240501)


def conv_text(kind="Convolution", fillers=True, **fields):
    body = " ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in fields.items())
    if fillers and kind != "Im2col":
        # Non-zero weights (the default filler is constant 0, which would hide bottom gradients).
        body += ' weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 }'
    return f'name: "L" type: "{kind}" convolution_param {{ {body} }}'


@pytest.fixture(autouse=True)
def _seed():
    backend.set_random_seed(1234)


def normal(*shape, scale=1.0):
    return RNG.standard_normal(shape) * scale


# =========================================================================== Caffe oracles
CASES = layer_case_names(("conv_", "deconv_", "pool_", "lrn_", "spp_", "im2col_"))


@pytest.mark.parametrize("name", CASES)
def test_caffe_case(name):
    run_caffe_case(name)


def test_caffe_cases_are_present():
    shared_path("fixtures", "caffe-ref", "layers", "cases.txt")
    prefixes = {n.split("_")[0] for n in CASES}
    assert prefixes == {"conv", "deconv", "pool", "lrn", "spp", "im2col"}
    assert len(CASES) >= 30


# =========================================================================== Convolution
def naive_conv(x, w, b, stride, pad, dil, group):
    """Direct definition of Caffe's convolution (loops over output cells; test sizes are tiny)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h + 2 * pad[0] - (dil[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (wd + 2 * pad[1] - (dil[1] * (kw - 1) + 1)) // stride[1] + 1
    xp = np.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]))
    xp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd] = x
    y = np.zeros((n, o, oh, ow))
    og = o // group
    for oc, i, j in itertools.product(range(o), range(oh), range(ow)):
        g = oc // og
        patch = xp[:, g * cg:(g + 1) * cg,
                   i * stride[0]:i * stride[0] + dil[0] * (kh - 1) + 1:dil[0],
                   j * stride[1]:j * stride[1] + dil[1] * (kw - 1) + 1:dil[1]]
        y[:, oc, i, j] = np.sum(patch * w[oc], axis=(1, 2, 3)) + (b[oc] if b is not None else 0)
    return y


def naive_deconv(x, w, b, stride, pad, dil, group):
    """Deconvolution by its definition: every input cell scatters w * x into the output."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    ext = (dil[0] * (kh - 1) + 1, dil[1] * (kw - 1) + 1)
    oh, ow = stride[0] * (h - 1) + ext[0] - 2 * pad[0], stride[1] * (wd - 1) + ext[1] - 2 * pad[1]
    full = np.zeros((n, og * group, stride[0] * (h - 1) + ext[0], stride[1] * (wd - 1) + ext[1]))
    cg = c // group
    for ci, i, j in itertools.product(range(c), range(h), range(wd)):
        g = ci // cg
        full[:, g * og:(g + 1) * og,
             i * stride[0]:i * stride[0] + ext[0]:dil[0],
             j * stride[1]:j * stride[1] + ext[1]:dil[1]] += x[:, ci, i, j][:, None, None, None] * w[ci]
    y = full[:, :, pad[0]:pad[0] + oh, pad[1]:pad[1] + ow]
    return y + (b[None, :, None, None] if b is not None else 0)


NAIVE_CONFIGS = [  # (text fields, stride, pad, dilation, group)
    (dict(num_output=4, kernel_size=3, pad=1), (1, 1), (1, 1), (1, 1), 1),
    (dict(num_output=6, kernel_h=3, kernel_w=2, stride_h=2, stride_w=1, pad_h=1, pad_w=0, group=3),
     (2, 1), (1, 0), (1, 1), 3),
    (dict(num_output=4, kernel_size=3, dilation=2, pad=2, stride=2), (2, 2), (2, 2), (2, 2), 1),
    (dict(num_output=3, kernel_size=1), (1, 1), (0, 0), (1, 1), 1),
]


@pytest.fixture
def column_paths(monkeypatch):
    """Convolutions take the column or row-product paths (the direct path, the default for NumPy
    float arrays, has its own tests in test_direct.py)."""
    monkeypatch.setattr(direct, "ENABLED", False)
    return monkeypatch


@pytest.fixture
def row_path(column_paths):
    """Sends every eligible convolution through the CPU row-product path, however few its channels
    (by default only kw * C >= ROW_MIN_WIDTH takes it)."""
    column_paths.setattr(im2col_mod, "ROW_MIN_WIDTH", 0)
    return column_paths


@pytest.mark.parametrize("rows", [False, True], ids=["columns", "rows"])
@pytest.mark.parametrize("fields,stride,pad,dil,group", NAIVE_CONFIGS)
def test_convolution_matches_naive_reference(column_paths, rows, fields, stride, pad, dil, group):
    monkeypatch = column_paths
    if rows:
        monkeypatch.setattr(im2col_mod, "ROW_MIN_WIDTH", 0)
    x = normal(2, 6 if group == 3 else 3, 7, 8)
    kh = fields.get("kernel_h", fields.get("kernel_size"))
    kw = fields.get("kernel_w", fields.get("kernel_size"))
    w = normal(fields["num_output"], x.shape[1] // group, kh, kw)
    b = normal(fields["num_output"])
    layer, bottom, top = build(parse_layer(conv_text(**fields)), [x], 1, params=[w, b])
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, naive_conv(x, w, b, stride, pad, dil, group), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fields,stride,pad,dil,group", NAIVE_CONFIGS)
def test_deconvolution_matches_naive_reference(fields, stride, pad, dil, group):
    x = normal(2, 6 if group == 3 else 3, 4, 5)
    kh = fields.get("kernel_h", fields.get("kernel_size"))
    kw = fields.get("kernel_w", fields.get("kernel_size"))
    w = normal(x.shape[1], fields["num_output"] // group, kh, kw)
    b = normal(fields["num_output"])
    layer, bottom, top = build(parse_layer(conv_text("Deconvolution", **fields)), [x], 1, params=[w, b])
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, naive_deconv(x, w, b, stride, pad, dil, group), rtol=1e-10, atol=1e-10)


CONV_GRAD_CONFIGS = [
    dict(num_output=3, kernel_size=3, pad=1),
    dict(num_output=2, kernel_size=3, stride=2, pad=1),
    dict(num_output=4, kernel_h=3, kernel_w=2, stride_h=2, stride_w=1, pad_h=1, pad_w=0),
    dict(num_output=4, kernel_size=2, group=2),
    dict(num_output=2, kernel_size=2, dilation=2, pad=1),
    dict(num_output=3, kernel_size=3, pad=2, bias_term=False),
    dict(num_output=3, kernel_size=1),
    dict(num_output=1, kernel_size=3, pad=1),  # stride 1 with fewer outputs: the flipped-filter backward
]


@pytest.mark.parametrize("fields", CONV_GRAD_CONFIGS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_convolution_gradients(fields):
    check_gradients(parse_layer(conv_text(**fields)), [normal(2, 4, 5, 6)])


@pytest.mark.parametrize("fields", [
    dict(num_output=2, kernel_size=3, stride=2, pad=1),
    dict(num_output=4, kernel_size=2, stride=1, group=2),
    dict(num_output=2, kernel_h=3, kernel_w=2, stride_h=1, stride_w=2, pad_h=1, pad_w=0),
    dict(num_output=2, kernel_size=2, dilation=2, bias_term=False),
], ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_deconvolution_gradients(fields):
    check_gradients(parse_layer(conv_text("Deconvolution", **fields)), [normal(2, 2, 3, 4)])


def test_convolution_3d_spatial_gradients_and_reference():
    # N-d spatial: (N, C, D, H, W) with per-axis kernel and pad.
    text = 'name: "L" type: "Convolution" convolution_param { num_output: 2 kernel_size: 2 kernel_size: 3 ' \
           'kernel_size: 2 pad: 0 pad: 1 pad: 1 stride: 1 stride: 2 stride: 1 weight_filler { type: "xavier" } }'
    x = normal(2, 2, 3, 4, 3)
    layer = check_gradients(parse_layer(text), [x])
    assert layer.blobs[0].shape == (2, 2, 2, 3, 2)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    layer2, bottom, top = build(parse_layer(text), [x], 1, params=[w, b])
    layer2.forward(bottom, top)
    assert top[0].shape == (2, 2, 2, 2, 4)
    xp = np.pad(x, ((0, 0), (0, 0), (0, 0), (1, 1), (1, 1)))
    expected = np.zeros(top[0].shape)
    for d, h, wi in itertools.product(range(2), range(2), range(4)):
        patch = xp[:, :, d:d + 2, 2 * h:2 * h + 3, wi:wi + 2]
        expected[:, :, d, h, wi] = np.einsum("ncdhw,ocdhw->no", patch, w) + b
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)


def test_convolution_1d_and_axis():
    check_gradients(parse_layer(conv_text(num_output=2, kernel_size=3, pad=1)), [normal(2, 3, 6)])
    # axis 2: the leading two axes are batch axes; equals the same conv on the merged batch.
    text = 'name: "L" type: "Convolution" convolution_param { num_output: 2 kernel_size: 2 axis: 2 ' \
           'weight_filler { type: "xavier" } }'
    x = normal(2, 3, 4, 5, 5)
    w, b = normal(2, 4, 2, 2), normal(2)
    layer, bottom, top = build(parse_layer(text), [x], 1, params=[w, b])
    layer.forward(bottom, top)
    assert top[0].shape == (2, 3, 2, 4, 4)
    np.testing.assert_allclose(top[0].data.reshape(6, 2, 4, 4),
                               naive_conv(x.reshape(6, 4, 5, 5), w, b, (1, 1), (0, 0), (1, 1), 1), rtol=1e-10)
    check_gradients(parse_layer(text), [normal(1, 2, 2, 4, 4)])


def test_convolution_two_bottoms_share_weights():
    text = parse_layer('name: "L" type: "Convolution" convolution_param { num_output: 2 kernel_size: 2 '
                       'weight_filler { type: "gaussian" std: 1 } }')
    a, b = normal(1, 2, 3, 3), normal(1, 2, 3, 3)
    layer = check_gradients(text, [a, b], num_tops=2)
    w, bias = layer.blobs[0].data, layer.blobs[1].data
    layer2, bottom, top = build(text, [a, b], 2, params=[w, bias])
    layer2.forward(bottom, top)
    for i, x in enumerate((a, b)):
        np.testing.assert_allclose(top[i].data, naive_conv(x, w, bias, (1, 1), (0, 0), (1, 1), 1), rtol=1e-10)


@pytest.mark.parametrize("rows", [False, True], ids=["columns", "rows"])
def test_convolution_parameter_gradients_accumulate_and_respect_propagate_flags(column_paths, rows):
    monkeypatch = column_paths
    monkeypatch.setattr(im2col_mod, "ROW_MIN_WIDTH", 0 if rows else 10**9)
    text = parse_layer(conv_text(num_output=2, kernel_size=2, pad=1))
    x = normal(2, 3, 4, 4)
    layer, bottom, top = build(text, [x], 1)
    assert rows_mod.eligible(layer.shape, np) == rows
    layer.forward(bottom, top)
    top[0].diff = normal(*top[0].shape)
    layer.backward(top, [True], bottom)
    once = [p.diff.copy() for p in layer.blobs]
    layer.backward(top, [True], bottom)
    for p, g in zip(layer.blobs, once):
        np.testing.assert_allclose(p.diff, 2 * g)
    layer.param_propagate_down = [False, True]
    before = layer.blobs[0].diff.copy()
    bottom[0].diff[...] = 7.0
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(layer.blobs[0].diff, before)
    np.testing.assert_allclose(layer.blobs[1].diff, 3 * once[1])
    assert np.all(bottom[0].diff == 7.0)  # propagate_down False: bottom diff untouched


def test_convolution_fillers_and_loaded_weights():
    text = parse_layer('name: "L" type: "Convolution" convolution_param { num_output: 3 kernel_size: 2 '
                       'weight_filler { type: "constant" value: 0.5 } bias_filler { type: "constant" value: -1 } }')
    layer, bottom, top = build(text, [normal(1, 2, 3, 3)], 1, dtype=np.float32)
    assert layer.blobs[0].shape == (3, 2, 2, 2) and layer.blobs[1].shape == (3,)
    assert layer.blobs[0].dtype == np.float32
    assert np.all(layer.blobs[0].data == 0.5) and np.all(layer.blobs[1].data == -1)
    # Weights already present (loaded): kept, not refilled; a wrong shape is an error.
    layer = vision.ConvolutionLayer(text)
    layer.blobs = [Blob((3, 2, 2, 2), dtype=np.float64), Blob((3,), dtype=np.float64)]
    layer.blobs[0].data[...] = 2.0
    layer.setup_layer([Blob((1, 2, 3, 3), dtype=np.float64)], [Blob(dtype=np.float64)])
    assert np.all(layer.blobs[0].data == 2.0)
    bad = vision.ConvolutionLayer(text)
    bad.blobs = [Blob((3, 2, 3, 3)), Blob((3,))]
    with pytest.raises(LayerError, match="shape"):
        bad.setup_layer([Blob((1, 2, 3, 3))], [Blob()])


@pytest.mark.parametrize("text,shape,message", [
    (conv_text(num_output=2, kernel_h=3, kernel_w=3), (1, 2, 4, 4, 4), "2D"),
    (conv_text(num_output=3, kernel_size=3, group=2), (1, 4, 5, 5), "group"),
    (conv_text(num_output=2), (1, 2, 5, 5), "kernel_size"),
    (conv_text(num_output=2, kernel_size=7), (1, 2, 5, 5), "output size"),
    ('name: "L" type: "Convolution" convolution_param { num_output: 2 kernel_size: 3 kernel_h: 3 kernel_w: 3 }',
     (1, 2, 5, 5), "not both"),
])
def test_convolution_errors(text, shape, message):
    with pytest.raises(LayerError, match=message):
        build(parse_layer(text), [np.zeros(shape)], 1)


@pytest.mark.parametrize("rows", [False, True], ids=["columns", "rows"])
def test_convolution_reshape_to_new_input_size(column_paths, rows):
    monkeypatch = column_paths
    if rows:
        monkeypatch.setattr(im2col_mod, "ROW_MIN_WIDTH", 0)
    text = parse_layer(conv_text(num_output=2, kernel_size=3, pad=1))
    layer, bottom, top = build(text, [normal(2, 3, 5, 5)], 1)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    bottom[0].reshape(3, 3, 6, 4)
    x = normal(3, 3, 6, 4)
    bottom[0].data[...] = x
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, naive_conv(x, w, b, (1, 1), (1, 1), (1, 1), 1), rtol=1e-10)


@pytest.mark.parametrize("kind,fields", [
    ("Convolution", dict(num_output=3, kernel_size=3, pad=1)),            # full width + flipped backward
    ("Convolution", dict(num_output=5, kernel_size=3, pad=2, stride=2)),  # col2im backward
    ("Convolution", dict(num_output=4, kernel_size=2, dilation=2, group=2)),
    ("Deconvolution", dict(num_output=2, kernel_size=3, stride=2, pad=1)),
    ("Deconvolution", dict(num_output=2, kernel_size=3, pad=1)),
])
def test_convolution_fast_paths_agree(column_paths, kind, fields):
    monkeypatch = column_paths
    """Batch chunks (uneven), full-width columns and the plain layout all give the same results."""
    text = parse_layer(conv_text(kind, **fields))
    x = normal(7, 4, 9, 8)
    layer, bottom, top = build(text, [x], 1)
    params = [p.data.copy() for p in layer.blobs]
    dy = normal(*top[0].shape)

    def run():
        lay, bot, tp = build(text, [x], 1, params=params)
        lay.forward(bot, tp)
        tp[0].diff = dy
        lay.backward(tp, [True], bot)
        return [tp[0].data.copy(), bot[0].diff.copy()] + [p.diff.copy() for p in lay.blobs]

    reference = run()
    monkeypatch.setattr(im2col_mod, "FULL_WIDTH_MAX_RATIO", 0.0)
    plain = run()
    monkeypatch.setattr(columns, "COLUMN_BUDGET_CPU", 2000)  # a few samples per chunk, the last one short
    chunked = run()
    monkeypatch.setattr(im2col_mod, "FULL_WIDTH_MAX_RATIO", 10.0)
    chunked_full = run()
    for got in (plain, chunked, chunked_full):
        for a, b in zip(reference, got):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # The compiled copies between the column matrix and NCHW (ColumnLayout.gather_into / scatter) give
    # what their NumPy twins give, bit for bit; the bias gradient (last) is summed in another order.
    monkeypatch.setattr(jit, "ENABLED", False)
    twins = run()
    for a, b in zip(chunked_full[:-1], twins[:-1]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(chunked_full[-1], twins[-1], rtol=1e-12, atol=1e-12)


def two_passes(layer, bottom, top, xs, dys) -> list:
    """Two forward and backward passes of a convolution with two bottoms sharing its weights (the
    inputs scaled by the pass number, so that the parameter gradients accumulate two different
    sums): the tops and bottom gradients of each pass, then the parameter gradients."""
    out = []
    for it in range(2):
        for b, x in zip(bottom, xs):
            b.data[...] = x * (it + 1)
        layer.forward(bottom, top)
        for t, dy in zip(top, dys):
            t.diff = dy
        layer.backward(top, [True] * len(bottom), bottom)
        out += [t.data.copy() for t in top] + [b.diff.copy() for b in bottom]
    return out + [p.diff.copy() for p in layer.blobs]


# The CPU row-product path (im2col.RowPlan): stride-1 2-D convolutions of one group.
ROW_CONFIGS = [
    dict(num_output=3, kernel_size=3, pad=1),                        # backward: pad 1, input-sized
    dict(num_output=4, kernel_size=3),                               # backward: pad 2 (extent - 1)
    dict(num_output=4, kernel_h=3, kernel_w=2, pad_h=2, pad_w=1),    # pad = extent - 1: backward unpadded
    dict(num_output=2, kernel_size=3, dilation=2, pad=1),
    dict(num_output=3, kernel_h=1, kernel_w=3, pad_w=1),
    dict(num_output=3, kernel_h=3, kernel_w=1, pad_h=1),             # kw = 1: the products read xb itself
    dict(num_output=3, kernel_size=1),
    dict(num_output=3, kernel_size=2, bias_term=False),
]
ROW_IDS = [",".join(f"{k}={v}" for k, v in f.items()) for f in ROW_CONFIGS]


@pytest.mark.parametrize("input_gradient", ["col2im", "convolution"])
@pytest.mark.parametrize("fold_below", [0, 10**6], ids=["kh-products", "folded"])
@pytest.mark.parametrize("fields", ROW_CONFIGS, ids=ROW_IDS)
def test_convolution_row_path_gradients(row_path, fields, fold_below, input_gradient):
    row_path.setattr(im2col_mod, "ROW_FOLD_BELOW", fold_below)
    row_path.setattr(rows_mod, "ROW_COL2IM_CHANNELS", 0)
    row_path.setattr(rows_mod, "ROW_COL2IM_ABOVE", 0.0 if input_gradient == "col2im" else 1e9)
    layer = check_gradients(parse_layer(conv_text(**fields)), [normal(2, 3, 5, 6)])
    assert rows_mod.eligible(layer.shape, np)
    assert layer.rows_input_gradient == (None if layer.algorithm == "pointwise" else input_gradient)


@pytest.mark.parametrize("fields", ROW_CONFIGS, ids=ROW_IDS)
def test_convolution_row_path_matches_column_path(column_paths, fields):
    """Two bottoms sharing the weights, two iterations (the parameter gradients accumulate; each
    backward reuses the last chunk's rows from its forward), with and without batch chunks
    (uneven ones) and kernel-row folding: all as the column path."""
    text = parse_layer(conv_text(**fields))
    xs = [normal(7, 5, 9, 8), normal(7, 5, 9, 8)]
    layer, _, top = build(text, xs, 2)
    params = [p.data.copy() for p in layer.blobs]
    dys = [normal(*top[0].shape), normal(*top[0].shape)]
    monkeypatch = column_paths
    monkeypatch.setattr(im2col_mod, "ROW_MIN_WIDTH", 0)

    def run(rows, budget=rows_mod.ROW_BUDGET, fold_below=im2col_mod.ROW_FOLD_BELOW):
        monkeypatch.setattr(im2col_mod, "ROW_PRODUCTS", rows)
        monkeypatch.setattr(rows_mod, "ROW_BUDGET", budget)
        monkeypatch.setattr(im2col_mod, "ROW_FOLD_BELOW", fold_below)
        lay, bot, tp = build(text, xs, 2, params=params)
        assert rows_mod.eligible(lay.shape, np) == rows
        out = two_passes(lay, bot, tp, xs, dys)
        if rows and budget < rows_mod.ROW_BUDGET:
            assert len(lay.strategy.row_chunks(np.float64)) > 2
        return out

    reference = run(False)
    runs = [run(True), run(True, budget=3000), run(True, fold_below=10**6), run(True, budget=3000, fold_below=0)]
    # Both input gradients of the row path, whichever the shapes choose (see ROW_COL2IM_ABOVE).
    for col2im_above in (0.0, 1e9):
        monkeypatch.setattr(rows_mod, "ROW_COL2IM_ABOVE", col2im_above)
        monkeypatch.setattr(rows_mod, "ROW_COL2IM_CHANNELS", 0)
        runs += [run(True), run(True, budget=3000)]
    for got in runs:
        for a, b in zip(reference, got):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fields", [f for f in ROW_CONFIGS if f.get("kernel_size") != 1],
                         ids=[i for f, i in zip(ROW_CONFIGS, ROW_IDS) if f.get("kernel_size") != 1])
def test_row_path_layout_kernels_are_exact_copies(column_paths, fields, dtype):
    """The compiled layout changes of the row path (jit/layout.py: NCHW to rows and back, the bias,
    the filters' permutation and the weight gradient's accumulation) give bit for bit what their
    NumPy twins give."""
    text = parse_layer(conv_text(**fields))
    x = normal(4, 5, 9, 8).astype(dtype)
    layer, _, top = build(text, [x], 1, dtype=dtype)
    params = [p.data.copy() for p in layer.blobs]
    dy = normal(*top[0].shape).astype(dtype)
    monkeypatch = column_paths
    monkeypatch.setattr(im2col_mod, "ROW_MIN_WIDTH", 0)

    def run(compiled, col2im_above):
        monkeypatch.setattr(jit, "ENABLED", compiled)
        monkeypatch.setattr(rows_mod, "ROW_COL2IM_ABOVE", col2im_above)
        monkeypatch.setattr(rows_mod, "ROW_COL2IM_CHANNELS", 0)
        lay, bot, tp = build(text, [x], 1, params=params, dtype=dtype)
        assert lay.algorithm == "rows"
        assert lay.rows_input_gradient == ("col2im" if col2im_above == 0 else "convolution")
        out = []
        for _ in range(2):  # the weight gradient accumulates
            lay.forward(bot, tp)
            tp[0].diff = dy
            lay.backward(tp, [True], bot)
            out += [tp[0].data.copy(), bot[0].diff.copy()]
        return out + [p.diff.copy() for p in lay.blobs]

    for col2im_above in (0.0, 1e9):  # both input gradients (the scatter-add of col2im has a kernel too)
        twins, compiled = run(False, col2im_above), run(True, col2im_above)
        for a, b in zip(twins, compiled):
            assert a.dtype == b.dtype == dtype
        for a, b in zip(twins[:-1], compiled[:-1]):
            np.testing.assert_array_equal(b, a)
        # The bias gradient: a compiled float64 sum against NumPy's in the dtype.
        np.testing.assert_allclose(compiled[-1], twins[-1], rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("name", layer_case_names(("conv_",)))
def test_caffe_conv_case_row_path(row_path, name):
    for fold_below in (0, 10**6):
        row_path.setattr(im2col_mod, "ROW_FOLD_BELOW", fold_below)
        run_caffe_case(name)


def test_convolution_row_path_choice(column_paths):
    """Taken for stride-1 2-D single-group convolutions with kw * C >= ROW_MIN_WIDTH (not for a
    first layer's few channels), pad <= extent - 1, and only for NumPy arrays."""
    def eligible(channels, **fields):
        layer, _, _ = build(parse_layer(conv_text(**fields)), [np.zeros((1, channels, 9, 9))], 1)
        return rows_mod.eligible(layer.shape, np)

    assert eligible(32, num_output=32, kernel_size=5, pad=2)
    assert eligible(20, num_output=50, kernel_size=5)
    assert not eligible(3, num_output=32, kernel_size=5, pad=2)      # few channels: the column path
    assert not eligible(32, num_output=8, kernel_size=5, stride=2)
    assert not eligible(32, num_output=8, kernel_size=5, group=2)
    assert not eligible(32, num_output=8, kernel_size=3, pad=3)      # pad > extent - 1
    layer, _, _ = build(parse_layer(conv_text(num_output=4, kernel_size=3)), [np.zeros((1, 32, 5, 5))], 1)
    assert not rows_mod.eligible(layer.shape, object())             # another array module


def test_convolution_row_path_input_gradient_choice(column_paths):
    """col2im where the full convolution of the top gradient costs more multiply-adds (a map that
    shrinks) or its products would have few columns (few input channels); the convolution otherwise."""
    def choice(channels, size, **fields):
        layer, _, _ = build(parse_layer(conv_text(**fields)), [np.zeros((1, channels, size, size))], 1)
        assert layer.algorithm == "rows"
        return layer.rows_input_gradient

    assert choice(20, 12, num_output=50, kernel_size=5) == "col2im"           # LeNet conv2: 144 / 64 cells
    assert choice(32, 16, num_output=32, kernel_size=5, pad=2) == "col2im"    # CIFAR-10 conv2: 32 channels
    assert choice(64, 56, num_output=64, kernel_size=3, pad=1) == "convolution"
    assert choice(128, 28, num_output=128, kernel_size=3) == "convolution"    # 28 x 28 -> 26 x 26: 1.16
    assert choice(128, 9, num_output=128, kernel_size=3) == "col2im"          # 9 x 9 -> 7 x 7: 1.65


def test_convolution_float32_follows_bottom():
    layer, bottom, top = build(parse_layer(conv_text(num_output=2, kernel_size=3)), [normal(2, 3, 5, 5)], 1,
                               dtype=np.float32)
    layer.forward(bottom, top)
    assert top[0].data.dtype == np.float32 and layer.blobs[0].data.dtype == np.float32


# =========================================================================== Im2col
def test_im2col_layer_values_and_gradients():
    text = parse_layer(conv_text("Im2col", kernel_size=2, stride=1, pad=1))
    x = normal(2, 3, 3, 4)
    layer, bottom, top = build(text, [x], 1)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 12, 4, 5)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for c, i, j in itertools.product(range(3), range(2), range(2)):
        np.testing.assert_array_equal(top[0].data[:, (c * 2 + i) * 2 + j], xp[:, c, i:i + 4, j:j + 5])
    check_gradients(text, [x])
    check_gradients(parse_layer(conv_text("Im2col", kernel_size=3, stride=2, pad=1, dilation=2)), [normal(1, 2, 5, 6)])


# =========================================================================== Pooling
def pool_text(phase=TRAIN, **fields):
    body = " ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in fields.items())
    return parse_layer(f'name: "L" type: "Pooling" pooling_param {{ {body} }}', phase)


def distinct(*shape):
    """Values without near-ties, so that a finite-difference step never changes an argmax."""
    n = int(np.prod(shape))
    return RNG.permutation(n).reshape(shape) * 0.1 - n * 0.05


@pytest.mark.parametrize("fields,shape", [
    (dict(pool="MAX", kernel_size=3, stride=2), (2, 2, 7, 9)),
    (dict(pool="MAX", kernel_size=3, stride=2, pad=1), (2, 2, 6, 7)),
    (dict(pool="MAX", kernel_size=2, stride=2, pad=1), (1, 2, 5, 7)),
    (dict(pool="MAX", kernel_h=3, kernel_w=2, stride_h=1, stride_w=2, pad_h=1, pad_w=1), (1, 2, 5, 6)),
    (dict(pool="MAX", kernel_size=2, stride=3), (1, 2, 7, 8)),
    (dict(pool="MAX", kernel_size=6, stride=1, pad=2), (1, 2, 6, 7)),   # many cells, overlapping
    (dict(pool="MAX", kernel_size=6, stride=6), (1, 2, 12, 13)),        # many cells, disjoint
    (dict(pool="MAX", global_pooling=True), (2, 3, 4, 5)),
    (dict(pool="AVE", kernel_size=3, stride=2, pad=1), (2, 2, 6, 7)),
    (dict(pool="AVE", kernel_size=3, stride=2), (1, 2, 8, 10)),
    (dict(pool="AVE", kernel_h=2, kernel_w=3, stride_h=2, stride_w=1, pad_h=1, pad_w=2), (1, 2, 5, 6)),
    (dict(pool="AVE", kernel_size=2, stride=3, round_mode="FLOOR"), (1, 2, 7, 8)),
    (dict(pool="AVE", kernel_size=6, stride=2, pad=3), (1, 2, 7, 8)),   # many cells
    (dict(pool="AVE", kernel_size=6, stride=6), (1, 2, 12, 13)),
    (dict(pool="AVE", global_pooling=True), (2, 3, 4, 5)),
])
def test_pooling_gradients(fields, shape):
    check_gradients(pool_text(**fields), [distinct(*shape)])


def test_pooling_output_shapes():
    cases = [((8, 10), 3, 2, 0, False, (4, 5)), ((5, 7), 2, 2, 1, False, (3, 4)), ((7, 9), 3, 2, 1, False, (4, 5)),
             ((8, 10), 3, 2, 0, True, (3, 4)), ((6, 6), 2, 2, 0, False, (3, 3)), ((7, 8), 2, 3, 0, True, (2, 3)),
             ((7, 8), 2, 3, 0, False, (3, 3))]
    for (h, w), k, s, p, floor, expected in cases:
        assert vision.pooled_shape(h, w, (k, k), (s, s), (p, p), floor) == expected, (h, w, k, s, p, floor)
    layer, bottom, top = build(pool_text(pool="MAX", kernel_size=3, stride=2, round_mode="FLOOR"),
                               [normal(1, 1, 8, 10)], 1)
    assert top[0].shape == (1, 1, 3, 4)


def test_max_pooling_by_hand():
    x = np.array([[1., 5., 5., 0.],
                  [2., 3., 5., 1.],
                  [7., 7., 0., 0.]])[None, None]
    layer, bottom, top = build(pool_text(pool="MAX", kernel_size=2, stride=2), [x], 2)
    layer.forward(bottom, top)
    # ceil: 3x4 with k2 s2 -> 2x2, the last row of windows covers row 2 only.
    np.testing.assert_array_equal(top[0].data[0, 0], [[5, 5], [7, 0]])
    # Ties: the first maximum in row-major order wins (5 at (0,1), not (0,2)/(1,2); 7 at (2,0)).
    np.testing.assert_array_equal(top[1].data[0, 0], [[1, 2], [8, 10]])
    top[0].diff = np.array([[[[1., 2.], [3., 4.]]]])
    layer.backward(top, [True], bottom)
    expected = np.zeros((3, 4))
    expected[0, 1], expected[0, 2], expected[2, 0], expected[2, 2] = 1, 2, 3, 4
    np.testing.assert_array_equal(bottom[0].diff[0, 0], expected)


def test_max_pooling_overlapping_windows_sum_gradients():
    x = np.zeros((1, 1, 3, 3))
    x[0, 0, 1, 1] = 9.0  # the centre is the maximum of all four 2x2 windows (stride 1)
    layer, bottom, top = build(pool_text(pool="MAX", kernel_size=2, stride=1), [x], 2)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[1].data, np.full((1, 1, 2, 2), 4.0))
    top[0].diff = np.array([[[[1., 2.], [3., 4.]]]])
    layer.backward(top, [True], bottom)
    assert bottom[0].diff[0, 0, 1, 1] == 10 and bottom[0].diff.sum() == 10


def test_max_pooling_padding_never_wins():
    x = -np.ones((1, 1, 3, 3)) * 5  # all negative: padding (outside the input) must not count as 0
    layer, bottom, top = build(pool_text(pool="MAX", kernel_size=3, stride=2, pad=1), [x], 2)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, np.full((1, 1, 2, 2), -5.0))
    np.testing.assert_array_equal(top[1].data[0, 0], [[0, 1], [3, 4]])


def test_max_pooling_nothing_beats_minus_flt_max():
    # As Caffe: a window whose cells are all -inf yields -FLT_MAX and mask -1, and no gradient.
    x = np.full((1, 1, 2, 4), -np.inf)
    x[0, 0, 0, 3] = 1.0
    for fields in (dict(kernel_size=2, stride=2), dict(kernel_size=2, stride=2, pad=1)):
        layer, bottom, top = build(pool_text(pool="MAX", **fields), [x], 2)
        layer.forward(bottom, top)
        lowest = -np.finfo(np.float32).max
        assert top[0].data[0, 0, 0, 0] == lowest and top[1].data[0, 0, 0, 0] == -1
        top[0].diff = np.ones(top[0].shape)
        layer.backward(top, [True], bottom)
        assert bottom[0].diff.sum() == 1.0 and bottom[0].diff[0, 0, 0, 3] == 1.0


def naive_max_pool(x, kernel, stride, pad, out):
    """Caffe's MAX pooling loop: from -FLT_MAX, a cell wins by strict >, so the first maximum in
    row-major order wins and NaN never does. (top, mask as flat h*W + w, -1 where no cell won)."""
    n, c, h, w = x.shape
    lowest = -np.finfo(np.float32).max
    top = np.full((n, c) + out, lowest)
    mask = np.full((n, c) + out, -1)
    for oh, ow in itertools.product(range(out[0]), range(out[1])):
        h0, w0 = oh * stride[0] - pad[0], ow * stride[1] - pad[1]
        for i, j in itertools.product(range(max(h0, 0), min(h0 + kernel[0], h)), range(max(w0, 0), min(w0 + kernel[1], w))):
            wins = x[:, :, i, j] > top[:, :, oh, ow]
            top[:, :, oh, ow] = np.where(wins, x[:, :, i, j], top[:, :, oh, ow])
            mask[:, :, oh, ow] = np.where(wins, i * w + j, mask[:, :, oh, ow])
    return top, mask


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fields,shape", [
    (dict(kernel_size=3, stride=2), (2, 3, 9, 11)),
    (dict(kernel_size=3, stride=2, pad=1), (2, 3, 8, 7)),
    (dict(kernel_size=2, stride=2), (2, 3, 8, 9)),
    (dict(kernel_h=3, kernel_w=2, stride_h=1, stride_w=3, pad_h=1, pad_w=0), (2, 3, 6, 10)),
    (dict(kernel_size=6, stride=3, pad=2), (2, 3, 10, 9)),                 # many cells
], ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else str(v))
def test_max_pooling_matches_caffe_loop(monkeypatch, fields, shape, dtype):
    """Ties everywhere (small integers), NaN, -inf and -FLT_MAX cells, windows of NaN only, and plane
    blocks of a few planes: top, mask and bottom gradient as Caffe's loop gives them."""
    monkeypatch.setattr(pool2d, "_POOL_BLOCK_BYTES", 2000)
    rng = np.random.default_rng(7)
    x = rng.integers(-3, 3, shape).astype(float)
    special = rng.random(shape)
    x[special < 0.08] = np.nan
    x[(special >= 0.08) & (special < 0.12)] = -np.inf
    x[(special >= 0.12) & (special < 0.14)] = -np.finfo(np.float32).max
    x[0, 0, :4, :4] = np.nan  # whole windows of NaN
    layer, bottom, top = build(pool_text(pool="MAX", **fields), [x], 2, dtype=dtype)
    layer.forward(bottom, top)
    p = layer.pool
    expected, mask = naive_max_pool(x.astype(dtype), p.kernel, p.stride, p.pad, p.out)
    np.testing.assert_array_equal(top[0].data, expected)
    np.testing.assert_array_equal(top[1].data, mask)
    dy = rng.standard_normal(top[0].shape).astype(dtype)
    top[0].diff = dy
    layer.backward(top, [True], bottom)
    dx = np.zeros((shape[0] * shape[1], shape[2] * shape[3]))
    flat_mask, flat_dy = mask.reshape(len(dx), -1), dy.reshape(len(dx), -1)
    for plane in range(len(dx)):
        live = flat_mask[plane] >= 0
        np.add.at(dx[plane], flat_mask[plane][live], flat_dy[plane][live])
    np.testing.assert_allclose(bottom[0].diff, dx.reshape(shape), rtol=1e-6)


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_pooling_forward_writes_into_its_top(pool):
    """The CPU passes write into the top's existing array: a second forward overwrites all of it."""
    layer, bottom, top = build(pool_text(pool=pool, kernel_size=3, stride=2), [normal(2, 3, 9, 9)], 1)
    layer.forward(bottom, top)
    first = top[0].data
    x = normal(2, 3, 9, 9)
    bottom[0].data[...] = x
    layer.forward(bottom, top)
    assert top[0].data is first
    fresh, fresh_bottom, fresh_top = build(pool_text(pool=pool, kernel_size=3, stride=2), [x], 1)
    fresh.forward(fresh_bottom, fresh_top)
    np.testing.assert_array_equal(top[0].data, fresh_top[0].data)


def test_ave_pooling_divisor_counts_padding_not_overhang():
    x = np.ones((1, 1, 4, 4))
    layer, bottom, top = build(pool_text(pool="AVE", kernel_size=3, stride=2, pad=1), [x], 1)
    layer.forward(bottom, top)
    # 4x4, k3 s2 p1 -> 3x3. Window rows [-1, 2), [1, 4), [3, 6): the divisor clips them to the padded
    # input [-1, 5) (3, 3, 2 rows: padding counts, the overhang past it does not); the sum runs over
    # the real rows only (2, 3, 1).
    per_axis = np.array([2 / 3, 3 / 3, 1 / 2])
    np.testing.assert_allclose(top[0].data[0, 0], np.outer(per_axis, per_axis))
    layer, bottom, top = build(pool_text(pool="AVE", kernel_size=3, stride=2), [np.ones((1, 1, 4, 4))], 1)
    layer.forward(bottom, top)
    # No padding, ceil rounding: the second window [2, 5) is clipped to the input [2, 4): divisor 2.
    np.testing.assert_allclose(top[0].data[0, 0], [[1.0, 1.0], [1.0, 1.0]])


def test_pooling_plane_blocks_agree(monkeypatch):
    x = normal(5, 7, 9, 11)
    dy_shape = None
    results = []
    for budget in (pool2d._POOL_BLOCK_BYTES, 3000):
        monkeypatch.setattr(pool2d, "_POOL_BLOCK_BYTES", budget)
        out = []
        for fields in (dict(pool="MAX", kernel_size=3, stride=2, pad=1), dict(pool="AVE", kernel_size=3, stride=2)):
            layer, bottom, top = build(pool_text(**fields), [x], 1)
            layer.forward(bottom, top)
            dy_shape = top[0].shape
            top[0].diff = np.arange(np.prod(dy_shape), dtype=float).reshape(dy_shape) % 7
            layer.backward(top, [True], bottom)
            out += [top[0].data.copy(), bottom[0].diff.copy()]
        results.append(out)
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-13)


def test_stochastic_pooling():
    x = RNG.uniform(0.1, 1.0, (2, 2, 4, 5))
    # TEST: the value-weighted average sum(x^2) / sum(x), and its gradient.
    text = pool_text(pool="STOCHASTIC", kernel_size=2, stride=2)
    test_text = pool_text(TEST, pool="STOCHASTIC", kernel_size=2, stride=2)
    layer, bottom, top = build(test_text, [x], 1)
    layer.forward(bottom, top)
    win = x[:, :, 0:2, 0:2]
    np.testing.assert_allclose(top[0].data[:, :, 0, 0], (win ** 2).sum((2, 3)) / win.sum((2, 3)))
    last = x[:, :, 0:2, 4:5]  # ceil: the last column of windows is one cell wide
    np.testing.assert_allclose(top[0].data[:, :, 0, 2], (last ** 2).sum((2, 3)) / last.sum((2, 3)))
    check_gradients(test_text, [x])
    # TRAIN: each output is one of its window's cells, drawn with probability x / sum(x).
    backend.set_random_seed(5)
    layer, bottom, top = build(text, [x], 1)
    layer.forward(bottom, top)
    for n, c, i, j in itertools.product(range(2), range(2), range(2), range(3)):
        assert top[0].data[n, c, i, j] in x[n, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
    top[0].diff = np.ones(top[0].shape)
    layer.backward(top, [True], bottom)
    assert bottom[0].diff.sum() == top[0].data.size
    assert set(np.round(x[bottom[0].diff > 0], 12)) == set(np.round(top[0].data.ravel(), 12))
    counts = np.zeros(4)
    x1 = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    layer, bottom, top = build(text, [x1], 1)
    for _ in range(2000):
        layer.forward(bottom, top)
        counts[int(top[0].data[0, 0, 0, 0]) - 1] += 1
    np.testing.assert_allclose(counts / counts.sum(), [0.1, 0.2, 0.3, 0.4], atol=0.04)


@pytest.mark.parametrize("text,top_count,message", [
    ('pooling_param { pool: AVE kernel_size: 2 }', 2, "second top"),
    ('pooling_param { pool: MAX kernel_size: 2 kernel_h: 2 kernel_w: 2 }', 1, "not both"),
    ('pooling_param { pool: MAX global_pooling: true kernel_size: 2 }', 1, "global"),
    ('pooling_param { pool: MAX kernel_size: 2 pad: 2 }', 1, "smaller than the kernel"),
    ('pooling_param { pool: STOCHASTIC kernel_size: 3 pad: 1 }', 1, "padding"),
    ('pooling_param { pool: MAX kernel_h: 2 }', 1, "both kernel_h and kernel_w are required"),
])
def test_pooling_errors(text, top_count, message):
    with pytest.raises(LayerError, match=message):
        build(parse_layer(f'name: "L" type: "Pooling" {text}'), [np.zeros((1, 1, 5, 5))], top_count)


def test_pooling_reshape_to_new_input_size():
    layer, bottom, top = build(pool_text(pool="MAX", kernel_size=2, stride=2), [normal(1, 2, 4, 4)], 1)
    bottom[0].reshape(2, 2, 6, 5)
    x = normal(2, 2, 6, 5)
    bottom[0].data[...] = x
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 2, 3, 3)
    np.testing.assert_array_equal(top[0].data[:, :, :, :2], x[:, :, :, :4].reshape(2, 2, 3, 2, 2, 2).max((3, 5)))
    np.testing.assert_array_equal(top[0].data[:, :, :, 2], x[:, :, :, 4].reshape(2, 2, 3, 2).max(3))


# =========================================================================== LRN
def lrn_text(**fields):
    body = " ".join(f"{k}: {v}" for k, v in fields.items())
    return parse_layer(f'name: "L" type: "LRN" lrn_param {{ {body} }}')


@pytest.mark.parametrize("fields", [
    dict(local_size=3, alpha=0.5, beta=0.75, k=1.5),
    dict(local_size=5, alpha=2.0, beta=0.6, k=1),
    dict(local_size=1, alpha=0.3, beta=1.1, k=0.5),
    dict(norm_region="WITHIN_CHANNEL", local_size=3, alpha=0.7, beta=0.75),
    dict(norm_region="WITHIN_CHANNEL", local_size=5, alpha=1.5, beta=0.5, k=3),
])
def test_lrn_gradients(fields):
    check_gradients(lrn_text(**fields), [normal(2, 4, 3, 4)])


def test_lrn_by_definition():
    x = normal(2, 6, 3, 4)
    layer, bottom, top = build(lrn_text(local_size=3, alpha=0.6, beta=0.7, k=2), [x], 1)
    layer.forward(bottom, top)
    sq = np.pad(x ** 2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    scale = 2 + 0.6 / 3 * (sq[:, 0:6] + sq[:, 1:7] + sq[:, 2:8])
    np.testing.assert_allclose(top[0].data, x * scale ** -0.7, rtol=1e-6)  # alpha, beta are float32
    layer, bottom, top = build(lrn_text(norm_region="WITHIN_CHANNEL", local_size=3, alpha=0.6, beta=0.7, k=2), [x], 1)
    layer.forward(bottom, top)
    sq = np.pad(x ** 2, ((0, 0), (0, 0), (1, 1), (1, 1)))
    box = sum(sq[:, :, i:i + 3, j:j + 4] for i in range(3) for j in range(3))
    np.testing.assert_allclose(top[0].data, x * (1 + 0.6 / 9 * box) ** -0.7, rtol=1e-6)  # k ignored


def test_lrn_errors():
    with pytest.raises(LayerError, match="odd"):
        build(lrn_text(local_size=4), [np.zeros((1, 5, 2, 2))], 1)
    with pytest.raises(LayerError, match="4 axes"):
        build(lrn_text(local_size=3), [np.zeros((2, 5, 2))], 1)


# =========================================================================== SPP
@pytest.mark.parametrize("height,pool,shape", [(2, "MAX", (2, 2, 5, 7)), (3, "AVE", (1, 2, 6, 7)),
                                               (3, "MAX", (1, 2, 8, 9)), (1, "AVE", (2, 2, 3, 4))])
def test_spp_gradients(height, pool, shape):
    text = parse_layer(f'name: "L" type: "SPP" spp_param {{ pyramid_height: {height} pool: {pool} }}')
    check_gradients(text, [distinct(*shape)])


def test_spp_levels_by_hand():
    x = normal(2, 3, 4, 4)
    text = parse_layer('name: "L" type: "SPP" spp_param { pyramid_height: 2 pool: MAX }')
    layer, bottom, top = build(text, [x], 1)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 3 * (1 + 4))
    np.testing.assert_array_equal(top[0].data[:, :3], x.max(axis=(2, 3)))
    np.testing.assert_array_equal(top[0].data[:, 3:].reshape(2, 3, 2, 2), x.reshape(2, 3, 2, 2, 2, 2).max((3, 5)))
    single = parse_layer('name: "L" type: "SPP" spp_param { pyramid_height: 1 pool: AVE }')
    layer, bottom, top = build(single, [x], 1)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 3, 1, 1)
    np.testing.assert_allclose(top[0].data[:, :, 0, 0], x.mean(axis=(2, 3)))


def test_spp_too_many_bins():
    text = parse_layer('name: "L" type: "SPP" spp_param { pyramid_height: 3 pool: MAX }')
    with pytest.raises(LayerError, match="bins"):
        build(text, [np.zeros((1, 1, 2, 2))], 1)
