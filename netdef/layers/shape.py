"""Layers that combine, split, reshape or select blobs: Eltwise, Concat, Slice, Split, Flatten,
Reshape, Crop, Silence, Tile, Reduction, Filter, BatchReindex (Caffe semantics)."""
from __future__ import annotations

import math

import numpy as np

from ..backend import get_array_module, to_host
from ..proto import netdef_pb2 as pb
from . import elementwise, fusion
from .base import Layer, register_layer
from .reused import ReusedArrays

_Elt = pb.EltwiseParameter
_Red = pb.ReductionParameter


def _canonical(layer: Layer, axis: int, n: int) -> int:
    if not -n <= axis < max(n, 1):
        raise layer.error(f"axis {axis} out of range for an input of {n} axes")
    return axis + n if axis < 0 else axis


def _no_in_place(layer: Layer, bottom, top) -> None:
    for t in top:
        if any(t is b for b in bottom):
            raise layer.error("does not allow in-place computation")


# ---------------------------------------------------------------------------------------------
@register_layer("Eltwise")
class EltwiseLayer(Layer):
    """Element-wise combination of K >= 2 inputs of the same shape.

    bottom[k]: x_k, all of one shape
    top[0]:    same shape; SUM: y = sum_k c_k x_k (c_k = coeff, 1 by default);
               PROD: y = prod_k x_k; MAX: y = max_k x_k
    MAX sends the gradient to one argmax, Caffe's: x_0 wins over x_1 only when strictly greater,
    every later x_k only when strictly greater than the running max. PROD's gradient is the
    product of the other inputs (stable_prod_grad) or y / x_k.
    """

    min_bottom = 2
    exact_num_top = 1

    def replayable(self) -> bool:
        return True

    def setup(self, bottom, top):
        p = self.layer_param.eltwise_param
        self.op = p.operation
        if p.coeff and len(p.coeff) != len(bottom):
            raise self.error(f"takes one coefficient per bottom blob ({len(bottom)}), got {len(p.coeff)}")
        if self.op == _Elt.PROD and p.coeff:
            raise self.error("takes coefficients only for summation")
        self.coeff = list(p.coeff) if p.coeff else [1.0] * len(bottom)
        self.stable_prod_grad = p.stable_prod_grad
        self._outputs = ReusedArrays()

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != bottom[0].shape:
                raise self.error(f"bottom {i} has shape {b.shape}, bottom 0 has {bottom[0].shape}")
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        xs = [b.data for b in bottom]
        out = self._outputs.get("top", like=xs[0], avoid=xs)
        if self.op == _Elt.SUM:
            elementwise.weighted_sum(xs, self.coeff, out)
        elif self.op == _Elt.PROD:
            elementwise.product(xs, out)
        else:
            self._mask = self._outputs.get("mask", like=xs[0], dtype=np.int32)
            elementwise.maximum(xs, out, self._mask)
        # The inputs, kept for PROD's gradient: nothing writes into them (in place, the top's new
        # array replaces bottom 0's in the blob).
        self._xs = xs
        top[0].data = out

    def forward_mapped(self, bottom, top, channel_map):
        # A sum and a ReLU after it (ResNet's shortcuts) in one pass; no state for backward.
        if self.op != _Elt.SUM:
            return False
        xs = [b.data for b in bottom]
        out = self._outputs.get("top", like=xs[0], avoid=xs)
        top[0].data = fusion.weighted_sum_mapped(xs, self.coeff, channel_map, out)
        return True

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff
        wanted = [k for k in range(len(bottom)) if propagate_down[k]]
        if self.op == _Elt.SUM:
            # A coefficient of 1 passes dy itself on: no layer writes into an array it did not make.
            grads = {k: dy if self.coeff[k] == 1 else
                     elementwise.weighted_sum([dy], [self.coeff[k]], self._diff_array(k, dy)) for k in wanted}
        else:
            outs = {k: self._diff_array(k, dy) for k in wanted}
            if self.op == _Elt.PROD:
                grads = elementwise.product_gradients(self._xs, dy, self.stable_prod_grad, outs)
            else:
                grads = elementwise.maximum_gradients(dy, self._mask, outs)
        for k, g in grads.items():
            bottom[k].diff = g

    def _diff_array(self, k: int, dy):
        return self._outputs.get(f"bottom_diff_{k}", like=dy, avoid=[dy, *self._xs])


