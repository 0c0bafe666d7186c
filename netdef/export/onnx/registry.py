"""Caffe layer type -> the function that writes its ONNX nodes, ``convert(graph, step)``.

A type missing here has no ONNX counterpart (yet) and is refused by name when an exported output
needs it; a type in INPUT_TYPES brings data in, and its tops become the graph's inputs.
"""
from __future__ import annotations

from ...registry import Registry
from . import dense, neuron, normalization, scores, shape, vision

#: Caffe layer type -> the function that writes its ONNX nodes.
CONVERTERS: Registry = Registry("ONNX converter", {
    "Convolution": vision.convolution,
    "Deconvolution": vision.deconvolution,
    "Pooling": vision.pooling,
    "LRN": vision.lrn,
    "InnerProduct": dense.inner_product,
    "ReLU": neuron.relu,
    "PReLU": neuron.prelu,
    "ELU": neuron.elu,
    "Sigmoid": neuron.sigmoid,
    "TanH": neuron.tanh,
    "AbsVal": neuron.absval,
    "Power": neuron.power,
    "Exp": neuron.exp,
    "Log": neuron.log,
    "BNLL": neuron.bnll,
    "Threshold": neuron.threshold,
    "Swish": neuron.swish,
    "Clip": neuron.clip,
    "Dropout": neuron.dropout,
    "BatchNorm": normalization.batch_norm,
    "Scale": normalization.scale,
    "Bias": normalization.bias,
    "Eltwise": shape.eltwise,
    "Concat": shape.concat,
    "Slice": shape.slice_,
    "Split": shape.split,
    "Flatten": shape.flatten,
    "Reshape": shape.reshape,
    "Softmax": scores.softmax,
    "ArgMax": scores.argmax,
})

#: Layers whose tops are the data the net is fed: the exported graph takes them as inputs (a data
#: layer's transform_param, crop and mean, stays outside the graph, as the data layer's work).
INPUT_TYPES = frozenset({"Input", "Data", "ImageData", "HDF5Data", "MemoryData", "DummyData", "WindowData"})

#: Layers that score predictions against labels; like losses, left out of a deployment graph.
METRIC_TYPES = frozenset({"Accuracy"})
