"""Parallel drivers of the direct convolution's microkernels (jit/microkernels.py), and its layout passes.

Blocked layouts (``block`` = the kernels' channels per block, trailing channels of the last block zero):
- packed weights wb (G x B x T x block): wb[g, b, t, c] = w[g*Og + b*block + c, t], t = (ci, i, j) in
  row-major order over the group's input channels and the kernel;
- blocked outputs and top gradients (N x G x B x H x W x block): pixel-major, a block's channels
  contiguous, what the kernels read and write with one vector load per pixel.

The layout changes between NCHW and blocked (``to_blocks``, ``from_blocks``) move square tiles of
lanes x lanes values through the microkernels' ``transpose``, what is left over one value at a time.

The padded input xp (N x C x Hp x Wp) is read through a table of tap offsets (within one group's
channels): off[t] = ci*Hp*Wp + i*dh*Wp + j*dw. A row of output pixels is cut into near-equal spans of
at most ``widest``, a group's taps likewise for the weight gradient; work is split over blocks of
output rows and channels (forward) or tap spans and channels (weight gradient), never over a sum, so
the threads never change a result.
"""
from __future__ import annotations

from ...threads import prepare_kernel_pool

prepare_kernel_pool()  # before numba starts its thread pool

import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402 (after the wait policy)

from .kernel_calls import addresses, call5, call9, call10, span  # noqa: E402

OPTIONS = dict(nogil=True, cache=True)


