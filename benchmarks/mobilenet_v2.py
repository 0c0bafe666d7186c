"""MobileNet v2 1.0-224 (Sandler et al. 2018) as a deployment prototxt, for the CPU benchmark only.

Not in the zoo (no trained weights or solver to ship); the benchmark needs it for its depthwise
convolutions: 17 inverted residual blocks, each a 1x1 expansion (t times the channels), a 3x3
depthwise convolution (group == channels) and a linear 1x1 projection, the input added back where
the shapes agree. Every convolution has no bias and is followed by BatchNorm and Scale with bias;
ReLU (Caffe has no ReLU6) after all but the projections.
"""
from __future__ import annotations

# (expansion t, output channels c, repeats n, first stride s), the paper's table 2.
BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
          (6, 320, 1, 1))


def _conv(name, bottom, outputs, kernel, stride=1, group=1, relu=True):
    pad = (kernel - 1) // 2
    group_field = f" group: {group}" if group > 1 else ""
    text = (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}"\n'
            f'  convolution_param {{ num_output: {outputs} bias_term: false pad: {pad} kernel_size: {kernel} '
            f'stride: {stride}{group_field} weight_filler {{ type: "msra" }} }} }}\n'
            f'layer {{ name: "{name}/bn" type: "BatchNorm" bottom: "{name}" top: "{name}" }}\n'
            f'layer {{ name: "{name}/scale" type: "Scale" bottom: "{name}" top: "{name}" '
            f'scale_param {{ bias_term: true }} }}\n')
    if relu:
        text += f'layer {{ name: "{name}/relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n'
    return text


def deploy(batch: int = 10) -> str:
    """The deployment net: Input (batch x 3 x 224 x 224) ... InnerProduct fc7 -> Softmax prob."""
    parts = ['name: "MobileNetV2"\n',
             f'layer {{ name: "data" type: "Input" top: "data" '
             f'input_param {{ shape {{ dim: {batch} dim: 3 dim: 224 dim: 224 }} }} }}\n',
             _conv("conv1", "data", 32, 3, stride=2)]
    bottom, channels = "conv1", 32
    for stage, (t, c, n, s) in enumerate(BLOCKS, start=2):
        for i in range(n):
            tag = f"conv{stage}_{i + 1}"
            stride = s if i == 0 else 1
            hidden = channels * t
            expanded = bottom
            if t != 1:
                parts.append(_conv(f"{tag}/expand", bottom, hidden, 1))
                expanded = f"{tag}/expand"
            parts.append(_conv(f"{tag}/dw", expanded, hidden, 3, stride=stride, group=hidden))
            parts.append(_conv(f"{tag}/linear", f"{tag}/dw", c, 1, relu=False))
            top = f"{tag}/linear"
            if stride == 1 and channels == c:
                parts.append(f'layer {{ name: "{tag}/add" type: "Eltwise" bottom: "{bottom}" '
                             f'bottom: "{top}" top: "{tag}/add" }}\n')
                top = f"{tag}/add"
            bottom, channels = top, c
    parts.append(_conv("conv_last", bottom, 1280, 1))
    parts.append('layer { name: "pool" type: "Pooling" bottom: "conv_last" top: "pool" '
                 'pooling_param { pool: AVE global_pooling: true } }\n'
                 'layer { name: "fc7" type: "InnerProduct" bottom: "pool" top: "fc7" '
                 'inner_product_param { num_output: 1000 weight_filler { type: "msra" } } }\n'
                 'layer { name: "prob" type: "Softmax" bottom: "fc7" top: "prob" }\n')
    return "".join(parts)
