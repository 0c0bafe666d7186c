"""BatchNorm chains trained as one step (layers/batchnorm_chain.py, jit/batchnorm_chain.py,
Net.forward_range and backward_range): a net that trains its chains fused against the same net run
layer by layer, bit for bit in every blob's values and gradients, every parameter and gradient and
BatchNorm's moving statistics over two iterations, for each shape of chain (with and without Scale,
its bias, its learned scale, ReLU, a leaky slope, global statistics, rows longer than a kernel
block, float64); a float64 numerical check of the fused gradients; where chains are and are not
formed; the hooks; and the refusals."""
from __future__ import annotations

import numpy as np
import pytest

import netdef
from netdef.layers import jit
from netdef.net import NetError
from tests.helpers import default_dtype

RNG = np.random.default_rng(20261126)


def chain_net(*, scale="bias", relu="relu", global_stats=False, size=9, channels=3, frozen_below=False):
    """Input -> Convolution -> BatchNorm (in place) -> [Scale] -> [ReLU] -> InnerProduct -> loss."""
    scale_layer = {
        None: "",
        "bias": 'layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }',
        "no_bias": 'layer { name: "sc" type: "Scale" bottom: "c" top: "c" }',
        "bias_learned_only": 'layer { name: "sc" type: "Scale" bottom: "c" top: "c" param { lr_mult: 0 } '
                             'param { lr_mult: 1 } scale_param { bias_term: true } }',
    }[scale]
    relu_layer = {
        None: "",
        "relu": 'layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }',
        "leaky": 'layer { name: "relu" type: "ReLU" bottom: "c" top: "c" relu_param { negative_slope: 0.1 } }',
    }[relu]
    conv_lr = "param { lr_mult: 0 } param { lr_mult: 0 }" if frozen_below else ""
    stats = "batch_norm_param { use_global_stats: true }" if global_stats else ""
    return f"""
    name: "chain"
    layer {{ name: "data" type: "Input" top: "data" top: "target"
             input_param {{ shape {{ dim: 2 dim: 2 dim: {size} dim: {size} }} shape {{ dim: 2 dim: 4 }} }} }}
    layer {{ name: "conv" type: "Convolution" bottom: "data" top: "c" {conv_lr}
             convolution_param {{ num_output: {channels} kernel_size: 3 pad: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
    layer {{ name: "bn" type: "BatchNorm" bottom: "c" top: "c" {stats} }}
    {scale_layer}
    {relu_layer}
    layer {{ name: "fc" type: "InnerProduct" bottom: "c" top: "fc" inner_product_param {{ num_output: 4 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
    layer {{ name: "loss" type: "EuclideanLoss" bottom: "fc" bottom: "target" top: "loss" }}
    """


def trained(text, fused: bool, values: dict, iterations: int = 2) -> dict:
    """Every blob's and parameter's values and gradients after ``iterations`` forward+backward
    passes of the net from ``values`` (parameters by (layer, index), and the inputs)."""
    net = netdef.Net(text, netdef.TRAIN)
    net.fuse_layers = fused
    for (layer, j), v in values["params"].items():
        net.params[layer][j].data[...] = v
    for name in ("data", "target"):
        net.blobs[name].data[...] = values[name]
    for _ in range(iterations):
        net.clear_param_diffs()
        net.forward_backward()
    state = {f"blob {n}": (b.data.copy(), b.diff.copy()) for n, b in net.blobs.items()}
    state.update({f"param {layer}.{j}": (p.data.copy(), p.diff.copy())
                  for layer, ps in net.params.items() for j, p in enumerate(ps)})
    state["steps"] = [[net.layers[li].name for li in range(first, last + 1)] for first, last in net.forward_steps()]
    return state