@njit(parallel=True, **OPTIONS)
def taps(xp, wb, off, part, y, bias, kernels, stride_h, stride_w, widest, chunk_taps, block_rows, to_nchw,
         weights_first):
    """y (N x G*Og x Ho x Wo) = the convolution of the padded xp with the packed weights, plus bias
    (G*B*block, zero past each group's Og channels); or, unless ``to_nchw``, only the sums, blocked
    in ``part``.

    Work items: (image, ``block_rows`` output rows, group, channel block), numbered with the channel
    block changing fastest, or with ``weights_first`` the image (prange gives each thread a run of
    consecutive items). Within one, the taps go in chunks of ``chunk_taps`` (their weights stay in L1
    across the block's rows and spans); the chunks before the last leave their partial sums in ``part``
    (N x G x B x Ho x Wo x block; unused, and any array, where one chunk holds every tap and
    ``to_nchw``), the last adds the bias and writes y."""
    n_, c_, hp, wp = xp.shape
    g_, b_, t_, block = wb.shape
    o_, ho, wo = y.shape[1], y.shape[2], y.shape[3]
    group_channels = c_ // g_
    per_group = o_ // g_
    size = xp.itemsize
    spans = (wo + widest - 1) // widest
    row_blocks = (ho + block_rows - 1) // block_rows
    chunks = (t_ + chunk_taps - 1) // chunk_taps
    x0, w0, p0, o0 = addresses(xp, wb, part, off)
    y0 = np.int64(y.ctypes.data)
    bias0 = np.int64(bias.ctypes.data)
    plane = np.int64(ho * wo)
    for item in prange(n_ * row_blocks * g_ * b_):
        if weights_first:  # a thread's items share channel blocks: each reads its share of the weights
            n = item % n_
            h_start = ((item // n_) % row_blocks) * block_rows
            b = (item // (n_ * row_blocks)) % b_
            g = item // (n_ * row_blocks * b_)
        else:  # they share images: each reads its share of the input
            b = item % b_
            g = (item // b_) % g_
            h_start = ((item // (b_ * g_)) % row_blocks) * block_rows
            n = item // (b_ * g_ * row_blocks)
        x_image = x0 + size * ((n * c_ + g * group_channels) * hp * wp)
        w_block = w0 + size * ((g * b_ + b) * t_ * block)
        p_block = p0 + size * (((n * g_ + g) * b_ + b) * ho * wo * block)
        y_block = y0 + size * ((n * o_ + g * per_group + b * block) * ho * wo)
        valid = np.int64(min(block, per_group - b * block))
        bias_block = bias0 + size * ((g * b_ + b) * block)
        for chunk in range(chunks):
            t_start = chunk * chunk_taps
            count = min(chunk_taps, t_ - t_start)
            variant = (0 if chunk == 0 else 2) + (1 if to_nchw and chunk == chunks - 1 else 0)  # TAPS_VARIANTS
            for h in range(h_start, min(ho, h_start + block_rows)):
                x_row = x_image + size * (h * stride_h * wp)
                for k in range(spans):
                    start, stop = span(k, spans, wo)
                    call10(kernels[variant, stop - start - 1], x_row + size * start * stride_w,
                            w_block + size * t_start * block, p_block + size * (h * wo + start) * block,
                            o0 + 8 * t_start, np.int64(count), np.int64(stride_w),
                            y_block + size * (h * wo + start), plane, valid, bias_block)


@njit(parallel=True, **OPTIONS)
def pixels(xp, dyb, off, dwb, kernels, stride_h, stride_w, widest, chunk, threads, fresh):
    """dwb (G x B x T x block) += the weight gradient from the padded xp and the blocked top gradient
    (``threads``: numba's, which the tap spans are cut for); with ``fresh``, dwb = the gradient: each
    task zeroes its own taps' sums right before its first image adds to them, where they then are in
    cache (zeroing the whole array first sent it through memory twice: 9 MB for ResNet's 3 x 3 x 512 x
    512 filters)."""
    n_, c_, hp, wp = xp.shape
    g_, b_, t_, block = dwb.shape
    ho, wo = dyb.shape[3], dyb.shape[4]
    group_channels = c_ // g_
    size = xp.itemsize
    spans = (t_ + widest - 1) // widest
    # Few tasks (LeNet's first layer: 25 taps, one block, 3 spans) would leave a thread idle for a
    # third of the pass: narrower spans until the threads share the tasks evenly. Each tap's sum is
    # the same whichever span it falls in, so this changes no result.
    while g_ * b_ * spans < 4 * threads and (g_ * b_ * spans) % threads != 0 and spans < t_:
        spans += 1
    x0, d0, w0, o0 = addresses(xp, dyb, dwb, off)
    tasks = g_ * b_ * spans
    # Images in chunks: the chunk's inputs and gradients stay in cache while every task reads them.
    for n_start in range(0, n_, chunk):
        n_stop = min(n_, n_start + chunk)
        for task in prange(tasks):
            g = task // (b_ * spans)
            b = (task // spans) % b_
            start, stop = span(task % spans, spans, t_)
            if fresh and n_start == 0:
                dwb[g, b, start:stop] = 0
            for n in range(n_start, n_stop):
                call9(kernels[stop - start - 1],
                       x0 + size * ((n * c_ + g * group_channels) * hp * wp),
                       d0 + size * (((n * g_ + g) * b_ + b) * ho * wo * block),
                       w0 + size * (((g * b_ + b) * t_ + start) * block),
                       o0 + 8 * start, np.int64(ho), np.int64(wo), np.int64(stride_w),
                       np.int64(stride_h * wp), np.int64(wo * block))


@njit(parallel=True, **OPTIONS)
def pack_flipped(w, out):
    """out (G x B x T x block) = the input gradient's filters from w (G*Og x Cg x kh x kw), packed per
    group and channel block: out[g, b, t, c] = w[g*Og + o, b*block + c, kh-1-i, kw-1-j], t over (o, i, j).
    Channels past the group's are zero. (The forward's packing is to_blocks': direct.py.)"""
    g_, b_, t_, block = out.shape
    per_group = w.shape[0] // g_
    kh, kw = w.shape[2], w.shape[3]
    rows = w.shape[1]
    for item in prange(g_ * b_):
        g = item // b_
        b = item % b_
        for t in range(t_):
            lead = t // (kh * kw)
            i = (t // kw) % kh
            j = t % kw
            for c in range(block):
                r = b * block + c
                if r >= rows:
                    out[g, b, t, c] = 0
                else:
                    out[g, b, t, c] = w[g * per_group + lead, r, kh - 1 - i, kw - 1 - j]


@njit(parallel=True, **OPTIONS)
def add_unpacked(packed, dw):
    """dw (G*Og x Cg x kh x kw) += the packed weight gradient (G x B x T x block), the forward's packed
    layout (module docstring). (Where dw is to be overwritten, ``from_blocks`` moves the values by tile
    transposes: this loop reads each packed value's cache line once per channel of its block.)"""
    g_, b_, t_, block = packed.shape
    per_group = dw.shape[0] // g_
    rows = dw.reshape(dw.shape[0], t_)
    for row in prange(dw.shape[0]):
        g = row // per_group
        r = row % per_group
        b = r // block
        c = r % block
        for t in range(t_):
            rows[row, t] += packed[g, b, t, c]


@njit(parallel=True, **OPTIONS)
def pad(x, out, pad_h, pad_w):
    """out (N x C x Hp x Wp) = x (N x C x H x W) with a border of zeros, pad_h above, pad_w left."""
    n_, c_, h_, w_ = x.shape
    hp, wp = out.shape[2], out.shape[3]
    for plane in prange(n_ * c_):
        n = plane // c_
        c = plane % c_
        for r in range(hp):
            row = out[n, c, r]
            src = r - pad_h
            if src < 0 or src >= h_:
                for q in range(wp):
                    row[q] = 0
                continue
            line = x[n, c, src]
            for q in range(pad_w):
                row[q] = 0
            for q in range(w_):
                row[pad_w + q] = line[q]
            for q in range(pad_w + w_, wp):
                row[q] = 0


# Pixels per tile of the layout changes: a tile's blocked cells (TILE x block values, 16 KiB for
# float32) stay in L1 while each channel's run of TILE cells is read or written. Whole planes at once
# read the blocked array once per channel: 32 passes over 6.4 MB for VGG's first layer.
TILE = 128


@njit(inline="always")
def _tile_item(item, blocked_shape):
    """(n, g, b, first cell, last cell + 1) of work item ``item`` of the layout changes."""
    g_, b_, cells = blocked_shape[1], blocked_shape[2], blocked_shape[3] * blocked_shape[4]
    tiles = (cells + TILE - 1) // TILE
    first = (item % tiles) * TILE
    plane = item // tiles
    return plane // (g_ * b_), (plane // b_) % g_, plane % b_, first, min(cells, first + TILE)


@njit(inline="always")
def _tile_items(blocked_shape):
    n_, g_, b_, h_, w_ = blocked_shape[:5]
    return n_ * g_ * b_ * ((h_ * w_ + TILE - 1) // TILE)


@njit(parallel=True, **OPTIONS)
def to_blocks(y, out, transpose, lanes):
    """out (N x G x B x H x W x block) from y (N x G*Og x H x W); channels past Og are zero. Square
    tiles of ``lanes`` channels x ``lanes`` cells by the ``transpose`` kernel (jit/microkernels.py), the
    cells past the last whole tile one value at a time."""
    g_, b_, block = out.shape[1], out.shape[2], out.shape[5]
    cells = out.shape[3] * out.shape[4]
    per_group = y.shape[1] // g_
    size = y.itemsize
    y0 = np.int64(y.ctypes.data)
    out0 = np.int64(out.ctypes.data)
    for item in prange(_tile_items(out.shape)):
        n, g, b, first, last = _tile_item(item, out.shape)
        dst = out[n, g, b].reshape(cells, block)
        dst0 = out0 + size * (((n * g_ + g) * b_ + b) * cells * block)
        present = min(block, per_group - b * block)
        whole_cells = last - (last - first) % lanes
        # A tile of the last channels present and zeros (a block's channels past the group's), the
        # present ones copied in row by row and transposed from there.
        tile = np.zeros((lanes, lanes), y.dtype)
        tile0 = np.int64(tile.ctypes.data)
        for c0 in range(0, block, lanes):
            rows = max(0, min(lanes, present - c0))
            channel = g * per_group + b * block + c0
            src0 = y0 + size * ((n * y.shape[1] + channel) * cells)
            for q in range(first, whole_cells, lanes):
                if rows == lanes:
                    call5(transpose, src0 + size * q, np.int64(cells), dst0 + size * (q * block + c0),
                           np.int64(block), src0)
                elif rows > 0:
                    for r in range(rows):
                        tile[r] = y[n, channel + r].reshape(cells)[q:q + lanes]
                    call5(transpose, tile0, np.int64(lanes), dst0 + size * (q * block + c0), np.int64(block), tile0)
                else:
                    dst[q:q + lanes, c0:c0 + lanes] = 0
            for q in range(whole_cells, last):
                for c in range(c0, c0 + lanes):
                    dst[q, c] = y[n, g * per_group + b * block + c].reshape(cells)[q] if c < present else 0


@njit(parallel=True, **OPTIONS)
def from_blocks(blocked, bias, y, transpose_add, lanes):
    """y (N x G*Og x H x W) = the blocked (N x G x B x H x W x block) plus bias[channel] (+0 where
    bias is empty: the same additions either way). Square tiles by ``transpose_add``, as to_blocks."""
    g_, b_, block = blocked.shape[1], blocked.shape[2], blocked.shape[5]
    cells = blocked.shape[3] * blocked.shape[4]
    per_group = y.shape[1] // g_
    size = y.itemsize
    with_bias = bias.shape[0] > 0
    zeros = np.zeros(lanes, y.dtype)
    y0 = np.int64(y.ctypes.data)
    blocked0 = np.int64(blocked.ctypes.data)
    bias0 = np.int64(bias.ctypes.data) if with_bias else np.int64(zeros.ctypes.data)
    for item in prange(_tile_items(blocked.shape)):
        n, g, b, first, last = _tile_item(item, blocked.shape)
        src = blocked[n, g, b].reshape(cells, block)
        src0 = blocked0 + size * (((n * g_ + g) * b_ + b) * cells * block)
        present = min(block, per_group - b * block)
        whole_channels = present - present % lanes
        whole_cells = last - (last - first) % lanes
        for c0 in range(0, whole_channels, lanes):
            channel = g * per_group + b * block + c0
            dst0 = y0 + size * ((n * y.shape[1] + channel) * cells)
            shifts = bias0 + size * channel if with_bias else bias0
            for q in range(first, whole_cells, lanes):
                call5(transpose_add, src0 + size * (q * block + c0), np.int64(block), dst0 + size * q,
                       np.int64(cells), shifts)
        for c in range(present):
            channel = g * per_group + b * block + c
            dst = y[n, channel].reshape(cells)
            shift = bias[channel] if with_bias else zeros[0]
            for q in range(whole_cells if c < whole_channels else first, last):
                dst[q] = src[q, c] + shift
