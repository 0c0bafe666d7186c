"""Vision layers: Convolution, Deconvolution, Im2col, Pooling, LRN and SPP, with Caffe's semantics.

Convolutions are matrix products over chunks of the batch on the column matrix of im2col.py (as many
samples per product as keep it cache-sized). On the CPU, 2-D convolutions of float arrays (not 1x1,
not depthwise; with at least direct.MIN_TAPS taps per group where the output planes are multiples of
4 KiB) take the direct path (direct.py: register-blocked compiled
kernels over the padded input, no column matrix); stride-1 convolutions of one group with enough
input channels take the row-product path where it is faster (narrow outputs, or when the direct input
gradient would be col2im's: im2col.RowPlan, kh products over row-shifted views of a rows-first copy of
the input, expanded over the kernel columns only), its input gradient a full convolution or col2im's,
chosen once per shape by their cost.
Pooling and LRN on C-contiguous float NumPy arrays run the compiled kernels of jit/pooling.py and
jit/lrn.py (when ``jit.ENABLED``); on a GPU the same functions run the CUDA kernels in kernels/*.cu.
The NumPy code here (one unit-stride array operation per kernel offset over stride-phase planes, never
a loop over pixels or samples) is the twin of both (``max_pool_forward`` ... ``lrn_within_backward``),
and what any other array runs.
"""
from __future__ import annotations

import math

import numpy as np

from .. import backend, cudnn
from ..blob import Blob
from ..fillers import fill
from ..proto import netdef_pb2 as pb
from . import depthwise, direct, elementwise, fusion
from . import im2col as _cols
from ..cudnn import convolution as cudnn_convolution
from ..cudnn import plans as cudnn_plans
from .matmul import matmul, matmul_row_mapped
from .base import TRAIN, Layer, register_layer
from .im2col import (Geometry, Workspace, add_row_weight_grad, col2im, column_layout, copy_from_rows, copy_to_rows,
                     im2col, row_col2im, row_plan, row_product, row_weight_product, row_weights, rows_expanded,
                     spread_strided, strided_pixels)

# Convolutions process the batch in chunks whose column matrix takes about this many bytes: on the
# CPU a matrix that stays in cache is faster to build and to multiply than one for the whole batch.
COLUMN_BUDGET_CPU = 8 << 20
COLUMN_BUDGET_GPU = 256 << 20
# The CPU row-product path (im2col.RowPlan) takes chunks whose expanded rows (or input-gradient columns)
# take about this many bytes. 32 MiB left CIFAR-10 quick's conv2 (batch 100) one chunk whose expanded
# rows (20 MB) each of the kh products read again from memory, and col2im's columns (82 MB) out of
# cache: 16 MiB (5 chunks) took its forward from 21 to 17 ms and its backward from 41 to 36 (one
# thread); 8 MiB measured the same with twice the chunks, and neither moved ResNet-50's 3x3 layers.
ROW_BUDGET = 16 << 20
# A 1x1 convolution whose output planes hold fewer pixels than this runs one matrix product for the
# whole batch on channel-major copies instead of one per image: OpenBLAS runs (O x 49) products badly.
# MobileNet v1's 7 x 7 1024 -> 1024 layer at batch 8 (2 threads): weight gradient 6.4 -> 3.2 ms,
# forward 3.8 -> 2.8, input gradient 4.3 -> 3.1; at 14 x 14 (196 pixels) the two ways measure alike,
# at 28 x 28 the copies cost more than they save.
POINTWISE_STACK_BELOW_PIXELS = 128
# The row path's input gradient is col2im's (dcols = dY W, then a compiled scatter-add) rather than the
# full convolution of the top gradient padded by extent - 1 - pad when that convolution would cost more
# than this many times col2im's multiply-adds, prod(input) / prod(output) (LeNet's conv2: 2.25), ...
ROW_COL2IM_ABOVE = 1.25
# ... or when the input has fewer channels than this: the convolution's products then have only C
# columns, which OpenBLAS runs at 2/3 of the rate of col2im's kh*kw*C (CIFAR-10 quick's conv2 and conv3,
# 32 channels, batch 100: backward 44 -> 38 ms and 18 -> 14 ms on one thread; same multiply-adds).
ROW_COL2IM_CHANNELS = 64


# ============================================================================ convolution family
def _spatial_param(layer: Layer, cp, name: str, h_name: str | None, w_name: str | None,
                   num_spatial: int, default: int | None) -> tuple:
    """One per-axis setting of a ConvolutionParameter, read as Caffe's BaseConvolutionLayer does:
    ``name_h``/``name_w`` (2-D only) or the repeated ``name`` with 1 or one-per-axis values."""
    values = list(getattr(cp, name))
    if h_name is not None and (cp.HasField(h_name) or cp.HasField(w_name)):
        if num_spatial != 2:
            raise layer.error(f"{h_name} & {w_name} can only be used for 2D convolution")
        if values:
            raise layer.error(f"either {name} or {h_name}/{w_name} should be specified; not both")
        return (int(getattr(cp, h_name)), int(getattr(cp, w_name)))
    allowed = (1, num_spatial) if default is None else (0, 1, num_spatial)
    if len(values) not in allowed:
        raise layer.error(f"{name} must be specified once, or once per spatial dimension "
                          f"({name} specified {len(values)} times; {num_spatial} spatial dims)")
    if not values:
        return (default,) * num_spatial
    return tuple(int(values[0 if len(values) == 1 else a]) for a in range(num_spatial))


def conv_geometry(layer: Layer, cp, num_spatial: int) -> Geometry:
    kernel = _spatial_param(layer, cp, "kernel_size", "kernel_h", "kernel_w", num_spatial, None)
    stride = _spatial_param(layer, cp, "stride", "stride_h", "stride_w", num_spatial, 1)
    pad = _spatial_param(layer, cp, "pad", "pad_h", "pad_w", num_spatial, 0)
    dilation = _spatial_param(layer, cp, "dilation", None, None, num_spatial, 1)
    if any(k <= 0 for k in kernel):
        raise layer.error(f"filter dimensions must be nonzero, got {kernel}")
    if any(s <= 0 for s in stride):
        raise layer.error(f"stride dimensions must be nonzero, got {stride}")
    if any(d <= 0 for d in dilation):
        raise layer.error(f"dilation dimensions must be nonzero, got {dilation}")
    return Geometry(kernel, stride, pad, dilation)


