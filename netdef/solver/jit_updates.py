"""Compiled per-blob update steps: normalization, L2 regularization, the rule's value and
``data -= value`` in one pass over memory.

Done one NumPy operation at a time, SGD's step over a large fully connected weight makes four
temporary arrays (each freshly mapped and page-faulted) and seven passes over memory, on the critical
path of distributed training when the next forward waits for that weight (benchmarks/README.md, "The
figures behind the solver's, the exchange's and the data's choices"). Here every
element goes through the same float32 operations in the same order as the separate steps (numba does
not contract a multiply and an add into a fused multiply-add without fastmath), so the results are
the same bits; ``tests/solver/test_jit_updates.py`` compares them.
"""
from __future__ import annotations

from ..threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from numba import njit, prange  # noqa: E402 (after the wait policy)


@njit(inline="always")
def _regularized(diff, data, i, divisor, scale, decay, decays):
    g = diff[i]
    if divisor != 1:
        g = g / divisor  # a sum over the ranks, averaged here as the exchange would have (the same bits)
    g = g * scale  # scale 1 when iter_size is 1: exact
    if decays:
        g = g + decay * data[i]
    return g


# Below this many elements a blob is updated on the calling thread: starting the parallel loop (waking
# the pool's sleeping threads) costs more than the whole serial step of a small blob, and LeNet has 7
# such blobs (benchmarks/README.md, "The figures behind the solver's, the exchange's and the data's
# choices").
PARALLEL_MIN_ELEMENTS = 1 << 15


@njit(inline="always")
def _sgd_element(data, diff, history, i, divisor, scale, decay, decays, local_rate, momentum):
    g = _regularized(diff, data, i, divisor, scale, decay, decays)
    v = local_rate * g + momentum * history[i]
    history[i] = v
    diff[i] = v
    data[i] = data[i] - v


@njit(nogil=True, parallel=True, cache=True)
def sgd_step(data, diff, history, divisor, scale, decay, decays, local_rate, momentum):
    """SGD with momentum: v = local_rate * g + momentum * v; diff = v; data -= v, where g is the
    gradient (``diff / divisor``) times ``scale`` plus, when ``decays``, ``decay * data`` (Caffe's L2
    regularization)."""
    for i in prange(data.shape[0]):
        _sgd_element(data, diff, history, i, divisor, scale, decay, decays, local_rate, momentum)


@njit(nogil=True, cache=True)
def sgd_step_serial(data, diff, history, divisor, scale, decay, decays, local_rate, momentum):
    """``sgd_step`` on the calling thread (small blobs: see PARALLEL_MIN_ELEMENTS)."""
    for i in range(data.shape[0]):
        _sgd_element(data, diff, history, i, divisor, scale, decay, decays, local_rate, momentum)


@njit(inline="always")
def _nesterov_element(data, diff, history, i, divisor, scale, decay, decays, local_rate, momentum,
                      one_plus_momentum):
    g = _regularized(diff, data, i, divisor, scale, decay, decays)
    previous = history[i]
    v = local_rate * g + momentum * previous
    history[i] = v
    step = one_plus_momentum * v + (-momentum) * previous
    diff[i] = step
    data[i] = data[i] - step


@njit(nogil=True, parallel=True, cache=True)
def nesterov_step(data, diff, history, divisor, scale, decay, decays, local_rate, momentum, one_plus_momentum):
    """Nesterov: v' = local_rate * g + momentum * v; diff = (1 + momentum) * v' - momentum * v;
    data -= diff (Caffe's NesterovSolver, with g as in ``sgd_step``)."""
    for i in prange(data.shape[0]):
        _nesterov_element(data, diff, history, i, divisor, scale, decay, decays, local_rate, momentum,
                          one_plus_momentum)


@njit(nogil=True, cache=True)
def nesterov_step_serial(data, diff, history, divisor, scale, decay, decays, local_rate, momentum,
                         one_plus_momentum):
    """``nesterov_step`` on the calling thread (small blobs: see PARALLEL_MIN_ELEMENTS)."""
    for i in range(data.shape[0]):
        _nesterov_element(data, diff, history, i, divisor, scale, decay, decays, local_rate, momentum,
                          one_plus_momentum)
