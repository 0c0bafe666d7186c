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
// One thread a block; the launcher sets the block (kernels that work block by block run once per
// block, the others as one block of one thread whose grid-stride loop visits every item).
static netdef_dim3 blockIdx = {0, 0, 0}, gridDim = {1, 1, 1};
static const netdef_dim3 threadIdx = {0, 0, 0}, blockDim = {1, 1, 1};
extern "C" void netdef_set_block(int x, int y, int grid_x, int grid_y) {
  blockIdx.x = x; blockIdx.y = y; gridDim.x = grid_x; gridDim.y = grid_y;
}
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
static inline void __syncthreads() {}
// A warp of one thread: no other lane to read from.
template <class T> static inline T __shfl_down_sync(unsigned, T, int) { return T(0); }
using std::min;
using std::max;
using std::pow;
using std::sqrt;
"""


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_the_grid_stride_loop_never_wraps_at_the_largest_count(source, tmp_path):
    """Each source's KERNEL_LOOP, as the last thread of the largest grid ``launch`` makes runs it over
    the most items ``launch`` takes: every index it visits is in range (the loop that stepped past
    2^31 - 1 wrapped to negative indices and went on)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not on PATH: the loop cannot be built as host code")
    shim = SHIM.replace("static const netdef_dim3 threadIdx = {0, 0, 0}, blockDim = {1, 1, 1};",
                        f"static netdef_dim3 threadIdx = {{{kernels.THREADS_PER_BLOCK - 1}, 0, 0}}, "
                        f"blockDim = {{{kernels.THREADS_PER_BLOCK}, 1, 1}};")
    (tmp_path / "shim.h").write_text(shim)
    (tmp_path / "loop.cpp").write_text(f'#include "{source}"\n' + """
extern "C" long long visits(int n, int block, int grid) {
  blockIdx.x = block; gridDim.x = grid;
  long long count = 0;
  KERNEL_LOOP(i, n) { if (i < 0 || i >= n) return -1; ++count; }
  return count;
}
""")
    lib = tmp_path / "loop.so"
    result = subprocess.run([gxx, "-O1", "-fwrapv", "-shared", "-fPIC", "-std=c++17", "-include", str(tmp_path / "shim.h"),
                             "-Dreal=float", str(tmp_path / "loop.cpp"), "-o", str(lib)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    visits = ctypes.CDLL(str(lib)).visits
    visits.restype = ctypes.c_longlong
    n, grid, threads = kernels.MAX_INT, kernels.MAX_BLOCKS, kernels.THREADS_PER_BLOCK
    first = (grid - 1) * threads + threads - 1
    assert visits(n, grid - 1, grid) == len(range(first, n, grid * threads))
    assert visits(1000, 0, 1) == len(range(threads - 1, 1000, threads))


def test_a_count_beyond_the_kernels_32_bit_indices_is_refused():
    from netdef.memory import BlobTooLargeError

    assert kernels.int_args(kernels.MAX_INT) == (np.int32(kernels.MAX_INT),)
    with pytest.raises(BlobTooLargeError, match="2147483648 values.*a smaller batch_size"):
        kernels.int_args(3, kernels.MAX_INT + 1)
    with pytest.raises(BlobTooLargeError):
        kernels.launch("relu_forward", kernels.MAX_INT + 1, ())


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
        params = _signature(kernels.kernel_names()[name].read_text(), name)
        assert params[0] == "const int nthreads"
        self._run(name, kernels._real_dtype(args), [ctypes.c_int(int(nthreads))], params[1:], args, [(0, 0)], (1, 1))

    def blocks(self, name, dtype, grid, block, args):
        """Stands in for kernels.launch_blocks: the kernel once per block of ``grid`` (a block of one
        thread here; the kernels are written for any block size)."""
        grid = tuple(grid) + (1,) * (2 - len(grid))
        assert isinstance(block, int) and block % 32 == 0 and block <= 1024, f"{name}: block of {block} threads"
        params = _signature(kernels.kernel_names()[name].read_text(), name)
        places = [(x, y) for x in range(grid[0]) for y in range(grid[1])]
        self._run(name, np.dtype(dtype), [], params, args, places, grid)

    def _run(self, name, dtype, c_args, params, args, places, grid):
        assert len(params) == len(args), f"{name}: {len(args)} arguments for {len(params)} parameters"
        for param, arg in zip(params, args):
            kind = param.rsplit(" ", 1)[0].replace("const ", "")
            if kind in ("real*", "int*", "double*"):
                want = {"real*": dtype, "int*": np.dtype(np.int32), "double*": np.dtype(np.float64)}[kind]
                assert isinstance(arg, np.ndarray) and arg.dtype == want, \
                    f"{name}: {param} got {type(arg)} {getattr(arg, 'dtype', '')}"
                assert arg.flags.c_contiguous, f"{name}: {param} is not C-contiguous"
                c_args.append(ctypes.c_void_p(arg.ctypes.data))
            elif kind == "int":
                assert type(arg) is np.int32, f"{name}: {param} must be numpy.int32, got {type(arg)}"
                c_args.append(ctypes.c_int(int(arg)))
            elif kind == "double":
                assert type(arg) is np.float64, f"{name}: {param} must be numpy.float64, got {type(arg)}"
                c_args.append(ctypes.c_double(float(arg)))
            elif kind == "real":
                assert type(arg) is dtype.type, f"{name}: {param} must be {dtype}, got {type(arg)}"
                c_args.append(ctypes.c_float(float(arg)) if dtype == np.float32 else ctypes.c_double(float(arg)))
            else:
                raise AssertionError(f"{name}: unexpected parameter type {param!r}")
        self.calls.append(name)
        lib = self.libs[(kernels.kernel_names()[name], dtype)]
        for x, y in places:
            lib.netdef_set_block(x, y, grid[0], grid[1])
            getattr(lib, name)(*c_args)


@pytest.fixture
def gpu_path(host_kernels, monkeypatch):
    """Make the layers take their GPU (kernel) path on NumPy arrays, running the host builds."""
    launcher = HostLauncher(host_kernels)
    monkeypatch.setattr(kernels, "launch", launcher)
    monkeypatch.setattr(kernels, "launch_blocks", launcher.blocks)
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
@pytest.mark.parametrize("size,channels", [(5, 7), (3, 2), (1, 3), (7, 4), (5, 1), (7, 2)])  # fewer channels than half a window too
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


# ------------------------------------------------------------------------- BatchNorm chain, channel sums, ReLU
BATCHNORM_CHAINS = [  # (N, C, M), Scale, its bias, ReLU slope (None: no ReLU), global statistics
    ((4, 3, 50), True, True, 0.0, False),
    ((5, 4, 1), True, False, None, False),      # N x C input: one value a channel per sample
    ((3, 2, 700), False, False, 0.1, False),    # several slices per channel (slices_for)
    ((2, 3, 20), True, True, 0.0, True),        # global statistics: no statistics pass
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", BATCHNORM_CHAINS, ids=str)
def test_batchnorm_chain_twins(gpu_path, case, dtype):
    """kernels/batchnorm_chain.cu through gpu_batchnorm_chain.py against the CPU chain's kernels
    (jit/batchnorm_chain.py): statistics, moving sums, output, input gradient and Scale's sums."""
    from netdef.layers import gpu_batchnorm_chain as gpu
    from netdef.layers.jit import batchnorm_chain as cpu

    shape, has_scale, has_bias, slope, global_stats = case
    rng = np.random.default_rng(5)
    channels, count = shape[1], shape[0] * shape[2]
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    x.reshape(-1)[:2] = 0.0
    scale = (rng.standard_normal(channels) + 0.5).astype(dtype) if has_scale else None
    bias = rng.standard_normal(channels).astype(dtype) if has_bias else None
    slope = None if slope is None else dtype(slope)
    tol = 2e-5 if dtype == np.float32 else 1e-11
    y = np.empty_like(x)
    if global_stats:
        mean = rng.standard_normal(channels).astype(dtype)
        std = (rng.random(channels) + 0.5).astype(dtype)
        gpu.forward_global(x, mean, std, scale, bias, slope, y)
        expected = (x - mean[:, None]) / std[:, None]
        if scale is not None:
            expected = expected * scale[:, None] + (0 if bias is None else bias[:, None])
        if slope is not None:
            expected = np.where(expected > 0, expected, expected * slope)
        np.testing.assert_allclose(y, expected, rtol=tol, atol=tol)
        inv_std = (1 / std).astype(dtype)
    else:
        mean, var, std = (np.empty(channels, dtype) for _ in range(3))
        moving = [(rng.random(channels) + 0.5).astype(dtype), (rng.random(channels) + 0.5).astype(dtype),
                  np.array([2.0], dtype)]
        start = [m.copy() for m in moving]
        maf, correction = 0.9, count / (count - 1)
        gpu.forward_batch(x, 1e-5, scale, bias, slope, y, mean, var, std, (*moving, maf, correction), gpu.Scratch())
        ref = [np.empty(channels, dtype) for _ in range(3)]
        ref_y = np.empty_like(x)
        cpu.forward_batch(x, dtype(1e-5), scale, bias, slope, ref_y, *ref)
        for got, want, what in zip((mean, var, std, y), (*ref, ref_y), ("mean", "var", "std", "y")):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)
        real_maf = dtype(maf)
        np.testing.assert_allclose(moving[0], start[0] * real_maf + ref[0], rtol=tol, err_msg="mean sum")
        np.testing.assert_allclose(moving[1], start[1] * real_maf + dtype(correction) * ref[1], rtol=tol, err_msg="var sum")
        np.testing.assert_allclose(moving[2], start[2] * real_maf + 1, rtol=tol, err_msg="factor")
        inv_std = None
    if slope is not None:
        assert (y <= 0).any() and (y > 0).any()  # both sides of the rectifier are exercised
    dy = rng.standard_normal(shape).astype(dtype)
    dx = np.empty_like(x)
    sums = gpu.backward(x, y, dy, mean, std, inv_std, scale, slope, dx, gpu.Scratch())
    ref_dx, ref_sums = np.empty_like(x), np.zeros((2, channels))
    cpu.backward(x, y, dy, mean, std, inv_std, scale, slope, cpu.BOTH_SUMS, ref_dx, ref_sums)
    size = float(np.abs(ref_dx).max())
    np.testing.assert_allclose(dx, ref_dx, rtol=tol * 10, atol=tol * 10 * size, err_msg="dx")
    np.testing.assert_allclose(sums, ref_sums, rtol=tol * 10, atol=tol * 10 * float(np.abs(ref_sums).max()),
                               err_msg="Scale's sums")
    assert gpu_path.calls[-3:] == ["bn_gradient_partial", "bn_gradient_finish", "bn_gradient_apply"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(4, 3, 50), (6, 5, 1), (2, 2, 3000)], ids=str)
def test_channel_sums_twins(gpu_path, shape, dtype):
    from netdef.layers import gpu_batchnorm_chain as gpu

    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape).astype(dtype)
    out = rng.standard_normal(shape[1]).astype(dtype)
    expected = out.astype(np.float64) + x.astype(np.float64).sum(axis=(0, 2))
    gpu.add_channel_sums(x, out)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * float(np.abs(x).sum()))
    assert gpu_path.calls == ["channel_sum_partial", "channel_sum_add"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("slope", [0.0, 0.25])
def test_relu_twins(gpu_path, slope, dtype):
    from netdef.layers import elementwise

    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 5)).astype(dtype)
    x.reshape(-1)[:3] = (0.0, -0.0, np.nan)
    dy = rng.standard_normal(x.shape).astype(dtype)
    y, dx = np.empty_like(x), np.empty_like(x)
    kernels.launch("relu_forward", x.size, (x, dtype(slope), y))
    kernels.launch("relu_backward", x.size, (x, dy, dtype(slope), dx))
    ref_y, ref_dx = np.empty_like(x), np.empty_like(x)
    elementwise._kernels().relu_forward(x.reshape(-1), dtype(slope), ref_y.reshape(-1))  # the CPU kernels
    elementwise._kernels().relu_backward(x.reshape(-1), dy.reshape(-1), dtype(slope), ref_dx.reshape(-1))
    np.testing.assert_array_equal(y, ref_y)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(ref_y))
    np.testing.assert_array_equal(dx, ref_dx)