class _ConvolutionBase(Layer):
    """Shared set-up of Convolution and Deconvolution (Caffe's BaseConvolutionLayer): bottoms and
    tops come in pairs that share the weights."""

    min_bottom = 1
    min_top = 1
    reverse = False  # Deconvolution swaps the roles of input and output channels

    def setup(self, bottom, top):
        if len(bottom) != len(top):
            raise self.error(f"takes as many tops as bottoms, got {len(bottom)} bottoms and {len(top)} tops")
        cp = self.layer_param.convolution_param
        self.channel_axis = bottom[0].canonical_axis(cp.axis)
        self.num_spatial = bottom[0].num_axes - self.channel_axis - 1
        if self.num_spatial < 1:
            raise self.error(f"needs at least one spatial axis after the channel axis {self.channel_axis}; "
                             f"bottom shape {bottom[0].shape}")
        self.geom = conv_geometry(self, cp, self.num_spatial)
        self.channels = bottom[0].shape[self.channel_axis]
        self.num_output = int(cp.num_output)
        self.group = int(cp.group)
        if self.num_output <= 0:
            raise self.error("num_output must be positive")
        if self.group <= 0 or self.channels % self.group or self.num_output % self.group:
            raise self.error(f"group {self.group} must divide both the input channels ({self.channels}) "
                             f"and num_output ({self.num_output})")
        if self.reverse:
            weight_shape = (self.channels, self.num_output // self.group) + self.geom.kernel
        else:
            weight_shape = (self.num_output, self.channels // self.group) + self.geom.kernel
        self.bias_term = bool(cp.bias_term)
        shapes = [weight_shape] + ([(self.num_output,)] if self.bias_term else [])
        if self.blobs:
            # Weights already loaded: Caffe skips the fillers and only checks the shapes.
            if len(self.blobs) != len(shapes):
                raise self.error(f"incorrect number of weight blobs: {len(self.blobs)}, expected {len(shapes)}")
            for j, (blob, shape) in enumerate(zip(self.blobs, shapes)):
                if tuple(blob.shape) != shape:
                    raise self.error(f"blob {j} has shape {blob.shape}; expected {shape}")
        else:
            dtype = bottom[0].dtype
            self.blobs = [Blob(shape, dtype=dtype) for shape in shapes]
            fill(self.blobs[0], cp.weight_filler)
            if self.bias_term:
                fill(self.blobs[1], cp.bias_filler)
        self.ws = Workspace()
        self._cols_fresh = {}
        self._rows_last = {}

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if shape != self._sized_for:
            self._size(shape)
        for b in bottom[1:]:
            if b.shape != shape:
                raise self.error(f"all bottoms must have the same shape; {b.shape} != {shape}")
        for t in top:
            t.reshape(self._top_shape)

    # The sizes below follow from the input's shape alone (and the layer's fixed parameters), and every
    # forward asks for them again: worked out once per shape (they took 7 of the 9 us that a
    # pointwise convolution's reshape took, 52 of them a forward in MobileNet v2).
    _sized_for = None

    def _size(self, shape: tuple) -> None:
        ca = self.channel_axis
        if len(shape) != ca + 1 + self.num_spatial:
            raise self.error(f"bottom num_axes may not change (now {shape})")
        if shape[ca] != self.channels:
            raise self.error(f"input has {shape[ca]} channels; the layer was set up for {self.channels}")
        in_spatial = tuple(shape[ca + 1:])
        out_spatial = self.geom.deconv_out(in_spatial) if self.reverse else self.geom.conv_out(in_spatial)
        if any(o <= 0 for o in out_spatial):
            raise self.error(f"output size {out_spatial} is not positive for input {in_spatial}")
        self.num = math.prod(shape[:ca])
        self.in_spatial, self.out_spatial = in_spatial, out_spatial
        self._top_shape = shape[:ca] + (self.num_output,) + out_spatial
        self._sized_for = shape

    def _chunks(self, xp, channels, spatial, dtype):
        """(start, stop, layout) for the sample ranges processed together: as many samples as keep
        the column matrix near COLUMN_BUDGET bytes (cache-sized on the CPU), in near-equal chunks."""
        key = (xp, channels, spatial, self.num, np.dtype(dtype))
        if getattr(self, "_chunk_key", None) != key:
            per_sample = channels * self.geom.kernel_count * math.prod(self.geom.conv_out(spatial))
            budget = COLUMN_BUDGET_CPU if xp is np else COLUMN_BUDGET_GPU
            size = max(1, min(self.num, budget // max(1, per_sample * np.dtype(dtype).itemsize)))
            count = -(-self.num // size)
            size = -(-self.num // count)
            layouts = {}
            chunks = []
            for start in range(0, self.num, size):
                stop = min(self.num, start + size)
                if stop - start not in layouts:
                    layouts[stop - start] = column_layout((stop - start, channels) + spatial, self.geom, xp)
                chunks.append((start, stop, layouts[stop - start]))
            self._chunk_key, self._chunk_list = key, chunks
        return self._chunk_list

    def _weights(self):
        """The weights as (group, rows per group, columns), rows being the first weight axis."""
        w = self.blobs[0].data
        return w.reshape(self.group, w.shape[0] // self.group, -1)

    def _gemm(self, xp, a, b, out, trans_a=False, trans_b=False):
        """out = a @ b per group; a, b, out are (group, rows, cols) arrays (transposed per flag)."""
        if trans_a:
            a = a.transpose(0, 2, 1)
        if trans_b:
            b = b.transpose(0, 2, 1)
        if self.group == 1:
            return matmul(a[0], b[0], out=None if out is None else out[0])[None]
        return matmul(a, b, out=out)


@register_layer("Convolution")
class ConvolutionLayer(_ConvolutionBase):
    """Convolution (cross-correlation) with learned filters, Caffe's ConvolutionLayer.

    bottom[i]: (N x C x H x W), or any leading axes before ``axis`` and any number of spatial axes.
    top[i]:    (N x num_output x H_out x W_out), H_out = (H + 2 pad_h - (dilation_h (kernel_h - 1) + 1))
               / stride_h + 1 rounded down (likewise W).
    blobs:     weight (num_output x C/group x kernel_h x kernel_w); bias (num_output) if bias_term.

    y[n, o] = b[o] + sum_{c in group(o), i, j} W[o, c, i, j] x_pad[n, c, h*stride + i*dilation, ...],
    computed as W (num_output x C*kh*kw per group) times the im2col matrix of a chunk of the batch.
    """

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        dtype = bottom[0].dtype
        self.algorithm = self._choose_algorithm(backend.xp(), dtype)
        self.rows_input_gradient = self._choose_rows_input_gradient() if self.algorithm == "rows" else None
        # The row path is chosen for its backward; where the direct kernels can compute the layer,
        # its forward is theirs (faster at every width; LeNet's conv2 at batch 64, 2 threads: see
        # direct.ROWS_BELOW_WIDTH). The backward then expands the rows itself where it needs them.
        self.direct_forward = self.algorithm == "direct" or (
            self.algorithm == "rows" and self._direct_usable(np.dtype(dtype)) and direct.compiles(np.dtype(dtype)))
        # Where the row path was chosen for its input gradient alone (outputs at least
        # direct.ROWS_BELOW_WIDTH wide), the direct kernels compute the weight gradient: no expanded rows,
        # and their product runs at the rate the row path's kh narrow products do not. LeNet's conv2 at
        # batch 64, 2 threads, backward: 5.9 against 7.9 ms. Narrow outputs keep the rows' (2 x 2: 1.15
        # against 1.51 ms; 4 x 4 alike).
        self.direct_weight_gradient = (self.algorithm == "rows" and self.direct_forward
                                       and self.out_spatial[1] >= direct.ROWS_BELOW_WIDTH)
        if self.direct_forward:
            self._plan_direct(dtype)
        self.direct_input_gradient = self._direct.input_gradient_choice if self.algorithm == "direct" else None

    def algorithm_summary(self) -> str:
        """The algorithms chosen for these shapes, for benchmarks and logs: the path of the forward
        (and of the weight gradient), then how the input gradient is computed: "rows", "rows/col2im",
        "direct/direct", "direct+rows/convolution" (the direct forward, the row path's backward),
        "direct/rows-col2im" (the direct forward and weight gradient, the row path's col2im), ..."""
        if self.direct_weight_gradient:
            return f"direct/rows-{self.rows_input_gradient}"
        first = "direct+rows" if self.direct_forward and self.algorithm == "rows" else self.algorithm
        second = self.rows_input_gradient or self.direct_input_gradient
        return first if second is None else f"{first}/{second}"

    def _choose_algorithm(self, xp, dtype) -> str:
        """How forward and backward compute, chosen once the shapes are known. On a GPU, cuDNN's
        products wherever it is installed and not refused (``engine: CAFFE``); the log says once per
        layer which path runs and why. Otherwise:

        - "depthwise": group == channels (2-D): shifted multiply-adds over the taps (depthwise.py);
        - "pointwise": 1x1 kernel, no padding, one group: y[n] = W @ x[n] as (C x H*W) matrices, no
          column matrix and, at stride 1, no copy of the input (with strides, a copy of the pixels
          they pick);
        - "direct": other 2-D convolutions of NumPy float arrays: register-blocked kernels over the
          padded input (direct.py);
        - "rows": the CPU row-product path (im2col.RowPlan, see _rows_eligible);
        - "columns": im2col and one product per group over chunks of the batch (anything else).
        """
        if xp is not np:
            reason = self._cudnn_refused(dtype)
            if reason is None:
                cudnn.log_path_once(self.name, "cuDNN", "its fastest plan per shape, timed once")
                return "cudnn"
            fallback = self._choose_netdef_algorithm(xp, dtype)
            cudnn.log_path_once(self.name, f"netdef's {fallback} path", reason)
            return fallback
        return self._choose_netdef_algorithm(xp, dtype)

    def _cudnn_refused(self, dtype) -> str | None:
        """None where this layer's products run through cuDNN on the GPU; else why not."""
        if self.layer_param.convolution_param.engine == pb.ConvolutionParameter.CAFFE:
            return "engine: CAFFE asks for Caffe's own path"
        if self._cudnn_failure is not None:
            return self._cudnn_failure
        if not cudnn.usable():
            return cudnn.why_not()
        refused = cudnn_convolution.usable_for(self.num_spatial, dtype)
        if refused is None and self._cudnn is None:
            self._cudnn = cudnn_convolution.CudnnConvolution(self.geom)
        return refused

    _cudnn = None  # the layer's cuDNN plans (cudnn/convolution.py), made when first chosen

    def _choose_netdef_algorithm(self, xp, dtype) -> str:
        g = self.geom
        if self.num_spatial == 2 and self.group > 1 and self.group == self.channels:
            return "depthwise"
        if self.group == 1 and all(k == 1 for k in g.kernel) and not any(g.pad):
            return "pointwise"
        if xp is np and self._direct_usable(dtype):
            # A TEST net's layers run forward only (a backward still works, by either path), and
            # the direct forward is the faster one at every width: the rows path wins narrow outputs
            # by its backward.
            training = self.phase == TRAIN
            slow_backward = training and direct.input_gradient(
                g, self.channels, self.group, self.in_spatial, self.out_spatial, dtype) != "direct"
            narrow = training and self.out_spatial[1] < direct.ROWS_BELOW_WIDTH
            rows_better = self._rows_eligible(xp) and (narrow or slow_backward)
            if not rows_better and direct.compiles(np.dtype(dtype)):
                return "direct"
        if self._rows_eligible(xp):
            return "rows"
        return "columns"

    def _direct_usable(self, dtype) -> bool:
        return direct.usable(dtype, self.num_spatial, self.group, self.channels, self.geom.kernel, self.out_spatial)

    def forward(self, bottom, top):
        xp = backend.get_array_module(bottom[0].data)
        if self.algorithm == "cudnn":
            return self._forward_cudnn(bottom, top)
        if self.algorithm == "depthwise":
            return self._forward_depthwise(bottom, top)
        if self.algorithm == "pointwise":
            return self._forward_pointwise(bottom, top)
        if self.direct_forward:
            self._rows_last.clear()
            return self._forward_direct(bottom, top)
        if self.algorithm == "rows":
            return self._forward_rows(bottom, top)
        self._rows_last.clear()
        o, g = self.num_output, self.group
        w = self._weights()
        chunks = self._chunks(xp, self.channels, self.in_spatial, bottom[0].dtype)
        for i, (b, t) in enumerate(zip(bottom, top)):
            x = b.data.reshape((self.num, self.channels) + self.in_spatial)
            y_all = t.data.reshape((self.num, o) + self.out_spatial)
            for start, stop, lay in chunks:
                cols = im2col(x[start:stop], lay, self.ws, key=("cols", i, lay.x_shape[0]))
                y = self.scratch.get("conv_y", (o, lay.ncols), x.dtype, xp)
                self._gemm(xp, w, cols.reshape(g, -1, lay.ncols), y.reshape(g, -1, lay.ncols))
                # One pass: the output columns plus the bias, written into the top.
                lay.gather_into(y, y_all[start:stop], self.blobs[1].data if self.bias_term else None)
            # The last chunk's columns are still in the workspace: backward starts with that chunk.
            self._cols_fresh[i] = True

    def forward_mapped(self, bottom, top, channel_map):
        # Every algorithm writes the output into the top's array itself: mapped there in place. The
        # pointwise and depthwise products add the bias in a pass of their own: the map adds it.
        # The depthwise kernels apply the map as they write each block of channels, the pointwise
        # products as each thread's panel is computed.
        if self.algorithm not in ("pointwise", "depthwise") or len(top) != 1:
            return fusion.forward_then_map(self, bottom, top, channel_map)
        mapped = channel_map
        if self.bias_term:
            dims = (self.num, self.num_output, math.prod(self.out_spatial))
            mapped = fusion.compose(fusion.ChannelMap(dims, shift=self.blobs[1].data), channel_map)
            if mapped is None:
                return fusion.forward_then_map(self, bottom, top, channel_map)
        if self.algorithm == "pointwise":
            done = self._pointwise_products(bottom, top, mapped if fusion.MAPS_IN_KERNELS else None)
        else:
            done = fusion.MAPS_IN_KERNELS and self._depthwise_mapped(bottom[0], top[0], mapped)
            if not done:
                self._depthwise_products(bottom, top)
        if not done:
            fusion.apply(mapped, top[0].data, top[0].data)
        return True

    def backward(self, top, propagate_down, bottom):
        xp = backend.get_array_module(top[0].diff)
        if self.algorithm == "cudnn":
            return self._backward_cudnn(top, propagate_down, bottom)
        if self.algorithm == "depthwise":
            return self._backward_depthwise(top, propagate_down, bottom)
        if self.algorithm == "pointwise":
            return self._backward_pointwise(top, propagate_down, bottom)
        if self.algorithm == "rows":
            return self._backward_rows(top, propagate_down, bottom)
        if self.algorithm == "direct":
            return self._backward_direct(top, propagate_down, bottom)
        o, g = self.num_output, self.group
        w = self._weights()
        want_w = self.param_propagate_down[0]
        want_b = self.bias_term and self.param_propagate_down[1]
        chunks = self._chunks(xp, self.channels, self.in_spatial, top[0].diff.dtype)
        back_geom = self._backward_data_geometry() if any(propagate_down) else None
        flipped = self._flipped_weights(xp) if back_geom is not None else None
        for i, (b, t) in enumerate(zip(bottom, top)):
            if not (want_w or want_b or propagate_down[i]):
                continue
            x = b.data.reshape((self.num, self.channels) + self.in_spatial)
            dy_all = t.diff.reshape((self.num, o) + self.out_spatial)
            dx_all = b.diff.reshape(x.shape) if propagate_down[i] else None
            for k, (start, stop, lay) in enumerate(reversed(chunks)):
                dy = lay.buffer(self.ws, ("dy", lay.x_shape[0]), o, dy_all.dtype, xp)
                lay.scatter(dy, dy_all[start:stop])
                if want_b:
                    self.blobs[1].diff += dy.sum(axis=1)
                dy_g = dy.reshape(g, o // g, -1)
                if want_w:
                    key = ("cols", i, lay.x_shape[0])
                    if k == 0 and self._cols_fresh.get(i):
                        cols = self.ws.get(key, (lay.rows, lay.ncols), dy.dtype, xp)
                    else:
                        cols = im2col(x[start:stop], lay, self.ws, key=key)
                    # (cols dy^T)^T: BLAS runs this orientation markedly faster than dy cols^T.
                    dw_t = self._gemm(xp, cols.reshape(g, -1, lay.ncols), dy_g, None, trans_b=True)
                    self.blobs[0].diff += dw_t.transpose(0, 2, 1).reshape(self.blobs[0].shape)
                if dx_all is not None and flipped is not None:
                    # Stride 1: the input gradient is the top gradient, padded by extent - 1 - pad,
                    # convolved with the flipped, transposed filters: im2col + one product, no col2im.
                    lay_t = column_layout((stop - start, o) + self.out_spatial, back_geom, xp)
                    cols_t = im2col(dy_all[start:stop], lay_t, self.ws, key=("dycols", lay_t.x_shape[0]))
                    dxt = self.scratch.get("conv_dxt", (self.channels, lay_t.ncols), dy.dtype, xp)
                    self._gemm(xp, flipped, cols_t.reshape(g, -1, lay_t.ncols), dxt.reshape(g, -1, lay_t.ncols))
                    dx_all[start:stop] = lay_t.gather(dxt)
                elif dx_all is not None:
                    self._col2im_input_gradient(xp, w, dy_g, lay, dx_all[start:stop])
            self._cols_fresh[i] = False

    # ------------------------------------------------------------------------------------ cuDNN
    def _cudnn_shapes(self):
        """(x, y) shapes as cuDNN reads them: the leading axes before ``axis`` as one batch axis."""
        return ((self.num, self.channels) + self.in_spatial, (self.num, self.num_output) + self.out_spatial)

    def _forward_cudnn(self, bottom, top):
        x_shape, y_shape = self._cudnn_shapes()
        w = self.blobs[0].data
        for b, t in zip(bottom, top):
            y = t.data.reshape(y_shape)
            try:
                self._cudnn.forward(b.data.reshape(x_shape), w, y)
            except cudnn_plans.Unsupported as exc:
                return self._leave_cudnn(exc).forward(bottom, top)
            self._add_bias(y)

    def _leave_cudnn(self, exc):
        """cuDNN had no plan for these shapes: this layer runs netdef's own path from now on, and the
        log says why. Returns the layer, to run the call again."""
        self._cudnn_failure = f"cuDNN has no plan: {exc}"
        self.algorithm = self._choose_netdef_algorithm(backend.xp(), self.blobs[0].dtype)
        cudnn.log_path_once(self.name, f"netdef's {self.algorithm} path", self._cudnn_failure)
        return self

    _cudnn_failure = None  # why cuDNN could not run this layer, once it could not

    def _backward_cudnn(self, top, propagate_down, bottom):
        x_shape, y_shape = self._cudnn_shapes()
        try:
            # Every pair has the same shapes: planned once here, before any gradient is added to.
            self._cudnn.plan_backward(bottom[0].data.reshape(x_shape), top[0].diff.reshape(y_shape), self.blobs[0].data)
        except cudnn_plans.Unsupported as exc:
            return self._leave_cudnn(exc).backward(top, propagate_down, bottom)
        w = self.blobs[0].data
        want_w = self.param_propagate_down[0]
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.diff.reshape(y_shape)
            self._bias_gradient(dy.reshape(self.num, self.num_output, -1))
            if want_w:
                x = b.data.reshape(x_shape)
                dw, overwrite = self.blobs[0].diff_for_accumulation()
                if overwrite:
                    self._cudnn.weight_gradient(x, dy, dw)
                else:
                    # cuDNN's graphs write their output: a second pair of blobs (or a gradient
                    # already there) adds through a temporary.
                    part = self.scratch.get("cudnn_dw", dw.shape, dw.dtype, backend.get_array_module(dw))
                    self._cudnn.weight_gradient(x, dy, part)
                    dw += part
            if propagate_down[i]:
                self._cudnn.input_gradient(dy, w, b.diff_to_overwrite().reshape(x_shape))

    def _col2im_input_gradient(self, xp, w, dy_g, lay, dx):
        """dx (a chunk of samples) = col2im of dcols = W^T dY, dy_g the chunk's gradient as
        (group, num_output / group, output positions)."""
        dcols = self.scratch.get("conv_dcols", (lay.rows, lay.ncols), dy_g.dtype, xp)
        self._gemm(xp, w, dy_g, dcols.reshape(self.group, -1, lay.ncols), trans_a=True)
        col2im(dcols, lay, dx, self.scratch)

    def _add_bias(self, y):
        if self.bias_term:
            y += self.blobs[1].data.reshape((1, -1) + (1,) * self.num_spatial)

    def _bias_gradient(self, dy):
        """Adds sum over samples and positions of ``dy`` (num x O x S) to the bias gradient."""
        if self.bias_term and self.param_propagate_down[1]:
            # One compiled parallel pass (NumPy's sum ran on one core: 1.4 ms of SqueezeNet's first layer).
            elementwise.add_channel_sums(dy, self.blobs[1].diff)

    # ---- depthwise (group == channels): depthwise.py
    def _forward_depthwise(self, bottom, top):
        self._depthwise_products(bottom, top)
        for t in top:
            self._add_bias(t.data.reshape((self.num, self.num_output) + self.out_spatial))

    def _depthwise_products(self, bottom, top):
        w = self.blobs[0].data
        for b, t in zip(bottom, top):
            y = t.data.reshape((self.num, self.num_output) + self.out_spatial)
            depthwise.forward(b.data.reshape((self.num, self.channels) + self.in_spatial), w, self.geom, y,
                              self.scratch)

    def _depthwise_mapped(self, b, t, channel_map) -> bool:
        """The depthwise products with ``channel_map`` applied as each block is written, where
        depthwise.forward_mapped computes them (False: nothing written)."""
        return depthwise.forward_mapped(b.data.reshape((self.num, self.channels) + self.in_spatial), self.blobs[0].data,
                                        self.geom, t.data.reshape((self.num, self.num_output) + self.out_spatial),
                                        channel_map, self.scratch)

    def _backward_depthwise(self, top, propagate_down, bottom):
        w = self.blobs[0].data
        for b, t, down in zip(bottom, top, propagate_down):
            dy = t.diff.reshape((self.num, self.num_output) + self.out_spatial)
            self._bias_gradient(dy.reshape(self.num, self.num_output, -1))
            if self.param_propagate_down[0]:
                x = b.data.reshape((self.num, self.channels) + self.in_spatial)
                depthwise.backward_weights(x, dy, self.geom, self.blobs[0].diff, self.scratch)
            if down:
                depthwise.backward_data(dy, w, self.geom, b.diff.reshape((self.num, self.channels) + self.in_spatial),
                                        self.scratch)

    # ---- pointwise (1x1, no padding, one group): per-sample products on (C x S) matrices, or, on small
    # planes, one product for the batch on channel-major copies (N x C x S -> C x N*S). With strides,
    # the products read a copy of the pixels the strides pick (im2col.strided_pixels), made again for
    # backward (the bottom's values then, as Caffe reads them), and the input gradient is spread back
    # over the map with zeros between. The column path ran ResNet-50's stride-2 projections at 70-220
    # GFLOP/s: its im2col copied the picked pixels on one core, and the products went through the
    # column matrix's layout.
    def _pointwise_stacked(self) -> bool:
        return self.num > 1 and math.prod(self.out_spatial) < POINTWISE_STACK_BELOW_PIXELS

    def _channel_major(self, a, key):
        """A (K x N x S) copy of the (N x K x S) array ``a``, in scratch ``key``."""
        xp = backend.get_array_module(a)
        out = self.scratch.get(key, (a.shape[1], a.shape[0], a.shape[2]), a.dtype, xp)
        xp.copyto(out, a.transpose(1, 0, 2))
        return out

    def _forward_pointwise(self, bottom, top):
        self._pointwise_products(bottom, top)
        for t in top:
            self._add_bias(t.data.reshape((self.num, self.num_output) + self.out_spatial))

    def _pointwise_strided(self) -> bool:
        return any(s != 1 for s in self.geom.stride)

    def _pointwise_input(self, data):
        """The input as the products read it, (N x C x S_out): as it is, or the strides' pixels copied."""
        if not self._pointwise_strided():
            return data.reshape(self.num, self.channels, -1)
        xp = backend.get_array_module(data)
        picked = self.scratch.get("pointwise_picked", (self.num, self.channels) + self.out_spatial, data.dtype, xp)
        strided_pixels(data.reshape((self.num, self.channels) + self.in_spatial), self.geom.stride, picked)
        return picked.reshape(self.num, self.channels, -1)

    def _pointwise_products(self, bottom, top, channel_map=None) -> bool:
        """The products into the tops; with ``channel_map`` and one top, mapped as each panel is
        computed where matmul_row_mapped can (the output channels are the products' rows). Whether
        the top was mapped (False: nothing is, the caller maps it)."""
        xp = backend.get_array_module(bottom[0].data)
        w = self.blobs[0].data.reshape(self.num_output, self.channels)
        mapped = channel_map is not None and len(top) == 1
        for b, t in zip(bottom, top):
            x = self._pointwise_input(b.data)
            y = t.data.reshape(self.num, self.num_output, -1)
            if not self._pointwise_stacked():
                if not (mapped and matmul_row_mapped(w, x, y, channel_map)):
                    matmul(w, x, out=y)
                    mapped = False
                continue
            yt = self.scratch.get("pointwise_yt", (self.num_output,) + x.shape[::2], x.dtype, xp)
            xt = self._channel_major(x, "pointwise_xt").reshape(self.channels, -1)
            if not (mapped and matmul_row_mapped(w, xt, yt.reshape(self.num_output, -1), channel_map)):
                matmul(w, xt, out=yt.reshape(self.num_output, -1))
                mapped = False
            xp.copyto(y, yt.transpose(1, 0, 2))
        return mapped

    def _backward_pointwise(self, top, propagate_down, bottom):
        xp = backend.get_array_module(top[0].diff)
        w = self.blobs[0].data.reshape(self.num_output, self.channels)
        stacked = self._pointwise_stacked()
        for b, t, down in zip(bottom, top, propagate_down):
            dy = t.diff.reshape(self.num, self.num_output, -1)
            self._bias_gradient(dy)
            x = self._pointwise_input(b.data)
            dyt = self._channel_major(dy, "pointwise_dyt").reshape(self.num_output, -1) if stacked else None
            if self.param_propagate_down[0]:
                # Right after the solver's clear the first product is written into the gradient itself
                # (what adding it to zeros gives), without the passes that zero it and read it back.
                diff, overwrite = self.blobs[0].diff_for_accumulation()
                dw = diff.reshape(self.num_output, self.channels)
                part = self.scratch.get("pointwise_dw", dw.shape, dw.dtype, xp)
                if stacked:
                    # One (O x N*S)(N*S x C) product: the sum over the batch's pixels in one pass.
                    matmul(dyt, self._channel_major(x, "pointwise_xt").reshape(self.channels, -1).T,
                           out=dw if overwrite else part)
                    if not overwrite:
                        dw += part
                else:
                    for n in range(self.num):
                        # One product per sample: (O x S)(S x C) needs no copy of either operand.
                        first = overwrite and n == 0
                        matmul(dy[n], x[n].T, out=dw if first else part)
                        if not first:
                            dw += part
            if down:
                # With strides, into the buffer of the picked pixels (which the weight gradient has used)
                dx = x if self._pointwise_strided() else b.diff.reshape(x.shape)
                if stacked:  # into the buffer of x's channel-major copy, which the weight gradient has used
                    dxt = self.scratch.get("pointwise_xt", (self.channels,) + x.shape[::2], x.dtype, xp)
                    matmul(w.T, dyt, out=dxt.reshape(self.channels, -1))
                    xp.copyto(dx, dxt.transpose(1, 0, 2))
                else:
                    matmul(w.T, dy, out=dx)
                if self._pointwise_strided():
                    spread_strided(dx.reshape((self.num, self.channels) + self.out_spatial), self.geom.stride,
                                   b.diff.reshape((self.num, self.channels) + self.in_spatial))

    # ---- direct (direct.py): register-blocked kernels over the padded input, NumPy float arrays
    def _plan_direct(self, dtype):
        key = (self.num, self.in_spatial, np.dtype(dtype))
        if getattr(self, "_direct_key", None) != key:
            self._direct = direct.DirectConvolution(self.geom, self.num, self.channels, self.num_output,
                                                    self.group, self.in_spatial, self.out_spatial, dtype)
            self._direct_key = key

    def _forward_direct(self, bottom, top):
        bias = self.blobs[1].data if self.bias_term else None
        for b, t in zip(bottom, top):
            self._direct.forward(b.data.reshape((self.num, self.channels) + self.in_spatial), self.blobs[0].data,
                                 bias, t.data.reshape((self.num, self.num_output) + self.out_spatial), self.scratch)

    def _direct_weight_gradient(self, x, dy):
        """The direct kernels' weight gradient of x and dy into the weights' diff: written right after
        the solver's deferred clear (what adding it to zeros gives), added otherwise."""
        dw, overwrite = self.blobs[0].diff_for_accumulation()
        self._direct.weight_gradient(x, dy, dw, self.scratch, overwrite=overwrite)

    def _backward_direct(self, top, propagate_down, bottom):
        w = self.blobs[0].data
        for b, t, down in zip(bottom, top, propagate_down):
            x = b.data.reshape((self.num, self.channels) + self.in_spatial)
            dy = t.diff.reshape((self.num, self.num_output) + self.out_spatial)
            self._bias_gradient(dy.reshape(self.num, self.num_output, -1))
            if self.param_propagate_down[0]:
                self._direct_weight_gradient(x, dy)
            if not down:
                continue
            dx = b.diff.reshape(x.shape)
            if self.direct_input_gradient == "direct":
                self._direct.input_gradient(dy, w, dx, self.scratch)
                continue
            weights = self._weights()
            for start, stop, lay in self._chunks(np, self.channels, self.in_spatial, dy.dtype):
                dy_cols = lay.buffer(self.ws, ("dy", lay.x_shape[0]), self.num_output, dy.dtype, np)
                lay.scatter(dy_cols, dy[start:stop])
                self._col2im_input_gradient(np, weights, dy_cols.reshape(self.group, self.num_output // self.group, -1),
                                            lay, dx[start:stop])

    # ---- the CPU row-product path (im2col.RowPlan): stride-1 2-D convolutions, one group
    def _rows_eligible(self, xp) -> bool:
        g = self.geom
        # The input gradient is the convolution of the padded top gradient with the flipped filters,
        # which needs pad <= extent - 1 (a larger pad only adds outputs that read nothing but padding).
        # With few input channels (a first layer) the channel-last copies of this path cost more than
        # the products save: the column path is faster there.
        return (not _cols.use_kernels(xp) and _cols.ROW_PRODUCTS and self.num_spatial == 2 and self.group == 1
                and g.stride == (1, 1) and all(p <= e - 1 for p, e in zip(g.pad, g.extent))
                and g.kernel[1] * self.channels >= _cols.ROW_MIN_WIDTH)

    def _choose_rows_input_gradient(self) -> str:
        """The row path's input gradient: "convolution" (the top gradient padded by extent - 1 - pad,
        convolved with the flipped filters: no scatter) or "col2im" (see ROW_COL2IM_ABOVE and
        ROW_COL2IM_CHANNELS). Made once the shapes are known, from them alone, so a resumed run takes the
        same path and gets the same bits."""
        if (math.prod(self.in_spatial) > ROW_COL2IM_ABOVE * math.prod(self.out_spatial)
                or self.channels < ROW_COL2IM_CHANNELS):
            return "col2im"
        return "convolution"

    def _row_chunks(self, dtype):
        """(start, stop, plan, backward plan) for the sample ranges processed together: as many
        samples as keep the expanded rows near ROW_BUDGET bytes, in near-equal chunks."""
        key = (self.num, self.in_spatial, np.dtype(dtype), _cols.ROW_FOLD_BELOW, ROW_BUDGET, self.rows_input_gradient)
        if getattr(self, "_row_key", None) != key:
            geom = self.geom
            back = Geometry(geom.kernel, geom.stride, tuple(e - 1 - p for p, e in zip(geom.pad, geom.extent)),
                            geom.dilation)
            one = row_plan(1, self.channels, self.in_spatial, geom)
            one_back = row_plan(1, self.num_output, self.out_spatial, back)
            if self.rows_input_gradient == "col2im":
                back_cells = math.prod(self.out_spatial) * geom.kernel_count * self.channels  # dcols
            else:
                back_cells = one_back.q_cells_per_sample
            per_sample = max(one.q_cells_per_sample, back_cells) * np.dtype(dtype).itemsize
            size = max(1, min(self.num, ROW_BUDGET // max(1, per_sample)))
            count = -(-self.num // size)
            size = -(-self.num // count)
            plans = {}
            chunks = []
            for start in range(0, self.num, size):
                n = min(self.num, start + size) - start
                if n not in plans:
                    plans[n] = (row_plan(n, self.channels, self.in_spatial, geom),
                                row_plan(n, self.num_output, self.out_spatial, back))
                chunks.append((start, start + n) + plans[n])
            self._row_key, self._row_chunk_list = key, chunks
        return self._row_chunk_list

    def _forward_rows(self, bottom, top):
        o = self.num_output
        ho, wo = self.out_spatial
        chunks = self._row_chunks(bottom[0].dtype)
        wq = row_weights(self.blobs[0].data, chunks[0][2].fold)
        bias = self.blobs[1].data if self.bias_term else None
        self._cols_fresh.clear()
        for i, (b, t) in enumerate(zip(bottom, top)):
            x = b.data.reshape((self.num, self.channels) + self.in_spatial)
            y_all = t.data.reshape((self.num, o) + self.out_spatial)
            for start, stop, plan, _ in chunks:
                n = stop - start
                q = rows_expanded(x[start:stop], plan, self.ws, ("rows", "q", i, n))
                y = self.scratch.get("rows_y", (ho * n * wo, o), x.dtype, np)
                row_product(q, wq, plan, y, self.scratch)
                copy_from_rows(y.reshape(ho, n, wo, o), y_all[start:stop], bias)
            # The last chunk's rows stay in the workspace: backward starts with that chunk.
            self._rows_last[i] = q

    def _backward_rows(self, top, propagate_down, bottom):
        o, c = self.num_output, self.channels
        (h, w), (ho, wo) = self.in_spatial, self.out_spatial
        want_w = self.param_propagate_down[0]
        want_b = self.bias_term and self.param_propagate_down[1]
        dtype = top[0].diff.dtype
        chunks = self._row_chunks(dtype)
        wt = wcols = None
        if any(propagate_down) and self.rows_input_gradient == "col2im":
            # dcols = dY W: W as (kh*kw*C x O), read transposed by the product.
            wcols = row_weights(self.blobs[0].data, self.geom.kernel[0]).reshape(-1, o)
        elif any(propagate_down):
            # The backward convolution's filters: W'[c, o, i, j] = W[o, c, kh-1-i, kw-1-j].
            flipped = self.blobs[0].data[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
            wt = row_weights(flipped, chunks[0][3].fold)
        for i, (b, t) in enumerate(zip(bottom, top)):
            last = self._rows_last.pop(i, None)
            if not (want_w or want_b or propagate_down[i]):
                continue
            dy_all = t.diff.reshape((self.num, o) + self.out_spatial)
            if want_b:
                elementwise.add_channel_sums(dy_all.reshape(self.num, o, -1), self.blobs[1].diff)
            x = b.data.reshape((self.num, c) + self.in_spatial)
            rows_w = want_w and not self.direct_weight_gradient
            if want_w and self.direct_weight_gradient:
                self._direct_weight_gradient(x, dy_all)
            if not (rows_w or propagate_down[i]):
                continue
            dx_all = b.diff.reshape(x.shape) if propagate_down[i] else None
            dwq = None
            for k, (start, stop, plan, plan_back) in enumerate(reversed(chunks)):
                n = stop - start
                dy_rows = self.scratch.get("rows_dy", (ho * n * wo, o), dtype, np)
                copy_to_rows(dy_all[start:stop], dy_rows.reshape(ho, n, wo, o))
                if rows_w:
                    if k == 0 and last is not None:
                        q = last
                    else:
                        q = rows_expanded(x[start:stop], plan, self.ws, ("rows", "q", i, n))
                    # The first chunk's product is the sum the others add to.
                    target = self.scratch.get("rows_dw_sum" if dwq is None else "rows_dw_part",
                                         (plan.products, plan.width, o), dtype, np)
                    part = row_weight_product(q, dy_rows, plan, target)
                    if dwq is None:
                        dwq = part
                    else:
                        dwq += part
                if dx_all is not None and wcols is not None:
                    dcols = self.scratch.get("rows_dcols", (ho * n * wo, wcols.shape[0]), dtype, np)
                    matmul(dy_rows, wcols.T, out=dcols)
                    row_col2im(dcols, plan, dx_all[start:stop])
                elif dx_all is not None:
                    qt = rows_expanded(dy_all[start:stop], plan_back, self.scratch, "rows_qt")
                    dx = self.scratch.get("rows_dx", (h * n * w, c), dtype, np)
                    row_product(qt, wt, plan_back, dx, self.scratch)
                    copy_from_rows(dx.reshape(h, n, w, c), dx_all[start:stop])
            if dwq is not None:
                add_row_weight_grad(dwq, self.blobs[0].diff)

    def _backward_data_geometry(self):
        """For stride-1 convolutions whose pad is at most extent - 1: the geometry of the convolution
        that maps the top gradient to the bottom gradient (pad extent - 1 - pad); None where col2im
        is used instead."""
        geom = self.geom
        if any(s != 1 for s in geom.stride) or any(p > e - 1 for p, e in zip(geom.pad, geom.extent)):
            return None
        # Worth it only when its column matrix (num_output rows per offset, over the input positions)
        # is no larger than the one col2im would sum (C rows per offset, over the output positions).
        if self.num_output * math.prod(self.in_spatial) > self.channels * math.prod(self.out_spatial):
            return None
        return Geometry(geom.kernel, geom.stride, tuple(e - 1 - p for p, e in zip(geom.pad, geom.extent)),
                        geom.dilation)

    def _flipped_weights(self, xp):
        """The filters as (group, C/group, num_output/group * prod(K)), spatially reversed: the
        weights of the backward-data convolution."""
        g, o, c = self.group, self.num_output, self.channels
        w = self.blobs[0].data.reshape((g, o // g, c // g) + self.geom.kernel)
        w = w[(slice(None),) * 3 + (slice(None, None, -1),) * self.num_spatial]
        return xp.ascontiguousarray(xp.swapaxes(w, 1, 2)).reshape(g, c // g, -1)


@register_layer("Deconvolution")
class DeconvolutionLayer(_ConvolutionBase):
    """Deconvolution (transposed convolution), Caffe's DeconvolutionLayer: the forward pass is a
    convolution's backward pass with respect to its input.

    bottom[i]: (N x C x H x W).
    top[i]:    (N x num_output x H_out x W_out), H_out = stride_h (H - 1) + dilation_h (kernel_h - 1) + 1
               - 2 pad_h (likewise W).
    blobs:     weight (C x num_output/group x kernel_h x kernel_w); bias (num_output) if bias_term.

    y = b + col2im(W^T x) per group, where x is read as (C x N*H*W).
    """

    reverse = True

    def forward(self, bottom, top):
        xp = backend.get_array_module(bottom[0].data)
        c, g = self.channels, self.group
        w = self._weights()
        # The columns live in the space of the output (this layer's output is a convolution's input).
        chunks = self._chunks(xp, self.num_output, self.out_spatial, bottom[0].dtype)
        for b, t in zip(bottom, top):
            x = b.data.reshape((self.num, c) + self.in_spatial)
            y_all = t.data.reshape((self.num, self.num_output) + self.out_spatial)
            for start, stop, lay in chunks:
                xt = lay.buffer(self.ws, ("xt", lay.x_shape[0]), c, x.dtype, xp)
                lay.scatter(xt, x[start:stop])
                cols = self.scratch.get("deconv_cols", (lay.rows, lay.ncols), x.dtype, xp)
                self._gemm(xp, w, xt.reshape(g, c // g, -1), cols.reshape(g, -1, lay.ncols), trans_a=True)
                col2im(cols, lay, y_all[start:stop], self.scratch)
            if self.bias_term:
                y_all += self.blobs[1].data.reshape((1, -1) + (1,) * self.num_spatial)

    def backward(self, top, propagate_down, bottom):
        xp = backend.get_array_module(top[0].diff)
        c, g = self.channels, self.group
        w = self._weights()
        want_w = self.param_propagate_down[0]
        want_b = self.bias_term and self.param_propagate_down[1]
        chunks = self._chunks(xp, self.num_output, self.out_spatial, top[0].diff.dtype)
        for b, t, down in zip(bottom, top, propagate_down):
            if not (want_w or want_b or down):
                continue
            dy_all = t.diff.reshape((self.num, self.num_output) + self.out_spatial)
            if want_b:
                elementwise.add_channel_sums(dy_all.reshape(self.num, self.num_output, -1), self.blobs[1].diff)
            if not (want_w or down):
                continue
            x = b.data.reshape((self.num, c) + self.in_spatial)
            dx_all = b.diff.reshape(x.shape) if down else None
            for start, stop, lay in chunks:
                dcols = im2col(dy_all[start:stop], lay, self.ws, key=("dcols", lay.x_shape[0]))
                dcols_g = dcols.reshape(g, -1, lay.ncols)
                if want_w:
                    xt = lay.buffer(self.ws, ("xt", lay.x_shape[0]), c, x.dtype, xp)
                    lay.scatter(xt, x[start:stop])
                    dw_t = self._gemm(xp, dcols_g, xt.reshape(g, c // g, -1), None, trans_b=True)
                    self.blobs[0].diff += dw_t.transpose(0, 2, 1).reshape(self.blobs[0].shape)
                if dx_all is not None:
                    dxt = self.scratch.get("deconv_dxt", (c, lay.ncols), dcols.dtype, xp)
                    self._gemm(xp, w, dcols_g, dxt.reshape(g, c // g, -1))
                    dx_all[start:stop] = lay.gather(dxt)


@register_layer("Im2col")
class Im2colLayer(Layer):
    """Caffe's Im2colLayer: the column matrix of each sample as an image.

    bottom: (N x C x H x W) (or any leading axes before ``axis``, any number of spatial axes).
    top:    (N x C*kernel_h*kernel_w x H_out x W_out), output sizes as Convolution's;
            top[n, (c*kh + i)*kw + j, ho, wo] = x_pad[n, c, ho*stride_h + i*dilation_h, wo*stride_w + j*dilation_w].
    Uses convolution_param's kernel/stride/pad/dilation (num_output is ignored).
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        cp = self.layer_param.convolution_param
        self.channel_axis = bottom[0].canonical_axis(cp.axis)
        self.num_spatial = bottom[0].num_axes - self.channel_axis - 1
        if self.num_spatial < 1:
            raise self.error(f"needs at least one spatial axis after the channel axis; bottom {bottom[0].shape}")
        self.geom = conv_geometry(self, cp, self.num_spatial)
        self.ws = Workspace()

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        ca = self.channel_axis
        if len(shape) != ca + 1 + self.num_spatial:
            raise self.error(f"bottom num_axes may not change (now {shape})")
        self.num = math.prod(shape[:ca])
        self.channels = shape[ca]
        self.in_spatial = tuple(shape[ca + 1:])
        self.out_spatial = self.geom.conv_out(self.in_spatial)
        if any(o <= 0 for o in self.out_spatial):
            raise self.error(f"output size {self.out_spatial} is not positive for input {self.in_spatial}")
        top[0].reshape(shape[:ca] + (self.channels * self.geom.kernel_count,) + self.out_spatial)

    def _layout(self, xp):
        key = (xp, self.num, self.channels, self.in_spatial)
        if getattr(self, "_layout_key", None) != key:
            self._layout_key = key
            self._layout_value = column_layout((self.num, self.channels) + self.in_spatial, self.geom, xp)
        return self._layout_value

    def forward(self, bottom, top):
        lay = self._layout(backend.get_array_module(bottom[0].data))
        cols = im2col(bottom[0].data.reshape(lay.x_shape), lay, self.ws)
        top[0].data.reshape((self.num, lay.rows) + self.out_spatial)[...] = lay.gather(cols)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = backend.get_array_module(top[0].diff)
        lay = self._layout(xp)
        dcols = lay.buffer(self.ws, "dcols", lay.rows, top[0].diff.dtype, xp)
        lay.scatter(dcols, top[0].diff.reshape((self.num, lay.rows) + self.out_spatial))
        col2im(dcols, lay, bottom[0].diff.reshape(lay.x_shape), self.ws)


# Pooling and LRN have modules of their own; their public names are read here too.
__all__ = ["ConvolutionLayer", "DeconvolutionLayer", "Im2colLayer", "conv_geometry", "LRNLayer", "lrn_across_backward",
           "lrn_across_forward", "lrn_within_backward", "lrn_within_forward", "Pool2D", "ave_pool_backward",
           "ave_pool_forward", "max_mask_flat", "max_pool_backward", "max_pool_forward", "pool_output_size",
           "pooled_shape", "PoolingLayer", "SPPLayer"]
from .lrn import LRNLayer, lrn_across_backward, lrn_across_forward, lrn_within_backward, lrn_within_forward  # noqa: E402,F401
from .pool2d import (Pool2D, ave_pool_backward, ave_pool_forward, max_mask_flat, max_pool_backward,  # noqa: E402,F401
                     max_pool_forward, pool_output_size, pooled_shape)
from .pooling import PoolingLayer, SPPLayer  # noqa: E402,F401
