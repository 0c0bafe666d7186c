"""netdef/solver/gpu_updates.py on a machine without a GPU.

It changes nothing there: every rule's ``fused_step`` on NumPy arrays either gives the bits of the
solver's steps one by one (SGD and Nesterov, the CPU kernels of jit_updates) or returns False having
touched nothing, and importing the update rules does not import CuPy. The kernels' arithmetic is
checked here too, their bodies compiled for the host by a C++ compiler without contraction (as nvrtc
with ``--fmad=false``) and called through ``fused_step``; on a GPU tests/test_gpu.py runs them.
"""
from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
import sys

import numpy as np
import pytest

from netdef import backend
from netdef.blob import Blob
from netdef.proto import netdef_pb2 as pb
from netdef.solver import gpu_updates
from netdef.solver.updates import UpdateRule, registered_update_rules, update_rule_class

f32 = np.float32

# Each built-in rule with settings that exercise its history terms (tests/test_gpu.py uses these too).
UPDATE_RULES = {
    "SGD": {"momentum": 0.9},
    "Nesterov": {"momentum": 0.9},
    "AdaGrad": {},
    "RMSProp": {"rms_decay": 0.95},
    "AdaDelta": {"momentum": 0.95, "delta": 1e-6},
    "Adam": {"momentum": 0.9, "momentum2": 0.999},
}
FUSED_ON_THE_CPU = {"SGD", "Nesterov"}


def stepwise_update(rule, param_id, blob, divisor, scale, decay, local_rate, iteration):
    """The solver without a fused step: _divide_now, normalize, regularize, compute_update_value, data -= diff."""
    diff = blob.diff
    if divisor != 1:
        diff /= f32(divisor)
    if scale != 1:
        diff *= scale
    if decay is not None:
        diff += decay * blob.data
    rule.compute_update_value(param_id, blob, local_rate, iteration)
    data = blob.data
    data -= blob.diff


def rule_and_params(rule_name, start):
    """A rule of ``UPDATE_RULES`` set up for parameters holding the arrays ``start``."""
    rule = update_rule_class(rule_name)(pb.SolverParameter(type=rule_name, base_lr=0.01, **UPDATE_RULES[rule_name]))
    params = []
    for values in start:
        blob = Blob(values.shape, dtype=np.float32)  # on the current device
        blob.data[...] = backend.to_device(values, like=blob.data)
        params.append(blob)
    rule.setup(params)
    return rule, params


def _bits(array):
    return array.view(np.uint32).copy()


def _assert_same_bits(fused_params, stepwise_params, fused_rule, stepwise_rule) -> None:
    """Every blob's data and diff, and every history blob, the same bits on both sides."""
    for i, (fused, stepwise) in enumerate(zip(fused_params, stepwise_params)):
        assert np.array_equal(_bits(fused.data), _bits(stepwise.data)), f"data[{i}]"
        assert np.array_equal(_bits(fused.diff), _bits(stepwise.diff)), f"diff[{i}]"
    for i, (fused, stepwise) in enumerate(zip(fused_rule.history, stepwise_rule.history)):
        assert np.array_equal(_bits(fused.data), _bits(stepwise.data)), f"history[{i}]"


@pytest.mark.parametrize("rule_name", list(UPDATE_RULES))
@pytest.mark.parametrize("decay", [None, 0.0005])
def test_fused_step_on_the_cpu_is_bit_identical_or_declined(rule_name, decay):
    rng = np.random.default_rng(2)
    shapes = [(40, 70), (6,)]
    start = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    fused_rule, fused_params = rule_and_params(rule_name, start)
    stepwise_rule, stepwise_params = rule_and_params(rule_name, start)
    divisor, scale = 3, f32(1) / f32(2)
    decay = None if decay is None else f32(decay)
    for iteration in range(3):
        local_rate = f32(0.01) * f32(1 + iteration % 2)
        for param_id, shape in enumerate(shapes):
            gradient = rng.standard_normal(shape).astype(np.float32)
            fused, stepwise = fused_params[param_id], stepwise_params[param_id]
            fused.diff[...] = gradient
            stepwise.diff[...] = gradient
            before = [_bits(a) for a in (fused.data, fused.diff, *(h.data for h in fused_rule.history))]
            if not fused_rule.fused_step(param_id, fused, scale, decay, local_rate, iteration, divisor):
                assert rule_name not in FUSED_ON_THE_CPU
                after = [_bits(a) for a in (fused.data, fused.diff, *(h.data for h in fused_rule.history))]
                assert all(np.array_equal(a, b) for a, b in zip(before, after)), "declined, yet changed the arrays"
                stepwise_update(fused_rule, param_id, fused, divisor, scale, decay, local_rate, iteration)
            else:
                assert rule_name in FUSED_ON_THE_CPU
            stepwise_update(stepwise_rule, param_id, stepwise, divisor, scale, decay, local_rate, iteration)
    _assert_same_bits(fused_params, stepwise_params, fused_rule, stepwise_rule)


