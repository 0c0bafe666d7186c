"""im2col / col2im over many samples at once, so that a convolution is one large matrix product.

Layout. For an input ``x`` of shape (N, C, *S) (S: the spatial sizes) and a kernel of shape K, the
column matrix has C * prod(K) rows, stored C-ordered as (C, *K, N, *O) (O: the output sizes). Its rows
are ordered as Caffe's (channel-major, then kernel offsets in row-major order), so that
``W.reshape(num_output, -1) @ cols`` is Caffe's per-sample GEMM done for all N samples at once;
groups are contiguous row blocks because C leads. ``ColumnLayout`` describes one such matrix, including
the "full-width" variant the CPU uses for stride-1 2-D convolutions (rows over the padded width, see
FULL_WIDTH_MAX_RATIO), and converts between the matrix and (N, R, *O) arrays.

CPU: a strided window view of the zero-padded input is copied in one pass (im2col); col2im adds one
slice per kernel offset (a loop over prod(K) offsets, never over pixels or samples).
GPU (CuPy arrays, 2-D spatial): the CUDA kernels ``im2col`` and ``col2im`` in kernels/im2col.cu, whose
NumPy twins are the CPU functions here. N-d spatial on the GPU uses the same strided-view code with CuPy.

Row products (CPU only, see the section below): a stride-1 2-D convolution as kh matrix products over
row-shifted views of the input stored rows-first, (H, N, W, C), and expanded over the kernel columns
only; no column matrix and no col2im.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from .. import backend
from . import jit, kernels
from .matmul import matmul


def use_kernels(xp) -> bool:
    """Whether to run the CUDA kernels: only for CuPy arrays (tests point this at the host build)."""
    return xp is not np


def strided_pixels(x, stride, out):
    """out (N x C x *O) = x (N x C x *S) at every stride-th position along each spatial axis: the
    input of a 1x1 convolution with strides, as its products read it (layers/convolution/pointwise.py)."""
    if len(stride) == 2 and jit.usable(x, out):
        from .jit import layout

        layout.pick_strided(x, out, *stride)
    else:
        out[...] = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)]
    return out


def spread_strided(small, stride, out):
    """out (N x C x *S) = ``small`` (N x C x *O) at every stride-th position, 0 elsewhere: the input
    gradient of a 1x1 convolution with strides (``strided_pixels``' adjoint)."""
    if len(stride) == 2 and jit.usable(small, out):
        from .jit import layout

        layout.spread_strided(small, out, *stride)
    else:
        out[...] = 0
        out[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)] = small
    return out


def trunc_div(a: int, b: int) -> int:
    # C++ integer division truncates toward zero; Caffe's shape formulas rely on it.
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


@dataclass(frozen=True)
class Geometry:
    """Kernel, stride, pad and dilation per spatial axis (tuples of equal length)."""

    kernel: tuple
    stride: tuple
    pad: tuple
    dilation: tuple

    @property
    def ndim(self) -> int:
        return len(self.kernel)

    @property
    def extent(self) -> tuple:
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel, self.dilation))

    @property
    def kernel_count(self) -> int:
        return math.prod(self.kernel)

    def conv_out(self, spatial) -> tuple:
        """Convolution output sizes: (in + 2p - extent) / s + 1, rounded as C++ does."""
        return tuple(trunc_div(i + 2 * p - e, s) + 1
                     for i, p, e, s in zip(spatial, self.pad, self.extent, self.stride))

    def deconv_out(self, spatial) -> tuple:
        """Deconvolution output sizes: s * (in - 1) + extent - 2p."""
        return tuple(s * (i - 1) + e - 2 * p for i, p, e, s in zip(spatial, self.pad, self.extent, self.stride))


