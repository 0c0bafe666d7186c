"""Per-blob update steps on a GPU, each one CuPy elementwise kernel: the average of a summed gradient,
normalization, L2 regularization, the rule's value and ``data -= value`` in one pass over memory.

Done one CuPy operation at a time, a step launches a kernel and makes a temporary array per operation
(about ten for SGD with weight decay); here every element goes through the float32 operations of those
steps in the same order
(``updates.py`` holds the step-by-step twins, ``jit_updates.py`` the CPU kernels). Each rule's body
below reads as its ``compute_update_value``, line for line, with ``g`` the gradient after
``diff /= divisor``, ``diff *= scale`` and ``diff += decay * data`` (the solver's ``_divide_now``,
``normalize`` and ``regularize``).

Nothing here imports CuPy until a kernel is first built; the kernels are built once per rule and
per regularization and compiled by CuPy once per device.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_array_module

f32 = np.float32

# nvrtc contracts ``a * b + c`` into one fused multiply-add (one rounding instead of two) unless told
# not to; the step-by-step path runs every operation as its own kernel, so each product is rounded to
# float32 before it is added, and so it must be here for the same bits. The rest is as for every CuPy
# kernel, the step-by-step ones included: nvrtc's IEEE division and square root, and the flush of
# denormals to zero that CuPy adds (where NumPy keeps them: the one difference from the CPU).
_COMPILE_OPTIONS = ("--fmad=false",)

# The gradient as the solver's separate steps leave it. Multiplying by a scale of 1 (iter_size 1,
# where the solver skips normalize) is exact.
_GRADIENT = """
float g = diff;
if (divisor != 1.0f) g = g / divisor;
g = g * scale;
"""
_L2 = "g = g + decay * data;\n"
_APPLY = """
diff = step;
data = data - step;
"""

# Per update rule, under its registered solver type (``updates.UPDATE_RULES``): its float32 constants
# (after the shared divisor, scale, decay, local_rate), its history arrays (the first set, then the
# second for AdaDelta and Adam) and the body that updates the histories and sets ``step``. The
# expressions are those of the rule's compute_update_value. Not a plug-in family: each rule's
# ``fused_step`` calls its own ``*_step`` function below.
_KERNELS = {
    "SGD": ("momentum", "history", """
        const float v = local_rate * g + momentum * history;
        history = v;
        const float step = v;
    """),
    "Nesterov": ("momentum, one_plus_momentum", "history", """
        const float previous = history;
        const float v = local_rate * g + momentum * previous;
        history = v;
        const float step = one_plus_momentum * v + (-momentum) * previous;
    """),
    "AdaGrad": ("delta", "history", """
        history = g * g + history;
        const float step = local_rate * (g / (sqrtf(history) + delta));
    """),
    "RMSProp": ("rms_decay, rest, delta", "history", """
        history = rest * (g * g) + rms_decay * history;
        const float step = local_rate * (g / (sqrtf(history) + delta));
    """),
    "AdaDelta": ("momentum, rest, delta", "history, update_history", """
        history = rest * (g * g) + momentum * history;
        const float u = g * sqrtf((delta + update_history) / (delta + history));
        update_history = rest * (u * u) + momentum * update_history;
        const float step = local_rate * u;
    """),
    "Adam": ("beta1, rest1, beta2, rest2, rate_correction, delta", "m, v", """
        m = rest1 * g + beta1 * m;
        v = rest2 * (g * g) + beta2 * v;
        const float step = rate_correction * (m / (sqrtf(v) + delta));
    """),
}


def usable(*arrays) -> bool:
    """Whether the kernels here update these arrays: CuPy float32 arrays of one shape."""
    first = arrays[0]
    return all(get_array_module(a) is not np and a.dtype == np.float32 and a.shape == first.shape
               for a in arrays)


def _float32_params(names: str) -> str:
    return ", ".join(f"float32 {name.strip()}" for name in names.split(","))


def kernel_rules() -> list[str]:
    """The update rules (solver types) that have a kernel here, sorted."""
    return sorted(_KERNELS)


def kernel_code(rule: str, l2: bool) -> tuple[str, str, str]:
    """The input parameters, output parameters and loop body of ``rule``'s kernel (with L2
    regularization where ``l2``), as ``cupy.ElementwiseKernel`` takes them."""
    constants, histories, body = _KERNELS[rule]
    return (_float32_params("divisor, scale, decay, local_rate, " + constants),
            _float32_params("data, diff, " + histories),
            _GRADIENT + (_L2 if l2 else "") + body + _APPLY)


@functools.cache
def _kernel(rule: str, l2: bool):
    import cupy

    return cupy.ElementwiseKernel(*kernel_code(rule, l2), name=f"netdef_{rule}_update{'_l2' if l2 else ''}",
                                  options=_COMPILE_OPTIONS)


def _launch(rule, data, diff, histories, divisor, scale, decay, local_rate, *constants) -> None:
    _kernel(rule, decay is not None)(f32(divisor), f32(scale), f32(0 if decay is None else decay), f32(local_rate),
                                     *(f32(c) for c in constants), data, diff, *histories)


def sgd_step(data, diff, history, divisor, scale, decay, local_rate, momentum) -> None:
    """SGD with momentum, as ``jit_updates.sgd_step`` (``decay`` None: no regularization)."""
    _launch("SGD", data, diff, (history,), divisor, scale, decay, local_rate, momentum)


def nesterov_step(data, diff, history, divisor, scale, decay, local_rate, momentum) -> None:
    """Nesterov, as ``jit_updates.nesterov_step``."""
    momentum = f32(momentum)
    _launch("Nesterov", data, diff, (history,), divisor, scale, decay, local_rate, momentum, f32(1) + momentum)


def adagrad_step(data, diff, history, divisor, scale, decay, local_rate, delta) -> None:
    """AdaGrad: history += g^2; step local_rate * g / (sqrt(history) + delta)."""
    _launch("AdaGrad", data, diff, (history,), divisor, scale, decay, local_rate, delta)


def rmsprop_step(data, diff, history, divisor, scale, decay, local_rate, rms_decay, delta) -> None:
    """RMSProp: history = rms_decay * history + (1 - rms_decay) * g^2; step as AdaGrad's."""
    rms_decay = f32(rms_decay)
    _launch("RMSProp", data, diff, (history,), divisor, scale, decay, local_rate, rms_decay, f32(1) - rms_decay,
            delta)


