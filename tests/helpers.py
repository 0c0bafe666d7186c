"""Shared test helpers: where ../shared is, one numerical gradient checker, and a runner for the
single-layer Caffe oracles in ../shared/fixtures/caffe-ref/layers/."""
from __future__ import annotations

import contextlib
import os
import pathlib

import numpy as np
import pytest
from google.protobuf import text_format

from netdef import backend
from netdef.blob import Blob
from netdef.layers.base import TEST, TRAIN, layer_class
from netdef.proto import netdef_pb2 as pb

REPO = pathlib.Path(__file__).resolve().parents[1]
# NETDEF_SHARED names a copy of ../shared elsewhere (a GPU machine gets the fixtures it needs that way).
SHARED = pathlib.Path(os.environ.get("NETDEF_SHARED", REPO.parent / "shared"))
CAFFE_REF = SHARED / "fixtures" / "caffe-ref"
LAYER_CASES = CAFFE_REF / "layers"


def shared_path(*parts: str) -> pathlib.Path:
    """A path under ../shared, skipping the calling test (with the reason) when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared (Caffe reference fixtures) is not beside this checkout")
    return path


@contextlib.contextmanager
def default_dtype(dtype):
    old = backend.default_dtype()
    backend.set_default_dtype(dtype)
    try:
        yield
    finally:
        backend.set_default_dtype(old)


def parse_layer(text: str, phase: int = TRAIN) -> pb.LayerParameter:
    """A LayerParameter from its fields, or from ``layer { ... }`` as the oracle cases store it."""
    if text.lstrip().startswith("layer"):
        param = text_format.Parse(text, pb.NetParameter()).layer[0]
    else:
        param = text_format.Parse(text, pb.LayerParameter())
    param.phase = phase
    return param


def make_layer(layer_param: pb.LayerParameter):
    return layer_class(layer_param.type)(layer_param)


def blobs_from(arrays, dtype) -> list[Blob]:
    out = []
    for i, a in enumerate(arrays):
        b = Blob(np.shape(a), dtype=dtype, name=f"x{i}")
        b.data[...] = backend.to_device(np.asarray(a, dtype=dtype), like=b.data)
        out.append(b)
    return out


def build(layer_param, bottoms, num_tops: int, dtype=np.float64, params=None):
    """Instantiate and set up one layer on fresh blobs; ``params`` (arrays) replace the fillers."""
    with default_dtype(dtype):
        layer = make_layer(layer_param)
        bottom = blobs_from(bottoms, dtype)
        top = [Blob(dtype=dtype, name=f"y{i}") for i in range(num_tops)]
        layer.setup_layer(bottom, top)
        if params is not None:
            assert len(params) == len(layer.blobs), f"layer has {len(layer.blobs)} blobs, {len(params)} given"
            for blob, value in zip(layer.blobs, params):
                assert blob.shape == np.shape(value), f"param shape {blob.shape} != {np.shape(value)}"
                blob.data[...] = backend.to_device(np.asarray(value, dtype=dtype), like=blob.data)
    return layer, bottom, top


def _objective(layer, bottom, top, top_diffs):
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    return sum(float(np.sum(t.data * d)) for t, d in zip(top, top_diffs))


def check_gradients(layer_param, bottoms, num_tops=1, params=None, check_bottoms=None, check_params=True,
                    step=1e-4, rtol=1e-4, atol=1e-6, seed=0, top_diffs=None):
    """Central-difference check (float64) of every requested bottom and parameter gradient of
    J = sum_i <top_i, top_diff_i>. Loss layers: pass ``top_diffs=[1.0]`` (the loss weight)."""
    rng = np.random.default_rng(seed)
    bottoms = [np.asarray(b, dtype=np.float64) for b in bottoms]
    layer, bottom, top = build(layer_param, bottoms, num_tops, np.float64, params)
    layer.forward(bottom, top)
    if top_diffs is None:
        top_diffs = [rng.standard_normal(t.shape) for t in top]
    top_diffs = [np.broadcast_to(np.asarray(d, dtype=np.float64), t.shape).copy() for t, d in zip(top, top_diffs)]
    if check_bottoms is None:
        check_bottoms = list(range(len(bottom)))
    for t, d in zip(top, top_diffs):
        t.diff = d.copy()
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward(top, [i in check_bottoms for i in range(len(bottom))], bottom)
    analytic_bottom = {i: np.array(bottom[i].diff) for i in check_bottoms}
    analytic_param = [np.array(p.diff) for p in layer.blobs]

    def numeric(array):
        grad = np.zeros_like(array)
        flat, g = array.reshape(-1), grad.reshape(-1)
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + step
            plus = _objective(layer, bottom, top, top_diffs)
            flat[k] = old - step
            minus = _objective(layer, bottom, top, top_diffs)
            flat[k] = old
            g[k] = (plus - minus) / (2 * step)
        return grad

    for i in check_bottoms:
        np.testing.assert_allclose(analytic_bottom[i], numeric(bottom[i].data), rtol=rtol, atol=atol,
                                   err_msg=f"bottom {i} gradient of {layer_param.type}")
    if check_params:
        for j, p in enumerate(layer.blobs):
            np.testing.assert_allclose(analytic_param[j], numeric(p.data), rtol=rtol, atol=atol,
                                       err_msg=f"param {j} gradient of {layer_param.type}")
    return layer


def assert_same_on_one_thread(run, repeats: int = 3):
    """``run()`` (a list of arrays, from compiled kernels) gives the same bits on numba's whole pool,
    ``repeats`` times, as on a single thread."""
    import numba

    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = run()
        numba.set_num_threads(before)
        for _ in range(repeats):
            for got, expected in zip(run(), single, strict=True):
                np.testing.assert_array_equal(got, expected)
    finally:
        numba.set_num_threads(before)


def layer_case_names(prefixes: tuple[str, ...] = ()) -> list[str]:
    """Names of the single-layer oracle cases (empty when ../shared is absent; tests then skip)."""
    if not LAYER_CASES.exists():
        return []
    names = sorted(p.stem for p in LAYER_CASES.glob("*.npz"))
    return [n for n in names if not prefixes or n.startswith(prefixes)]


def run_caffe_case(name: str, rtol=1e-4, atol=1e-5):
    """Run one oracle case through netdef (float32) and compare every output, gradient and
    updated stored blob with what Caffe computed, on whichever device new blobs live (read back to
    the host for the comparison)."""
    path = shared_path("fixtures", "caffe-ref", "layers", f"{name}.npz")
    case = np.load(path)
    phase = TEST if str(case["phase"]) == "TEST" else TRAIN
    param = parse_layer(str(case["layer"]), phase)
    nb = len([k for k in case.files if k.startswith("bottom/")])
    nt = len([k for k in case.files if k.startswith("top/")])
    bottoms = [case[f"bottom/{i}"] for i in range(nb)]
    params = [case[f"param/{j}"] for j in range(len([k for k in case.files if k.startswith("param/")]))]
    layer, bottom, top = build(param, bottoms, nt, np.float32, params if params else None)
    layer.forward(bottom, top)
    for i in range(nt):
        np.testing.assert_allclose(backend.to_host(top[i].data), case[f"top/{i}"], rtol=rtol, atol=atol, err_msg=f"{name}: top {i}")
    for j in range(len(params)):
        if f"param_after/{j}" in case.files:
            np.testing.assert_allclose(backend.to_host(layer.blobs[j].data), case[f"param_after/{j}"], rtol=rtol, atol=atol,
                                       err_msg=f"{name}: stored blob {j} after forward")
    if str(case["mode"]) == "forward":
        return layer
    for i in range(nt):
        top[i].diff = np.broadcast_to(case[f"top_diff/{i}"], top[i].shape)
    for p in layer.blobs:
        p.diff[...] = 0
    propagate = [f"bottom_diff/{i}" in case.files for i in range(nb)]
    layer.backward(top, propagate, bottom)
    for i in range(nb):
        if propagate[i]:
            np.testing.assert_allclose(backend.to_host(bottom[i].diff), case[f"bottom_diff/{i}"], rtol=rtol, atol=atol,
                                       err_msg=f"{name}: bottom {i} gradient")
    for j in range(len(params)):
        if f"param_diff/{j}" in case.files:
            np.testing.assert_allclose(backend.to_host(layer.blobs[j].diff), case[f"param_diff/{j}"], rtol=rtol, atol=atol,
                                       err_msg=f"{name}: param {j} gradient")
    return layer


def compare_with_caffe_blobs(net, ref, rtol: float, atol: float) -> None:
    """Run one forward and backward of ``net`` on the input and labels of a Caffe blob dump
    (``{prefix}_blobs.npz``) and compare every blob, diff and parameter gradient it holds, on
    whichever device the net lives (read back to the host)."""
    net.forward(data=ref["input"], label=ref["label"])
    net.clear_param_diffs()
    net.backward()
    checked = 0
    for key in ref.files:
        kind, _, name = key.partition("/")
        if kind == "blob" and name in net.blobs and name != "prob":
            got = net.blobs[name].data
        elif kind == "diff" and name in net.blobs:
            got = net.blobs[name].diff
        elif kind == "pdiff":
            layer, i = name.split("/")
            got = net.params[layer][int(i)].diff
        else:
            continue
        scale = max(1.0, float(np.abs(ref[key]).max()))
        np.testing.assert_allclose(backend.to_host(got), ref[key], rtol=rtol, atol=atol * scale, err_msg=key)
        checked += 1
    assert checked >= 20


def train_twice(text: str, fused: bool, rng, values=None):
    """Two forward+backward passes of the TRAIN net ``text`` with chains trained as one step or layer
    by layer (``fused``), from ``values`` (parameters and the Input blobs "data" and "target"; drawn
    from ``rng`` when None). Returns ({"blob NAME" / "param LAYER.J": (values, gradient)}, the
    net's steps as lists of layer names, the values, the net)."""
    import netdef

    netdef.set_random_seed(0)  # the fillers' weights: the same net on every run
    net = netdef.Net(text, netdef.TRAIN)
    net.fuse_layers = fused
    if values is None:
        values = {"params": {(l, j): p.data.copy() for l, ps in net.params.items() for j, p in enumerate(ps)},
                  "data": rng.standard_normal(net.blobs["data"].shape),
                  "target": rng.standard_normal(net.blobs["target"].shape)}
    for (layer, j), v in values["params"].items():
        net.params[layer][j].data[...] = v
    for name in ("data", "target"):
        net.blobs[name].data[...] = values[name]
    for _ in range(2):
        net.clear_param_diffs()
        net.forward_backward()
    state = {f"blob {n}": (b.data.copy(), b.diff.copy()) for n, b in net.blobs.items()}
    state.update({f"param {l}.{j}": (p.data.copy(), p.diff.copy()) for l, ps in net.params.items() for j, p in enumerate(ps)})
    steps = [[net.layers[i].name for i in range(first, last + 1)] for first, last in net.forward_steps()]
    return state, steps, values, net


def gpu_missing() -> str | None:
    """Why the GPU tests cannot run here (no CuPy, no usable CUDA device), or None."""
    return backend.gpu_problem(0)


def skip_without_gpu():
    """A skip mark for tests that need a GPU, saying why there is none (the fixture ``on_gpu`` in
    conftest.py then puts new blobs on it)."""
    missing = gpu_missing()
    return pytest.mark.skipif(missing is not None, reason=f"no GPU: {missing}")


def skip_without_cudnn():
    """A skip mark for tests that need a GPU with cuDNN, saying what is missing."""
    from netdef import cudnn

    usable, why = cudnn.status()
    missing = gpu_missing() or (None if usable else why)
    return pytest.mark.skipif(missing is not None, reason=f"no GPU with cuDNN: {missing}")


@contextlib.contextmanager
def gpu_settings():
    """New blobs on GPU 0 for the block; afterwards the CPU again, and the GPU settings a test may
    change (precision, cuDNN switched off) back at their defaults."""
    from netdef import cudnn

    backend.set_device("gpu", 0)
    try:
        yield
    finally:
        backend.set_device("cpu")
        backend.set_precision("float32")
        cudnn.set_enabled(True)


def dummy_data_solver(inputs: int, prefix: str = "snaps/run") -> str:
    """A solver prototxt with its net inside: random DummyData of ``inputs`` values per item, one
    InnerProduct, a loss; 2 iterations on the CPU, then the final snapshot at ``prefix``. No data
    files needed; the model file holds about 8 x ``inputs`` bytes."""
    return f"""
net_param {{
  layer {{ name: "d" type: "DummyData" top: "x" top: "y"
          dummy_data_param {{ shape {{ dim: 4 dim: {inputs} }} shape {{ dim: 4 dim: 2 }}
                             data_filler {{ type: "gaussian" }} data_filler {{ type: "gaussian" }} }} }}
  layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "p" inner_product_param {{ num_output: 2 }} }}
  layer {{ name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }}
}}
base_lr: 0.01
lr_policy: "fixed"
max_iter: 2
snapshot_prefix: "{prefix}"
solver_mode: CPU
"""
