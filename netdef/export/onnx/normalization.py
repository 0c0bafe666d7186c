"""BatchNorm (with the Scale folded into it where plan.py found one), Scale and Bias as ONNX nodes."""
from __future__ import annotations

import numpy as np

from ... import backend


def batch_norm(g, step) -> None:
    """Caffe stores the running sums and their scale factor: mean = blobs[0] / blobs[2], var =
    blobs[1] / blobs[2] (both 0 when the factor is 0). ONNX BatchNormalization's own scale and bias
    are the folded Scale layer's (1 and 0 without one)."""
    bn = step.layer
    if not bn.use_global_stats:
        raise step.refuse("use_global_stats: false normalizes each batch by its own statistics; ONNX "
                          "BatchNormalization uses the stored ones (drop use_global_stats: false to export)")
    if len(step.bottom_shapes[0]) < 2:
        raise step.refuse(f"ONNX BatchNormalization needs (N x C ...) inputs; the input is {step.bottom_shapes[0]}")
    stored = [backend.to_host(blob.data).astype(np.float64) for blob in bn.blobs]
    factor = 0.0 if stored[2].reshape(-1)[0] == 0 else 1.0 / stored[2].reshape(-1)[0]
    channels = step.bottom_shapes[0][1]
    gamma, beta = np.ones(channels), np.zeros(channels)
    if len(step.layers) > 1:
        scale = step.layers[1]
        gamma = scale.blobs[0].data
        if scale.bias_index is not None:
            beta = scale.blobs[scale.bias_index].data
    names = [g.weight(f"{step.name}/{what}", values)
             for what, values in (("gamma", gamma), ("beta", beta), ("mean", stored[0] * factor),
                                  ("var", stored[1] * factor))]
    g.node("BatchNormalization", [step.bottoms[0], *names], step.tops, epsilon=bn.eps)


def _broadcast_shape(x_shape: tuple, operand_shape: tuple, axis: int) -> list[int]:
    """The operand's shape padded with trailing 1s, so that ONNX's (NumPy's) broadcasting lines it
    up with the input's axes [axis, axis + k) as Caffe's Scale and Bias do."""
    k = len(operand_shape)
    if k == 0:
        return []
    axis = axis + len(x_shape) if axis < 0 else axis
    return list(operand_shape) + [1] * (len(x_shape) - axis - k)


def _learned(g, step, blob, axis: int, hint: str) -> str:
    return g.weight(hint, blob.data.reshape(_broadcast_shape(step.bottom_shapes[0], tuple(blob.shape), axis)))


def _second_bottom(g, step, axis: int, hint: str) -> str:
    shape = _broadcast_shape(step.bottom_shapes[0], step.bottom_shapes[1], axis)
    return g.step("Reshape", [step.bottoms[1], g.ints(f"{hint}/shape", shape)], hint)


def _operand(g, step, axis: int, hint: str) -> str:
    """The scale (or the bias) to broadcast: the second bottom when there is one, else the first
    learned blob."""
    if len(step.bottoms) > 1:
        return _second_bottom(g, step, axis, hint)
    return _learned(g, step, step.layer.blobs[0], axis, hint)


def scale(g, step) -> None:
    """y = x * s (+ b), s and b broadcast from scale_param.axis over their own axes."""
    layer = step.layer
    axis = layer.layer_param.scale_param.axis
    ops = [("Mul", [_operand(g, step, axis, f"{step.name}/scale")], {})]
    if layer.bias_index is not None:
        ops.append(("Add", [_learned(g, step, layer.blobs[layer.bias_index], axis, f"{step.name}/bias")], {}))
    g.chain(step.bottoms[0], ops, step.tops[0], step.name)


def bias(g, step) -> None:
    """y = x + b, b broadcast from bias_param.axis over its own axes."""
    b = _operand(g, step, step.layer.layer_param.bias_param.axis, f"{step.name}/bias")
    g.node("Add", [step.bottoms[0], b], step.tops)
