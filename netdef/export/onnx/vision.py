"""Convolution, Deconvolution, Pooling and LRN as ONNX nodes.

Pooling. Caffe rounds the output size up (ceil mode; the last window may run past the padded input)
and then drops a last window that would start inside the right padding. Rather than rely on ONNX's
own ceil mode (whose rules differ between runtimes), the export takes Caffe's output size O and
pads the end by just what the last window reaches past the input, e = (O-1) s + k - H - p, with
floor rounding: the ONNX output size is then O exactly, and e < k because Caffe's last window
starts inside the input. MAX ignores padded cells in both. AVE divides by the window clipped to the
padded extent [-p, H + p): the export pads p zeros explicitly (cells that count) and lets
AveragePool pad the rest of the last window without counting it (count_include_pad = 0).
"""
from __future__ import annotations

import numpy as np

from ...proto import netdef_pb2 as pb

_Pool = pb.PoolingParameter
_LRN = pb.LRNParameter


def _conv_attributes(layer) -> dict:
    geom = layer.geom
    return {"kernel_shape": list(geom.kernel), "strides": list(geom.stride), "pads": list(geom.pad) * 2,
            "dilations": list(geom.dilation), "group": layer.group}


def _convolution_nodes(op: str, g, step) -> None:
    layer = step.layer
    if layer.channel_axis != 1:
        raise step.refuse(f"ONNX {op} needs the channels on axis 1; this layer's axis is {layer.channel_axis}")
    weights = [g.weight(f"{step.name}/weight", layer.blobs[0].data)]
    if layer.bias_term:
        weights.append(g.weight(f"{step.name}/bias", layer.blobs[1].data))
    # Several bottom/top pairs share the layer's weights (Caffe allows it).
    for bottom, top in zip(step.bottoms, step.tops):
        g.node(op, [bottom, *weights], [top], **_conv_attributes(layer))


def convolution(g, step) -> None:
    """Caffe's weights (num_output x C/group x k...) are ONNX Conv's, groups and dilation included."""
    _convolution_nodes("Conv", g, step)


def deconvolution(g, step) -> None:
    """Caffe's weights (C x num_output/group x k...) are ONNX ConvTranspose's; Caffe's output size
    s (H - 1) + d (k - 1) + 1 - 2p is ConvTranspose's with output_padding 0."""
    _convolution_nodes("ConvTranspose", g, step)


# ---------------------------------------------------------------------------------------------- pooling
def pooling(g, step) -> None:
    layer = step.layer
    if len(step.tops) > 1:
        raise step.refuse("the second top (MAX pooling's argmax mask, a flat index per plane) has no ONNX "
                          "counterpart")
    x, y = step.bottoms[0], step.tops[0]
    in_hw, out_hw = step.bottom_shapes[0][2:], step.top_shapes[0][2:]
    if layer.global_pooling and layer.method in (_Pool.MAX, _Pool.AVE):
        g.node("GlobalMaxPool" if layer.method == _Pool.MAX else "GlobalAveragePool", [x], [y])
        return
    kernel = in_hw if layer.global_pooling else layer.kernel
    stride, pad = layer.stride, layer.pad
    window = {"kernel_shape": list(kernel), "strides": list(stride)}
    if layer.method == _Pool.MAX:
        ends = _window_ends(in_hw, out_hw, kernel, stride, pad)
        g.node("MaxPool", [x], [y], pads=list(pad) + ends, **window)
    elif layer.method == _Pool.AVE:
        if any(pad):
            x = g.step("Pad", [x, g.ints(f"{step.name}/pads", [0, 0, *pad, 0, 0, *pad])], f"{step.name}/padded")
        padded_hw = [size + 2 * p for size, p in zip(in_hw, pad)]
        ends = _window_ends(padded_hw, out_hw, kernel, stride, (0, 0))
        g.node("AveragePool", [x], [y], pads=[0, 0] + ends, count_include_pad=0, **window)
    else:
        _stochastic_test(g, step, kernel, stride, _window_ends(in_hw, out_hw, kernel, stride, (0, 0)))


def _window_ends(in_hw, out_hw, kernel, stride, pad) -> list[int]:
    """Padding at the end of each axis that makes floor rounding give Caffe's output size."""
    return [max(0, (o - 1) * s + k - i - p) for i, o, k, s, p in zip(in_hw, out_hw, kernel, stride, pad)]


def _stochastic_test(g, step, kernel, stride, ends) -> None:
    """STOCHASTIC pooling at TEST: sum(x^2) / sum(x) over each window (no padding; the ceil-rounded
    last windows add zeros), 0 where sum(x) <= 0. Both sums as averages over the same k x k cells,
    whose ratio is the ratio of the sums."""
    x, hint = step.bottoms[0], step.name
    window = {"kernel_shape": list(kernel), "strides": list(stride), "pads": [0, 0] + ends, "count_include_pad": 1}
    squares = g.step("AveragePool", [g.step("Mul", [x, x], f"{hint}/square")], f"{hint}/squares", **window)
    values = g.step("AveragePool", [x], f"{hint}/values", **window)
    zero = g.weight(f"{hint}/zero", np.float32(0))
    positive = g.step("Greater", [values, zero], f"{hint}/positive")
    ratio = g.step("Div", [squares, values], f"{hint}/ratio")
    g.node("Where", [positive, ratio, zero], [step.tops[0]])


# ---------------------------------------------------------------------------------------------- LRN
def lrn(g, step) -> None:
    """ACROSS_CHANNELS is ONNX LRN (the same window of size n centred on each channel, alpha / n);
    WITHIN_CHANNEL is x (1 + alpha mean(x^2 over the n x n window, zeros outside))^-beta."""
    layer = step.layer
    x, y = step.bottoms[0], step.tops[0]
    if layer.region == _LRN.ACROSS_CHANNELS:
        g.node("LRN", [x], [y], size=layer.size, alpha=layer.alpha, beta=layer.beta, bias=layer.k)
        return
    hint, half = step.name, (layer.size - 1) // 2
    mean = g.step("AveragePool", [g.step("Mul", [x, x], f"{hint}/square")], f"{hint}/mean_square",
                  kernel_shape=[layer.size] * 2, strides=[1, 1], pads=[half] * 4, count_include_pad=1)
    scale = g.chain(mean, [("Mul", [g.weight(f"{hint}/alpha", np.float32(layer.alpha))], {}),
                           ("Add", [g.weight(f"{hint}/one", np.float32(1))], {}),
                           ("Pow", [g.weight(f"{hint}/minus_beta", np.float32(-layer.beta))], {})],
                    g.tensor_name(f"{hint}/scale"), hint)
    g.node("Mul", [x, scale], [y])