class Workspace:
    """Arrays a layer keeps between calls so that large temporaries are allocated once.

    ``get`` returns the array stored under ``key`` when its shape, dtype and module still fit,
    otherwise a new one (filled with ``fill`` when given). A reused array keeps its contents unless
    ``clear`` (then it is zeroed, as a new one is)."""

    def __init__(self):
        self._arrays: dict = {}

    def get(self, key, shape, dtype, xp, clear=False, fill=None):
        shape = tuple(int(d) for d in shape)
        a = self._arrays.get(key)
        if a is None or a.shape != shape or a.dtype != np.dtype(dtype) or backend.get_array_module(a) is not xp:
            a = xp.empty(shape, dtype=dtype)
            if fill is not None or clear:
                a.fill(0 if fill is None else fill)
            self._arrays[key] = a
        elif clear:
            a.fill(0)
        return a

    def clear(self) -> None:
        self._arrays.clear()

    @property
    def nbytes(self) -> int:
        """The bytes of the arrays kept."""
        return sum(a.nbytes for a in self._arrays.values())


def _as_strided(xp, a, shape, strides):
    if xp is np:
        return np.lib.stride_tricks.as_strided(a, shape=shape, strides=strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(a, shape=shape, strides=strides)


def padded(x, pad, ws: Workspace | None = None, key="pad", value=0.0, extra=None):
    """``x`` (N, C, *S) inside a border of ``pad`` cells per side filled with ``value`` (plus ``extra``
    more cells at the end of each axis, for windows that run past the padding); ``x`` itself when
    there is nothing to add. The border of a reused workspace array is never written, so it is
    filled once."""
    extra = extra or (0,) * len(pad)
    if not any(pad) and not any(extra):
        return x
    xp = backend.get_array_module(x)
    shape = x.shape[:2] + tuple(s + 2 * p + e for s, p, e in zip(x.shape[2:], pad, extra))
    if ws is None:
        buf = xp.full(shape, value, dtype=x.dtype)
    else:
        buf = ws.get((key, value), shape, x.dtype, xp, fill=value)
    inner = (slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(pad, x.shape[2:]))
    buf[inner] = x
    return buf


def window_view(xpad, geom: Geometry, out_sizes, order="cols"):
    """Read-only strided view of the windows of the padded input ``xpad`` (N, C, *P).

    order "cols": (C, *K, N, *O) (the column layout); "windows": (N, C, *O, *K)."""
    xp = backend.get_array_module(xpad)
    st = xpad.strides
    nd = geom.ndim
    k_strides = tuple(st[2 + a] * geom.dilation[a] for a in range(nd))
    o_strides = tuple(st[2 + a] * geom.stride[a] for a in range(nd))
    if order == "cols":
        shape = (xpad.shape[1],) + tuple(geom.kernel) + (xpad.shape[0],) + tuple(out_sizes)
        strides = (st[1],) + k_strides + (st[0],) + o_strides
    else:
        shape = xpad.shape[:2] + tuple(out_sizes) + tuple(geom.kernel)
        strides = st[:2] + o_strides + k_strides
    return _as_strided(xp, xpad, shape, strides)


def offset_slices(geom: Geometry, out_sizes):
    """For each kernel offset (row-major): the offset tuple and the index that selects, in the
    padded input (N, C, *P), the cells that offset reads for every output position."""
    for offs in itertools.product(*(range(k) for k in geom.kernel)):
        idx = (slice(None), slice(None)) + tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s)
            for o, d, s, n in zip(offs, geom.dilation, geom.stride, out_sizes))
        yield offs, idx


def _ints(*values):
    return tuple(np.int32(v) for v in values)


# ---------------------------------------------------------------------------------------- layout
# Stride-1 2-D convolutions on the CPU store each column row over the padded width Wp instead of
# the output width Wo ("full width"): then every (channel, kernel offset, sample) block of the column
# matrix is ONE contiguous run of Ho*Wp cells of the padded input, so im2col and col2im move long
# runs instead of Ho runs of Wo cells (numpy's cost is per run for short rows). The price is
# (Wp - Wo) / Wo more columns in the matrix products, hence the ratio limit.
FULL_WIDTH_MAX_RATIO = 1.5


