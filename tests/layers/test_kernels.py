"""The CUDA kernels of netdef/layers/kernels/*.cu.

1. Every source compiles with nvcc (float and double builds) when nvcc is on PATH.
2. Without a GPU, the kernels' logic still runs: each source is compiled as host C++ (g++, with a
   small shim that turns __global__ into a plain function and the grid-stride loop into a loop over
   every work item) and called through ctypes in place of CuPy's launch. The layers' GPU code path
   (argument lists included, checked against each kernel's signature) then runs on NumPy arrays and
   is compared with the NumPy twins and with the Caffe oracles.
"""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from netdef.layers import im2col as im2col_mod
from netdef.layers import kernels
from netdef.layers import vision
from netdef.layers.im2col import Geometry, col2im, column_layout, im2col
from netdef.proto import netdef_pb2 as pb
from tests.helpers import layer_case_names, run_caffe_case

SOURCES = kernels.sources()


def test_sources_and_names():
    names = kernels.kernel_names()
    for expected in ("im2col", "col2im", "max_pool_forward", "max_pool_backward", "ave_pool_forward",
                     "ave_pool_backward", "lrn_fill_scale", "lrn_compute_output", "lrn_compute_diff"):
        assert expected in names, expected
    assert kernels.real_type(np.float32) == "float" and kernels.real_type(np.float64) == "double"
    with pytest.raises(TypeError):
        kernels.real_type(np.int32)


