"""The CPU's row-product path (im2col.RowPlan) for stride-1 2-D convolutions of one group: kh matrix
products over row-shifted views of a rows-first copy of the input, expanded over the kernel columns
only; no column matrix. Chosen for its backward (planner.py): where the direct kernels compute the
layer, they take its forward, and for outputs at least direct.ROWS_BELOW_WIDTH wide its weight
gradient too. Its input gradient is the full convolution of the padded top gradient or col2im's,
chosen once per shape by their cost (``input_gradient_choice``).
"""
from __future__ import annotations

import math

import numpy as np

from .. import direct
from .. import im2col as _cols
from ..im2col import (Geometry, Workspace, add_row_weight_grad, copy_from_rows, copy_to_rows, row_col2im, row_plan,
                      row_product, row_weight_product, row_weights, rows_expanded)
from ..matmul import matmul
from .algorithm import ConvolutionAlgorithm
from .base import ConvolutionShape
from .direct import add_weight_gradient

# The row path takes chunks whose expanded rows (or input-gradient columns) take about this many bytes:
# each of the kh products reads the expanded rows again, and col2im's columns are summed, from cache
# rather than memory (benchmarks/README.md, "The figures behind the convolution paths").
ROW_BUDGET = 16 << 20
# The row path's input gradient is col2im's (dcols = dY W, then a compiled scatter-add) rather than the
# full convolution of the top gradient padded by extent - 1 - pad when that convolution would cost more
# than this many times col2im's multiply-adds, prod(input) / prod(output) (LeNet's conv2: 2.25), ...
ROW_COL2IM_ABOVE = 1.25
# ... or when the input has fewer channels than this: the convolution's products then have only C
# columns, which OpenBLAS runs at about 2/3 of the rate of col2im's kh*kw*C for the same multiply-adds
# (benchmarks/README.md, "The figures behind the convolution paths").
ROW_COL2IM_CHANNELS = 64


def eligible(shape: ConvolutionShape, xp) -> bool:
    """Whether the row path can compute this convolution on arrays of ``xp``."""
    g = shape.geom
    # The input gradient is the convolution of the padded top gradient with the flipped filters,
    # which needs pad <= extent - 1 (a larger pad only adds outputs that read nothing but padding).
    # With few input channels (a first layer) the channel-last copies of this path cost more than
    # the products save: the column path is faster there.
    return (not _cols.use_kernels(xp) and _cols.ROW_PRODUCTS and shape.num_spatial == 2 and shape.group == 1
            and g.stride == (1, 1) and all(p <= e - 1 for p, e in zip(g.pad, g.extent))
            and g.kernel[1] * shape.channels >= _cols.ROW_MIN_WIDTH)


def input_gradient_choice(shape: ConvolutionShape) -> str:
    """The row path's input gradient: "convolution" (the top gradient padded by extent - 1 - pad,
    convolved with the flipped filters: no scatter) or "col2im" (see ROW_COL2IM_ABOVE and
    ROW_COL2IM_CHANNELS). From the shapes alone, so a resumed run takes the same path and gets the
    same bits."""
    if (math.prod(shape.in_spatial) > ROW_COL2IM_ABOVE * math.prod(shape.out_spatial)
            or shape.channels < ROW_COL2IM_CHANNELS):
        return "col2im"
    return "convolution"


