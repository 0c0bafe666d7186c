"""CUDA graphs of a net's passes on a real GPU (netdef/net_graphs.py): training with
``Net.cuda_graphs`` gives the bits of training without, for a net whose eager layers (a data layer
that refills its top, Dropout, the loss) sit between replayed stretches and hand them new arrays every
pass; with ``iter_size`` 2 (a recording per pass kind); and across a change of batch shape (every
recording forgotten, the new shapes recorded anew). The stretches really replay from graphs.

Without CuPy or a CUDA device every test here skips, saying which (tests/test_net_graphs.py checks on
the CPU which stretches would replay).
"""
from __future__ import annotations

import numpy as np
import pytest

import netdef
from netdef import backend
from tests.helpers import gpu_settings, skip_without_gpu

pytestmark = skip_without_gpu()

NET = """
name: "graphs"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 8 dim: 3 dim: 12 dim: 12 } shape { dim: 8 }
                           data_filler { type: "gaussian" } data_filler { type: "constant" value: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 6 kernel_size: 5 pad: 2 bias_term: false weight_filler { type: "xavier" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" relu_param { negative_slope: 0.05 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "norm1" type: "LRN" bottom: "pool1" top: "norm1" lrn_param { local_size: 3 norm_region: WITHIN_CHANNEL } }
layer { name: "a" type: "Convolution" bottom: "norm1" top: "a"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "b" type: "Convolution" bottom: "norm1" top: "b"
        convolution_param { num_output: 6 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "sum" }
layer { name: "cat" type: "Concat" bottom: "sum" bottom: "norm1" top: "cat" }
layer { name: "pool2" type: "Pooling" bottom: "cat" top: "pool2" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }
layer { name: "relu2" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "drop" type: "Dropout" bottom: "ip1" top: "ip1" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


# The same net reading fixed inputs, whose batch a test changes.
INPUT_NET = NET.replace(NET[NET.index('layer { name: "data"'):NET.index('layer { name: "conv1"')],
                        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 8 dim: 3 dim: 12 dim: 12 } } }\n'
                        'layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 8 } } }\n')


def solver_text(net: str, iter_size: int = 1) -> str:
    return ('base_lr: 0.05 momentum: 0.9 weight_decay: 0.0005 lr_policy: "fixed" max_iter: 100 display: 0 '
            f'random_seed: 3 solver_mode: GPU iter_size: {iter_size} net_param {{ {net} }}')


def set_inputs(net, batch: int) -> None:
    rng = np.random.default_rng(batch)
    net.blobs["data"].reshape(batch, 3, 12, 12)
    net.blobs["label"].reshape(batch)
    net.blobs["data"].data = rng.standard_normal((batch, 3, 12, 12)).astype(np.float32)
    net.blobs["label"].data = rng.integers(0, 5, batch).astype(np.float32)
    net.reshape()


def trained(cuda_graphs: bool, steps: int, iter_size: int = 1, batch_after: int | None = None):
    """(every parameter and blob value on the host, the stretches replayed) after ``steps`` iterations;
    ``batch_after``: INPUT_NET, its batch growing from 8 to 12 after that many."""
    import cupy

    with gpu_settings():
        cupy.random.seed(11)  # Dropout draws on the device
        solver = netdef.get_solver(solver_text(NET if batch_after is None else INPUT_NET, iter_size))
        solver.net.keep_blob_diffs = False
        solver.net.cuda_graphs = cuda_graphs
        if batch_after is None:
            solver.step(steps)
        else:
            set_inputs(solver.net, 8)
            solver.step(batch_after)
            set_inputs(solver.net, 12)
            solver.step(steps - batch_after)
        values = {f"param {name}/{i}": backend.to_host(blob.data).copy()
                  for name, blobs in solver.net.params.items() for i, blob in enumerate(blobs)}
        values.update({f"blob {name}": backend.to_host(blob.data).copy() for name, blob in solver.net.blobs.items()})
        if cuda_graphs:  # a stretch CUDA would not record: the test says which and why
            assert solver.net.cuda_graphs.refused() == []
        return values, solver.net.cuda_graphs.replayed() if solver.net.cuda_graphs else []


def assert_same_bits(with_graphs: dict, without: dict) -> None:
    for key, value in without.items():
        np.testing.assert_array_equal(with_graphs[key], value, err_msg=key)


def test_training_with_graphs_gives_the_bits_of_training_without():
    without, none_replayed = trained(False, 7)
    again, _ = trained(False, 7)
    assert_same_bits(again, without)  # the eager run repeats itself: a graph must too
    with_graphs, replayed = trained(True, 7)
    assert none_replayed == []
    assert set(replayed) == {("forward", "conv1", "relu2"), ("forward", "ip2", "ip2"), ("backward", "ip2", "ip2"),
                             ("backward", "relu2", "data")}
    assert_same_bits(with_graphs, without)


@pytest.mark.parametrize("iter_size", [2])
def test_passes_of_iter_size_replay_their_own_recordings(iter_size):
    without, _ = trained(False, 6, iter_size=iter_size)
    with_graphs, replayed = trained(True, 6, iter_size=iter_size)
    assert replayed
    assert_same_bits(with_graphs, without)


def test_a_new_batch_shape_is_recorded_anew():
    without, _ = trained(False, 9, batch_after=5)
    with_graphs, replayed = trained(True, 9, batch_after=5)
    assert replayed
    assert with_graphs["blob data"].shape[0] == 12
    assert_same_bits(with_graphs, without)


def test_a_test_net_replays_its_forward_with_the_bits_of_running_it():
    """A TEST-phase net (BatchNorm with its stored statistics, Dropout the identity) scored with
    graphs: each batch's outputs are those of the same net run eagerly."""
    import cupy

    def scored(cuda_graphs: bool):
        with gpu_settings():
            net = netdef.Net(INPUT_NET, netdef.TEST)
            net.forward_only = True
            rng = np.random.default_rng(4)
            for blobs in net.params.values():
                for blob in blobs:
                    blob.data[...] = cupy.asarray(rng.random(blob.shape, dtype=np.float32) + 0.5)
            net.cuda_graphs = cuda_graphs
            outputs = []
            for batch in range(6):
                set_inputs(net, 8)
                net.blobs["data"].data *= batch + 1  # a new batch each time, in a new array
                net.forward_range()
                outputs.append(backend.to_host(net.blobs["ip2"].data).copy())
            return outputs, net.cuda_graphs.replayed() if net.cuda_graphs else []

    without, _ = scored(False)
    with_graphs, replayed = scored(True)
    assert replayed, "nothing was replayed"
    for batch, (got, want) in enumerate(zip(with_graphs, without)):
        np.testing.assert_array_equal(got, want, err_msg=f"batch {batch}")
