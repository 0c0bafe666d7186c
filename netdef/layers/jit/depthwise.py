"""Depthwise 2-D convolution kernels: one parallel pass over the planes, each tap one vector loop.

Shapes: x (N x C x H x W), w (C*m x 1 x kh x kw) (m: channel multiplier; output channel o reads input
channel o // m), y (N x C*m x H_out x W_out); all C-contiguous. Geometry as Caffe: input row
h = ho * stride_h - pad_h + i * dilation_h for tap row i (likewise columns); the padding reads zeros. Twins: ``depthwise.forward_reference``, ``backward_data_reference``,
``backward_weights_reference``.

Every plane is first laid out so that each tap is one long multiply-add over contiguous memory: the
input plane, zero-padded, is split into its stride_h x stride_w phases (phase (a, b) holds the padded
cells (u*sh + a, v*sw + b)), each Wq = ceil(Wp / sw) wide. Tap (i, j) with i*dh = qi*sh + a and
j*dw = qj*sw + b reads, for output (r, col), phase (a, b) at (r + qi, col + qj): with the output laid
out Wq wide too ("wide" rows whose last Wq - W_out cells are computed and dropped), that is a constant
offset, so a tap is one loop over the whole plane. The earlier kernels ran one loop per output row
and tap, with computed indices that numba checks for negative wrap-around: that check kept LLVM from
vectorizing, and rows of 7-14 cells (MobileNet's later layers) spent more time in loop overhead than
in arithmetic, at a fraction of PyTorch's rate; these run at about PyTorch's (benchmarks/README.md,
"The figures behind the other layers' choices"). ``contract`` lets LLVM
fuse the multiply and the add (FMA), and the weight gradient's sums may be reassociated
(``reassoc``) so that they vectorize: the results differ from the twins by rounding only, and are
the same from run to run on a given machine.
"""
from __future__ import annotations

import numpy as np
from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

from numba import get_thread_id, njit, prange  # noqa: E402 (after the wait policy)

from .fusion import stage_addresses  # noqa: E402
from .kernel_calls import call5, call7, call9, call11, span  # noqa: E402

FAST = {"contract"}
FAST_SUMS = {"contract", "reassoc"}


@njit(inline="always", fastmath=FAST)
def _axpy(dst, tap, src):
    """dst += tap * src over equal-length 1-D arrays."""
    for k in range(dst.shape[0]):
        dst[k] += tap * src[k]


@njit(inline="always", fastmath=FAST_SUMS)
def _dot(a, b):
    """Sum of a * b over equal-length 1-D arrays, accumulated in float64."""
    total = 0.0
    for k in range(a.shape[0]):
        total += a[k] * b[k]
    return total


@njit(inline="always")
def _copy(dst, src):
    for k in range(dst.shape[0]):
        dst[k] = src[k]


# The taps' loops run over a whole number of this many cells: LLVM's vectorized loop takes 4 vectors of
# 16 floats a turn and leaves the rest to a scalar loop, which was all of a 7 x 7 plane's 63 cells
# (7 rows 9 wide) and a third of a 14 x 14 one's. The cells past the plane's are computed and dropped.
VECTOR_RUN = 64