# ---------------------------------------------------------------------------------------------
def _axis_or_legacy_dim(layer, param, legacy_field: str, num_axes: int) -> int:
    """Concat's and Slice's axis: ``axis`` (negative counts from the end) or the legacy non-negative
    ``concat_dim``/``slice_dim``, never both."""
    if param.HasField(legacy_field):
        if param.HasField("axis"):
            raise layer.error(f"give either axis or {legacy_field}, not both")
        axis = int(getattr(param, legacy_field))
        if axis >= num_axes:
            raise layer.error(f"{legacy_field} {axis} out of range for {num_axes} axes")
        return axis
    return _canonical(layer, param.axis, num_axes)


@register_layer("Concat")
class ConcatLayer(Layer):
    """Concatenates inputs along one axis.

    bottom[k]: shapes equal except along ``axis`` (legacy ``concat_dim``), sizes d_k there
    top[0]:    the concatenation, size sum_k d_k along ``axis``
    """

    min_bottom = 1
    exact_num_top = 1

    def replayable(self) -> bool:
        return True

    def _axis(self, bottom):
        return _axis_or_legacy_dim(self, self.layer_param.concat_param, "concat_dim", bottom[0].num_axes)

    def reshape(self, bottom, top):
        _no_in_place(self, bottom, top)
        axis = self._axis(bottom)
        ref = list(bottom[0].shape)
        total = 0
        for i, b in enumerate(bottom):
            shape = list(b.shape)
            if len(shape) != len(ref) or shape[:axis] + shape[axis + 1:] != ref[:axis] + ref[axis + 1:]:
                raise self.error(f"bottom {i} of shape {b.shape} does not match bottom 0 {bottom[0].shape} "
                                 f"outside axis {axis}")
            total += shape[axis]
        self._axis_index = axis
        self._sizes = [b.shape[axis] for b in bottom]
        ref[axis] = total
        top[0].reshape(ref)
        if len(bottom) == 1:
            top[0].share_data(bottom[0])

    def forward(self, bottom, top):
        if len(bottom) == 1:
            top[0].share_data(bottom[0])
            return
        xp = get_array_module(bottom[0].data)
        top[0].data = xp.concatenate([b.data for b in bottom], axis=self._axis_index)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff
        if len(bottom) == 1:
            if propagate_down[0]:
                bottom[0].diff = dy
            return
        index = [slice(None)] * dy.ndim
        start = 0
        for k, size in enumerate(self._sizes):
            if propagate_down[k]:
                index[self._axis_index] = slice(start, start + size)
                bottom[k].diff = dy[tuple(index)].copy()
            start += size