def test_every_built_in_rule_has_a_fused_step():
    """Each rule's whole step is one kernel on a GPU (gpu_updates); a rule left with the base class's
    ``fused_step`` would run one CuPy kernel per operation there."""
    for rule_name in UPDATE_RULES:
        assert update_rule_class(rule_name).fused_step is not UpdateRule.fused_step, rule_name


def test_every_registered_update_rule_has_a_gpu_kernel_under_its_name():
    assert gpu_updates.kernel_rules() == registered_update_rules() == sorted(UPDATE_RULES)


def test_importing_the_update_rules_does_not_import_cupy():
    code = "import sys, netdef.solver.updates, netdef.solver.gpu_updates; print('cupy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def _host_kernel(compiler: str, folder, rule: str, l2: bool):
    """``rule``'s kernel body in a host loop, called as its ElementwiseKernel is: float32 scalars, then
    the arrays it updates (each element bound by reference, as CuPy binds them)."""
    in_params, out_params, operation = gpu_updates.kernel_code(rule, l2)
    scalars = [p.split()[1] for p in in_params.split(",")]
    arrays = [p.split()[1] for p in out_params.split(",")]
    assert {p.split()[0] for p in (in_params + "," + out_params).split(",")} == {"float32"}
    params = ", ".join([f"float {n}" for n in scalars] + [f"float *_raw_{n}" for n in arrays] + ["long size"])
    bind = " ".join(f"float &{n} = _raw_{n}[i];" for n in arrays)
    source = folder / f"{rule}_{int(l2)}.cpp"
    source.write_text(f"#include <math.h>\nextern \"C\" void step({params}) {{\n"
                      f"for (long i = 0; i < size; ++i) {{ {bind}\n{operation}\n}}\n}}\n")
    library = folder / f"{rule}_{int(l2)}.so"
    subprocess.run([compiler, "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-o", str(library), str(source)],
                   check=True, capture_output=True, text=True)
    step = ctypes.CDLL(str(library)).step

    def call(*args):
        assert len(args) == len(scalars) + len(arrays), f"{rule}: {len(args)} arguments"
        assert all(type(a) is np.float32 for a in args[:len(scalars)]), f"{rule}: scalars not float32"
        updated = args[len(scalars):]
        assert all(a.dtype == np.float32 and a.flags.c_contiguous and a.size == updated[0].size for a in updated)
        step(*[ctypes.c_float(a) for a in args[:len(scalars)]],
             *[a.ctypes.data_as(ctypes.c_void_p) for a in updated], ctypes.c_long(updated[0].size))

    return call


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="no C++ compiler")
def test_the_gpu_kernels_arithmetic_compiled_for_the_host_gives_the_stepwise_bits(tmp_path, monkeypatch):
    compiler = shutil.which("c++") or shutil.which("g++")
    kernels = {}

    def kernel(rule, l2):
        if (rule, l2) not in kernels:
            kernels[rule, l2] = _host_kernel(compiler, tmp_path, rule, l2)
        return kernels[rule, l2]

    monkeypatch.setattr(gpu_updates, "usable", lambda *arrays: True)
    monkeypatch.setattr(gpu_updates, "_kernel", kernel)
    shapes = [(40, 70), (6,)]
    for rule_name, decay, (divisor, iter_size) in itertools.product(UPDATE_RULES, [None, 0.0005], [(1, 1), (3, 2)]):
        rng = np.random.default_rng(7)
        start = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        fused_rule, fused_params = rule_and_params(rule_name, start)
        stepwise_rule, stepwise_params = rule_and_params(rule_name, start)
        scale = f32(1) / f32(iter_size) if iter_size != 1 else f32(1)
        decay = None if decay is None else f32(decay)
        for iteration in range(3):
            local_rate = f32(0.01) * f32(1 + iteration % 2)
            for param_id, shape in enumerate(shapes):
                gradient = rng.standard_normal(shape).astype(np.float32) * f32(divisor)
                fused_params[param_id].diff[...] = gradient
                stepwise_params[param_id].diff[...] = gradient
                assert fused_rule.fused_step(param_id, fused_params[param_id], scale, decay, local_rate, iteration,
                                             divisor)
                stepwise_update(stepwise_rule, param_id, stepwise_params[param_id], divisor, scale, decay, local_rate,
                                iteration)
        case = f"{rule_name}, decay {decay}, divisor {divisor}, iter_size {iter_size}"
        assert not np.array_equal(fused_params[0].data, start[0]), case
        for i, (fused, stepwise) in enumerate(zip(fused_params, stepwise_params)):
            assert np.array_equal(_bits(fused.data), _bits(stepwise.data)), f"{case}: data[{i}]"
            assert np.array_equal(_bits(fused.diff), _bits(stepwise.diff)), f"{case}: diff[{i}]"
        for i, (fused, stepwise) in enumerate(zip(fused_rule.history, stepwise_rule.history)):
            assert np.array_equal(_bits(fused.data), _bits(stepwise.data)), f"{case}: history[{i}]"
    assert len(kernels) == 2 * len(UPDATE_RULES)  # every rule's kernel, with and without L2