# ------------------------------------------------------------------------- channel maps (TEST-phase fusion)
CHANNEL_MAPS = {  # which stages of fusion.ChannelMap are present: shift, normalize, scale, bias, ReLU slope
    "BatchNorm, Scale with bias, ReLU": (False, True, True, True, 0.0),
    "BatchNorm alone": (False, True, False, False, None),
    "ReLU alone": (False, False, False, False, 0.0),
    "a convolution's bias, ReLU (a relu chain in training)": (True, False, False, False, 0.0),
    "a convolution's bias, BatchNorm, Scale with bias, ReLU": (True, True, True, True, 0.0),
    "Scale without bias, leaky ReLU": (False, False, True, False, 0.1),
    "BatchNorm, Scale": (False, True, True, False, None),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stages", CHANNEL_MAPS.values(), ids=list(CHANNEL_MAPS))
def test_channel_map_on_the_kernel_path_gives_the_layers_bits(gpu_path, monkeypatch, stages, dtype):
    """fusion.apply on a GPU: one pass of kernels/batchnorm_chain.cu's bn_chain_apply, the bits of the
    layers' reference functions one after the other (a zero's sign aside: the kernel rectifies as the
    ReLU layer's kernel does); in place, as the net runs it."""
    from netdef.layers import fusion

    shift, normalize, scale, bias, slope = stages
    rng = np.random.default_rng(8)
    dims = (3, 5, 7)
    x = (rng.standard_normal(dims) * 2).astype(dtype)
    x.reshape(-1)[:3] = (0.0, -0.0, np.nan)
    channel = lambda offset=0.0: (rng.standard_normal(5) + offset).astype(dtype)  # noqa: E731
    m = fusion.ChannelMap(dims=dims, shift=channel() if shift else None, mean=channel() if normalize else None,
                          std=np.abs(channel(1.0)) + dtype(0.1) if normalize else None,
                          scale=channel(0.5) if scale else None, bias=channel() if bias else None,
                          negative_slope=slope)
    expected = fusion.apply_reference(m, x, np.empty_like(x))
    monkeypatch.setattr(fusion.jit, "usable", lambda *arrays: False)  # not the CPU's compiled kernels
    monkeypatch.setattr(kernels, "usable", lambda *arrays: True)     # NumPy arrays as the GPU's
    got = x.copy()
    fusion.apply(m, got, got)
    np.testing.assert_array_equal(got, expected)
    assert gpu_path.calls == ["bn_chain_apply"]