@dataclass(frozen=True)
class ColumnLayout:
    """How the column matrix of inputs of shape ``x_shape`` = (N, C, *S) is stored.

    The matrix is (rows, ncols) = (C * prod(K), N * prod(O[:-1]) * width), C-ordered as
    (C, *K, N, *O[:-1], width). ``width`` is O[-1], or the padded input width in the full-width
    layout, whose extra columns are not output positions: the products read them as zero where it
    matters (a full-width operand written with ``scatter`` keeps zeros there) and ``gather`` drops them.
    """

    x_shape: tuple
    geom: Geometry
    out: tuple
    width: int

    @property
    def full_width(self) -> bool:
        return self.width != self.out[-1]

    @property
    def rows(self) -> int:
        return self.x_shape[1] * self.geom.kernel_count

    @property
    def ncols(self) -> int:
        return self.x_shape[0] * math.prod(self.out[:-1]) * self.width

    def gather(self, mat):
        """(R, ncols) matrix -> (N, R, *O) view of its output-position columns."""
        r = mat.shape[0]
        full = mat.reshape((r, self.x_shape[0]) + self.out[:-1] + (self.width,))
        if self.full_width:
            full = full[..., :self.out[-1]]
        return full.swapaxes(0, 1)

    def scatter(self, mat, values):
        """Write ``values`` (N, R, *O) into the output-position columns of ``mat`` (R, ncols); the
        other columns keep what they hold (zeros, for a buffer created with fill=0)."""
        if self._compiled(mat, values):
            from .jit import layout

            layout.columns_from_nchw(values, self._planes(mat))
        else:
            self.gather(mat)[...] = values.reshape(self.gather(mat).shape)

    def gather_into(self, mat, out, bias=None):
        """out (N, R, *O) = the output-position columns of ``mat`` (R, ncols) (+ bias[r])."""
        if self._compiled(mat, out, bias):
            from .jit import layout

            layout.nchw_from_columns(self._planes(mat), np.zeros(mat.shape[0], mat.dtype) if bias is None else bias,
                                     out)
        elif bias is None:
            out[...] = self.gather(mat)
        else:
            xp = backend.get_array_module(mat)
            xp.add(self.gather(mat), bias.reshape((1, -1) + (1,) * len(self.out)), out=out)

    def _compiled(self, mat, *arrays) -> bool:
        # The kernels (jit/layout.py) take 2-D maps; the NumPy lines are their twins.
        return len(self.out) == 2 and jit.usable(mat, *arrays)

    def _planes(self, mat):
        return mat.reshape((mat.shape[0], self.x_shape[0]) + self.out[:-1] + (self.width,))

    def buffer(self, ws: "Workspace | None", key, rows, dtype, xp):
        """A (rows, ncols) matrix whose non-output columns are zero."""
        shape = (rows, self.ncols)
        if ws is None:
            return xp.zeros(shape, dtype)
        return ws.get(key, shape, dtype, xp, fill=0)


def column_layout(x_shape, geom: Geometry, xp=np) -> ColumnLayout:
    """The layout im2col uses for inputs of shape ``x_shape`` (N, C, *S) on module ``xp``."""
    out = geom.conv_out(tuple(x_shape[2:]))
    width = out[-1]
    if geom.ndim == 2 and not use_kernels(xp) and geom.stride == (1, 1):
        padded_width = x_shape[3] + 2 * geom.pad[1]
        if padded_width <= FULL_WIDTH_MAX_RATIO * out[-1]:
            width = padded_width
    return ColumnLayout(tuple(x_shape), geom, out, width)


def _flat_padded(shape, dtype, xp, geom, ws, key):
    """A zero-initialised flat buffer for the padded input of ``shape`` (N*C*Hp*Wp cells plus the
    slack that full-width runs reach past the last plane), and its (N, C, Hp, Wp) view."""
    n, c, h, w = shape
    hp, wp = h + 2 * geom.pad[0], w + 2 * geom.pad[1]
    slack = (geom.kernel[1] - 1) * geom.dilation[1]
    if ws is None:
        flat = xp.zeros(n * c * hp * wp + slack, dtype)
    else:
        flat = ws.get(key, (n * c * hp * wp + slack,), dtype, xp, fill=0)
    return flat, flat[:n * c * hp * wp].reshape(n, c, hp, wp)


def _full_width_strides(layout: ColumnLayout, itemsize: int):
    n, c, h, w = layout.x_shape
    hp, wp = h + 2 * layout.geom.pad[0], w + 2 * layout.geom.pad[1]
    plane = hp * wp
    return plane, wp, tuple(v * itemsize for v in (plane, layout.geom.dilation[0] * wp,
                                                     layout.geom.dilation[1], c * plane, 1))


