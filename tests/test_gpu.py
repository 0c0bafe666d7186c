"""netdef on a GPU: blobs in CuPy arrays, the layers' CuPy code and the CUDA kernels of
netdef/layers/kernels on a real device.

1. Every single-layer Caffe oracle (../shared/fixtures/caffe-ref/layers) on the GPU.
2. LeNet with Caffe's trained weights: every blob, diff and parameter gradient on the GPU against
   what Caffe computed.
3. Training: the same solver steps on the CPU and on the GPU give the same weights (to float32
   rounding: the GPU sums in another order) for a net of the CPU's fused chains and paths (a strided
   1x1 convolution among them), and ``netdef train --gpu 0`` trains on the GPU.
4. The solver's update as one kernel per blob (netdef/solver/gpu_updates.py), for every rule: what the
   separate steps give on the CPU, and on the GPU the same bits; one launch for many blobs, the bits
   of a launch per blob.
5. ``netdef time --gpu 0``: per-layer times from CUDA events.
6. The CuPy forms of code the CPU tests run on NumPy: fp16's float16 messages, the memory watch.

Without CuPy or a CUDA device every test here skips, saying which; CI has no GPU, so these run where
one is lent (NETDEF_SHARED names the fixtures' copy there).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

import netdef
from netdef import backend
from tests.helpers import compare_with_caffe_blobs, layer_case_names, run_caffe_case, shared_path, skip_without_gpu
from tests.solver.test_gpu_updates import UPDATE_RULES, rule_and_params, stepwise_update

f32 = np.float32


pytestmark = skip_without_gpu()


@pytest.mark.parametrize("name", layer_case_names())
def test_caffe_oracle_on_gpu(name, on_gpu):
    layer = run_caffe_case(name)
    for blob in layer.blobs:
        assert backend.get_array_module(blob.data) is not np, f"{name}: parameter left on the host"


def test_lenet_matches_caffe_on_gpu(on_gpu):
    ref = np.load(shared_path("fixtures", "caffe-ref", "lenet_blobs.npz"))
    model = shared_path("fixtures", "caffe-ref", "lenet_train_test.prototxt")
    weights = shared_path("fixtures", "caffe-models", "lenet_iter_10000.caffemodel")
    net = netdef.Net(str(model), netdef.TRAIN, weights=str(weights))
    assert backend.get_array_module(net.params["conv1"][0].data) is not np
    compare_with_caffe_blobs(net, ref, rtol=1e-3, atol=1e-5)


NET = """
name: "gpu_check"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 16 dim: 3 dim: 12 dim: 12 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 16 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "norm1" type: "LRN" bottom: "pool1" top: "norm1" lrn_param { local_size: 3 } }
layer { name: "proj" type: "Convolution" bottom: "norm1" top: "proj"
        convolution_param { num_output: 8 kernel_size: 1 stride: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "conv2" type: "Convolution" bottom: "proj" top: "conv2"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 group: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss" }
"""

SOLVER = """
net: "{net}"
base_lr: 0.05
momentum: 0.9
weight_decay: 0.0005
lr_policy: "fixed"
max_iter: 100
display: 0
random_seed: 7
"""


def _trained_weights(folder, device: str, data, labels, steps: int = 5):
    backend.set_device(device, 0)
    try:
        solver = netdef.get_solver(str(folder / "solver.prototxt"))
        net = solver.net
        start = np.load(folder / "start.npz")
        for name, blobs in net.params.items():
            for i, blob in enumerate(blobs):
                blob.data[...] = backend.to_device(start[f"{name}/{i}"], like=blob.data)
        net.blobs["data"].data[...] = backend.to_device(data, like=net.blobs["data"].data)
        net.blobs["label"].data[...] = backend.to_device(labels, like=net.blobs["label"].data)
        solver.step(steps)
        return {f"{name}/{i}": backend.to_host(blob.data).copy()
                for name, blobs in net.params.items() for i, blob in enumerate(blobs)}
    finally:
        backend.set_device("cpu")


def test_training_on_gpu_matches_cpu(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(SOLVER.replace("{net}", str(tmp_path / "net.prototxt")))
    first = netdef.Net(str(tmp_path / "net.prototxt"), netdef.TRAIN)
    steps = [[first.layers[i].name for i in range(a, b + 1)] for a, b in first.forward_steps()]
    assert ["bn1", "scale1", "relu1"] in steps and ["conv2", "relu2"] in steps  # chains trained as one step
    assert first.layer_dict["proj"].algorithm == "pointwise"  # a strided 1x1: the pixels it picks, copied
    np.savez(tmp_path / "start.npz", **{f"{name}/{i}": backend.to_host(blob.data)
                                        for name, blobs in first.params.items() for i, blob in enumerate(blobs)})
    rng = np.random.default_rng(3)
    data = rng.standard_normal((16, 3, 12, 12)).astype(np.float32)
    labels = rng.integers(0, 10, 16).astype(np.float32)
    on_cpu = _trained_weights(tmp_path, "cpu", data, labels)
    on_gpu = _trained_weights(tmp_path, "gpu", data, labels)
    start = np.load(tmp_path / "start.npz")
    moved = 0
    for key, value in on_cpu.items():
        scale = max(1.0, float(np.abs(value).max()))
        np.testing.assert_allclose(on_gpu[key], value, rtol=1e-4, atol=1e-5 * scale, err_msg=key)
        moved += not np.array_equal(value, start[key])
    assert moved >= len(on_cpu) - 2, "training left most parameters where they started"


CLI_NET = """
layer { name: "d" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 8 dim: 2 dim: 6 dim: 6 } shape { dim: 8 }
                           data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_gpu_flag_overrides_the_solver_files_cpu_mode(tmp_path):
    """Caffe's -gpu wins over solver_mode: CPU (every zoo solver says CPU)."""
    (tmp_path / "net.prototxt").write_text(CLI_NET)
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed" max_iter: 20 '
                                              'display: 10 solver_mode: CPU device_id: 3\n')
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "train", "solver.prototxt", "--gpu", "0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Using GPU 0" in done.stderr
    # The memory line (netdef/solver/device_memory.py): the weights and activations of this small net.
    peak = re.search(r"Device memory: at most ([\d.]+) MiB in use at once up to iteration 2; CuPy's pool holds "
                     r"([\d.]+) MiB", done.stderr)
    assert peak and float(peak.group(1)) > 0 and float(peak.group(2)) > 0, done.stderr
    losses = [float(x) for x in re.findall(r"Iteration \d+ \(.*\), loss = ([\d.e+-]+)", done.stderr)]
    assert len(losses) == 2 and losses[-1] < losses[0], done.stderr


def _update_in_turn(cases, shapes, divisor, iter_size, decay, steps: int = 4) -> None:
    """Run ``steps`` updates of every blob, each case ``(rule, params, fused)`` with the same gradients:
    by ``fused_step`` where ``fused`` (which must take them), else by the solver's steps one by one."""
    rng = np.random.default_rng(11)
    scale = f32(1) / f32(iter_size) if iter_size != 1 else f32(1)
    decay = None if decay is None else f32(decay)
    for iteration in range(steps):  # the histories carry over
        local_rate = f32(0.01) * f32(1 + iteration % 2)
        for param_id, shape in enumerate(shapes):
            gradient = rng.standard_normal(shape).astype(np.float32) * f32(divisor)  # a sum over ranks
            for rule, params, fused in cases:
                blob = params[param_id]
                blob.diff[...] = backend.to_device(gradient, like=blob.diff)
                if fused:
                    assert rule.fused_step(param_id, blob, scale, decay, local_rate, iteration, divisor)
                else:
                    stepwise_update(rule, param_id, blob, divisor, scale, decay, local_rate, iteration)


def _update_arrays(rule, params) -> dict:
    arrays = {f"data[{i}]": blob.data for i, blob in enumerate(params)}
    arrays.update({f"diff[{i}]": blob.diff for i, blob in enumerate(params)})
    arrays.update({f"history[{i}]": blob.data for i, blob in enumerate(rule.history)})
    return {name: backend.to_host(array) for name, array in arrays.items()}


def _rule_and_params_on_gpu(rule_name, start):
    backend.set_device("gpu", 0)
    try:
        rule, params = rule_and_params(rule_name, start)
    finally:
        backend.set_device("cpu")
    assert backend.get_array_module(params[0].data) is not np
    return rule, params


UPDATE_SHAPES = [(37, 129), (5,)]


@pytest.mark.parametrize("rule_name", list(UPDATE_RULES))
@pytest.mark.parametrize("decay", [None, 0.0005])
@pytest.mark.parametrize("divisor, iter_size", [(1, 1), (3, 2)])
def test_fused_update_on_gpu_matches_the_stepwise_update_on_cpu(rule_name, decay, divisor, iter_size):
    """To float32 rounding: CuPy's kernels flush denormals to zero, NumPy does not."""
    start = [np.random.default_rng(5).standard_normal(s).astype(np.float32) for s in UPDATE_SHAPES]
    cpu = rule_and_params(rule_name, start)
    gpu = _rule_and_params_on_gpu(rule_name, start)
    _update_in_turn([(*cpu, False), (*gpu, True)], UPDATE_SHAPES, divisor, iter_size, decay)
    on_cpu, on_gpu = _update_arrays(*cpu), _update_arrays(*gpu)
    for name, expected in on_cpu.items():
        atol = 1e-7 * float(np.abs(expected).max())
        np.testing.assert_allclose(on_gpu[name], expected, rtol=1e-5, atol=atol, err_msg=f"{rule_name}: {name}")
    assert not np.array_equal(on_gpu["data[0]"], start[0]), "the update left the weights where they were"


@pytest.mark.parametrize("rule_name", list(UPDATE_RULES))
@pytest.mark.parametrize("decay", [None, 0.0005])
def test_fused_update_on_gpu_is_bit_identical_to_the_stepwise_update_on_gpu(rule_name, decay):
    """Every product rounded before it is added (gpu_updates compiles with --fmad=false), CuPy's own
    settings otherwise: the bits of one CuPy kernel per operation."""
    start = [np.random.default_rng(5).standard_normal(s).astype(np.float32) for s in UPDATE_SHAPES]
    stepwise = _rule_and_params_on_gpu(rule_name, start)
    fused = _rule_and_params_on_gpu(rule_name, start)
    _update_in_turn([(*stepwise, False), (*fused, True)], UPDATE_SHAPES, 3, 2, decay)
    by_steps, by_kernel = _update_arrays(*stepwise), _update_arrays(*fused)
    for name, expected in by_steps.items():
        assert np.array_equal(by_kernel[name].view(np.uint32), expected.view(np.uint32)), f"{rule_name}: {name}"


@pytest.mark.parametrize("rule_name", ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta"])
def test_one_launch_for_every_blob_is_bit_identical_to_a_launch_per_blob(rule_name):
    """``UpdateRule.fused_steps`` (gpu_updates.multi_step: one launch per kind of regularization, the
    blobs found by their offsets) against ``fused_step`` blob by blob, with lr_mults, decays (one
    blob without) and divisors that differ per blob, three iterations at changing rates."""
    shapes, lr_mults, decays, divisors = [(37, 129), (5,), (3, 4, 9)], [1.0, 2.0, 0.5], [f32(5e-4), None, f32(1e-3)], [1, 3, 3]
    rng = np.random.default_rng(9)
    start = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    one_by_one, blobs_one = _rule_and_params_on_gpu(rule_name, start)
    together, blobs_all = _rule_and_params_on_gpu(rule_name, start)
    scale = f32(0.5)
    for iteration in range(3):
        rate = f32(0.01) * f32(1 + iteration)
        for param_id, shape in enumerate(shapes):
            gradient = backend.to_device(rng.standard_normal(shape).astype(np.float32), like=blobs_one[0].data)
            blobs_one[param_id].diff[...] = gradient
            blobs_all[param_id].diff[...] = gradient
            assert one_by_one.fused_step(param_id, blobs_one[param_id], scale, decays[param_id],
                                         rate * f32(lr_mults[param_id]), iteration, divisors[param_id])
        for l2 in (False, True):
            ids = [i for i in range(len(shapes)) if (decays[i] is not None) == l2]
            arrays = together.fused_steps_arrays(ids, [blobs_all[i] for i in ids])
            assert arrays is not None
            together.fused_steps(arrays, l2, [(f32(divisors[i]), f32(lr_mults[i]), decays[i] or f32(0)) for i in ids],
                                 rate, scale)
    by_blob, at_once = _update_arrays(one_by_one, blobs_one), _update_arrays(together, blobs_all)
    for name, expected in by_blob.items():
        assert np.array_equal(at_once[name].view(np.uint32), expected.view(np.uint32)), f"{rule_name}: {name}"
    assert not np.array_equal(at_once["data[0]"], start[0])


def test_time_on_gpu_times_each_layer_by_cuda_events(tmp_path):
    """``netdef time --gpu 0``, as ``caffe time -gpu 0``: every layer's forward and backward time, the
    averages, and the profile that ``--json`` writes."""
    (tmp_path / "net.prototxt").write_text(CLI_NET)
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "time", "--model=net.prototxt", "--gpu", "0",
                           "--iterations=3", "--json=times.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    log = done.stderr
    assert "Use GPU with device ID 0" in log
    assert re.search(r"Device memory: at most [\d.]+ MiB in use at once over the first forward and backward; "
                     r"CuPy's pool holds [\d.]+ MiB", log), log

    def ms(layer, direction):
        found = re.search(rf"\] +{layer}\t{direction}: ([\d.e+-]+) ms\.$", log, re.M)
        assert found, f"no {direction} time for {layer}:\n{log}"
        return float(found.group(1))

    for layer in ("d", "conv", "ip", "loss"):
        assert ms(layer, "forward") >= 0 and ms(layer, "backward") >= 0
    for layer in ("conv", "ip", "loss"):  # each launches kernels both ways
        assert ms(layer, "forward") > 0 and ms(layer, "backward") > 0, log
    assert len(re.findall(r"Iteration: \d+ forward-backward time: [\d.e+-]+ ms\.", log)) == 3
    average = float(re.search(r"Average Forward-Backward: ([\d.e+-]+) ms\.", log).group(1))
    assert average > 0 and "*** Benchmark ends ***" in log
    profile = json.loads((tmp_path / "times.json").read_text())
    assert profile["device"] == "gpu 0"
    assert [layer["name"] for layer in profile["layers"]] == ["d", "conv", "ip", "loss"]
    assert all(layer["forward_ms"] > 0 for layer in profile["layers"][1:])


def test_an_out_of_range_label_on_the_gpu_stops_the_next_forward(on_gpu):
    """The label check of a loss runs on the device and is read one forward later (no wait for the
    device in every iteration): the batch after a bad one is refused, naming the label."""
    net = netdef.Net("""
    layer { name: "data" type: "Input" top: "data" top: "label"
            input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
    """, netdef.TRAIN)
    net.forward()  # labels 0: in range
    net.forward()
    net.blobs["label"].data[...] = 7  # 3 classes
    net.forward()  # queued; its check is read at the next forward
    with pytest.raises(Exception, match=r"label 7 out of range \[0, 3\).*one forward later"):
        net.forward()


def test_the_own_weights_rules_move_the_flat_vector_in_one_copy_each_way(on_gpu):
    """easgd, gossip and hybrid see the parameters as one float32 vector on the host
    (comm/own_weights.py): on a GPU it is gathered on the device and goes through pinned memory, and
    gives the values a copy of each blob would, both ways, twice in a row (the buffers are reused)."""
    from netdef.comm.communicator import Communicator
    from netdef.comm.own_weights import OwnWeightsRule

    net = netdef.Net("""
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
    layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
            convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 }
                                bias_filler { type: "constant" value: 0.5 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
            inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
    """, netdef.TRAIN)
    rule = OwnWeightsRule(Communicator(), net)
    for step in range(2):
        per_blob = np.concatenate([backend.to_host(b.data).ravel() for b in net.learnable_params]).astype(f32)
        flat = rule.flat_weights()
        assert isinstance(flat, np.ndarray) and flat.dtype == f32
        np.testing.assert_array_equal(flat, per_blob)
        rule.set_flat_weights(flat * f32(2) + f32(step))
        again = np.concatenate([backend.to_host(b.data).ravel() for b in net.learnable_params])
        np.testing.assert_array_equal(again, per_blob * f32(2) + f32(step))
        assert flat is not rule.flat_weights()  # each caller keeps its own copy


def test_float16_messages_made_on_the_gpu_are_the_hosts_bits(on_gpu):
    """fp16 over NCCL makes its messages with CuPy (comm/fp16.Float16DeviceWire): the host encoding's
    bits, and the same sums, whatever CuPy's rules for a scalar beside an array."""
    import cupy

    from netdef.comm.fp16 import Float16DeviceWire, Float16Wire

    rng = np.random.default_rng(5)
    host, device = Float16Wire(), Float16DeviceWire(cupy)
    for scale in (1e-30, 1e-8, 1.0, 1e5, 3e36):
        values = (rng.standard_normal(1001) * scale).astype(f32)
        values[[3, 7, 9]] = [np.nan, np.inf, -np.inf]
        sent, made = host.encode(values), device.encode(cupy.asarray(values))
        assert made.dtype == np.float16
        # A NaN stays a NaN; CUDA's conversion gives it a payload of its own (0x7fff), not NumPy's.
        nan = np.isnan(sent)
        np.testing.assert_array_equal(np.isnan(made.get()), nan, err_msg=str(scale))
        np.testing.assert_array_equal(made.get().view(np.uint16)[~nan], sent.view(np.uint16)[~nan], err_msg=str(scale))
        by_host, by_device = np.full_like(values, 1.5), cupy.full(values.shape, 1.5, dtype=f32)
        host.accumulate(by_host, sent)
        device.accumulate(by_device, made)
        assert by_device.get().tobytes() == by_host.tobytes()
        host.decode(sent, by_host)
        device.decode(made, by_device)
        assert by_device.get().tobytes() == by_host.tobytes()


def test_the_memory_watch_sees_what_cupys_pool_hands_out(on_gpu):
    """netdef/device_memory.py on CuPy's own pool and allocator: the peak covers a block allocated and
    freed while it watched, and the pool's allocator is back after it."""
    import cupy

    from netdef.device_memory import PeakWatch

    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    watch = PeakWatch(cupy)
    assert watch.opened
    block = cupy.empty(64 << 20, dtype=np.uint8)
    del block
    watch.close()
    assert watch.peak >= before + (64 << 20)
    assert cupy.cuda.get_allocator() == pool.malloc