@njit(inline="always")
def _phase_layout(h_, w_, ho_, sh, sw, ph, pw, kh, dh):
    """(Wq, cells per phase, cells per tap loop) for planes of H x W padded by (ph, pw) at strides
    (sh, sw): rows enough for every padded cell and for the farthest tap's reads over Ho wide rows,
    and room after them for the loops' run up to a multiple of VECTOR_RUN."""
    wq = (w_ + 2 * pw + sw - 1) // sw
    rows = max((h_ + 2 * ph + sh - 1) // sh, ho_ + ((kh - 1) * dh) // sh + 1)
    length = -(-(ho_ * wq) // VECTOR_RUN) * VECTOR_RUN
    return wq, rows * wq + length - ho_ * wq, length


@njit(inline="always")
def _phase_rows(plane_rows, sh, ph, a):
    """range of the plane's rows r that phase row ``a`` holds ((r + ph) % sh == a)."""
    return range((a - ph) % sh, plane_rows, sh)


@njit(inline="always")
def _phase_columns(w_, sw, pw, a, b, cells):
    """(c0, count, base) of phase (a, b): its first plane column c0 ((c0 + pw) % sw == b), how many
    plane columns it holds (0 when none), and where that column's cells start in the flat phases."""
    c0 = (b - pw) % sw
    count = (w_ - c0 + sw - 1) // sw if c0 < w_ else 0
    return c0, count, (a * sw + b) * cells + (c0 + pw) // sw


@njit(inline="always")
def _split_phases(plane, sh, sw, ph, pw, wq, cells, phases):
    """The ``plane`` (H x W) into its sh*sw phases (flat, ``cells`` each, Wq wide) inside the
    padding: ``phases`` comes zeroed and the cells of the padding are never written."""
    h_, w_ = plane.shape
    for a in range(sh):
        for b in range(sw):
            c0, count, base = _phase_columns(w_, sw, pw, a, b, cells)
            for r in _phase_rows(h_, sh, ph, a):
                start = base + ((r + ph) // sh) * wq
                if sw == 1:  # a contiguous copy, compiled apart from the strided one
                    _copy(phases[start:start + count], plane[r][c0:c0 + count])
                else:
                    _copy(phases[start:start + count], plane[r][c0:c0 + (count - 1) * sw + 1:sw])


@njit(inline="always")
def _merge_phases(phases, sh, sw, ph, pw, wq, cells, plane):
    """The inverse of _split_phases, dropping the padding: ``plane`` (H x W) from the phases."""
    h_, w_ = plane.shape
    for a in range(sh):
        for b in range(sw):
            c0, count, base = _phase_columns(w_, sw, pw, a, b, cells)
            for r in _phase_rows(h_, sh, ph, a):
                start = base + ((r + ph) // sh) * wq
                if sw == 1:
                    _copy(plane[r][c0:c0 + count], phases[start:start + count])
                else:
                    _copy(plane[r][c0:c0 + (count - 1) * sw + 1:sw], phases[start:start + count])


@njit(inline="always")
def _tap_offset(i, j, sh, sw, dh, dw, wq, cells):
    """Where tap (i, j)'s reads for output (0, 0) start in the flat phases."""
    qi, a = divmod(i * dh, sh)
    qj, b = divmod(j * dw, sw)
    return (a * sw + b) * cells + qi * wq + qj


@njit(inline="always")
def _widen(plane, wq, wide):
    """``plane`` (Ho x W_out) into Wq-wide rows (the cells past W_out stay as they are: zero)."""
    ho_, wo_ = plane.shape
    for r in range(ho_):
        _copy(wide[r * wq:r * wq + wo_], plane[r])


@njit(inline="always")
def _unwiden(wide, wq, plane):
    """The first W_out cells of each Wq-wide row of ``wide`` into ``plane`` (Ho x W_out)."""
    ho_, wo_ = plane.shape
    for r in range(ho_):
        _copy(plane[r], wide[r * wq:r * wq + wo_])


@njit(nogil=True, parallel=True, cache=True, fastmath=FAST)
def forward(x, w, y, sh, sw, ph, pw, dh, dw):
    """y = the depthwise convolution of x with w (no bias)."""
    n_, c_, h_, w_ = x.shape
    o_, _, kh, kw = w.shape
    m = o_ // c_
    ho_ = y.shape[2]
    wq, cells, length = _phase_layout(h_, w_, ho_, sh, sw, ph, pw, kh, dh)
    for plane in prange(n_ * o_):
        n = plane // o_
        o = plane % o_
        phases = np.zeros(sh * sw * cells, x.dtype)
        _split_phases(x[n, o // m], sh, sw, ph, pw, wq, cells, phases)
        wide = np.zeros(length, x.dtype)
        for i in range(kh):
            for j in range(kw):
                start = _tap_offset(i, j, sh, sw, dh, dw, wq, cells)
                _axpy(wide, w[o, 0, i, j], phases[start:start + length])
        _unwiden(wide, wq, y[n, o])


@njit(nogil=True, parallel=True, cache=True, fastmath=FAST)
def backward_data(dy, w, dx, sh, sw, ph, pw, dh, dw):
    """dx = the input gradient: each tap scatters the (wide) top gradient into the input's phases."""
    n_, c_, h_, w_ = dx.shape
    o_, _, kh, kw = w.shape
    m = o_ // c_
    ho_ = dy.shape[2]
    wq, cells, length = _phase_layout(h_, w_, ho_, sh, sw, ph, pw, kh, dh)
    for plane in prange(n_ * c_):
        n = plane // c_
        c = plane % c_
        phases = np.zeros(sh * sw * cells, dx.dtype)
        # Zero past W_out: those cells add nothing where they land (real cells or the dropped padding).
        wide = np.zeros(length, dy.dtype)
        for o in range(c * m, c * m + m):
            _widen(dy[n, o], wq, wide)
            for i in range(kh):
                for j in range(kw):
                    start = _tap_offset(i, j, sh, sw, dh, dw, wq, cells)
                    _axpy(phases[start:start + length], w[o, 0, i, j], wide)
        _merge_phases(phases, sh, sw, ph, pw, wq, cells, dx[n, c])


@njit(nogil=True, parallel=True, cache=True, fastmath=FAST_SUMS)
def backward_weights(x, dy, dw_out, sh, sw, ph, pw, dh, dw):
    """dw_out (C*m x 1 x kh x kw) += the weight gradient (accumulated in float64 per output channel,
    one channel per task and the samples in order, so the sum is the same whatever the thread count)."""
    n_, c_, h_, w_ = x.shape
    o_, _, kh, kw = dw_out.shape
    m = o_ // c_
    ho_ = dy.shape[2]
    wq, cells, length = _phase_layout(h_, w_, ho_, sh, sw, ph, pw, kh, dh)
    for o in prange(o_):
        c = o // m
        total = np.zeros((kh, kw))
        phases = np.zeros(sh * sw * cells, x.dtype)  # every sample fills the same cells
        wide = np.zeros(length, dy.dtype)  # zero past W_out: those cells meet no real output
        for n in range(n_):
            _split_phases(x[n, c], sh, sw, ph, pw, wq, cells, phases)
            _widen(dy[n, o], wq, wide)
            for i in range(kh):
                for j in range(kw):
                    start = _tap_offset(i, j, sh, sw, dh, dw, wq, cells)
                    total[i, j] += _dot(wide, phases[start:start + length])
        for i in range(kh):
            for j in range(kw):
                dw_out[o, 0, i, j] += total[i, j]


# ---- the channel-blocked path: a block of ``lanes`` channels of one image at a time, laid out
# pixel-major with the block's channels contiguous (one vector per pixel) and zero-padded, its taps
# summed by the depthwise microkernels (jit/microkernels.py). The phase layout above copies each plane
# row by row: on MobileNet's 7 x 7 and 14 x 14 planes those short copies took longer than the sums.
# Each output is the same sum as the phase kernels' (taps in order from zero, one fused multiply-add
# each): the same bits.


@njit(inline="always")
def _planes_of_block(a, n, c0, valid, lanes):
    """For the block of channels c0 ... c0 + lanes of image n of ``a`` (N x C x H x W): ``a`` flat,
    the index and the address of its first cell, and how many of a plane's cells the square tiles
    cover (none where the block has only ``valid`` < lanes channels)."""
    cells = a.shape[2] * a.shape[3]
    base = (n * a.shape[1] + c0) * cells
    whole = cells - cells % lanes if valid == lanes else 0
    return a.reshape(a.size), base, np.int64(a.ctypes.data) + a.itemsize * base, whole


@njit(inline="always")
def _into_padded_block(x, n, c0, valid, lanes, ph, pw, transpose, plane, padded):
    """``padded`` (Hp*Wp x lanes, flat) = channels c0 ... c0 + lanes of x[n] zero-padded by (ph, pw),
    by way of ``plane`` (at least H*W x lanes, flat): square tiles by ``transpose``, the rest (the
    cells past the last whole tile, a block with ``valid`` < lanes channels) one value at a time
    (zeros past ``valid``)."""
    h_, w_ = x.shape[2], x.shape[3]
    cells = h_ * w_
    hp, wp = h_ + 2 * ph, w_ + 2 * pw
    size = x.itemsize
    flat, base, src0, whole = _planes_of_block(x, n, c0, valid, lanes)
    plane0 = np.int64(plane.ctypes.data)
    for q in range(0, whole, lanes):
        call5(transpose, src0 + size * q, np.int64(cells), plane0 + size * q * lanes, np.int64(lanes), src0)
    for q in range(whole, cells):
        for c in range(lanes):
            plane[q * lanes + c] = flat[base + c * cells + q] if c < valid else 0
    padded[:ph * wp * lanes] = 0
    padded[(hp - ph) * wp * lanes:hp * wp * lanes] = 0
    row = w_ * lanes
    for r in range(h_):
        start = ((r + ph) * wp + pw) * lanes
        padded[start - pw * lanes:start] = 0
        _copy(padded[start:start + row], plane[r * row:(r + 1) * row])
        padded[start + row:start + row + pw * lanes] = 0


@njit(inline="always")
def _from_block(sums, n, c0, valid, lanes, transpose, y, mapper, stages):
    """Channels c0 ... c0 + valid of y[n] (Ho x Wo) from ``sums`` (Ho*Wo x lanes, flat), by square
    tiles where the block is whole, the rest one value at a time; then each of those planes through
    the channel map while it is still in cache, where there is one (``mapper``: jit/fusion.rows_mapper's
    address, 0 for none; ``stages``: the addresses of the map's arrays)."""
    cells = y.shape[2] * y.shape[3]
    size = y.itemsize
    flat, base, dst0, whole = _planes_of_block(y, n, c0, valid, lanes)
    sums0 = np.int64(sums.ctypes.data)
    for q in range(0, whole, lanes):
        call5(transpose, sums0 + size * q * lanes, np.int64(lanes), dst0 + size * q, np.int64(cells), sums0)
    for q in range(whole, cells):
        for c in range(valid):
            flat[base + c * cells + q] = sums[q * lanes + c]
    if mapper == 0:
        return
    shifts, means, stds, scales, biases, slope = stages
    call11(mapper, dst0, np.int64(cells), np.int64(cells), np.int64(valid), np.int64(c0), shifts, means, stds, scales,
           biases, slope)


@njit(inline="always")
def _start_item(x, item, blocks, lanes, ph, pw, transpose, planes, padded):
    """Work item ``item`` of the blocked kernels (an image, a block of channels): (image, block, first
    channel, channels present, this thread's row of the buffers), its input laid into this thread's
    ``padded`` buffer."""
    n = item // blocks
    b = item % blocks
    c0 = b * lanes
    valid = min(lanes, x.shape[1] - c0)
    thread = get_thread_id()
    _into_padded_block(x, n, c0, valid, lanes, ph, pw, transpose, planes[thread], padded[thread])
    return n, b, c0, valid, thread


@njit(inline="always")
def _block_weights(w, taps, counts, c0, valid, lanes, out):
    """``out`` (P x Q x T x lanes, flat) = the weights of channels c0 ... c0 + valid (zero past them)
    for each phase's taps in order: w[c0 + lane, taps[a, b, t]] (w as C x kh*kw)."""
    kernel = w.shape[2] * w.shape[3]
    flat = w.reshape(w.size)
    row_phases, col_phases, most = taps.shape
    for a in range(row_phases):
        for b in range(col_phases):
            for t in range(counts[a, b]):
                at = ((a * col_phases + b) * most + t) * lanes
                for lane in range(lanes):
                    out[at + lane] = flat[(c0 + lane) * kernel + taps[a, b, t]] if lane < valid else 0


@njit(nogil=True, parallel=True, cache=True, error_model="numpy")
def blocked_taps(x, w, taps, off, counts, y, sh, sw, ph, pw, lanes, kernels, transpose, widest, planes, padded,
                 sums, weights, mapper, shift, mean, std, scale, bias, slope):
    """y (N x C x Ho x Wo) by phases of its rows and columns (P x Q = counts.shape: 1 x 1 for a
    forward, stride_h x stride_w for a strided input gradient): output (a + P*u, b + Q*v) is the sum
    over phase (a, b)'s taps t < counts[a, b] (in the table's order, from zero) of w[channel, 0,
    taps[a, b, t]] (w's kernel flat) times x zero-padded by (ph, pw) at off[a, b, t] elements of the
    blocked layout past (u*sh, v*sw); zero where a phase has no taps. Blocks of ``lanes`` channels
    (the kernels' vector). ``planes``, ``padded``, ``sums``, ``weights``: one flat buffer per thread
    of numba's pool (at least H*W, Hp*Wp and Ho*Wo cells of lanes values; P*Q*T*lanes). One work
    item per image and block of channels. ``mapper`` (jit/fusion.rows_mapper's address; 0: none)
    applies a channel map (layers/fusion.py) to each block's planes as they are written: ``shift``
    ... ``bias`` its per-channel arrays, ``slope`` its negative slope as one value (arrays whatever
    stages the map has: the mapper reads only its own)."""
    n_, c_, w_ = x.shape[0], x.shape[1], x.shape[3]
    blocks = (c_ + lanes - 1) // lanes
    row_phases, col_phases, most = taps.shape
    ho, wo = y.shape[2], y.shape[3]
    wp = w_ + 2 * pw
    size = x.itemsize
    stages = stage_addresses(shift, mean, std, scale, bias, slope)
    for item in prange(n_ * blocks):
        n, b, c0, valid, thread = _start_item(x, item, blocks, lanes, ph, pw, transpose, planes, padded)
        xb, yb, wb = padded[thread], sums[thread], weights[thread]
        _block_weights(w, taps, counts, c0, valid, lanes, wb)
        xb0, yb0, wb0 = np.int64(xb.ctypes.data), np.int64(yb.ctypes.data), np.int64(wb.ctypes.data)
        for a in range(row_phases):
            for c in range(col_phases):
                count = counts[a, c]
                columns = (wo - c + col_phases - 1) // col_phases
                spans = (columns + widest - 1) // widest
                w0 = wb0 + size * ((a * col_phases + c) * most * lanes)
                o0 = np.int64(off[a, c].ctypes.data)
                for r in range(a, ho, row_phases):
                    if count == 0:
                        for q in range(c, wo, col_phases):
                            yb[(r * wo + q) * lanes:(r * wo + q + 1) * lanes] = 0
                        continue
                    row = xb0 + size * ((r - a) // row_phases * sh * wp * lanes)
                    for k in range(spans):
                        start, stop = span(k, spans, columns)
                        call7(kernels[stop - start - 1], row + size * start * sw * lanes, w0,
                              yb0 + size * (r * wo + c + start * col_phases) * lanes, o0, np.int64(count),
                              np.int64(sw * lanes), np.int64(col_phases * lanes))
        _from_block(yb, n, c0, valid, lanes, transpose, y, mapper, stages)


@njit(nogil=True, parallel=True, cache=True)
def blocked_weights(x, dy, off, parts, sh, sw, ph, pw, kernels, transpose, widest, planes, padded, gradients):
    """parts (N x C/lanes rounded up x T x lanes) = per image and block of channels, that image's
    weight gradient: for tap t, the sum over its output rows and columns (in order) of dy times x
    zero-padded by (ph, pw) at ``off[t]`` past the output's window origin, in the element type (the
    caller sums the images). ``planes``, ``padded``, ``gradients``: one flat buffer per thread of
    numba's pool (max(H*W, Ho*Wo), Hp*Wp and Ho*Wo cells of lanes values)."""
    blocks, taps, lanes = parts.shape[1], parts.shape[2], parts.shape[3]
    ho, wo = dy.shape[2], dy.shape[3]
    # Elements between the reads of neighbouring output pixels and rows, in the padded block.
    pixel_step, row_step = sw * lanes, sh * (x.shape[3] + 2 * pw) * lanes
    spans = (taps + widest - 1) // widest
    size = x.itemsize
    for item in prange(x.shape[0] * blocks):
        n, b, c0, valid, thread = _start_item(x, item, blocks, lanes, ph, pw, transpose, planes, padded)
        xb, gb = padded[thread], gradients[thread]
        _into_padded_block(dy, n, c0, valid, lanes, 0, 0, transpose, planes[thread], gb)
        part = parts[n, b].reshape(taps * lanes)
        part[:] = 0
        xb0, gb0, part0 = np.int64(xb.ctypes.data), np.int64(gb.ctypes.data), np.int64(part.ctypes.data)
        for k in range(spans):
            start, stop = span(k, spans, taps)
            call9(kernels[stop - start - 1], xb0, gb0, part0 + size * start * lanes,
                  np.int64(off.ctypes.data) + 8 * start, np.int64(ho), np.int64(wo), np.int64(pixel_step),
                  np.int64(row_step), np.int64(wo * lanes))