@register_layer("Slice")
class SliceLayer(Layer):
    """Slices the input along one axis into several tops.

    bottom[0]: x with size D along ``axis`` (legacy ``slice_dim``)
    top[k]:    x[..., p_{k-1}:p_k, ...] with p = (0, slice_point..., D); without slice points
               D is split evenly over the tops (D must be divisible)
    """

    exact_num_bottom = 1
    min_top = 1

    def _axis(self, bottom):
        return _axis_or_legacy_dim(self, self.layer_param.slice_param, "slice_dim", bottom[0].num_axes)

    def reshape(self, bottom, top):
        _no_in_place(self, bottom, top)
        axis = self._axis(bottom)
        dim = bottom[0].shape[axis]
        points = list(self.layer_param.slice_param.slice_point)
        if points:
            if len(points) != len(top) - 1:
                raise self.error(f"{len(top)} tops need {len(top) - 1} slice points, got {len(points)}")
            bounds = [0] + points + [dim]
            sizes = [bounds[k + 1] - bounds[k] for k in range(len(top))]
            if any(s <= 0 for s in sizes):
                raise self.error(f"slice points {points} must increase strictly within (0, {dim})")
        else:
            if dim % len(top):
                raise self.error(f"cannot split size {dim} of axis {axis} evenly into {len(top)} tops")
            sizes = [dim // len(top)] * len(top)
        self._axis_index = axis
        self._sizes = sizes
        for t, size in zip(top, sizes):
            shape = list(bottom[0].shape)
            shape[axis] = size
            t.reshape(shape)
        if len(top) == 1:
            top[0].share_data(bottom[0])

    def forward(self, bottom, top):
        x = bottom[0].data
        if len(top) == 1:
            top[0].share_data(bottom[0])
            return
        index = [slice(None)] * x.ndim
        start = 0
        for t, size in zip(top, self._sizes):
            index[self._axis_index] = slice(start, start + size)
            t.data = x[tuple(index)].copy()
            start += size

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if len(top) == 1:
            bottom[0].diff = top[0].diff
            return
        xp = get_array_module(top[0].diff)
        bottom[0].diff = xp.concatenate([t.diff for t in top], axis=self._axis_index)


@register_layer("Split")
class SplitLayer(Layer):
    """Copies one input to several consumers (the tops share the bottom's data array).

    bottom[0]: x
    top[k]:    x (same array); backward: dx = sum_k dy_k
    """

    exact_num_bottom = 1
    min_top = 1

    def replayable(self) -> bool:
        return True

    def setup(self, bottom, top):
        self._outputs = ReusedArrays()

    def reshape(self, bottom, top):
        _no_in_place(self, bottom, top)
        for t in top:
            t.reshape(bottom[0].shape)
            t.share_data(bottom[0])

    def forward(self, bottom, top):
        # Re-share: an earlier layer may have replaced the bottom's array since reshape.
        for t in top:
            t.share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dys = [t.diff for t in top]
        if len(dys) == 1:
            bottom[0].diff = dys[0]  # passed on: no layer writes into an array it did not make
            return
        total = self._outputs.get("bottom_diff", like=dys[0], avoid=dys)
        bottom[0].diff = elementwise.weighted_sum(dys, [1.0] * len(dys), total)


@register_layer("Flatten")
class FlattenLayer(Layer):
    """Merges the axes axis..end_axis into one (a view, no copy).

    bottom[0]: d_0 x ... x d_{n-1}
    top[0]:    d_0 x ... x d_{axis-1} x (d_axis * ... * d_end) x d_{end+1} x ... x d_{n-1}
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def replayable(self) -> bool:
        return True

    def reshape(self, bottom, top):
        _no_in_place(self, bottom, top)
        p = self.layer_param.flatten_param
        shape = bottom[0].shape
        start = _canonical(self, p.axis, len(shape))
        end = _canonical(self, p.end_axis, len(shape))
        top[0].reshape(tuple(shape[:start]) + (math.prod(shape[start:end + 1]),) + tuple(shape[end + 1:]))
        top[0].share_data(bottom[0])

    def forward(self, bottom, top):
        top[0].share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff = top[0].diff.reshape(bottom[0].shape)


@register_layer("Reshape")
class ReshapeLayer(Layer):
    """Changes the shape without copying (a view).

    bottom[0]: d_0 x ... x d_{n-1}
    top[0]:    the axes [axis, axis + num_axes) (num_axes -1: to the end) replaced by ``shape``,
               where a 0 copies the bottom's dim at that position and one -1 is inferred
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        _no_in_place(self, bottom, top)
        dims = list(self.layer_param.reshape_param.shape.dim)
        if dims.count(-1) > 1:
            raise self.error("new shape contains multiple -1 dims; at most one may be given")
        if any(d < -1 for d in dims):
            raise self.error(f"invalid dims {dims}: each must be >= -1")
        self._dims = dims

    def reshape(self, bottom, top):
        p = self.layer_param.reshape_param
        bshape = list(bottom[0].shape)
        n = len(bshape)
        start = p.axis if p.axis >= 0 else n + p.axis + 1
        if not 0 <= start <= n:
            raise self.error(f"axis {p.axis} out of range for {n} axes")
        if p.num_axes < -1:
            raise self.error(f"num_axes must be >= -1, got {p.num_axes}")
        end = n if p.num_axes == -1 else start + p.num_axes
        if end > n:
            raise self.error(f"axis {start} + num_axes {p.num_axes} exceeds {n} axes")
        new = list(self._dims)
        for i, d in enumerate(new):
            if d == 0:
                if start + i >= n:
                    raise self.error(f"dim {i} is 0 (copy) but the bottom has no axis {start + i}")
                new[i] = bshape[start + i]
        shape = bshape[:start] + new + bshape[end:]
        count = bottom[0].count
        if -1 in new:
            known = math.prod(d for d in shape if d != -1)
            if known == 0 or count % known:
                raise self.error(f"cannot infer the -1 dim of {shape} for {count} elements")
            shape[start + new.index(-1)] = count // known
        if math.prod(shape) != count:
            raise self.error(f"shape {shape} has {math.prod(shape)} elements, the bottom {bshape} has {count}")
        top[0].reshape(shape)
        top[0].share_data(bottom[0])

    def forward(self, bottom, top):
        top[0].share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff = top[0].diff.reshape(bottom[0].shape)


@register_layer("Crop")
class CropLayer(Layer):
    """Crops the first input to the shape of the second from ``axis`` on.

    bottom[0]: x, the data
    bottom[1]: a reference whose dims from ``axis`` on give the top's (shape only; no gradient)
    top[0]:    x[..., o_a : o_a + r_a, ...] for each axis a >= axis, offsets o (none: 0; one: the
               same for every axis; else one per axis from ``axis``)
    """

    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def setup(self, bottom, top):
        p = self.layer_param.crop_param
        n = bottom[0].num_axes
        if bottom[1].num_axes != n:
            raise self.error(f"inputs must have the same number of axes ({n} vs {bottom[1].num_axes})")
        self._start = _canonical(self, p.axis, n)
        if len(p.offset) > 1 and self._start + len(p.offset) != n:
            raise self.error(f"{len(p.offset)} offsets given, axes {self._start}..{n - 1} need {n - self._start}")

    def reshape(self, bottom, top):
        p = self.layer_param.crop_param
        shape = list(bottom[0].shape)
        window = []
        for i in range(len(shape)):
            offset = 0
            if i >= self._start:
                if len(p.offset) == 1:
                    offset = p.offset[0]
                elif len(p.offset) > 1:
                    offset = p.offset[i - self._start]
                size = bottom[1].shape[i]
                if bottom[0].shape[i] - offset < size:
                    raise self.error(f"axis {i}: offset {offset} + size {size} exceeds input size {bottom[0].shape[i]}")
                shape[i] = size
            window.append(slice(offset, offset + shape[i]))
        self._window = tuple(window)
        top[0].reshape(shape)

    def forward(self, bottom, top):
        top[0].data = bottom[0].data[self._window].copy()

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        dx = xp.zeros(bottom[0].shape, dtype=bottom[0].dtype)
        dx[self._window] = top[0].diff
        bottom[0].diff = dx


@register_layer("Silence")
class SilenceLayer(Layer):
    """Consumes inputs so they are not reported as net outputs.

    bottom[k]: anything; no tops. Backward writes zero gradients.
    """

    min_bottom = 1
    exact_num_top = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for b, down in zip(bottom, propagate_down):
            if down:
                xp = get_array_module(b.data)
                b.diff = xp.zeros(b.shape, dtype=b.dtype)


@register_layer("Tile")
class TileLayer(Layer):
    """Repeats the input ``tiles`` times along ``axis``.

    bottom[0]: d_0 x ... x d_axis x ... x d_{n-1}
    top[0]:    d_0 x ... x (tiles * d_axis) x ... x d_{n-1}; the whole block of axes from
               ``axis`` on is repeated: y[o, t, i] = x[o, i] (o: leading axes, i: the rest)
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        _no_in_place(self, bottom, top)
        p = self.layer_param.tile_param
        if p.tiles <= 0:
            raise self.error(f"tiles must be positive, got {p.tiles}")
        shape = list(bottom[0].shape)
        axis = _canonical(self, p.axis, len(shape))
        self._outer = math.prod(shape[:axis])
        self._inner = math.prod(shape[axis:])
        self._tiles = p.tiles
        shape[axis] *= p.tiles
        top[0].reshape(shape)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data.reshape(self._outer, 1, self._inner)
        top[0].data = xp.broadcast_to(x, (self._outer, self._tiles, self._inner)).copy()

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            dy = top[0].diff.reshape(self._outer, self._tiles, self._inner)
            bottom[0].diff = dy.sum(axis=1)


@register_layer("Reduction")
class ReductionLayer(Layer):
    """Reduces all axes from ``axis`` to the end.

    bottom[0]: d_0 x ... x d_{n-1}
    top[0]:    d_0 x ... x d_{axis-1} (0-d for axis 0); with D = d_axis * ... * d_{n-1}:
               SUM: coeff * sum x; ASUM: coeff * sum |x|; SUMSQ: coeff * sum x^2;
               MEAN: coeff * sum x / D
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        _no_in_place(self, bottom, top)
        p = self.layer_param.reduction_param
        shape = bottom[0].shape
        axis = _canonical(self, p.axis, len(shape))
        self._num = math.prod(shape[:axis])
        self._dim = math.prod(shape[axis:])
        self._coeff = float(p.coeff) / self._dim if p.operation == _Red.MEAN else float(p.coeff)
        top[0].reshape(tuple(shape[:axis]))

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self._num, self._dim)
        xp = get_array_module(x)
        op = self.layer_param.reduction_param.operation
        if op == _Red.ASUM:
            r = xp.abs(x).sum(axis=1)
        elif op == _Red.SUMSQ:
            r = (x * x).sum(axis=1)
        else:
            r = x.sum(axis=1)
        top[0].data = (r * self._coeff).reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        dy = top[0].diff.reshape(self._num, 1) * self._coeff
        op = self.layer_param.reduction_param.operation
        x = bottom[0].data.reshape(self._num, self._dim)
        if op == _Red.ASUM:
            dx = xp.sign(x) * dy
        elif op == _Red.SUMSQ:
            dx = 2 * x * dy
        else:
            dx = xp.broadcast_to(dy, (self._num, self._dim))
        bottom[0].diff = dx.reshape(bottom[0].shape)


