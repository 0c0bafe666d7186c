"""Eltwise SUM + ReLU (+ Split) trained as one step (layers/sum_chain.py, jit/fusion.py's
summed_rectified_gradient): nets that train their sum chains fused against the same nets run layer by
layer, bit for bit in every blob's values and gradients and every parameter's, over two iterations
(with and without the Split, a coefficient other than 1, a leaky slope, an input that wants no
gradient, float64), and where chains form."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import default_dtype, train_twice

RNG = np.random.default_rng(20261126)

NET = """
name: "residual"
layer { name: "data" type: "Input" top: "data" top: "target"
        input_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } shape { dim: 2 dim: 4 } } }
layer { name: "c1" type: "Convolution" bottom: "data" top: "a"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "data" top: "s" }
layer { name: "relu" type: "ReLU" bottom: "s" top: "s" RELU_PARAM }
layer { name: "c2" type: "Convolution" bottom: "s" top: "b"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum2" type: "Eltwise" bottom: "b" bottom: "s" top: "t" eltwise_param { coeff: 1 coeff: 0.5 } }
layer { name: "relu2" type: "ReLU" bottom: "t" top: "t" RELU_PARAM }
layer { name: "fc" type: "InnerProduct" bottom: "t" top: "fc"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "fc" bottom: "target" top: "loss" }
"""


def trained(text, fused: bool, values=None):
    return train_twice(text, fused, RNG, values)[:3]


@pytest.mark.parametrize("slope, dtype", [(None, np.float32), (0.1, np.float32), (None, np.float64)],
                         ids=["relu", "leaky", "float64"])
def test_sum_chains_trained_as_one_step_give_the_bits_of_their_layers(slope, dtype):
    text = NET.replace("RELU_PARAM", "" if slope is None else f"relu_param {{ negative_slope: {slope} }}")
    with default_dtype(dtype):
        fused, steps, values = trained(text, True)
        layered, layered_steps, _ = trained(text, False, values)
    # The first sum feeds two consumers through a Split; the second one layer.
    assert ["sum", "relu", "s_relu_0_split"] in steps and ["sum2", "relu2"] in steps
    assert all(len(step) == 1 for step in layered_steps)
    for key in layered:
        for part, a, b in zip(("values", "gradient"), fused[key], layered[key]):
            assert a.dtype == b.dtype and np.array_equal(a, b) and np.array_equal(np.signbit(a), np.signbit(b)), \
                f"{key} {part}"
    rectified = fused["blob t"][0] < 0 if slope else fused["blob t"][0] == 0
    assert rectified.any() and (fused["blob t"][1] != 0).any()


def test_no_sum_chain_where_the_sum_can_be_read_or_is_no_sum():
    own_top = NET.replace("RELU_PARAM", "").replace('"relu" type: "ReLU" bottom: "s" top: "s"',
                                                    '"relu" type: "ReLU" bottom: "s" top: "r"') \
                 .replace('"c2" type: "Convolution" bottom: "s"', '"c2" type: "Convolution" bottom: "r"') \
                 .replace('bottom: "b" bottom: "s" top: "t"', 'bottom: "b" bottom: "r" top: "t"')
    steps = trained(own_top, True)[1]
    assert ["sum", "relu"] not in steps and not any(step[0] == "sum" and len(step) > 1 for step in steps)
    product = NET.replace("RELU_PARAM", "").replace('top: "t" eltwise_param { coeff: 1 coeff: 0.5 }',
                                                    'top: "t" eltwise_param { operation: PROD }')
    assert ["sum2", "relu2"] not in trained(product, True)[1]
