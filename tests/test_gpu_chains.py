"""BatchNorm chains trained as one step on a GPU (layers/gpu_batchnorm_chain.py, kernels/batchnorm_chain.cu):
for every shape of chain the CPU tests cover (tests/layers/test_batchnorm_chain.py), two iterations of
the net with its chains run as one step on the GPU against the same net run layer by layer on the GPU
and against the fused chains on the CPU: every blob's values and gradients, every parameter and its
gradient, BatchNorm's moving sums. Sums run in another order on the GPU, so the comparison is to
float rounding, not to the bit; that the chain really ran as one step is checked too.

Without CuPy or a CUDA device every test here skips, saying which.
"""
from __future__ import annotations

import numpy as np
import pytest

import netdef
from netdef import backend
from tests.helpers import default_dtype, gpu_settings, skip_without_gpu
from tests.layers.test_batchnorm_chain import VARIANTS, chain_net, random_values

pytestmark = skip_without_gpu()

# A channel of several reduction slices (slices_for: 8 x 4096 values in 32 slices), and a
# BatchNorm over N x C values (one spatial value a channel).
GPU_VARIANTS = {**VARIANTS, "many slices": {"size": 64, "channels": 2}}


def trained(text, fused: bool, values: dict, iterations: int = 2) -> dict:
    """As the CPU test's ``trained``, on whichever device new blobs go to, with the values on the
    host; plus whether the BatchNorm chain last ran as one step."""
    net = netdef.Net(text, netdef.TRAIN)
    net.fuse_layers = fused
    for (layer, j), v in values["params"].items():
        blob = net.params[layer][j]
        blob.data[...] = backend.to_device(np.asarray(v, dtype=blob.data.dtype), like=blob.data)
    for name in ("data", "target"):
        blob = net.blobs[name]
        blob.data[...] = backend.to_device(np.asarray(values[name], dtype=blob.data.dtype), like=blob.data)
    for _ in range(iterations):
        net.clear_param_diffs()
        net.forward_backward()
    state = {f"blob {n}": (backend.to_host(b.data).copy(), backend.to_host(b.diff).copy()) for n, b in net.blobs.items()}
    state.update({f"param {layer}.{j}": (backend.to_host(p.data).copy(), backend.to_host(p.diff).copy())
                  for layer, ps in net.params.items() for j, p in enumerate(ps)})
    bn = list(net._layer_names).index("bn")
    state["ran as one step"] = net._training_chain_of[bn].ran_fused if bn in net._training_chain_of else False
    return state


def assert_close(a: dict, b: dict, rtol: float, what: str) -> None:
    for key in b:
        if key == "ran as one step":
            continue
        for part, x, y in zip(("values", "gradient"), a[key], b[key]):
            scale = max(1.0, float(np.abs(y).max()) if y.size else 1.0)
            if key == "param conv.1" and part == "gradient":
                # The bias below BatchNorm: its gradient, the sum of BatchNorm's input gradient over a
                # channel, is zero but for rounding (BatchNorm takes the mean out), so it is only as
                # close as float sums of that many terms are: measured against their magnitudes.
                scale = float(np.abs(b["blob c"][1]).sum()) / 10
            np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * scale, err_msg=f"{what}: {key} {part}")


CASES = [(variant, np.float32) for variant in GPU_VARIANTS] + [("scale+relu", np.float64)]


@pytest.mark.parametrize("variant, dtype", CASES)
def test_a_chain_on_the_gpu_gives_its_layers_values_and_the_cpus(variant, dtype):
    text = chain_net(**GPU_VARIANTS[variant])
    rtol = 2e-4 if dtype == np.float32 else 1e-10
    with default_dtype(dtype):
        values = random_values(text, dtype)
        on_cpu = trained(text, True, values)
        with gpu_settings():
            fused = trained(text, True, values)
            layered = trained(text, False, values)
    assert fused["ran as one step"] and not layered["ran as one step"] and on_cpu["ran as one step"]
    assert_close(fused, layered, rtol, "GPU chain against the GPU's layers")
    assert_close(fused, on_cpu, rtol, "GPU chain against the CPU's chain")
    assert fused["param bn.2"][0][0] > 0  # the moving statistics were recorded (or kept: global)