# One thread, one block: the kernel's grid-stride loop visits every value (as tests/layers/test_kernels.py).
_HOST_SHIM = """#include <math.h>
struct netdef_dim3 { int x, y, z; };
static const netdef_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
"""


def _host_multi_kernel(compiler: str, folder, rule: str, l2: bool):
    """``rule``'s many-blob kernel compiled for the host; called with host pointer tables."""
    name, source = gpu_updates.multi_kernel_source(rule, l2)
    path = folder / f"{name}.cpp"
    path.write_text(_HOST_SHIM + source)
    library = folder / f"{name}.so"
    subprocess.run([compiler, "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-o", str(library), str(path)],
                   check=True, capture_output=True, text=True)
    return getattr(ctypes.CDLL(str(library)), name)


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="no C++ compiler")
@pytest.mark.parametrize("rule_name", gpu_updates.MULTI_BLOB_RULES)
def test_the_many_blob_kernel_compiled_for_the_host_gives_the_stepwise_bits(tmp_path, rule_name):
    """Three blobs of different sizes, lr_mults and decays (one without), divisors 1 and 3, in one
    launch per kind of regularization, against the solver's steps blob by blob."""
    compiler = shutil.which("c++") or shutil.which("g++")
    shapes, lr_mults, decays, divisors = [(40, 70), (6,), (3, 5, 7)], [1.0, 2.0, 0.5], [f32(5e-4), None, f32(1e-3)], [1, 3, 3]
    rng = np.random.default_rng(11)
    start = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    fused_rule, fused_params = rule_and_params(rule_name, start)
    stepwise_rule, stepwise_params = rule_and_params(rule_name, start)
    constants = fused_rule.multi_blob_constants()
    scale, rate = f32(0.5), f32(0.01)
    kernels = {l2: _host_multi_kernel(compiler, tmp_path, rule_name, l2) for l2 in (False, True)}
    for iteration in range(3):
        for param_id, shape in enumerate(shapes):
            gradient = rng.standard_normal(shape).astype(np.float32) * f32(divisors[param_id])
            fused_params[param_id].diff[...] = gradient
            stepwise_params[param_id].diff[...] = gradient
            stepwise_update(stepwise_rule, param_id, stepwise_params[param_id], divisors[param_id], scale,
                            decays[param_id], rate * f32(lr_mults[param_id]), iteration)
        for l2 in (False, True):
            ids = [i for i in range(len(shapes)) if (decays[i] is not None) == l2]
            roles = [[fused_params[i].data for i in ids], [fused_params[i].diff for i in ids]]
            roles += [[fused_rule.history[s * len(shapes) + i].data for i in ids] for s in range(fused_rule.history_sets)]
            starts = np.cumsum([0] + [start[i].size for i in ids]).astype(np.int64)
            tables = [np.array([a.ctypes.data for a in role], dtype=np.uint64) for role in roles]
            columns = [np.array(column, dtype=np.float32) for column in
                       ([divisors[i] for i in ids], [lr_mults[i] for i in ids], [decays[i] or 0 for i in ids])]
            pointer = ctypes.c_void_p
            kernels[l2](ctypes.c_longlong(int(starts[-1])), ctypes.c_int(len(ids)), pointer(starts.ctypes.data),
                        *[pointer(t.ctypes.data) for t in tables], *[pointer(c.ctypes.data) for c in columns],
                        ctypes.c_float(rate), ctypes.c_float(scale), *[ctypes.c_float(c) for c in constants])
    assert not np.array_equal(fused_params[0].data, start[0])
    _assert_same_bits(fused_params, stepwise_params, fused_rule, stepwise_rule)


def test_the_many_blob_step_declines_numpy_arrays_and_rules_without_a_kernel():
    """On the CPU the solver updates blob by blob (``apply_all`` declines before touching anything);
    Adam, whose constants differ per blob, has no many-blob kernel."""
    start = [np.ones((4, 3), np.float32)]
    rule, params = rule_and_params("SGD", start)
    assert rule.fused_steps_arrays([0], params) is None
    adam, adam_params = rule_and_params("Adam", start)
    assert adam.multi_blob_constants() is None and "Adam" not in gpu_updates.MULTI_BLOB_RULES