# ---------------------------------------------------------------------------------------- im2col
def im2col(x, layout: ColumnLayout, ws: Workspace | None = None, key="cols"):
    """The column matrix (layout.rows, layout.ncols) of ``x`` (N, C, *S); see ColumnLayout."""
    xp = backend.get_array_module(x)
    geom = layout.geom
    cols = ws.get(key, (layout.rows, layout.ncols), x.dtype, xp) if ws is not None else \
        xp.empty((layout.rows, layout.ncols), x.dtype)
    if use_kernels(xp) and geom.ndim == 2:
        _im2col_cuda(xp.ascontiguousarray(x), geom, layout.out, cols)
        return cols
    if layout.full_width:
        n, c = x.shape[:2]
        flat, img = _flat_padded(x.shape, x.dtype, xp, geom, ws, (key, "flat"))
        img[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(geom.pad, x.shape[2:]))] = x
        plane, wp, st = _full_width_strides(layout, x.itemsize)
        shape = (c,) + geom.kernel + (n, layout.out[0] * wp)
        view = np.lib.stride_tricks.as_strided(flat, shape=shape, strides=st, writeable=False)
        cols.reshape(shape)[...] = view
        return cols
    view = window_view(padded(x, geom.pad, ws, key=(key, "pad")), geom, layout.out, "cols")
    cols.reshape(view.shape)[...] = view
    return cols


def _im2col_cuda(x, geom, out_sizes, cols):
    n, c, h, w = x.shape
    kernels.launch("im2col", cols.size, (x,) + _ints(n, c, h, w, *geom.kernel, *geom.pad, *geom.stride,
                                                     *geom.dilation, *out_sizes) + (cols,))


def col2im(cols, layout: ColumnLayout, out, ws: Workspace | None = None, key="col2im"):
    """The adjoint of im2col: writes into ``out`` (shape layout.x_shape) the sum, for every input
    cell, of the column entries that im2col copies from it. In the full-width layout the
    non-output columns of ``cols`` must be zero (they are, for products with a scattered operand)."""
    xp = backend.get_array_module(cols)
    geom = layout.geom
    x_shape = layout.x_shape
    n, c = x_shape[:2]
    spatial = tuple(x_shape[2:])
    inner = (slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(geom.pad, spatial))
    if use_kernels(xp) and geom.ndim == 2:
        _col2im_cuda(xp.ascontiguousarray(cols), x_shape, geom, layout.out, out)
        return out
    if layout.full_width:
        flat, img = _flat_padded(x_shape, cols.dtype, xp, geom, ws, (key, "flat"))
        flat[...] = 0
        plane, wp, st = _full_width_strides(layout, cols.itemsize)
        run = layout.out[0] * wp
        blocks = cols.reshape((c,) + geom.kernel + (n, run))
        for i in range(geom.kernel[0]):
            for j in range(geom.kernel[1]):
                start = i * geom.dilation[0] * wp + j * geom.dilation[1]
                target = np.lib.stride_tricks.as_strided(flat[start:], shape=(c, n, run),
                                                         strides=(st[0], st[3], st[4]))
                target += blocks[:, i, j]
        out[...] = img[inner]
        return out
    cols = cols.reshape((c,) + tuple(geom.kernel) + (n,) + tuple(layout.out))
    if any(geom.pad):
        pshape = (n, c) + tuple(s + 2 * p for s, p in zip(spatial, geom.pad))
        acc = ws.get(key, pshape, cols.dtype, xp, clear=True) if ws is not None else xp.zeros(pshape, cols.dtype)
    else:
        acc = out
        acc[...] = 0
    for offs, idx in offset_slices(geom, layout.out):
        # cols[c, *offs] is (C, N, *O); the input is (N, C, *S).
        acc[idx] += xp.swapaxes(cols[(slice(None),) + offs], 0, 1)
    if acc is not out:
        out[...] = acc[inner]
    return out


def _col2im_cuda(cols, x_shape, geom, out_sizes, out):
    n, c, h, w = x_shape
    target = out if out.flags.c_contiguous else backend.get_array_module(out).empty(x_shape, cols.dtype)
    kernels.launch("col2im", n * c * h * w, (cols,) + _ints(n, c, h, w, *geom.kernel, *geom.pad, *geom.stride,
                                                            *geom.dilation, *out_sizes) + (target,))
    if target is not out:
        out[...] = target


