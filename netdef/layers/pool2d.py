"""2-D pooling of (N, C, H, W) arrays with Caffe's arithmetic: ``Pool2D``, one configuration (kernel,
stride, pad, input and output sizes) that the Pooling and SPP layers (pooling.py) apply, and its MAX
and AVE passes forward and backward (STOCHASTIC is Pool2D's own).

On C-contiguous float NumPy arrays the compiled kernels of jit/pooling.py run (when ``jit.ENABLED``);
on a GPU the CUDA kernels of kernels/pooling.cu. The NumPy code here (one unit-stride array operation
per window offset over stride-phase planes, never a loop over pixels or samples) is the twin of both
(``max_pool_forward`` ... ``ave_pool_backward``), and what any other array runs.
"""
from __future__ import annotations

import math

import numpy as np

from .. import backend
from ..proto import netdef_pb2 as pb
from . import im2col as _cols
from . import jit, kernels
from .im2col import Geometry, Workspace, offset_slices, padded, window_view

_Pool = pb.PoolingParameter


def _lowest() -> float:
    # Caffe starts every max at -FLT_MAX (for both float and double), so a window whose cells are all
    # <= -FLT_MAX yields -FLT_MAX and no argmax.
    return float(-np.finfo(np.float32).max)


def pool_output_size(size: int, kernel: int, stride: int, pad: int, floor: bool = False) -> int:
    """Caffe's pooled size before the padding correction: ceil (default) or floor of
    (size + 2 pad - kernel) / stride, plus one."""
    span = size + 2 * pad - kernel
    return (span // stride if floor else -(-span // stride)) + 1


def pooled_shape(height, width, kernel, stride, pad, floor=False) -> tuple:
    """Output (H_out, W_out) as Caffe's PoolingLayer::Reshape computes it, padding correction included:
    with any padding, a last window that would start inside the padding is dropped."""
    out_h = pool_output_size(height, kernel[0], stride[0], pad[0], floor)
    out_w = pool_output_size(width, kernel[1], stride[1], pad[1], floor)
    if pad[0] or pad[1]:
        if (out_h - 1) * stride[0] >= height + pad[0]:
            out_h -= 1
        if (out_w - 1) * stride[1] >= width + pad[1]:
            out_w -= 1
    return out_h, out_w


# Above this many cells per window, pooling copies the windows once and reduces them, rather than
# doing one array operation per window offset.
_OFFSET_LOOP_MAX_CELLS = 25


class Pool2D:
    """One 2-D pooling configuration applied to (N, C, H, W) arrays (used by Pooling and SPP)."""

    def __init__(self, method: int, kernel, stride, pad, in_hw, out_hw):
        self.method = method
        self.kernel, self.stride, self.pad = tuple(kernel), tuple(stride), tuple(pad)
        self.in_hw, self.out = tuple(in_hw), tuple(out_hw)
        self.geom = Geometry(self.kernel, self.stride, self.pad, (1, 1))
        # Cells past the padded input that the last (ceil-rounded) windows reach.
        self.extra = tuple(max(0, (o - 1) * s + k - (i + 2 * p))
                           for o, s, k, i, p in zip(self.out, self.stride, self.kernel, self.in_hw, self.pad))
        self.ws = Workspace()
        self.state = None
        self.phase_layout = None  # the CPU passes' layout of small windows (_Phases), made when first used

    # ---- helpers
    def _needs_buffer(self) -> bool:
        return any(self.pad) or any(self.extra)

    def _buffer(self, x, value):
        return padded(x, self.pad, self.ws, key="in", value=value, extra=self.extra)

    def _zero_acc(self, like, shape):
        """A zeroed accumulator covering the padded input (N, C, H + 2p + extra, ...)."""
        xp = backend.get_array_module(like)
        full = shape[:2] + tuple(s + 2 * p + e for s, p, e in zip(shape[2:], self.pad, self.extra))
        return self.ws.get("acc", full, like.dtype, xp, clear=True)

    def _gradient_accumulator(self, dy, x_shape, out):
        """Where a backward sums its window gradients, zeroed: a padded buffer where the windows reach
        past the input (``_needs_buffer``), else ``out`` itself."""
        if self._needs_buffer():
            return self._zero_acc(dy, x_shape)
        out[...] = 0
        return out

    def _crop(self, acc, shape):
        return acc[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(self.pad, shape[2:]))]

    def _many_cells(self) -> bool:
        return self.kernel[0] * self.kernel[1] > _OFFSET_LOOP_MAX_CELLS

    def _disjoint(self) -> bool:
        return self.stride[0] >= self.kernel[0] and self.stride[1] >= self.kernel[1]

    def divisor(self, xp, dtype):
        """AVE divisor per output cell: the window clipped to the padded input [-pad, size + pad)."""
        sizes = []
        for o, s, p, k, size in zip(self.out, self.stride, self.pad, self.kernel, self.in_hw):
            start = np.arange(o) * s - p
            sizes.append(np.minimum(start + k, size + p) - start)
        return xp.asarray(np.outer(sizes[0], sizes[1]).astype(dtype))

    def flat_mask(self, code):
        """The offset code of each output's argmax as the flat index h*W + w in the input plane
        (-1 where no cell won)."""
        xp = backend.get_array_module(code)
        kw = self.kernel[1]
        rows = xp.arange(self.out[0]).reshape(-1, 1) * self.stride[0] - self.pad[0]
        cols = xp.arange(self.out[1]).reshape(1, -1) * self.stride[1] - self.pad[1]
        code = code.astype(np.int32)
        flat = (rows + code // kw) * self.in_hw[1] + cols + code % kw
        return xp.where(code < 0, -1, flat).astype(np.int32)

    # ---- forward / backward
    def forward(self, x, train: bool = True, out=None):
        """Pooled (N, C, H_out, W_out) array; keeps what backward needs. The CPU paths for small windows
        write into ``out`` when it is a C-contiguous array of that shape and dtype (saving a fresh
        allocation per call), other paths return a new array."""
        if self.method == _Pool.MAX:
            y, mask = max_pool_forward(x, self, out)
            self.state = ("max", mask)
            return y
        if self.method == _Pool.AVE:
            self.state = ("ave",)
            return ave_pool_forward(x, self, out)
        return self._stochastic_forward(x, train)

    def backward(self, dy, x_shape, out):
        """Writes the bottom gradient (shape ``x_shape``) into ``out``."""
        kind = self.state[0]
        if kind == "max":
            return max_pool_backward(dy, self.state[1], x_shape, self, out)
        if kind == "ave":
            return ave_pool_backward(dy, x_shape, self, out)
        return self._stochastic_backward(dy, x_shape, out)

    # ---- STOCHASTIC (Caffe has it on the GPU only; the same arithmetic here for both modules)
    def _windows(self, x):
        # Caffe's stochastic pooling has no padding; ceil-rounded windows that run past the input are
        # filled with zeros, which never change a cumulative sum.
        xbuf = padded(x, (0, 0), self.ws, key="sto", value=0.0, extra=self.extra)
        xp = backend.get_array_module(x)
        win = window_view(xbuf, self.geom, self.out, "windows")
        return xp.ascontiguousarray(win).reshape(win.shape[:4] + (-1,))

    def _stochastic_forward(self, x, train):
        xp = backend.get_array_module(x)
        win = self._windows(x)
        if train:
            # Sample a cell with probability proportional to its value: the first cell whose running
            # sum reaches u * total, u ~ U[0, 1) (Caffe: StoPoolForwardTrain).
            csum = xp.cumsum(win, axis=-1)
            u = backend.to_device(backend.rng().random(win.shape[:4]), like=x).astype(x.dtype)
            thres = u * csum[..., -1]
            pick = xp.argmax(csum >= thres[..., None], axis=-1)
            self.state = ("sto_train", pick, win.shape)
            return xp.take_along_axis(win, pick[..., None], axis=-1)[..., 0]
        # TEST: the value-weighted average sum(x^2) / sum(x) (0 where the sum is not positive).
        total = win.sum(axis=-1)
        squares = (win * win).sum(axis=-1)
        positive = total > 0
        safe = xp.where(positive, total, 1)
        self.state = ("sto_test", win, total, squares, positive, safe)
        return xp.where(positive, squares / safe, 0).astype(x.dtype)

    def _stochastic_backward(self, dy, x_shape, out):
        xp = backend.get_array_module(dy)
        if self.state[0] == "sto_train":
            _, pick, wshape = self.state
            onehot = xp.arange(wshape[-1]) == pick[..., None]
            contrib = onehot * dy[..., None]
        else:
            # Gradient of sum(x^2)/sum(x): (2 x_k S - Q) / S^2 (Caffe reuses the TRAIN indices here,
            # which have no meaning at TEST; this is the true derivative of the TEST output).
            _, win, total, squares, positive, safe = self.state
            contrib = (2 * win * total[..., None] - squares[..., None]) / (safe * safe)[..., None]
            contrib = xp.where(positive[..., None], contrib * dy[..., None], 0)
        contrib = contrib.reshape(contrib.shape[:4] + self.kernel).astype(dy.dtype)
        geom = Geometry(self.kernel, self.stride, (0, 0), (1, 1))
        full = tuple(x_shape[:2]) + tuple(s + e for s, e in zip(x_shape[2:], self.extra))
        acc = self.ws.get("acc", full, dy.dtype, xp, clear=True)
        for (i, j), idx in offset_slices(geom, self.out):
            acc[idx] += contrib[..., i, j]
        out[...] = acc[:, :, :x_shape[2], :x_shape[3]]
        return out


def _pool_args(p: Pool2D, x_shape):
    n, c, h, w = x_shape
    return kernels.int_args(c, h, w, p.out[0], p.out[1], p.kernel[0], p.kernel[1], p.stride[0], p.stride[1], p.pad[0],
                            p.pad[1])


class _Phases:
    """The CPU layout of 2-D pooling with small windows.

    The padded input is split by stride phase: plane (a, b) holds the padded cells (a + sh*t, b + sw*u)
    as a contiguous (P, hq, wq) array (P = N*C planes), stored flat. The cells that window offset
    (i, j) reads for every output of every plane are then ONE contiguous run of that flat array: from
    (i//sh)*wq + j//sw on, P*hq*wq cells long, read in a "full" output layout (P, hq, wq) whose cells
    past (oh, ow) are not outputs (they read padding or the next plane; nothing uses them). So every
    per-offset operation is a single unit-stride pass: numpy runs strided or row-by-row passes several
    times slower. The flat arrays carry ``slack`` cells past the last plane for the longest shift.
    """

    def __init__(self, p: Pool2D):
        (kh, kw), (sh, sw), (ph, pw), (oh, ow) = p.kernel, p.stride, p.pad, p.out
        h, w = p.in_hw
        self.na, self.nb = min(sh, kh), min(sw, kw)
        self.hq = oh + (kh - 1) // sh
        self.wq = ow + (kw - 1) // sw
        self.plane = self.hq * self.wq
        self.out = (oh, ow)
        # Offset k = i*kw + j reads plane (i % sh, j % sw) from cell (i//sh)*wq + j//sw on.
        self.offsets = [(i % sh, j % sw, (i // sh) * self.wq + j // sw) for i in range(kh) for j in range(kw)]
        self.slack = max(first for _, _, first in self.offsets)

        def spans(size, pad, stride, phases, cap):
            out = []
            for a in range(phases):
                t0 = max(0, -(-(pad - a) // stride))
                t1 = min(cap, (size - 1 + pad - a) // stride + 1)
                out.append((t0, max(t0, t1), a + stride * t0 - pad))
            return out

        self.row_spans = spans(h, ph, sh, self.na, self.hq)
        self.col_spans = spans(w, pw, sw, self.nb, self.wq)
        covered_rows = sum(t1 - t0 for t0, t1, _ in self.row_spans)
        covered_cols = sum(u1 - u0 for u0, u1, _ in self.col_spans)
        # Input cells read by no window (strides larger than kernels, or floor rounding) get no
        # gradient: merge() then clears the whole gradient first.
        self.complete = covered_rows == h and covered_cols == w
        self.stride = (sh, sw)

    def _regions(self):
        sh, sw = self.stride
        for a, (t0, t1, r0) in enumerate(self.row_spans):
            if t1 <= t0:
                continue
            for b, (u0, u1, c0) in enumerate(self.col_spans):
                if u1 <= u0:
                    continue
                src = (slice(None), slice(r0, r0 + sh * (t1 - t0 - 1) + 1, sh),
                       slice(c0, c0 + sw * (u1 - u0 - 1) + 1, sw))
                yield a, b, (slice(t0, t1), slice(u0, u1)), src

    def blocks(self, planes: int, itemsize: int):
        """Ranges of planes (N*C) processed together, sized so that their phase planes stay in
        cache (the passes are memory-bound otherwise)."""
        per_plane = self.na * self.nb * self.plane * itemsize
        size = max(1, min(planes, _POOL_BLOCK_BYTES // per_plane))
        return [(start, min(planes, start + size)) for start in range(0, planes, size)]

    def _planes(self, q, count):
        return q[:, :, :count * self.plane].reshape(self.na, self.nb, count, self.hq, self.wq)

    def split(self, x, fill, ws: Workspace):
        """(na, nb, P*hq*wq + slack) flat phase planes of ``x`` (P, H, W) padded with ``fill``. Cells
        outside the input are filled when the workspace array is created and never written after."""
        count = x.shape[0]
        q = ws.get(("phases", fill, count), (self.na, self.nb, count * self.plane + self.slack), x.dtype, np,
                   fill=fill)
        planes = self._planes(q, count)
        for a, b, dst, src in self._regions():
            np.copyto(planes[(a, b, slice(None)) + dst], x[src])
        return q

    def windows(self, q, count):
        """For each window offset in row-major order: the (P*hq*wq,) run of cells it reads."""
        n = count * self.plane
        return [q[a, b, first:first + n] for a, b, first in self.offsets]

    def gradient(self, ws: Workspace, key, count, dtype):
        """An accumulator (na, nb, P*hq*wq + slack) for the phase planes' gradients of ``count`` planes,
        with its contents undefined: ``target`` initialises each plane with its first contribution."""
        return ws.get((key, count), (self.na, self.nb, count * self.plane + self.slack), dtype, np), set()

    def target(self, dq, k: int, count: int):
        """(run, fresh): dq's (P*hq*wq,) run for window offset ``k``. ``fresh``: the first offset of its
        phase plane, which the caller WRITES (the rest of that plane is zeroed here); later offsets of
        the plane are ADDED. This saves clearing whole planes and one add per plane."""
        dq, started = dq
        a, b, first = self.offsets[k]
        n = count * self.plane
        if (a, b) in started:
            return dq[a, b, first:first + n], False
        started.add((a, b))
        dq[a, b, :first] = 0
        dq[a, b, first + n:] = 0
        return dq[a, b, first:first + n], True

    def merge(self, dq, out):
        """Write the phase planes' gradients (na, nb, P*hq*wq + slack) back to ``out`` (P, H, W)."""
        if not self.complete:
            out[...] = 0
        planes = self._planes(dq[0], out.shape[0])
        for a, b, dst, src in self._regions():
            np.copyto(out[src], planes[(a, b, slice(None)) + dst])
        return out

    def full(self, ws, key, values):
        """``values`` (P, oh, ow) in the full layout (P*hq*wq,), zeros outside (oh, ow)."""
        count = values.shape[0]
        buf = ws.get((key, count), (count * self.plane,), values.dtype, np, fill=0)
        self.valid(buf)[...] = values
        return buf

    def valid(self, full):
        """The (P, oh, ow) outputs of a full-layout (P*hq*wq,) array (a view)."""
        return full.reshape(-1, self.hq, self.wq)[:, :self.out[0], :self.out[1]]


# Plane blocks of the CPU pooling passes take about this many bytes of phase planes.
_POOL_BLOCK_BYTES = 512 << 10


def _phases(p: Pool2D) -> _Phases:
    if p.phase_layout is None:
        p.phase_layout = _Phases(p)
    return p.phase_layout


def _pool_target(out, shape, dtype):
    """``out`` when the CPU pooling passes can write into it, else a new array."""
    if (isinstance(out, np.ndarray) and out.shape == shape and out.dtype == dtype and out.flags.c_contiguous
            and out.flags.writeable):
        return out
    return np.empty(shape, dtype)


def _pool_geometry(p: Pool2D) -> tuple:
    return p.kernel + p.stride + p.pad


def max_pool_forward(x, p: Pool2D, out=None):
    """MAX pooling of (N, C, H, W): (top, mask). Twin of the CUDA kernel ``max_pool_forward``.

    The mask is ("flat", h*W + w) from the kernels (CUDA or compiled CPU), or the winning window
    offset i*kw + j (-1: none) from the NumPy passes; ``max_mask_flat`` gives Caffe's flat index from
    any of them."""
    xp = backend.get_array_module(x)
    shape = x.shape[:2] + p.out
    if _cols.use_kernels(xp):
        x = xp.ascontiguousarray(x)
        top = xp.empty(shape, x.dtype)
        mask = xp.empty(shape, np.int32)
        kernels.launch("max_pool_forward", top.size, (x,) + _pool_args(p, x.shape) + (top, mask))
        return top, ("flat", mask)
    if jit.usable(x):
        from .jit import pooling as compiled

        top = _pool_target(out, shape, x.dtype)
        mask = p.ws.get("mask", shape, np.int32, np)
        compiled.max_forward(jit.planes(x), jit.planes(top), jit.planes(mask), *_pool_geometry(p))
        return top, ("flat", mask)
    lowest = _lowest()
    ncells = p.kernel[0] * p.kernel[1]
    if p._many_cells():
        win = window_view(p._buffer(x, lowest), p.geom, p.out, "windows")
        win = np.ascontiguousarray(win).reshape(shape + (ncells,))
        nan = np.isnan(win)
        if nan.any():
            # As Caffe's strict comparison: a NaN cell never wins (argmax would pick it).
            win = np.where(nan, -np.inf, win)
        code = np.argmax(win, axis=-1)
        best = np.take_along_axis(win, code[..., None], axis=-1)[..., 0]
        none = ~(best > lowest)
        if none.any():
            # As Caffe: nothing beats -FLT_MAX (all cells padding, -inf or NaN).
            best[none] = lowest
            code[none] = -1
        return best, ("code", code.astype(np.int32))
    ph = _phases(p)
    planes = shape[0] * shape[1]
    x3 = x.reshape(planes, *x.shape[2:])
    top = _pool_target(out, shape, x.dtype)
    top3 = top.reshape(planes, *p.out)
    code_dtype = np.int8 if ncells < 127 else np.int32
    code = p.ws.get("code", (planes * ph.plane,), code_dtype, np)
    for start, stop in ph.blocks(planes, x.itemsize):
        count = stop - start
        cells = ph.windows(ph.split(x3[start:stop], lowest, p.ws), count)
        # Branch-free passes (masked copies that depend on the data are several times slower).
        # The maximum: np.maximum is several times faster than np.fmax but lets NaN through, so a
        # NaN among the outputs sends the block through the NaN-ignoring pass from -FLT_MAX, which is
        # Caffe's loop (its strict comparison never picks NaN) ...
        best = p.ws.get(("best", count), (count * ph.plane,), x.dtype, np)
        np.copyto(best, cells[0])
        for v in cells[1:]:
            np.maximum(best, v, out=best)
        block = top3[start:stop]
        block[...] = ph.valid(best)
        if np.isnan(block).any():
            best.fill(lowest)
            for v in cells:
                np.fmax(best, v, out=best)
            block[...] = ph.valid(best)
        # ... then the first offset holding it: max over k of (cell_k == best) * (K - k) = K - first k
        # (the booleans read as int8, so that no pass converts types).
        rank = code[start * ph.plane:stop * ph.plane]
        rank.fill(0)
        hit = p.ws.get(("hit", count), best.shape, bool, np)
        tmp = p.ws.get(("rank", count), best.shape, code_dtype, np)
        for k, v in enumerate(cells):
            np.equal(v, best, out=hit)
            np.multiply(hit.view(np.int8), code_dtype(ncells - k), out=tmp)
            np.maximum(rank, tmp, out=rank)
        np.subtract(code_dtype(ncells), rank, out=rank)
        none = block <= lowest
        if none.any():
            # As Caffe: nothing beats -FLT_MAX (a window of padding, -inf or NaN only).
            block[none] = lowest
            ph.valid(rank)[none] = -1
    return top, ("phase", code.reshape(shape[0], shape[1], ph.plane))


def max_mask_flat(mask, p: Pool2D):
    """Caffe's mask top: the flat input index h*W + w of each output's maximum (int32, -1: none)."""
    kind, m = mask
    if kind == "flat":
        return m
    if kind == "phase":
        ph = _phases(p)
        m = m.reshape(m.shape[0], m.shape[1], ph.hq, ph.wq)[..., :p.out[0], :p.out[1]]
    return p.flat_mask(m)


def max_pool_backward(dy, mask, x_shape, p: Pool2D, out):
    """Routes each top diff to its window's maximum, summing where windows overlap; writes ``out``.
    Twin of the CUDA kernel ``max_pool_backward``."""
    xp = backend.get_array_module(dy)
    kind, m = mask
    if _cols.use_kernels(xp):
        if kind != "flat":
            m = xp.ascontiguousarray(max_mask_flat(mask, p).reshape(dy.shape))
        dy = xp.ascontiguousarray(dy)
        target = out if out.flags.c_contiguous else xp.empty(x_shape, dy.dtype)
        kernels.launch("max_pool_backward", math.prod(x_shape), (dy, m) + _pool_args(p, x_shape) + (target,))
        if target is not out:
            out[...] = target
        return out
    if kind == "flat":
        return _max_pool_backward_flat(dy, m, out)
    if kind == "phase":
        ph = _phases(p)
        planes = x_shape[0] * x_shape[1]
        dy3 = dy.reshape(planes, *p.out)
        out3 = out.reshape(planes, *x_shape[2:])
        for start, stop in ph.blocks(planes, dy.itemsize):
            count = stop - start
            codes = m.reshape(-1)[start * ph.plane:stop * ph.plane]
            # Zero outside the outputs: the codes there are arbitrary, the products are not.
            dy_full = ph.full(p.ws, "dy", dy3[start:stop])
            dq = ph.gradient(p.ws, "dq", count, dy.dtype)
            hit = p.ws.get(("hit", count), dy_full.shape, bool, np)
            tmp = p.ws.get(("tmp", count), dy_full.shape, dy.dtype, np)
            for k in range(len(ph.offsets)):
                np.equal(codes, k, out=hit)
                run, fresh = ph.target(dq, k, count)
                if fresh:
                    np.multiply(dy_full, hit, out=run)
                else:
                    np.multiply(dy_full, hit, out=tmp)
                    np.add(run, tmp, out=run)
            ph.merge(dq, out3[start:stop])
        return out
    acc = p._gradient_accumulator(dy, x_shape, out)
    if p._disjoint():
        # Every input cell is in at most one window: write the windows at once.
        ncells = p.kernel[0] * p.kernel[1]
        contrib = (np.arange(ncells, dtype=m.dtype) == m[..., None]) * dy[..., None]
        st = acc.strides
        view = np.lib.stride_tricks.as_strided(
            acc, shape=dy.shape + p.kernel,
            strides=st[:2] + (st[2] * p.stride[0], st[3] * p.stride[1], st[2], st[3]))
        view[...] = contrib.reshape(dy.shape + p.kernel)
    else:
        tmp = np.empty(dy.shape, dtype=dy.dtype)
        hit = np.empty(dy.shape, dtype=bool)
        for k, (_, idx) in enumerate(offset_slices(p.geom, p.out)):
            np.equal(m, k, out=hit)
            np.multiply(dy, hit, out=tmp)
            acc[idx] += tmp
    if acc is not out:
        out[...] = p._crop(acc, x_shape)
    return out


def _max_pool_backward_flat(dy, mask, out):
    """max_pool_backward on the CPU from a flat mask (the compiled forward's): each top diff added to
    its cell, outputs in row-major order (the NumPy twin of the compiled kernel)."""
    planes = dy.shape[0] * dy.shape[1]
    if jit.usable(dy, out) and mask.flags.c_contiguous:
        from .jit import pooling as compiled

        compiled.max_backward(dy.reshape(planes, -1), mask.reshape(planes, -1), out.reshape(planes, -1))
        return out
    grad = np.zeros((planes, out.shape[2] * out.shape[3]), dy.dtype)
    flat = mask.reshape(planes, -1)
    hit = flat >= 0
    rows = np.broadcast_to(np.arange(planes)[:, None], flat.shape)
    np.add.at(grad, (rows[hit], flat[hit]), dy.reshape(planes, -1)[hit])
    out[...] = grad.reshape(out.shape)
    return out


def ave_pool_forward(x, p: Pool2D, out=None):
    """AVE pooling: the sum over the window's real cells divided by the window clipped to the padded
    input. Twin of the CUDA kernel ``ave_pool_forward``."""
    xp = backend.get_array_module(x)
    shape = x.shape[:2] + p.out
    if _cols.use_kernels(xp):
        x = xp.ascontiguousarray(x)
        top = xp.empty(shape, x.dtype)
        kernels.launch("ave_pool_forward", top.size, (x,) + _pool_args(p, x.shape) + (top,))
        return top
    if jit.usable(x):
        from .jit import pooling as compiled

        top = _pool_target(out, shape, x.dtype)
        compiled.ave_forward(jit.planes(x), jit.planes(top), *_pool_geometry(p))
        return top
    if p._many_cells():
        total = window_view(p._buffer(x, 0.0), p.geom, p.out, "windows").sum(axis=(-2, -1))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(total, p.divisor(np, x.dtype), out=total)
    ph = _phases(p)
    planes = shape[0] * shape[1]
    x3 = x.reshape(planes, *x.shape[2:])
    top = _pool_target(out, shape, x.dtype)
    top3 = top.reshape(planes, *p.out)
    for start, stop in ph.blocks(planes, x.itemsize):
        count = stop - start
        cells = ph.windows(ph.split(x3[start:stop], 0.0, p.ws), count)
        total = p.ws.get(("total", count), (count * ph.plane,), x.dtype, np)
        np.copyto(total, cells[0])
        for v in cells[1:]:
            np.add(total, v, out=total)
        top3[start:stop] = ph.valid(total)
    with np.errstate(divide="ignore", invalid="ignore"):
        top /= p.divisor(np, x.dtype)
    return top


def ave_pool_backward(dy, x_shape, p: Pool2D, out):
    """Spreads each top diff / divisor over its window's real cells; writes ``out``.
    Twin of the CUDA kernel ``ave_pool_backward``."""
    xp = backend.get_array_module(dy)
    if _cols.use_kernels(xp):
        dy = xp.ascontiguousarray(dy)
        target = out if out.flags.c_contiguous else xp.empty(x_shape, dy.dtype)
        kernels.launch("ave_pool_backward", math.prod(x_shape), (dy,) + _pool_args(p, x_shape) + (target,))
        if target is not out:
            out[...] = target
        return out
    if jit.usable(dy, out):
        from .jit import pooling as compiled

        compiled.ave_backward(jit.planes(dy), jit.planes(out), *_pool_geometry(p))
        return out
    with np.errstate(divide="ignore", invalid="ignore"):
        share = dy / p.divisor(np, dy.dtype)
    if not p._many_cells():
        ph = _phases(p)
        planes = x_shape[0] * x_shape[1]
        share3 = share.reshape(planes, *p.out)
        out3 = out.reshape(planes, *x_shape[2:])
        for start, stop in ph.blocks(planes, dy.itemsize):
            share_full = ph.full(p.ws, "share", share3[start:stop])
            dq = ph.gradient(p.ws, "dq", stop - start, dy.dtype)
            for k in range(len(ph.offsets)):
                run, fresh = ph.target(dq, k, stop - start)
                if fresh:
                    np.copyto(run, share_full)
                else:
                    np.add(run, share_full, out=run)
            ph.merge(dq, out3[start:stop])
        return out
    acc = p._gradient_accumulator(dy, x_shape, out)
    if p._disjoint():
        st = acc.strides
        view = np.lib.stride_tricks.as_strided(
            acc, shape=dy.shape + p.kernel,
            strides=st[:2] + (st[2] * p.stride[0], st[3] * p.stride[1], st[2], st[3]))
        view[...] = share[..., None, None]
    else:
        for _, idx in offset_slices(p.geom, p.out):
            acc[idx] += share
    if acc is not out:
        out[...] = p._crop(acc, x_shape)
    return out