# ---------------------------------------------------------------------------------------------
@register_layer("Filter")
class FilterLayer(Layer):
    """Keeps the items (first-axis rows) whose selector is nonzero.

    bottom[k] (k < K): N x ..., the blobs to filter
    bottom[K]:         N (or N x 1 x ...): the selector; no gradient
    top[k]:            M x ... with the rows of bottom[k] whose selector is nonzero, in order
                       (M is known only at forward: the tops are reshaped there)
    """

    min_bottom = 2
    min_top = 1
    _selector_index: int | None = None  # the selector's bottom, once set up

    def allow_force_backward(self, bottom_index):
        # The selector is the last bottom; before setup, count the bottoms the definition names.
        selector = self._selector_index
        if selector is None:
            selector = len(self.layer_param.bottom) - 1
        return bottom_index != selector

    def setup(self, bottom, top):
        if len(top) != len(bottom) - 1:
            raise self.error(f"takes one top per filtered bottom: {len(bottom) - 1} expected, got {len(top)}")
        self._selector_index = len(bottom) - 1
        self._first_reshape = True

    def _selected(self, bottom):
        sel = bottom[self._selector_index].data.reshape(-1)
        xp = get_array_module(sel)
        return xp.nonzero(sel)[0]

    def _shape_tops(self, bottom, top, rows):
        for t, b in zip(top, bottom):
            t.reshape((rows,) + tuple(b.shape[1:]))

    def reshape(self, bottom, top):
        selector = bottom[self._selector_index]
        if any(d != 1 for d in selector.shape[1:]):
            raise self.error(f"selector dims must be singletons except the first, got {selector.shape}")
        for i, b in enumerate(bottom[:-1]):
            if b.num_axes == 0 or b.shape[0] != selector.shape[0]:
                raise self.error(f"bottom {i} of shape {b.shape} must have {selector.shape[0]} items like the selector")
        if self._first_reshape:
            # As Caffe: before any data is seen, the tops get every item.
            self._first_reshape = False
            self._shape_tops(bottom, top, bottom[0].shape[0])
        else:
            self._shape_tops(bottom, top, int(self._selected(bottom).shape[0]))

    def forward(self, bottom, top):
        idx = self._selected(bottom)
        self._idx = idx
        self._shape_tops(bottom, top, int(idx.shape[0]))
        for t, b in zip(top, bottom):
            t.data = b.data[idx]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[self._selector_index]:
            raise self.error("cannot back-propagate to the selector input")
        for k, t in enumerate(top):
            if propagate_down[k]:
                xp = get_array_module(t.diff)
                dx = xp.zeros(bottom[k].shape, dtype=bottom[k].dtype)
                dx[self._idx] = t.diff
                bottom[k].diff = dx