# ---------------------------------------------------------------------------------------- row products
# CPU stride-1 2-D convolutions without a full column matrix. The input is stored "rows first":
# xb[h, n, w, c] (padded H, sample, padded W, channel). Expanding it over the kernel COLUMNS only,
#     q[h, n, wo, j, c] = xb[h, n, wo + j*dw, c]      (kw*C contiguous cells per row: one run per (h, n, wo)),
# makes the column-matrix rows of kernel row i the rows h = ho + i*dh of q, and those are one
# contiguous block of q (its first axis is h). So the convolution is kh products
#     y[(ho, n, wo), o] = sum_i q[(ho + i*dh, n, wo), (j, c)] @ wq[i][(j, c), o]
# over views of q, with no copy per kernel row, on a matrix kw (not kh*kw) times the input, and with
# unit-stride K in both operands (BLAS's fastest orientation here). When kw*C is small, a product
# with so short a K runs slowly: then the kernel rows are "folded" into q as well (fold = kh: the
# classic column matrix, in this rows-first layout, and one product). Each product runs over its live
# output rows only (_live_rows: the rows for which its kernel row reads the input, not the padding).
# q is written straight from the NCHW input by one compiled pass (rows_expanded).
# Backward: the weight gradient is q_i^T @ dy per product; the input gradient is either this same
# machinery run on the top gradient padded by extent - 1 - pad, with the flipped, transposed filters
# (the adjoint of a stride-1 convolution is such a convolution: no scatter), or col2im's: one product
# dcols = dy W with kh*kw*C columns, then a compiled scatter-add (row_col2im). The layer chooses once
# per shape (layers/convolution/rows.py, ROW_COL2IM_*): col2im where the map shrinks (the convolution would cost
# prod(input) / prod(output) times the multiply-adds) or the input has few channels.
ROW_PRODUCTS = True          # tests switch the path off to compare it with the column path
ROW_MIN_WIDTH = 64           # Convolution takes this path when kw * C is at least this (see convolution/rows.py)
ROW_FOLD_BELOW = 64          # fold the kernel rows into q when kw * C is below this


@dataclass(frozen=True)
class RowPlan:
    """The rows-first layout of a stride-1 2-D convolution of inputs (n, C, H, W) (see above)."""

    n: int
    channels: int
    spatial: tuple
    geom: Geometry
    fold: int

    @property
    def padded(self) -> tuple:
        return tuple(s + 2 * p for s, p in zip(self.spatial, self.geom.pad))

    @functools.cached_property
    def out(self) -> tuple:
        # Cached: the products and copies of a chunk ask for it dozens of times.
        return self.geom.conv_out(self.spatial)

    @property
    def products(self) -> int:
        return self.geom.kernel[0] // self.fold

    @property
    def width(self) -> int:
        """K of each product: (fold kernel rows) x kw x C."""
        return self.fold * self.geom.kernel[1] * self.channels

    @property
    def q_rows(self) -> int:
        """Rows h of q: the output rows plus the reach of the kernel rows not folded in."""
        return self.out[0] + (self.products - 1) * self.fold * self.geom.dilation[0]

    @property
    def block(self) -> int:
        """Rows of q (and of the output) per row h: n * W_out."""
        return self.n * self.out[1]

    @property
    def q_cells_per_sample(self) -> int:
        return self.q_rows * self.out[1] * self.width

    def expands(self) -> bool:
        """Whether q differs from xb (otherwise the products read xb itself)."""
        return not (self.fold == 1 and self.geom.kernel[1] == 1)


def row_plan(n, channels, spatial, geom: Geometry) -> RowPlan:
    fold = geom.kernel[0] if geom.kernel[1] * channels < ROW_FOLD_BELOW else 1
    return RowPlan(int(n), int(channels), tuple(spatial), geom, fold)


