"""Convolutions through cuDNN on a GPU (netdef/cudnn): the path each layer takes, the answers against
netdef's CPU path in float64, strict float32 against TensorFloat-32, geometries (groups, depthwise,
dilation, strides, 3-D), two bottoms sharing weights, gradients added to what is there.

Every test but the first skips without CuPy and a CUDA device, or without the cuDNN frontend,
saying which; the first runs everywhere.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

from netdef import backend, cudnn
from tests.helpers import build, parse_layer, skip_without_cudnn


def test_the_plans_the_workspace_limit_cut_are_listed_with_the_most_any_candidate_wanted(monkeypatch):
    """What gpu_train.py reports after a run (runs everywhere: plans made by hand, no GPU needed)."""
    from netdef.cudnn import plans

    built = {("conv_fprop", 1): plans.Plan(None, [], 0, 0, None, (3 << 30, 5 << 30)),
             ("conv_wgrad", 2): plans.Plan(None, [], 1, 1 << 20, None),
             ("conv_dgrad", 3): plans.Unsupported("no plan")}
    monkeypatch.setattr(plans, "_plans", built)
    assert plans.limited_by_workspace() == [("conv_fprop", 5 << 30)]


def test_status_names_what_is_missing():
    usable, why = cudnn.status()
    try:
        import cudnn as frontend  # noqa: F401
    except ImportError:
        assert not usable
        assert "nvidia-cudnn-frontend" in why and "pip install" in why
        return
    assert usable or "pip install" in why


needs_cudnn = skip_without_cudnn()


def _conv(params: str, shape, rng, dtype, weights=None, bottoms=1):
    layer_param = parse_layer(f'name: "c" type: "Convolution" ' + "".join(f'bottom: "x{i}" top: "y{i}" ' for i in range(bottoms))
                              + f'convolution_param {{ {params} weight_filler {{ type: "gaussian" std: 0.1 }} '
                              f'bias_filler {{ type: "gaussian" std: 0.1 }} }}')
    inputs = [rng.standard_normal(shape) for _ in range(bottoms)]
    layer, bottom, top = build(layer_param, inputs, bottoms, dtype, weights)
    return layer, bottom, top


def _run(layer, bottom, top, top_diffs, accumulate_into=None):
    """forward, then backward with ``top_diffs``; parameter gradients start at ``accumulate_into``
    (zeros when None). Returns host copies of (tops, bottom diffs, parameter diffs)."""
    layer.forward(bottom, top)
    for t, d in zip(top, top_diffs):
        t.diff = backend.to_device(d.astype(t.dtype), like=t.data)
    for j, p in enumerate(layer.blobs):
        p.diff[...] = 0 if accumulate_into is None else backend.to_device(accumulate_into[j].astype(p.dtype), like=p.data)
    layer.backward(top, [True] * len(bottom), bottom)
    host = backend.to_host
    return ([host(t.data).astype(np.float64) for t in top], [host(b.diff).astype(np.float64) for b in bottom],
            [host(p.diff).astype(np.float64) for p in layer.blobs])


def _relative_error(found, expected) -> float:
    return float(np.linalg.norm(found - expected) / max(np.linalg.norm(expected), 1e-30))


def _against_cpu_float64(params, shape, rng, bottoms=1, accumulate=False):
    """The GPU float32 layer (cuDNN) and the CPU float64 layer on the same values: the worst relative
    error over tops, bottom gradients and parameter gradients, and the GPU layer."""
    cpu, cpu_bottom, cpu_top = _conv(params, shape, np.random.default_rng(1), np.float64, bottoms=bottoms)
    weights = [backend.to_host(p.data) for p in cpu.blobs]
    backend.set_device("gpu", 0)
    gpu, gpu_bottom, gpu_top = _conv(params, shape, np.random.default_rng(1), np.float32, weights, bottoms=bottoms)
    top_diffs = [rng.standard_normal(t.shape) for t in cpu_top]
    start = [rng.standard_normal(p.shape) for p in cpu.blobs] if accumulate else None
    found = _run(gpu, gpu_bottom, gpu_top, top_diffs, start)
    backend.set_device("cpu")
    expected = _run(cpu, cpu_bottom, cpu_top, top_diffs, start)
    worst = max(_relative_error(f, e) for fs, es in zip(found, expected) for f, e in zip(fs, es))
    return worst, gpu


@needs_cudnn
def test_convolutions_run_through_cudnn_and_say_so(on_gpu, caplog):
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.INFO, logger="netdef"):
        layer, bottom, top = _conv("num_output: 8 kernel_size: 3 pad: 1", (4, 3, 10, 10), rng, np.float32)
        layer.forward(bottom, top)
    assert layer.algorithm == "cudnn"
    assert any("runs cuDNN" in r.getMessage() for r in caplog.records)


@needs_cudnn
def test_switched_off_cudnn_falls_back_to_im2col_and_says_why(on_gpu, caplog):
    cudnn.set_enabled(False)
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.INFO, logger="netdef"):
        layer, bottom, top = _conv("num_output: 8 kernel_size: 3 pad: 1", (4, 3, 10, 10), rng, np.float32)
    assert layer.algorithm != "cudnn"
    assert any("cuDNN switched off" in r.getMessage() for r in caplog.records)


GEOMETRIES = [
    "num_output: 64 kernel_size: 3 pad: 1",                              # VGG's 3x3
    "num_output: 32 kernel_size: 1 stride: 2",                           # a strided 1x1 (ResNet's projection)
    "num_output: 48 kernel_size: 5 pad: 2 group: 2",                     # AlexNet's grouped conv2
    "num_output: 32 kernel_size: 3 pad: 1 group: 32",                    # depthwise (MobileNet)
    "num_output: 16 kernel_size: 3 pad: 2 dilation: 2",                  # dilated
    "num_output: 24 kernel_h: 3 kernel_w: 5 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 2",  # rectangular
    "num_output: 16 kernel_size: 11 stride: 4",                          # AlexNet's conv1
]


@needs_cudnn
@pytest.mark.parametrize("params", GEOMETRIES)
def test_cudnn_matches_float64_in_strict_float32(params, on_gpu, caplog):
    caplog.set_level(logging.INFO, logger="netdef")
    worst, layer = _against_cpu_float64(params, (6, 32, 23, 23), np.random.default_rng(2))
    assert layer.algorithm == "cudnn", caplog.text[-2000:]  # the log says why cuDNN was not taken
    # float32 sums of a few hundred products: ~1e-6 relative; TensorFloat-32 would give ~1e-3.
    assert worst < 2e-5, f"{params}: relative error {worst:.2e} (strict float32 expected)"


@needs_cudnn
def test_two_bottoms_and_gradients_added_to_what_is_there(on_gpu):
    worst, layer = _against_cpu_float64("num_output: 16 kernel_size: 3 pad: 1", (4, 8, 12, 12),
                                        np.random.default_rng(3), bottoms=2, accumulate=True)
    assert worst < 2e-5


@needs_cudnn
def test_three_dimensional_convolution(on_gpu):
    worst, layer = _against_cpu_float64("num_output: 8 kernel_size: 3 pad: 1", (2, 4, 6, 7, 8), np.random.default_rng(4))
    assert layer.algorithm == "cudnn"
    assert worst < 2e-5


@needs_cudnn
def test_tf32_is_a_choice_with_tf32_accuracy(on_gpu):
    backend.set_precision("tf32")
    worst, layer = _against_cpu_float64("num_output: 128 kernel_size: 3 pad: 1", (16, 128, 28, 28), np.random.default_rng(5))
    assert layer.algorithm == "cudnn"
    assert worst < 5e-3, f"relative error {worst:.2e} is beyond TensorFloat-32's"
