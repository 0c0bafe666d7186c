"""cuDNN on a GPU: the library of the field for the layers whose kernels it holds.

netdef reaches cuDNN through NVIDIA's cuDNN frontend Python API (``nvidia-cudnn-frontend`` on PyPI,
imported as ``cudnn``), which builds an operation graph per layer and shape, asks cuDNN's heuristics
for execution plans, and runs the chosen plan on CuPy arrays. CuPy 14 no longer wraps cuDNN itself.

- ``status()`` says whether cuDNN can be used here, and if not, why and how to install it; a layer
  that cannot use it keeps netdef's own CUDA path (im2col + cuBLAS for convolutions) and says so once
  in the log.
- Plans are built once per operation and shape, process-wide (plans.py), and the fastest candidate is
  chosen by timing them on the layer's own arrays, as Caffe's cuDNN layers and PyTorch's
  ``cudnn.benchmark`` do, on the device's clock (timing.py). Candidates whose workspace exceeds
  ``workspace_limit()`` are left out.
- Precision follows ``netdef.backend.precision()``: strict float32 leaves out every engine that
  computes float32 on tensor cores (TensorFloat-32); ``"tf32"`` lets the timing choose among them
  and the others. Neither takes an engine that converts float32 inputs to float16 or bfloat16.

Nothing here imports CuPy or the frontend until a GPU layer asks.
"""
from __future__ import annotations

import functools
import logging

log = logging.getLogger("netdef")

# The most scratch memory one cuDNN plan may use. The workspace is one buffer shared by every layer
# (layers run one at a time on the compute stream), so this bounds its size, not a per-layer sum.
DEFAULT_WORKSPACE_LIMIT = 1 << 30
# How many of the best-ranked plans that run are timed per operation and shape: PyTorch's
# ``torch.backends.cudnn.benchmark_limit`` default. More can find a faster plan; each costs a build
# (a runtime-compiled engine's can take a while) and a few launches at the first iteration.
DEFAULT_BENCHMARK_LIMIT = 10
_settings = {"workspace_limit": DEFAULT_WORKSPACE_LIMIT, "benchmark_limit": DEFAULT_BENCHMARK_LIMIT, "enabled": True}

INSTALL_HINT = ('pip install "netdef-trainer[gpu]" for CUDA 12, "netdef-trainer[gpu-cuda13]" for CUDA 13 '
                '(nvidia-cudnn-frontend, nvidia-cudnn-cu12/cu13 and cuda-bindings)')


def set_workspace_limit(nbytes: int) -> None:
    """The most workspace (bytes) a cuDNN plan chosen from now on may use."""
    if nbytes < 0:
        raise ValueError(f"the cuDNN workspace limit must be at least 0 bytes, not {nbytes}")
    _settings["workspace_limit"] = int(nbytes)


def workspace_limit() -> int:
    return _settings["workspace_limit"]


def set_benchmark_limit(count: int) -> None:
    """How many candidate plans that run are timed for each operation and shape planned from now on
    (PyTorch's ``cudnn.benchmark_limit``; at least 1)."""
    if count < 1:
        raise ValueError(f"the cuDNN benchmark limit must be at least 1 plan, not {count}")
    _settings["benchmark_limit"] = int(count)


def benchmark_limit() -> int:
    return _settings["benchmark_limit"]


def set_enabled(enabled: bool) -> None:
    """Whether layers planned from now on may use cuDNN (``False``: netdef's own CUDA kernels, as
    ``engine: CAFFE`` asks for one layer)."""
    _settings["enabled"] = bool(enabled)


@functools.lru_cache(maxsize=None)
def status() -> tuple[bool, str]:
    """(usable, why): whether the cuDNN frontend and a cuDNN 9 library load on this machine; ``why``
    is the version when usable, else what is missing and how to install it."""
    try:
        import cudnn
    except ImportError as exc:
        return False, f"the cuDNN frontend is not installed ({exc}); {INSTALL_HINT}"
    except OSError as exc:  # the frontend's extension found no libcudnn to load
        return False, f"the cuDNN library did not load ({exc}); {INSTALL_HINT}"
    try:
        version = cudnn.backend_version()
    except Exception as exc:  # noqa: BLE001 - any failure here means: not usable, say why
        return False, f"cuDNN did not answer its version ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
    if not version:
        return False, f"no cuDNN library was found; {INSTALL_HINT}"
    return True, f"cuDNN {version} through the cuDNN frontend {cudnn.__version__}"


def usable() -> bool:
    return _settings["enabled"] and status()[0]


def why_not() -> str:
    """Why a layer does not use cuDNN (for the log), when ``usable()`` is False."""
    if not _settings["enabled"]:
        return "cuDNN switched off"
    return status()[1]


_logged_once: set = set()


def log_path_once(layer_name: str, path: str, reason: str) -> None:
    """Log which path a GPU layer runs and why, once per layer and path."""
    key = (layer_name, path)
    if key in _logged_once:
        return
    _logged_once.add(key)
    log.info("Layer %s runs %s on the GPU: %s", layer_name, path, reason)