def adadelta_step(data, diff, history, update_history, divisor, scale, decay, local_rate, momentum, delta) -> None:
    """AdaDelta: the squared-gradient average ``history``, the squared-update average ``update_history``."""
    momentum = f32(momentum)
    _launch("AdaDelta", data, diff, (history, update_history), divisor, scale, decay, local_rate, momentum,
            f32(1) - momentum, delta)


def adam_step(data, diff, m, v, divisor, scale, decay, local_rate, beta1, beta2, correction, delta) -> None:
    """Adam: first moment ``m``, second moment ``v``; ``correction`` the bias correction of this
    iteration (``AdamUpdate`` computes it as Caffe does), multiplied into the rate here on the host as
    the step-by-step path does."""
    beta1, beta2 = f32(beta1), f32(beta2)
    _launch("Adam", data, diff, (m, v), divisor, scale, decay, local_rate, beta1, f32(1) - beta1, beta2,
            f32(1) - beta2, f32(local_rate) * f32(correction), delta)


# ------------------------------------------------------------------------------------- many blobs at once
# A rule's kernel launched once per blob costs the host a CuPy call per parameter blob and iteration
# (ResNet-50 has 161, ResNet-152 about 460): on a GPU the host's Python, not the device, set the pace of
# the deep nets (benchmarks/README.md, "The first GPU figures"). The same body runs here over many blobs
# in one launch: each thread finds its blob in the blobs' start offsets, reads the blob's scalars (the
# divisor, lr_mult, decay) from small device tables and runs the rule's expressions on its element, so
# every value gets the bits of the one-blob kernel. The rules whose constants are the same for every blob
# take it (Adam's rate correction is a blob's local rate times the iteration's: per blob, one kernel each).
MULTI_BLOB_RULES = ("SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta")
MULTI_BLOCK = 512
MULTI_MAX_BLOCKS = 4096


