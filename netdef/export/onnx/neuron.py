"""Element-wise layers (ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, Power, Exp, Log, BNLL, Threshold,
Swish, Clip) and Dropout, which is the identity at TEST, as ONNX nodes."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper


def _scalar(g, step, what: str, value: float) -> str:
    return g.weight(f"{step.name}/{what}", np.float32(value))


def _unary(op: str):
    def convert(g, step) -> None:
        g.node(op, step.bottoms, step.tops)

    convert.__doc__ = f"The ONNX {op} node."
    return convert


sigmoid = _unary("Sigmoid")
tanh = _unary("Tanh")
absval = _unary("Abs")
bnll = _unary("Softplus")   # log(1 + exp(x))
dropout = _unary("Identity")


def relu(g, step) -> None:
    slope = step.layer.negative_slope
    if slope == 0:
        g.node("Relu", step.bottoms, step.tops)
    else:
        g.node("LeakyRelu", step.bottoms, step.tops, alpha=slope)


def prelu(g, step) -> None:
    """Slopes per channel (axis 1) reshaped to broadcast over the spatial axes, or one shared."""
    layer = step.layer
    ndim = len(step.bottom_shapes[0])
    slopes = layer.blobs[0].data
    shape = (1,) if layer.channel_shared else (slopes.size,) + (1,) * (ndim - 2)
    g.node("PRelu", [step.bottoms[0], g.weight(f"{step.name}/slope", slopes.reshape(shape))], step.tops)


def elu(g, step) -> None:
    g.node("Elu", step.bottoms, step.tops, alpha=step.layer.alpha)


def power(g, step) -> None:
    """(shift + scale x) ^ power; a constant where power * scale is 0 (Caffe's special case)."""
    layer = step.layer
    x, y = step.bottoms[0], step.tops[0]
    if layer.diff_scale == 0:
        value = 1.0 if layer.power == 0 else layer.shift ** layer.power
        fill = helper.make_tensor("value", TensorProto.FLOAT, [1], [value])
        g.node("ConstantOfShape", [g.step("Shape", [x], f"{step.name}/shape")], [y], value=fill)
        return
    ops = []
    if layer.scale != 1:
        ops.append(("Mul", [_scalar(g, step, "scale", layer.scale)], {}))
    if layer.shift != 0:
        ops.append(("Add", [_scalar(g, step, "shift", layer.shift)], {}))
    if layer.power != 1:
        ops.append(("Pow", [_scalar(g, step, "power", layer.power)], {}))
    g.chain(x, ops, y, step.name)


def exp(g, step) -> None:
    """base ^ (shift + scale x) = exp(ln(base) scale x) * base ^ shift."""
    layer = step.layer
    ops = []
    if layer.inner_scale != 1:
        ops.append(("Mul", [_scalar(g, step, "inner_scale", layer.inner_scale)], {}))
    ops.append(("Exp", [], {}))
    if layer.outer_scale != 1:
        ops.append(("Mul", [_scalar(g, step, "outer_scale", layer.outer_scale)], {}))
    g.chain(step.bottoms[0], ops, step.tops[0], step.name)


def log(g, step) -> None:
    """log_base(shift + scale x) = ln(shift + scale x) / ln(base)."""
    layer = step.layer
    ops = []
    if layer.scale != 1:
        ops.append(("Mul", [_scalar(g, step, "scale", layer.scale)], {}))
    if layer.shift != 0:
        ops.append(("Add", [_scalar(g, step, "shift", layer.shift)], {}))
    ops.append(("Log", [], {}))
    if layer.base_scale != 1:
        ops.append(("Mul", [_scalar(g, step, "base_scale", layer.base_scale)], {}))
    g.chain(step.bottoms[0], ops, step.tops[0], step.name)


def threshold(g, step) -> None:
    """1 where x > threshold (strictly), else 0."""
    above = g.step("Greater", [step.bottoms[0], _scalar(g, step, "threshold", step.layer.threshold)],
                   f"{step.name}/above")
    g.node("Cast", [above], step.tops, to=TensorProto.FLOAT)


def swish(g, step) -> None:
    """x sigmoid(beta x)."""
    x = step.bottoms[0]
    gate = g.chain(x, [("Mul", [_scalar(g, step, "beta", step.layer.beta)], {}), ("Sigmoid", [], {})],
                   g.tensor_name(f"{step.name}/gate"), step.name)
    g.node("Mul", [x, gate], step.tops)


def clip(g, step) -> None:
    layer = step.layer
    g.node("Clip", [step.bottoms[0], _scalar(g, step, "min", layer.lo), _scalar(g, step, "max", layer.hi)],
           step.tops)
