"""benchmarks/floor_bound.py: the matrix products a net's forward+backward stands for."""
import pytest
from google.protobuf import text_format

import netdef
from netdef.proto import netdef_pb2 as pb
from tests.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def bound():
    with benchmark_module("floor_bound") as module:
        yield module


def test_lenet_products_are_im2col_and_inner_product_shapes(bound):
    with benchmark_module("cpu_forward_backward") as cfb:
        train, _ = cfb.netdef_nets("lenet", 64)
        products = bound.net_products(train)
        assert sum(p.multiply_adds for p in products) == cfb.multiply_adds(train)[1]
    by_name = {p.what: (p.m, p.k, p.n, p.count) for p in products}
    # conv1 reads the data: no input gradient. 20 filters of 1 x 5 x 5 over 64 x 24 x 24 outputs.
    assert by_name["conv1 forward"] == (20, 25, 64 * 24 * 24, 1)
    assert by_name["conv1 weight gradient"] == (20, 64 * 24 * 24, 25, 1)
    assert "conv1 input gradient" not in by_name
    assert by_name["conv2 input gradient"] == (20 * 25, 50, 64 * 8 * 8, 1)
    assert by_name["ip1 forward"] == (64, 800, 500, 1)
    assert by_name["ip1 weight gradient"] == (500, 64, 800, 1)
    assert by_name["ip1 input gradient"] == (64, 500, 800, 1)
    assert len(products) == 11


def test_grouped_convolution_is_one_product_per_group(bound):
    param = text_format.Parse("""
        layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 4 dim: 6 dim: 6 } } }
        layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
                convolution_param { num_output: 6 kernel_size: 3 group: 2 } }
        layer { name: "conv2" type: "Convolution" bottom: "conv" top: "conv2"
                convolution_param { num_output: 2 kernel_size: 1 } }
    """, pb.NetParameter())
    net = netdef.Net(param, netdef.TRAIN)
    products = {p.what: p for p in bound.net_products(net)}
    assert products["conv forward"] == bound.Product("conv forward", 3, 2 * 9, 2 * 4 * 4, 2)
    assert products["conv forward"].multiply_adds == 2 * 4 * 4 * 6 * 2 * 9
    assert products["conv2 weight gradient"] == bound.Product("conv2 weight gradient", 2, 2 * 4 * 4, 6, 1)


def test_convolution_of_two_bottoms_counts_its_products_twice(bound):
    param = text_format.Parse("""
        layer { name: "a" type: "Input" top: "a" input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
        layer { name: "b" type: "Input" top: "b" input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
        layer { name: "conv" type: "Convolution" bottom: "a" bottom: "b" top: "ya" top: "yb"
                convolution_param { num_output: 4 kernel_size: 3 } }
    """, pb.NetParameter())
    net = netdef.Net(param, netdef.TRAIN)
    products = {p.what: p for p in bound.net_products(net)}
    assert products["conv forward"] == bound.Product("conv forward", 4, 27, 2 * 3 * 3, 2)
    with benchmark_module("cpu_forward_backward") as cfb:
        assert sum(p.multiply_adds for p in products.values()) == cfb.multiply_adds(net)[1]
