"""The array module (NumPy on the CPU, CuPy on a GPU), device selection and random state.

This is the one place with process-wide mutable state, on purpose: Caffe's mode/device setting and
its random seed are global too, and pycaffe users call ``netdef.set_device`` / ``netdef.set_random_seed``
once at start-up.
"""
from __future__ import annotations

import numpy as np

_state = {"device": "cpu", "device_id": 0, "rng": np.random.default_rng(), "dtype": np.float32,
          "precision": "float32"}

# What a float32 convolution or matrix product may compute in on a GPU: "float32" (Caffe's strict
# float32, the default) or "tf32" (TensorFloat-32 tensor cores: float32 range, a 10-bit mantissa in
# the products, float32 sums; PyTorch's default for cuDNN convolutions). The CPU always computes in
# float32.
PRECISIONS = ("float32", "tf32")


def set_device(device="cpu", device_id: int = 0) -> None:
    """Select where new blobs live: ``"cpu"`` (NumPy) or ``"gpu"`` (CuPy on ``device_id``).

    ``set_device(1)`` (an integer, pycaffe's spelling) only chooses the GPU id, as ``caffe.set_device``.
    """
    if isinstance(device, int) and not isinstance(device, bool):
        set_device_id(device)
        return
    if device not in ("cpu", "gpu"):
        raise ValueError(f"set_device: device must be 'cpu' or 'gpu', not {device!r}")
    if device == "gpu":
        # Said here, not at the first allocation as CUDA's own error that names no remedy.
        problem = gpu_problem(device_id)
        if problem is not None:
            raise RuntimeError(f"set_mode_gpu / set_device('gpu', {device_id}): no usable GPU, {problem}; "
                               f"netdef.set_mode_cpu() runs on the CPU")
        import cupy

        cupy.cuda.Device(device_id).use()
    _state["device"] = device
    _state["device_id"] = device_id
    if device == "gpu":
        _apply_precision_to_cublas()


def gpu_count() -> tuple[int, str | None]:
    """How many GPUs this process sees, and why none can be used where that is so (CuPy missing, no
    driver): (0, the reason), else (the count, None)."""
    try:
        import cupy
    except ImportError:
        return 0, 'CuPy is not installed: pip install "netdef-trainer[gpu]" (CUDA 12) or "netdef-trainer[gpu-cuda13]" (CUDA 13)'
    try:
        return int(cupy.cuda.runtime.getDeviceCount()), None
    except Exception as exc:  # noqa: BLE001 - CUDA's errors (no driver, a driver too old) all mean no GPU
        return 0, f"CUDA is not usable: {' '.join(str(exc).split())}"


def gpu_problem(device_id: int) -> str | None:
    """Why GPU ``device_id`` cannot be used here (CuPy missing, no driver, no such device, a device
    that refuses this process a context, as one in exclusive-process mode held by another does), or
    None."""
    count, problem = gpu_count()
    if problem is not None:
        return problem
    if device_id >= count:
        return f"there is no GPU {device_id} ({count} found)"
    import cupy

    try:
        with cupy.cuda.Device(device_id):
            cupy.empty(1, dtype=cupy.float32)  # the first allocation creates the context
    except Exception as exc:  # noqa: BLE001 - any CUDA error here means this process cannot use it
        return f"GPU {device_id} refuses this process ({' '.join(str(exc).split())}; is it in exclusive mode and taken?)"
    return None


def set_mode_cpu() -> None:
    """pycaffe's spelling of ``set_device('cpu')``."""
    set_device("cpu")


def set_mode_gpu() -> None:
    """pycaffe's spelling of ``set_device('gpu')``."""
    set_device("gpu", _state["device_id"])


def set_device_id(device_id: int) -> None:
    """pycaffe's ``caffe.set_device(id)``: choose the GPU without switching mode."""
    _state["device_id"] = device_id


def device() -> str:
    return _state["device"]


def xp():
    """The array module new blobs are allocated with."""
    if _state["device"] == "gpu":
        import cupy

        return cupy
    return np


def get_array_module(*arrays):
    """NumPy or CuPy, whichever owns ``arrays`` (Chainer's discipline: layers never import cupy)."""
    for a in arrays:
        if type(a) is np.ndarray:  # asked several times a layer call: the common case without a string test
            continue
        if type(a).__module__.startswith("cupy"):
            import cupy

            return cupy
    return np


def address(array) -> int:
    """Where ``array``'s first element lies: host memory for a NumPy array, device memory for CuPy's."""
    return array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr


def to_host(array) -> np.ndarray:
    """A NumPy array with the same values (no copy when it already is one)."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "get"):  # a CuPy array, recognised without importing CuPy on a CPU-only run
        return array.get()
    return np.asarray(array)


def to_device(array, like=None):
    """Move a host array to the current device (or to the module of ``like``)."""
    module = get_array_module(like) if like is not None else xp()
    if module is np:
        return to_host(array)
    return module.asarray(array)


def set_random_seed(seed: int) -> None:
    """Seed netdef's random generator (fillers, dropout, shuffling): same seed, same run."""
    _state["rng"] = np.random.default_rng(seed)


def rng() -> np.random.Generator:
    """The generator that fillers and stochastic layers draw from."""
    return _state["rng"]


def set_generator_state(generator: np.random.Generator, state) -> None:
    """Give ``generator`` a saved ``bit_generator.state`` (as read from a snapshot), or raise ValueError
    saying why it is not a state of that bit generator, the generator then unchanged. NumPy's own
    checks raise TypeError, KeyError, ValueError, or OverflowError (a number past 128 bits)."""
    previous = generator.bit_generator.state
    try:
        generator.bit_generator.state = state
    except (TypeError, KeyError, ValueError, OverflowError) as exc:
        generator.bit_generator.state = previous
        raise ValueError(" ".join(str(exc).split())[:120]) from None


def set_precision(precision: str) -> None:
    """``"float32"`` (strict, the default) or ``"tf32"``: what float32 convolutions and matrix
    products on a GPU may compute in (see PRECISIONS). Takes effect for layers planned afterwards
    and for every later cuBLAS product."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    _state["precision"] = precision
    if _state["device"] == "gpu":
        _apply_precision_to_cublas()


def precision() -> str:
    return _state["precision"]


def _apply_precision_to_cublas() -> None:
    # CuPy reads its float32 compute type once (from CUPY_TF32) and keeps it in this module: set
    # it here so that the setting follows netdef's, whenever CuPy was imported.
    from cupy._core import _routines_linalg as linalg

    compute_type = linalg.COMPUTE_TYPE_TF32 if _state["precision"] == "tf32" else linalg.COMPUTE_TYPE_DEFAULT
    linalg.set_compute_type(np.float32, compute_type)


def default_dtype():
    return _state["dtype"]


def set_default_dtype(dtype) -> None:
    """float32 (Caffe's) by default; float64 for numerical gradient checks."""
    _state["dtype"] = np.dtype(dtype).type