@register_layer("BatchReindex")
class BatchReindexLayer(Layer):
    """Gathers items of the first input by index.

    bottom[0]: N x ..., the data x
    bottom[1]: M, indices in [0, N) (given as float); no gradient
    top[0]:    M x ...: y[m] = x[index[m]]; repeated indices add their gradients
    """

    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        if bottom[1].num_axes != 1:
            raise self.error(f"the index bottom must be 1-D, got shape {bottom[1].shape}")
        top[0].reshape((bottom[1].shape[0],) + tuple(bottom[0].shape[1:]))

    def forward(self, bottom, top):
        idx = bottom[1].data.astype(np.int64)
        host = to_host(idx)
        n = bottom[0].shape[0]
        if host.size and (host.min() < 0 or host.max() >= n):
            raise self.error(f"indices must lie in [0, {n}), got {host.min()}..{host.max()}")
        self._idx = idx
        top[0].data = bottom[0].data[idx]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot back-propagate to the index input")
        if not propagate_down[0]:
            return
        dy = top[0].diff
        xp = get_array_module(dy)
        n = bottom[0].shape[0]
        rows = dy.reshape(dy.shape[0], -1)
        if xp is np:
            dx = np.zeros((n, rows.shape[1]), dtype=bottom[0].dtype)
            np.add.at(dx, self._idx, rows)
        else:
            # One-hot matrix product: a scatter-add that every array module provides.
            onehot = (self._idx[None, :] == xp.arange(n)[:, None]).astype(rows.dtype)
            dx = onehot @ rows
        bottom[0].diff = dx.reshape(bottom[0].shape)