# ------------------------------------------------------------------------------------ nvcc
@pytest.mark.parametrize("real", ["float", "double"])
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_nvcc_compiles(source, real, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the CUDA sources cannot be compile-checked here")
    cmd = [nvcc, "--ptx", "-o", str(tmp_path / "k.ptx"), "--std=c++17", "-arch=sm_80", f"-Dreal={real}", str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    ptx = (tmp_path / "k.ptx").read_text()
    for name, path in kernels.kernel_names().items():
        if path == source:
            assert f".entry {name}(" in ptx, f"kernel {name} missing from the PTX of {source.name}"


# ------------------------------------------------------------------------------------ host build
SHIM = r"""
#include <cmath>
#include <algorithm>
struct netdef_dim3 { int x, y, z; };
static const netdef_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static const netdef_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
#define __device__
#define __host__
using std::min;
using std::max;
using std::pow;
"""


def _signature(source_text: str, name: str) -> list[str]:
    match = re.search(r'extern\s+"C"\s+__global__\s+void\s+' + name + r'\s*\(([^)]*)\)', source_text)
    return [" ".join(p.split()) for p in match.group(1).split(",")]


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not on PATH: the kernels cannot be built as host code")
    out = tmp_path_factory.mktemp("host_kernels")
    (out / "shim.h").write_text(SHIM)
    libs = {}
    for source in SOURCES:
        for real, dtype in (("float", np.float32), ("double", np.float64)):
            lib = out / f"{source.stem}_{real}.so"
            cmd = [gxx, "-O1", "-shared", "-fPIC", "-std=c++17", "-x", "c++", "-include", str(out / "shim.h"),
                   f"-Dreal={real}", str(source), "-o", str(lib)]
            result = subprocess.run(cmd, capture_output=True, text=True)
            assert result.returncode == 0, f"host build of {source.name} failed:\n{result.stderr}"
            libs[(source, np.dtype(dtype))] = ctypes.CDLL(str(lib))
    return libs


class HostLauncher:
    """Stands in for kernels.launch: checks the arguments against the kernel's signature exactly as
    CuPy needs them (int32 for int, the arrays' float type for real, contiguous arrays) and runs the
    host build."""

    def __init__(self, libs):
        self.libs = libs
        self.calls = []

    def __call__(self, name, nthreads, args):
        path = kernels.kernel_names()[name]
        dtype = kernels._real_dtype(args)
        params = _signature(path.read_text(), name)
        assert len(params) == len(args) + 1, f"{name}: {len(args) + 1} arguments for {len(params)} parameters"
        assert params[0] == "const int nthreads"
        c_args = [ctypes.c_int(int(nthreads))]
        for param, arg in zip(params[1:], args):
            kind = param.rsplit(" ", 1)[0].replace("const ", "")
            if kind in ("real*", "int*"):
                want = dtype if kind == "real*" else np.dtype(np.int32)
                assert isinstance(arg, np.ndarray) and arg.dtype == want, \
                    f"{name}: {param} got {type(arg)} {getattr(arg, 'dtype', '')}"
                assert arg.flags.c_contiguous, f"{name}: {param} is not C-contiguous"
                c_args.append(ctypes.c_void_p(arg.ctypes.data))
            elif kind == "int":
                assert type(arg) is np.int32, f"{name}: {param} must be numpy.int32, got {type(arg)}"
                c_args.append(ctypes.c_int(int(arg)))
            elif kind == "real":
                assert type(arg) is dtype.type, f"{name}: {param} must be {dtype}, got {type(arg)}"
                c_args.append(ctypes.c_float(float(arg)) if dtype == np.float32 else ctypes.c_double(float(arg)))
            else:
                raise AssertionError(f"{name}: unexpected parameter type {param!r}")
        self.calls.append(name)
        getattr(self.libs[(path, dtype)], name)(*c_args)


@pytest.fixture
def gpu_path(host_kernels, monkeypatch):
    """Make the layers take their GPU (kernel) path on NumPy arrays, running the host builds."""
    launcher = HostLauncher(host_kernels)
    monkeypatch.setattr(kernels, "launch", launcher)
    monkeypatch.setattr(im2col_mod, "use_kernels", lambda xp: True)
    return launcher


def _cpu(monkeypatch):
    monkeypatch.setattr(im2col_mod, "use_kernels", lambda xp: False)


GEOMETRIES = [
    Geometry((3, 3), (1, 1), (1, 1), (1, 1)),
    Geometry((3, 2), (2, 1), (1, 0), (1, 1)),
    Geometry((3, 3), (2, 3), (2, 1), (2, 1)),
    Geometry((1, 1), (1, 1), (0, 0), (1, 1)),
    Geometry((4, 4), (3, 2), (0, 2), (1, 2)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geom", GEOMETRIES, ids=str)
def test_im2col_col2im_twins(gpu_path, monkeypatch, geom, dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 7, 8)).astype(dtype)
    lay = column_layout(x.shape, geom, np)
    assert not lay.full_width  # the kernels use the plain layout
    gpu_cols = lay.gather(im2col(x, lay)).copy()
    dcols = rng.standard_normal(gpu_cols.shape).astype(dtype)  # (N, rows, *O)
    buf = lay.buffer(None, None, lay.rows, dtype, np)
    lay.scatter(buf, dcols)
    gpu_dx = col2im(buf, lay, np.empty_like(x))
    assert gpu_path.calls == ["im2col", "col2im"]
    _cpu(monkeypatch)
    cpu_lay = column_layout(x.shape, geom, np)
    np.testing.assert_array_equal(gpu_cols, cpu_lay.gather(im2col(x, cpu_lay)))
    buf = cpu_lay.buffer(None, None, cpu_lay.rows, dtype, np)
    cpu_lay.scatter(buf, dcols)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(gpu_dx, col2im(buf, cpu_lay, np.empty_like(x)), rtol=tol, atol=tol)
    # col2im is im2col's adjoint: <im2col(x), d> = <x, col2im(d)>.
    np.testing.assert_allclose(np.sum(gpu_cols * dcols), np.sum(x * gpu_dx), rtol=tol)


POOLS = [  # method, kernel, stride, pad, input (h, w)
    (pb.PoolingParameter.MAX, (3, 3), (2, 2), (0, 0), (8, 10)),
    (pb.PoolingParameter.MAX, (3, 3), (2, 2), (1, 1), (7, 9)),
    (pb.PoolingParameter.MAX, (2, 2), (2, 2), (1, 1), (5, 7)),
    (pb.PoolingParameter.MAX, (3, 2), (1, 2), (2, 1), (6, 5)),
    (pb.PoolingParameter.MAX, (6, 7), (6, 7), (0, 0), (6, 7)),
    (pb.PoolingParameter.AVE, (3, 3), (2, 2), (1, 1), (7, 9)),
    (pb.PoolingParameter.AVE, (3, 3), (2, 2), (0, 0), (8, 10)),
    (pb.PoolingParameter.AVE, (2, 3), (1, 2), (1, 2), (5, 6)),
    (pb.PoolingParameter.AVE, (6, 6), (6, 6), (0, 0), (6, 7)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cfg", POOLS, ids=str)
def test_pooling_twins(gpu_path, monkeypatch, cfg, dtype):
    method, kernel, stride, pad, hw = cfg
    rng = np.random.default_rng(2)
    # Rounded values make ties, so that the first-maximum rule is exercised.
    x = np.round(rng.standard_normal((2, 3) + hw) * 2).astype(dtype)
    out = vision.pooled_shape(*hw, kernel, stride, pad)
    pool = vision.Pool2D(method, kernel, stride, pad, hw, out)
    y = pool.forward(x)
    mask = vision.max_mask_flat(pool.state[1], pool).copy() if method == pb.PoolingParameter.MAX else None
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = pool.backward(dy, x.shape, np.empty_like(x)).copy()
    assert len(gpu_path.calls) == 2
    _cpu(monkeypatch)
    cpu = vision.Pool2D(method, kernel, stride, pad, hw, out)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, cpu.forward(x), rtol=tol, atol=tol)
    if mask is not None:
        np.testing.assert_array_equal(mask, vision.max_mask_flat(cpu.state[1], cpu))
    np.testing.assert_allclose(dx, cpu.backward(dy, x.shape, np.empty_like(x)), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size,channels", [(5, 7), (3, 2), (1, 3), (7, 4)])
def test_lrn_twins(gpu_path, monkeypatch, size, channels, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, channels, 3, 4)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    args = (size, 0.3, 0.75, 1.5)
    y, scale, power = vision.lrn_across_forward(x, *args)
    dx = vision.lrn_across_backward(x, y, scale, power, dy, size, 0.3, 0.75)
    assert gpu_path.calls == ["lrn_fill_scale", "lrn_compute_output", "lrn_compute_diff"]
    _cpu(monkeypatch)
    y2, scale2, power2 = vision.lrn_across_forward(x, *args)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(scale, scale2, rtol=tol)
    np.testing.assert_allclose(y, y2, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, vision.lrn_across_backward(x, y2, scale2, power2, dy, size, 0.3, 0.75),
                               rtol=tol, atol=tol)


CASES = layer_case_names(("conv_", "deconv_", "pool_", "lrn_", "spp_", "im2col_"))


# Convolutions whose algorithm needs no column matrix run as plain array products on a GPU too.
KERNEL_FREE_CONVOLUTIONS = ("depthwise", "pointwise")


@pytest.mark.parametrize("name", CASES)
def test_caffe_cases_on_kernel_path(gpu_path, name):
    layer = run_caffe_case(name)
    if name.startswith("lrn_within"):
        return
    if isinstance(layer, vision.ConvolutionLayer) and layer.algorithm in KERNEL_FREE_CONVOLUTIONS:
        assert not gpu_path.calls, f"{layer.algorithm} convolution launched {gpu_path.calls}"
    else:
        assert gpu_path.calls, "the kernel path was not taken"


def test_caffe_cases_present():
    from tests.helpers import shared_path

    shared_path("fixtures", "caffe-ref", "layers", "conv_k3_s1_p1.npz")
    assert len(CASES) >= 30
