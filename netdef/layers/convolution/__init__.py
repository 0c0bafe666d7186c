"""The convolution family: Caffe's Convolution, Deconvolution and Im2col layers.

A Convolution layer computes by one of several algorithms, each a small class behind one interface
(algorithm.py's ``ConvolutionAlgorithm``: forward, backward, its name and choices, the memory it
keeps), chosen once per input shape by planner.py:

    layer.py         ConvolutionLayer: Caffe's contract, shapes and parameters; runs its planned algorithm
    planner.py       which algorithm, and why (cuDNN's refusals, logged once per layer)
    algorithm.py     the interface; the base of the algorithms that add the bias in a pass of their own
    columns.py       im2col and one product per group over chunks of the batch (any convolution)
    rows.py          the CPU's row products for stride-1 convolutions of one group
    direct.py        the register-blocked kernels of layers/direct.py (CPU, 2-D, float)
    pointwise.py     1x1 convolutions as matrix products on the input as it lies
    depthwise.py     group == channels: the kernels of layers/depthwise.py
    cudnn.py         the GPU's products through cuDNN (netdef/cudnn)
    base.py          what Convolution and Deconvolution share: geometry, weights, sizes, the bias
    deconvolution.py DeconvolutionLayer, by the column path's pieces
    im2col_layer.py  Im2colLayer

Importing this package registers the three layer types.
"""
from .base import ConvolutionShape, conv_geometry
from .deconvolution import DeconvolutionLayer
from .im2col_layer import Im2colLayer
from .layer import ConvolutionLayer

__all__ = ["ConvolutionLayer", "ConvolutionShape", "DeconvolutionLayer", "Im2colLayer", "conv_geometry"]