def random_values(text, dtype) -> dict:
    with default_dtype(dtype):
        net = netdef.Net(text, netdef.TRAIN)
    params = {}
    for layer, ps in net.params.items():
        for j, p in enumerate(ps):
            if layer == "bn":  # moving sums and a factor of 2: statistics of a positive variance
                params[layer, j] = RNG.random(p.shape) + 0.5
            else:
                params[layer, j] = RNG.standard_normal(p.shape)
    data = RNG.standard_normal(net.blobs["data"].shape)
    data.reshape(-1)[:3] = 0.0  # exact zeros in the convolution's input
    return {"params": params, "data": data, "target": RNG.standard_normal(net.blobs["target"].shape)}


def same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b) and np.array_equal(np.signbit(a), np.signbit(b))


VARIANTS = {
    "scale+relu": {},
    "scale(no bias)": {"relu": None, "scale": "no_bias"},
    "relu alone": {"scale": None},
    "leaky relu": {"relu": "leaky"},
    "scale's bias learned alone": {"scale": "bias_learned_only"},
    "global statistics": {"global_stats": True},
    "rows of two kernel blocks": {"size": 130, "channels": 2},  # 16900 values a row (blocks of 16384)
}


# float64: each variant compiles kernels of its own (seconds each), so one variant is enough.
CASES = [(variant, np.float32) for variant in VARIANTS] + [("scale+relu", np.float64)]


@pytest.mark.parametrize("variant, dtype", CASES)
def test_a_chain_trained_as_one_step_gives_the_bits_of_its_layers_one_by_one(variant, dtype):
    text = chain_net(**VARIANTS[variant])
    with default_dtype(dtype):
        values = random_values(text, dtype)
        fused = trained(text, True, values)
        layered = trained(text, False, values)
    members = ["bn"] + (["sc"] if "sc" in text else []) + (["relu"] if '"relu"' in text else [])
    assert members in fused["steps"] and members not in layered["steps"]
    for key in layered:
        if key == "steps":
            continue
        for part, a, b in zip(("values", "gradient"), fused[key], layered[key]):
            assert same_bits(a, b), f"{key} {part}"
    assert fused["param bn.2"][0][0] > 0  # the moving statistics were recorded (or kept: global)
    if '"relu"' in text:  # some values were rectified, some gradients passed
        rectified = fused["blob c"][0] < 0 if "negative_slope" in text else fused["blob c"][0] == 0
        assert rectified.any() and (fused["blob c"][1] != 0).any()


def test_the_fused_gradients_pass_a_numerical_check():
    """float64: the input's and Scale's parameter gradients of J = <chain output, d>."""
    text = """
    name: "check"
    force_backward: true
    layer { name: "data" type: "Input" top: "x" input_param { shape { dim: 3 dim: 2 dim: 2 dim: 3 } } }
    layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" }
    layer { name: "sc" type: "Scale" bottom: "y" top: "y" scale_param { bias_term: true } }
    layer { name: "relu" type: "ReLU" bottom: "y" top: "y" relu_param { negative_slope: 0.2 } }
    """
    with default_dtype(np.float64):
        net = netdef.Net(text, netdef.TRAIN)
    net.params["sc"][0].data[...] = [1.5, -0.7]
    net.params["sc"][1].data[...] = [0.2, -0.1]
    net.blobs["x"].data[...] = RNG.standard_normal(net.blobs["x"].shape)
    d = RNG.standard_normal(net.blobs["y"].shape)
    assert ["bn", "sc", "relu"] in [[net.layers[i].name for i in range(a, b + 1)] for a, b in net.forward_steps()]

    def objective():
        net.forward()
        return float(np.sum(net.blobs["y"].data * d))

    objective()
    net.clear_param_diffs()
    net.backward(y=d.copy())
    analytic = [net.blobs["x"].diff.copy()] + [p.diff.copy() for p in net.params["sc"]]
    for array, expected in zip([net.blobs["x"].data] + [p.data for p in net.params["sc"]], analytic):
        numeric = np.zeros_like(array)
        flat = array.reshape(-1)
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + 1e-5
            plus = objective()
            flat[k] = old - 1e-5
            minus = objective()
            flat[k] = old
            numeric.reshape(-1)[k] = (plus - minus) / 2e-5
        np.testing.assert_allclose(expected, numeric, rtol=1e-5, atol=1e-7)