class RowsAlgorithm(ConvolutionAlgorithm):
    """The row path, its input gradient ``input_gradient`` ("convolution" or "col2im"). With
    ``direct_kernels`` (direct.DirectConvolution), the forward is theirs, and with
    ``direct_weight_gradient`` the weight gradient too; the backward expands the rows itself where it
    needs them."""

    name = "rows"

    def __init__(self, shape: ConvolutionShape, input_gradient: str,
                 direct_kernels: direct.DirectConvolution | None = None, direct_weight_gradient: bool = False):
        super().__init__(shape)
        self.input_gradient = input_gradient
        self.direct_kernels = direct_kernels
        self.direct_weight_gradient = direct_weight_gradient
        self.workspace = Workspace()  # the expanded rows, the last chunk's kept from forward to backward
        self.last_rows: dict = {}  # bottom i -> its last chunk's expanded rows, left by the forward
        self._chunk_key = None
        self._chunks: list = []

    def summary(self) -> str:
        if self.direct_weight_gradient:
            return f"direct/rows-{self.input_gradient}"
        first = "rows" if self.direct_kernels is None else "direct+rows"
        return f"{first}/{self.input_gradient}"

    def kept_bytes(self) -> int:
        return self.workspace.nbytes

    def row_chunks(self, dtype) -> list:
        """(start, stop, plan, backward plan) for the sample ranges processed together: as many
        samples as keep the expanded rows near ROW_BUDGET bytes, in near-equal chunks."""
        s = self.shape
        key = (np.dtype(dtype), _cols.ROW_FOLD_BELOW, ROW_BUDGET)
        if self._chunk_key != key:
            geom = s.geom
            back = Geometry(geom.kernel, geom.stride, tuple(e - 1 - p for p, e in zip(geom.pad, geom.extent)),
                            geom.dilation)
            one = row_plan(1, s.channels, s.in_spatial, geom)
            one_back = row_plan(1, s.num_output, s.out_spatial, back)
            if self.input_gradient == "col2im":
                back_cells = math.prod(s.out_spatial) * geom.kernel_count * s.channels  # dcols
            else:
                back_cells = one_back.q_cells_per_sample
            per_sample = max(one.q_cells_per_sample, back_cells) * np.dtype(dtype).itemsize
            size = max(1, min(s.num, ROW_BUDGET // max(1, per_sample)))
            count = -(-s.num // size)
            size = -(-s.num // count)
            plans = {}
            chunks = []
            for start in range(0, s.num, size):
                n = min(s.num, start + size) - start
                if n not in plans:
                    plans[n] = (row_plan(n, s.channels, s.in_spatial, geom),
                                row_plan(n, s.num_output, s.out_spatial, back))
                chunks.append((start, start + n) + plans[n])
            self._chunk_key, self._chunks = key, chunks
        return self._chunks

    def forward(self, layer, bottom, top):
        if self.direct_kernels is not None:
            self.last_rows.clear()
            bias = layer.blobs[1].data if layer.bias_term else None
            for b, t in zip(bottom, top):
                self.direct_kernels.forward(b.data.reshape(self.shape.x_shape), layer.blobs[0].data, bias,
                                            t.data.reshape(self.shape.y_shape), layer.scratch)
            return
        s = self.shape
        o = s.num_output
        ho, wo = s.out_spatial
        chunks = self.row_chunks(bottom[0].dtype)
        wq = row_weights(layer.blobs[0].data, chunks[0][2].fold)
        bias = layer.blobs[1].data if layer.bias_term else None
        for i, (b, t) in enumerate(zip(bottom, top)):
            x = b.data.reshape(s.x_shape)
            y_all = t.data.reshape(s.y_shape)
            for start, stop, plan, _ in chunks:
                n = stop - start
                q = rows_expanded(x[start:stop], plan, self.workspace, ("rows", "q", i, n))
                y = layer.scratch.get("rows_y", (ho * n * wo, o), x.dtype, np)
                row_product(q, wq, plan, y, layer.scratch)
                copy_from_rows(y.reshape(ho, n, wo, o), y_all[start:stop], bias)
            # The last chunk's rows stay in the workspace: backward starts with that chunk.
            self.last_rows[i] = q

    def backward(self, layer, top, propagate_down, bottom):
        s = self.shape
        o, c = s.num_output, s.channels
        (h, w), (ho, wo) = s.in_spatial, s.out_spatial
        want_w = layer.param_propagate_down[0]
        want_b = layer.bias_term and layer.param_propagate_down[1]
        dtype = top[0].diff.dtype
        chunks = self.row_chunks(dtype)
        wt = wcols = None
        if any(propagate_down) and self.input_gradient == "col2im":
            # dcols = dY W: W as (kh*kw*C x O), read transposed by the product.
            wcols = row_weights(layer.blobs[0].data, s.geom.kernel[0]).reshape(-1, o)
        elif any(propagate_down):
            # The backward convolution's filters: W'[c, o, i, j] = W[o, c, kh-1-i, kw-1-j].
            flipped = layer.blobs[0].data[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
            wt = row_weights(flipped, chunks[0][3].fold)
        for i, (b, t) in enumerate(zip(bottom, top)):
            last = self.last_rows.pop(i, None)
            if not (want_w or want_b or propagate_down[i]):
                continue
            dy_all = t.diff.reshape(s.y_shape)
            layer.add_bias_gradient(dy_all.reshape(s.num, o, -1))
            x = b.data.reshape(s.x_shape)
            rows_w = want_w and not self.direct_weight_gradient
            if want_w and self.direct_weight_gradient:
                add_weight_gradient(self.direct_kernels, layer, x, dy_all)
            if not (rows_w or propagate_down[i]):
                continue
            dx_all = b.diff.reshape(x.shape) if propagate_down[i] else None
            dwq = None
            for k, (start, stop, plan, plan_back) in enumerate(reversed(chunks)):
                n = stop - start
                dy_rows = layer.scratch.get("rows_dy", (ho * n * wo, o), dtype, np)
                copy_to_rows(dy_all[start:stop], dy_rows.reshape(ho, n, wo, o))
                if rows_w:
                    if k == 0 and last is not None:
                        q = last
                    else:
                        q = rows_expanded(x[start:stop], plan, self.workspace, ("rows", "q", i, n))
                    # The first chunk's product is the sum the others add to.
                    target = layer.scratch.get("rows_dw_sum" if dwq is None else "rows_dw_part",
                                               (plan.products, plan.width, o), dtype, np)
                    part = row_weight_product(q, dy_rows, plan, target)
                    if dwq is None:
                        dwq = part
                    else:
                        dwq += part
                if dx_all is not None and wcols is not None:
                    dcols = layer.scratch.get("rows_dcols", (ho * n * wo, wcols.shape[0]), dtype, np)
                    matmul(dy_rows, wcols.T, out=dcols)
                    row_col2im(dcols, plan, dx_all[start:stop])
                elif dx_all is not None:
                    qt = rows_expanded(dy_all[start:stop], plan_back, layer.scratch, "rows_qt")
                    dx = layer.scratch.get("rows_dx", (h * n * w, c), dtype, np)
                    row_product(qt, wt, plan_back, dx, layer.scratch)
                    copy_from_rows(dx.reshape(h, n, w, c), dx_all[start:stop])
            if dwq is not None:
                add_row_weight_grad(dwq, layer.blobs[0].diff)
