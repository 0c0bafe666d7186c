"""The column path: im2col (im2col.py) and one matrix product per group, over chunks of the batch.

What any convolution can take (every geometry, group count and array module), and on a GPU without
cuDNN what every convolution but the depthwise and pointwise ones takes. Its pieces serve others: the
direct path's col2im input gradient and the Deconvolution layer use ``ColumnChunks``,
``grouped_weights``, ``grouped_product``, the per-chunk steps (``scattered_chunk``,
``add_weight_gradient``, ``product_into_chunk``) and ``col2im_input_gradient``.
"""
from __future__ import annotations

import math

import numpy as np

from ... import backend
from ..im2col import Geometry, Workspace, col2im, column_layout, im2col
from ..matmul import matmul
from .algorithm import ConvolutionAlgorithm
from .base import ConvolutionShape

# Convolutions process the batch in chunks whose column matrix takes about this many bytes: on the
# CPU a matrix that stays in cache is faster to build and to multiply than one for the whole batch.
COLUMN_BUDGET_CPU = 8 << 20
COLUMN_BUDGET_GPU = 256 << 20


def grouped_weights(w, group: int):
    """The weights as (group, rows per group, columns), rows being the first weight axis."""
    return w.reshape(group, w.shape[0] // group, -1)


def grouped_product(group: int, a, b, out, trans_a=False, trans_b=False):
    """out = a @ b per group; a, b, out are (group, rows, cols) arrays (transposed per flag)."""
    if trans_a:
        a = a.transpose(0, 2, 1)
    if trans_b:
        b = b.transpose(0, 2, 1)
    if group == 1:
        return matmul(a[0], b[0], out=None if out is None else out[0])[None]
    return matmul(a, b, out=out)


class ColumnChunks:
    """The sample ranges of a batch whose column matrices are built together, for one geometry: as many
    samples as keep a column matrix near COLUMN_BUDGET bytes (cache-sized on the CPU), in near-equal
    chunks. The list for the last sizes asked is kept."""

    def __init__(self, geom: Geometry):
        self.geom = geom
        self._key = None
        self._chunks: list = []

    def __call__(self, xp, num: int, channels: int, spatial: tuple, dtype) -> list:
        """[(start, stop, column layout)] for ``num`` samples of ``channels`` x ``spatial``."""
        key = (xp, channels, spatial, num, np.dtype(dtype))
        if self._key != key:
            geom = self.geom
            per_sample = channels * geom.kernel_count * math.prod(geom.conv_out(spatial))
            budget = COLUMN_BUDGET_CPU if xp is np else COLUMN_BUDGET_GPU
            size = max(1, min(num, budget // max(1, per_sample * np.dtype(dtype).itemsize)))
            count = -(-num // size)
            size = -(-num // count)
            layouts = {}
            chunks = []
            for start in range(0, num, size):
                stop = min(num, start + size)
                if stop - start not in layouts:
                    layouts[stop - start] = column_layout((stop - start, channels) + spatial, geom, xp)
                chunks.append((start, stop, layouts[stop - start]))
            self._key, self._chunks = key, chunks
        return self._chunks


def scattered_chunk(lay, workspace, name: str, rows: int, chunk, xp):
    """``chunk`` (a chunk of samples, (N, rows, *positions)) as a (rows, positions) matrix of the
    column layout ``lay``, in the workspace's buffer ``name`` for that chunk size."""
    mat = lay.buffer(workspace, (name, lay.x_shape[0]), rows, chunk.dtype, xp)
    lay.scatter(mat, chunk)
    return mat


def add_weight_gradient(weight, group: int, columns_g, dy_g) -> None:
    """``weight.diff`` += the weight gradient of a chunk from its columns and its top gradient in
    columns, both (group, rows per group, positions): (cols dy^T)^T, the orientation BLAS runs
    markedly faster than dy cols^T."""
    dw_t = grouped_product(group, columns_g, dy_g, None, trans_b=True)
    weight.diff += dw_t.transpose(0, 2, 1).reshape(weight.shape)


def product_into_chunk(scratch, name: str, weights_g, columns_g, lay, out, xp) -> None:
    """``out`` (a chunk of samples) = ``weights_g`` times ``columns_g`` per group (both grouped),
    computed into the scratch array ``name`` and gathered from the column layout ``lay``."""
    group, ncols = weights_g.shape[0], lay.ncols
    product = scratch.get(name, (group * weights_g.shape[1], ncols), columns_g.dtype, xp)
    grouped_product(group, weights_g, columns_g, product.reshape(group, -1, ncols))
    out[...] = lay.gather(product)


def col2im_input_gradient(scratch, xp, weights, dy_g, lay, dx) -> None:
    """dx (a chunk of samples) = col2im of dcols = W^T dY; ``weights`` grouped (``grouped_weights``),
    dy_g the chunk's gradient as (group, num_output / group, output positions)."""
    group = weights.shape[0]
    dcols = scratch.get("conv_dcols", (lay.rows, lay.ncols), dy_g.dtype, xp)
    grouped_product(group, weights, dy_g, dcols.reshape(group, -1, lay.ncols), trans_a=True)
    col2im(dcols, lay, dx, scratch)


def backward_data_geometry(shape: ConvolutionShape) -> Geometry | None:
    """For stride-1 convolutions whose pad is at most extent - 1: the geometry of the convolution that
    maps the top gradient to the bottom gradient (pad extent - 1 - pad); None where col2im is used
    instead."""
    geom = shape.geom
    if any(s != 1 for s in geom.stride) or any(p > e - 1 for p, e in zip(geom.pad, geom.extent)):
        return None
    # Worth it only when its column matrix (num_output rows per offset, over the input positions)
    # is no larger than the one col2im would sum (C rows per offset, over the output positions).
    if shape.num_output * math.prod(shape.in_spatial) > shape.channels * math.prod(shape.out_spatial):
        return None
    return Geometry(geom.kernel, geom.stride, tuple(e - 1 - p for p, e in zip(geom.pad, geom.extent)),
                    geom.dilation)


class ColumnsAlgorithm(ConvolutionAlgorithm):
    """y = W times the im2col matrix of a chunk of the batch, per group; backward: the weight gradient
    from the same columns (the last chunk's kept from forward), the input gradient as the convolution
    of the padded top gradient with the flipped filters where that matrix is no larger than col2im's,
    col2im of W^T dY otherwise."""

    name = "columns"

    def __init__(self, shape: ConvolutionShape):
        super().__init__(shape)
        self.workspace = Workspace()  # the column matrices, the last chunk's kept from forward to backward
        self.chunks = ColumnChunks(shape.geom)
        self.fresh_columns: dict[int, bool] = {}  # bottom i -> the workspace holds its last chunk's columns
        self.backward_geometry = backward_data_geometry(shape)

    def kept_bytes(self) -> int:
        return self.workspace.nbytes

    def forward(self, layer, bottom, top):
        s = self.shape
        xp = backend.get_array_module(bottom[0].data)
        o, g = s.num_output, s.group
        w = grouped_weights(layer.blobs[0].data, g)
        chunks = self.chunks(xp, s.num, s.channels, s.in_spatial, bottom[0].dtype)
        bias = layer.blobs[1].data if layer.bias_term else None
        for i, (b, t) in enumerate(zip(bottom, top)):
            x = b.data.reshape(s.x_shape)
            y_all = t.data.reshape(s.y_shape)
            for start, stop, lay in chunks:
                cols = im2col(x[start:stop], lay, self.workspace, key=("cols", i, lay.x_shape[0]))
                y = layer.scratch.get("conv_y", (o, lay.ncols), x.dtype, xp)
                grouped_product(g, w, cols.reshape(g, -1, lay.ncols), y.reshape(g, -1, lay.ncols))
                # One pass: the output columns plus the bias, written into the top.
                lay.gather_into(y, y_all[start:stop], bias)
            # The last chunk's columns are still in the workspace: backward starts with that chunk.
            self.fresh_columns[i] = True

    def backward(self, layer, top, propagate_down, bottom):
        s = self.shape
        xp = backend.get_array_module(top[0].diff)
        o, g = s.num_output, s.group
        w = grouped_weights(layer.blobs[0].data, g)
        want_w = layer.param_propagate_down[0]
        want_b = layer.bias_term and layer.param_propagate_down[1]
        chunks = self.chunks(xp, s.num, s.channels, s.in_spatial, top[0].diff.dtype)
        back_geom = self.backward_geometry if any(propagate_down) else None
        flipped = self._flipped_weights(layer, xp) if back_geom is not None else None
        for i, (b, t) in enumerate(zip(bottom, top)):
            if not (want_w or want_b or propagate_down[i]):
                continue
            x = b.data.reshape(s.x_shape)
            dy_all = t.diff.reshape(s.y_shape)
            dx_all = b.diff.reshape(x.shape) if propagate_down[i] else None
            for k, (start, stop, lay) in enumerate(reversed(chunks)):
                dy = scattered_chunk(lay, self.workspace, "dy", o, dy_all[start:stop], xp)
                if want_b:
                    layer.blobs[1].diff += dy.sum(axis=1)
                dy_g = dy.reshape(g, o // g, -1)
                if want_w:
                    key = ("cols", i, lay.x_shape[0])
                    if k == 0 and self.fresh_columns.get(i):
                        cols = self.workspace.get(key, (lay.rows, lay.ncols), dy.dtype, xp)
                    else:
                        cols = im2col(x[start:stop], lay, self.workspace, key=key)
                    add_weight_gradient(layer.blobs[0], g, cols.reshape(g, -1, lay.ncols), dy_g)
                if dx_all is not None and flipped is not None:
                    # Stride 1: the input gradient is the top gradient, padded by extent - 1 - pad,
                    # convolved with the flipped, transposed filters: im2col + one product, no col2im.
                    lay_t = column_layout((stop - start, o) + s.out_spatial, back_geom, xp)
                    cols_t = im2col(dy_all[start:stop], lay_t, self.workspace, key=("dycols", lay_t.x_shape[0]))
                    product_into_chunk(layer.scratch, "conv_dxt", flipped, cols_t.reshape(g, -1, lay_t.ncols), lay_t,
                                       dx_all[start:stop], xp)
                elif dx_all is not None:
                    col2im_input_gradient(layer.scratch, xp, w, dy_g, lay, dx_all[start:stop])
            self.fresh_columns[i] = False

    def _flipped_weights(self, layer, xp):
        """The filters as (group, C/group, num_output/group * prod(K)), spatially reversed: the
        weights of the backward-data convolution."""
        s = self.shape
        g, o, c = s.group, s.num_output, s.channels
        w = layer.blobs[0].data.reshape((g, o // g, c // g) + s.geom.kernel)
        w = w[(slice(None),) * 3 + (slice(None, None, -1),) * s.num_spatial]
        return xp.ascontiguousarray(xp.swapaxes(w, 1, 2)).reshape(g, c // g, -1)