def row_weights(w, fold: int):
    """Weights (O, C, kh, kw) (any strides: the backward pass passes flipped, transposed filters) as the
    kh/fold right-hand sides (kh/fold, fold*kw*C, O) of the products."""
    o, c, kh, kw = w.shape
    # The kernel reads any strides: usable() asks for C-contiguous arrays, which the view is not.
    if jit.ENABLED and isinstance(w, np.ndarray) and w.dtype.kind == "f" and w.size:
        from .jit import layout

        out = np.empty((kh, kw, c, o), w.dtype)
        layout.weights_to_rows(w, out)
    else:
        out = np.ascontiguousarray(w.transpose(2, 3, 1, 0))
    return out.reshape(kh // fold, fold * kw * c, o)


def add_row_weight_grad(dwq, grad) -> None:
    """grad (O, C, kh, kw) += the (kh/fold, fold*kw*C, O) gradient of row_weights."""
    o, c, kh, kw = grad.shape
    rows = dwq.reshape(kh, kw, c, o)
    if jit.usable(rows, grad):
        from .jit import layout

        layout.add_weights_from_rows(rows, grad)
    else:
        grad += rows.transpose(3, 2, 0, 1)


def copy_to_rows(x, rows, pad=(0, 0)) -> None:
    """rows[h + ph, n, w + pw, c] = x[n, c, h, w]: an NCHW array into (the interior of) the rows-first
    layout. Compiled (jit/layout.py) for NumPy arrays: NumPy's transposed copy is several times slower."""
    (ph, pw), (h, w) = pad, x.shape[2:]
    if jit.usable(x, rows):
        from .jit import layout

        layout.rows_from_nchw(x, rows, ph, pw)
    else:
        rows[ph:ph + h, :, pw:pw + w, :] = x.transpose(2, 0, 3, 1)


def copy_from_rows(rows, out, bias=None) -> None:
    """out[n, c, h, w] = rows[h, n, w, c] (+ bias[c]): the rows-first layout back into an NCHW array."""
    if jit.usable(rows, out, bias):
        from .jit import layout

        if bias is None:
            layout.nchw_from_rows(rows, out)
        else:
            layout.nchw_from_rows_plus_bias(rows, bias, out)
    elif bias is None:
        out[...] = rows.transpose(1, 3, 0, 2)
    else:
        np.add(rows.transpose(1, 3, 0, 2), bias[:, None, None], out=out)


def rows_from_nchw(x, plan: RowPlan, ws: Workspace, key):
    """xb (Hp, n, Wp, C): the NCHW array ``x`` (n, C, H, W) in the rows-first layout inside a zero
    border (the border of the workspace array is zeroed when it is created, never written after)."""
    xb = ws.get(key, plan.padded[:1] + (plan.n,) + plan.padded[1:] + (plan.channels,), x.dtype, np, fill=0)
    copy_to_rows(x, xb, plan.geom.pad)
    return xb


def rows_expanded(x, plan: RowPlan, ws, key):
    """q as the matrix (q_rows * n * W_out, width) for the NCHW array ``x`` (n, C, H, W): what
    row_expand(rows_from_nchw(x)) gives, in one compiled pass for NumPy arrays (jit/layout.py)."""
    if not jit.usable(x):
        return row_expand(rows_from_nchw(x, plan, ws, (key, "xb")), plan, ws, key)
    from .jit import layout

    q = ws.get(key, (plan.q_rows * plan.block, plan.width), x.dtype, np)

    (_, kw), (ph, pw), (dh, dw) = plan.geom.kernel, plan.geom.pad, plan.geom.dilation
    layout.expand_rows_from_nchw(x, ph, pw, dh, dw,
                                 q.reshape(plan.q_rows, plan.n, plan.out[1], plan.fold, kw, plan.channels))
    return q


def row_expand(xb, plan: RowPlan, ws: Workspace, key):
    """q as the matrix (q_rows * n * W_out, width): one strided copy of xb (or xb itself)."""
    if not plan.expands():
        return xb.reshape(-1, plan.channels)
    (_, kw), (dh, dw) = plan.geom.kernel, plan.geom.dilation
    s0, s1, s2, s3 = xb.strides
    shape = (plan.q_rows, plan.n, plan.out[1], plan.fold, kw, plan.channels)
    view = np.lib.stride_tricks.as_strided(xb, shape=shape, strides=(s0, s1, s2, dh * s0, dw * s2, s3),
                                           writeable=False)
    q = ws.get(key, (plan.q_rows * plan.block, plan.width), xb.dtype, np)
    q.reshape(shape)[...] = view
    return q


def row_col2im(dcols, plan: RowPlan, out) -> None:
    """out (n, C, H, W) = the adjoint of the folded expansion: dcols (H_out * n * W_out, kh*kw*C), rows
    ordered (ho, n, wo) and columns (i, j, c), each entry added to the input cell its kernel offset reads
    (im2col's col2im, for the rows-first layout). Compiled (jit/layout.py) for NumPy arrays."""
    (kh, kw), (ph, pw), (dh, dw) = plan.geom.kernel, plan.geom.pad, plan.geom.dilation
    (ho, wo), (h, w) = plan.out, plan.spatial
    blocks = dcols.reshape(ho, plan.n, wo, kh, kw, plan.channels)
    if jit.usable(blocks, out):
        from .jit import layout

        layout.col2im_rows(blocks, ph, pw, dh, dw, out)
        return
    acc = np.zeros(plan.padded[:1] + (plan.n,) + plan.padded[1:] + (plan.channels,), dcols.dtype)
    for i in range(kh):
        for j in range(kw):
            acc[i * dh:i * dh + ho, :, j * dw:j * dw + wo] += blocks[:, :, :, i, j]
    out[...] = acc[ph:ph + h, :, pw:pw + w].transpose(1, 3, 0, 2)


def _row_slice(plan: RowPlan, i: int, start: int, stop: int):
    # Product i reads the q rows h = ho + i*fold*dh: output row block [start, stop) of it.
    shift = i * plan.fold * plan.geom.dilation[0] * plan.block
    return slice(shift + start, shift + stop)


def _live_rows(plan: RowPlan, i: int) -> tuple:
    """The output rows [lo, hi) for which product i reads at least one input row (not padding):
    the other rows of its q block are zero and contribute nothing."""
    if plan.products == 1:
        return 0, plan.out[0]
    pad, size, dh = plan.geom.pad[0], plan.spatial[0], plan.geom.dilation[0]
    shift = i * plan.fold * dh
    lo, hi = max(0, pad - shift), min(plan.out[0], pad + size - shift)
    return lo, max(lo, hi)


def row_product(q, wq, plan: RowPlan, out, ws: Workspace):
    """out (H_out * n * W_out, O) = sum over the products i of q_i @ wq[i]; rows ordered (ho, n, wo).

    Each product runs over its live rows only (see _live_rows: with padding, the outer kernel rows
    read padding for the first and last output rows), which a product over all rows initialises."""
    ho, block = plan.out[0], plan.block
    spans = [_live_rows(plan, i) for i in range(plan.products)]
    first = next((i for i, span in enumerate(spans) if span == (0, ho)), None)
    if first is None:
        out.fill(0)
    else:
        matmul(q[_row_slice(plan, first, 0, ho * block)], wq[first], out=out)
    part = None
    for i, (lo, hi) in enumerate(spans):
        if i == first or hi <= lo:
            continue
        if part is None:
            # Whole products, then one add each: row blocks that keep the partial sums in cache
            # measured slower (BLAS's two threads run small products less efficiently).
            part = ws.get("rows_part", out.shape, out.dtype, np)
        rows = slice(lo * block, hi * block)
        matmul(q[_row_slice(plan, i, rows.start, rows.stop)], wq[i], out=part[rows])
        _accumulate(out[rows], part[rows])
    return out


def _accumulate(dst, src) -> None:
    """dst += src; compiled (jit/layout.py) for NumPy arrays, which run it on every core."""
    if jit.usable(dst, src):
        from .jit import layout

        layout.accumulate(dst.reshape(-1), src.reshape(-1))
    else:
        dst += src


def row_weight_product(q, dy_rows, plan: RowPlan, dwq):
    """Writes into ``dwq`` (kh/fold, width, O) the weight gradient: q_i^T @ dy_rows for each product i
    (over its live rows); returns it."""
    for i in range(plan.products):
        lo, hi = _live_rows(plan, i)
        if hi <= lo:
            dwq[i] = 0
            continue
        rows = slice(lo * plan.block, hi * plan.block)
        matmul(q[_row_slice(plan, i, rows.start, rows.stop)].T, dy_rows[rows], out=dwq[i])
    return dwq
