"""Eltwise, Concat, Slice, Split, Flatten and Reshape as ONNX nodes."""
from __future__ import annotations

import numpy as np

from ...proto import netdef_pb2 as pb

_Elt = pb.EltwiseParameter


def _canonical(axis: int, num_axes: int) -> int:
    return axis + num_axes if axis < 0 else axis


def _axis_or_legacy(param, legacy_field: str, num_axes: int) -> int:
    """Concat's and Slice's axis: the legacy concat_dim/slice_dim when given, else ``axis``."""
    if param.HasField(legacy_field):
        return int(getattr(param, legacy_field))
    return _canonical(param.axis, num_axes)


def eltwise(g, step) -> None:
    """SUM: Sum of the inputs, each multiplied by its coefficient unless that is 1; PROD: a chain
    of Mul; MAX: Max."""
    layer = step.layer
    if layer.op == _Elt.MAX:
        g.node("Max", step.bottoms, step.tops)
    elif layer.op == _Elt.PROD:
        first, *rest = step.bottoms
        g.chain(first, [("Mul", [x], {}) for x in rest], step.tops[0], step.name)
    else:
        terms = [x if c == 1 else g.step("Mul", [x, g.weight(f"{step.name}/coeff{k}", np.float32(c))],
                                          f"{step.name}/term{k}")
                 for k, (x, c) in enumerate(zip(step.bottoms, layer.coeff))]
        g.node("Sum", terms, step.tops)


def concat(g, step) -> None:
    if len(step.bottoms) == 1:
        g.node("Identity", step.bottoms, step.tops)
        return
    axis = _axis_or_legacy(step.layer.layer_param.concat_param, "concat_dim", len(step.bottom_shapes[0]))
    g.node("Concat", step.bottoms, step.tops, axis=axis)


def slice_(g, step) -> None:
    """ONNX Split with the sizes of the tops (from slice_point, or the even split)."""
    if len(step.tops) == 1:
        g.node("Identity", step.bottoms, step.tops)
        return
    axis = _axis_or_legacy(step.layer.layer_param.slice_param, "slice_dim", len(step.bottom_shapes[0]))
    sizes = g.ints(f"{step.name}/sizes", [shape[axis] for shape in step.top_shapes])
    g.node("Split", [step.bottoms[0], sizes], step.tops, axis=axis)


def split(g, step) -> None:
    for top in step.tops:
        g.node("Identity", step.bottoms, [top])


def flatten(g, step) -> None:
    """The axes axis..end_axis merged: ONNX Reshape to (0 ... 0, -1, the later axes), where 0
    keeps the input's axis (so the batch size is not written into the graph)."""
    param = step.layer.layer_param.flatten_param
    shape = step.bottom_shapes[0]
    start, end = _canonical(param.axis, len(shape)), _canonical(param.end_axis, len(shape))
    target = [0] * start + [-1] + list(shape[end + 1:])
    g.node("Reshape", [step.bottoms[0], g.ints(f"{step.name}/shape", target)], step.tops)


def reshape(g, step) -> None:
    """Caffe's rules map onto ONNX Reshape's: a 0 in ``shape`` copies the input's axis at the same
    position and one -1 is inferred, in both. The axes before ``axis`` are kept as 0s; those after
    axis + num_axes are written out."""
    param = step.layer.layer_param.reshape_param
    shape = step.bottom_shapes[0]
    n = len(shape)
    start = param.axis if param.axis >= 0 else n + param.axis + 1
    end = n if param.num_axes == -1 else start + param.num_axes
    target = [0] * start + list(param.shape.dim) + list(shape[end:])
    g.node("Reshape", [step.bottoms[0], g.ints(f"{step.name}/shape", target)], step.tops)