def multi_kernel_source(rule: str, l2: bool) -> tuple[str, str]:
    """(the kernel's name, its CUDA source) for ``rule`` over many blobs (with L2 where ``l2``). Its
    parameters: the value count, the blob count, the blobs' start offsets (blobs + 1, the last the
    count), pointer tables of the data, the diffs and each history set, per-blob tables of divisors,
    lr_mults and decays, then the iteration's rate, the scale and the rule's constants (float32)."""
    constants, histories, body = _KERNELS[rule]
    names = [c.strip() for c in constants.split(",")]
    sets = [h.strip() for h in histories.split(",")]
    name = f"netdef_{rule}_update_blobs{'_l2' if l2 else ''}"
    params = (["const long long total", "const int blobs", "const long long* starts", "float* const* data_of",
               "float* const* diff_of"] + [f"float* const* {h}_of" for h in sets]
              + ["const float* divisors", "const float* lr_mults", "const float* decays", "const float rate",
                 "const float scale"] + [f"const float {c}" for c in names])
    load = "\n".join(f"    float {h} = {h}_of[b][j];" for h in sets)
    store = "\n".join(f"    {h}_of[b][j] = {h};" for h in sets)
    source = f"""
extern "C" __global__ void {name}({", ".join(params)}) {{
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)blockDim.x * gridDim.x) {{
    // The blob of value i: starts[b] <= i < starts[b + 1].
    int b = 0, end = blobs;
    while (end - b > 1) {{
      const int mid = (b + end) / 2;
      if (starts[mid] <= i) b = mid; else end = mid;
    }}
    const long long j = i - starts[b];
    const float divisor = divisors[b];
    const float local_rate = rate * lr_mults[b];
    const float decay = decays[b];
    (void)decay;
    float data = data_of[b][j];
    float diff = diff_of[b][j];
{load}
{_GRADIENT}{_L2 if l2 else ""}{body}{_APPLY}
    data_of[b][j] = data;
    diff_of[b][j] = diff;
{store}
  }}
}}
"""
    return name, source


@functools.cache
def _multi_kernel(rule: str, l2: bool):
    import cupy

    name, source = multi_kernel_source(rule, l2)
    return cupy.RawKernel(source, name, options=_COMPILE_OPTIONS)


def usable_many(arrays) -> bool:
    """Whether the kernels here update these arrays: CuPy float32 C-contiguous arrays, each blob's set
    (``arrays``: one tuple of data, diff and histories per blob) of one shape."""
    return all(usable(*blob_arrays) and all(a.flags.c_contiguous for a in blob_arrays) for blob_arrays in arrays)


class BlobTables:
    """The device tables of one group of blobs for the many-blob kernels: start offsets, pointers and
    per-blob scalars, uploaded when they change (the first iteration, a reallocated array, a new
    divisor), reused otherwise: an upload from the host waits for the device."""

    def __init__(self):
        self._key = None
        self._tables = None

    def tables(self, arrays, scalars):
        """(starts, the pointer tables, the scalar tables, the value count) for ``arrays`` (per blob:
        data, diff, histories) and ``scalars`` (per blob: divisor, lr_mult, decay)."""
        import cupy

        key = (tuple(tuple(a.data.ptr for a in blob) for blob in arrays), tuple(scalars),
               tuple(blob[0].size for blob in arrays))
        if key != self._key:
            sizes = [blob[0].size for blob in arrays]
            starts = np.zeros(len(arrays) + 1, np.int64)
            np.cumsum(sizes, out=starts[1:])
            pointers = np.array(key[0], dtype=np.uint64).T  # one row per array role, a column per blob
            columns = np.array(scalars, dtype=np.float32).T  # divisors, lr_mults, decays
            self._tables = (cupy.asarray(starts), [cupy.asarray(np.ascontiguousarray(row)) for row in pointers],
                            [cupy.asarray(np.ascontiguousarray(column)) for column in columns], int(starts[-1]))
            self._key = key
        return self._tables


def multi_step(rule: str, l2: bool, tables: BlobTables, arrays, scalars, rate, scale, constants) -> None:
    """One launch of ``rule``'s step over every blob of ``arrays`` (per blob: data, diff, then each
    history set's array), ``scalars`` (per blob: divisor, lr_mult, decay), at the iteration's ``rate``."""
    starts, pointers, columns, total = tables.tables(arrays, scalars)
    blocks = max(1, min(-(-total // MULTI_BLOCK), MULTI_MAX_BLOCKS))
    _multi_kernel(rule, l2)((blocks,), (MULTI_BLOCK,),
                            (np.int64(total), np.int32(len(arrays)), starts, *pointers, *columns, f32(rate), f32(scale),
                             *(f32(c) for c in constants)))
