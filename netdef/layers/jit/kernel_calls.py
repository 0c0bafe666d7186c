"""Calls from numba-compiled code to the LLVM microkernels (jit/microkernels.py) by their addresses.

numba's intrinsics take no *args, so there is one per arity the kernels have; every argument is an
i64 (addresses, counts, strides). ``addresses`` gives the data pointers of arrays as the kernels take
them, ``span`` the near-equal pieces a row of pixels or a run of taps is cut into, one call each.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

I64 = ir.IntType(64)


def _signature_and_call(arity: int):
    """The signature (address, then ``arity`` i64 arguments) and the code of a call to a kernel address."""

    def codegen(context, builder, signature, values):
        function = builder.inttoptr(values[0], ir.FunctionType(ir.VoidType(), [I64] * arity).as_pointer())
        builder.call(function, list(values[1:]))
        return context.get_dummy_value()

    return types.void(*([types.int64] * (arity + 1))), codegen


@intrinsic
def call11(typingctx, address, a, b, c, d, e, f, g, h, i, j, k):
    return _signature_and_call(11)


@intrinsic
def call10(typingctx, address, a, b, c, d, e, f, g, h, i, j):
    return _signature_and_call(10)


@intrinsic
def call9(typingctx, address, a, b, c, d, e, f, g, h, i):
    return _signature_and_call(9)


@intrinsic
def call7(typingctx, address, a, b, c, d, e, f, g):
    return _signature_and_call(7)


@intrinsic
def call6(typingctx, address, a, b, c, d, e, f):
    return _signature_and_call(6)


@intrinsic
def call5(typingctx, address, a, b, c, d, e):
    return _signature_and_call(5)


@njit(inline="always")
def addresses(a, b, c, d):
    """The data addresses of four arrays, as the kernels take them."""
    return np.int64(a.ctypes.data), np.int64(b.ctypes.data), np.int64(c.ctypes.data), np.int64(d.ctypes.data)


@njit(inline="always")
def span(k, count, total):
    """Start and stop of span ``k`` of ``count`` near-equal spans of ``total``."""
    return k * total // count, (k + 1) * total // count
