"""Softmax and ArgMax as ONNX nodes."""
from __future__ import annotations

from onnx import TensorProto


def softmax(g, step) -> None:
    """ONNX Softmax works along one axis from opset 13 on, as Caffe's does."""
    axis = step.layer.layer_param.softmax_param.axis
    g.node("Softmax", step.bottoms, step.tops, axis=axis + len(step.bottom_shapes[0]) if axis < 0 else axis)


def argmax(g, step) -> None:
    """The top k along ``axis`` (without one: over each item's entries, flattened), as floats.

    Caffe orders equal values by decreasing index, ONNX TopK by increasing index: TopK runs on the
    reversed axis and the indices are mapped back (i -> size - 1 - i)."""
    layer = step.layer
    x, hint = step.bottoms[0], step.name
    shape = step.bottom_shapes[0]
    if layer.has_axis:
        axis = layer.axis
        size = shape[axis]
    else:
        axis, size = 1, 1
        for d in shape[1:]:
            size *= d
        x = g.step("Flatten", [x], f"{hint}/entries", axis=1)
    reversed_x = g.step("Slice", [x, g.ints(f"{hint}/start", [-1]), g.ints(f"{hint}/end", [-(size + 1)]),
                                  g.ints(f"{hint}/axes", [axis]), g.ints(f"{hint}/steps", [-1])], f"{hint}/reversed")
    values, positions = g.tensor_name(f"{hint}/values"), g.tensor_name(f"{hint}/positions")
    g.node("TopK", [reversed_x, g.ints(f"{hint}/k", [layer.top_k])], [values, positions], axis=axis)
    indices = g.step("Cast", [g.step("Sub", [g.ints(f"{hint}/last", size - 1), positions], f"{hint}/indices")],
                     f"{hint}/float_indices", to=TensorProto.FLOAT)
    if layer.has_axis:
        g.node("Identity", [values if layer.out_max_val else indices], step.tops)
        return
    # (N x k) -> (N x 1 x k), or (N x 2 x k) holding (indices; values), then Caffe's trailing 1s.
    rows = [indices, values] if layer.out_max_val else [indices]
    stacked = [g.step("Unsqueeze", [row, g.ints(f"{hint}/axis1", [1])], f"{hint}/row") for row in rows]
    joined = stacked[0] if len(stacked) == 1 else g.step("Concat", stacked, f"{hint}/joined", axis=1)
    g.node("Reshape", [joined, g.ints(f"{hint}/shape", step.top_shapes[0])], step.tops)