def test_no_chain_where_a_value_between_its_layers_can_be_read_or_batchnorm_needs_no_backward():
    # Scale writes a blob of its own: BatchNorm's top stays readable, so no chain.
    own_top = chain_net().replace('bottom: "c" top: "c" scale_param', 'bottom: "c" top: "s" scale_param') \
                         .replace('"relu" type: "ReLU" bottom: "c" top: "c"', '"relu" type: "ReLU" bottom: "s" top: "s"') \
                         .replace('"fc" type: "InnerProduct" bottom: "c"', '"fc" type: "InnerProduct" bottom: "s"')
    net = netdef.Net(own_top, netdef.TRAIN)
    assert all(last == first for first, last in net.forward_steps())
    # Nothing below BatchNorm learns, but Scale does: the layers run one by one.
    net = netdef.Net(chain_net(frozen_below=True), netdef.TRAIN)
    net.blobs["data"].data[...] = RNG.standard_normal(net.blobs["data"].shape)
    bn = net.layer_index("bn")
    assert not net.layer_need_backward[bn] and net.layer_need_backward[bn + 1]
    assert (bn, bn) in net.forward_steps()
    net.forward_backward()
    assert np.abs(net.params["sc"][0].diff).sum() > 0


def test_hooks_see_every_layer_of_a_chain_and_scales_gradients_once_final():
    net = netdef.Net(chain_net(), netdef.TRAIN)
    calls = []
    net.register_layer_hooks(before_backward=lambda li: calls.append(("before", li)),
                             after_backward=lambda li: calls.append(("after", li)))
    net.register_backward_hook(lambda li, ids: calls.append(("final", li, tuple(ids))))
    net.forward_backward()
    bn, sc, relu = (net.layer_index(n) for n in ("bn", "sc", "relu"))
    chain_calls = [c for c in calls if c[1] in (bn, sc, relu)]
    scale_ids = tuple(net.gradients_final_at(sc))
    assert chain_calls == [("before", relu), ("before", sc), ("before", bn),
                           ("after", relu), ("after", sc), ("final", sc, scale_ids), ("after", bn)]


def test_a_backward_range_that_cuts_a_fused_chain_is_refused_and_runs_layered_when_fusing_is_off():
    net = netdef.Net(chain_net(), netdef.TRAIN)
    net.blobs["data"].data[...] = RNG.standard_normal(net.blobs["data"].shape)
    net.forward()
    with pytest.raises(NetError, match=r"cuts the chain 'bn'..'relu'.*fuse_layers = False"):
        net.backward(start="sc")
    net.fuse_layers = False
    net.forward()
    net.backward(start="sc", c=RNG.standard_normal(net.blobs["c"].shape).astype(np.float32))
    assert np.abs(net.params["conv"][0].diff).sum() > 0


def test_without_the_kernels_the_layers_run_one_by_one(monkeypatch):
    text = chain_net()
    values = random_values(text, np.float32)
    fused = trained(text, True, values, iterations=1)
    monkeypatch.setattr(jit, "ENABLED", False)
    reference = trained(text, True, values, iterations=1)  # NumPy's functions: other sums, other bits
    for key in ("blob data", "param sc.0", "param sc.1", "param conv.0"):
        np.testing.assert_allclose(fused[key][1], reference[key][1], rtol=2e-4, atol=1e-5, err_msg=key)


def test_the_chains_bits_do_not_depend_on_the_thread_count():
    from tests.helpers import assert_same_on_one_thread

    text = chain_net(channels=5)
    values = random_values(text, np.float32)

    def run():
        state = trained(text, True, values, iterations=1)
        return [state[key][part] for key in ("blob c", "param sc.0", "param sc.1", "param conv.0") for part in (0, 1)]

    assert_same_on_one_thread(run)
