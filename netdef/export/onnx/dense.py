"""InnerProduct as ONNX Flatten + Gemm."""
from __future__ import annotations


def inner_product(g, step) -> None:
    """x read as (M x K) from ``axis`` on (Flatten), times W^T (W with transpose: true) plus b
    (Gemm), reshaped to the input's leading axes plus num_output where those are not just N."""
    layer = step.layer
    x, x_shape, top_shape = step.bottoms[0], step.bottom_shapes[0], step.top_shapes[0]
    if not (layer.axis == 1 and len(x_shape) == 2):
        x = g.step("Flatten", [x], f"{step.name}/rows", axis=layer.axis)
    inputs = [x, g.weight(f"{step.name}/weight", layer.blobs[0].data)]
    if layer.bias_term:
        inputs.append(g.weight(f"{step.name}/bias", layer.blobs[1].data))
    matrix_top = layer.axis == 1
    product = step.tops[0] if matrix_top else g.tensor_name(f"{step.name}/product")
    g.node("Gemm", inputs, [product], transB=0 if layer.transpose else 1)
    if not matrix_top:
        g.node("Reshape", [product, g.ints(f"{step.name}/shape", top_shape)], step.tops)
