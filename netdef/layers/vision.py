"""The vision layers, Caffe's, by the names netdef has always given them: Convolution, Deconvolution and
Im2col (the convolution/ package), Pooling and SPP (pooling.py, their arithmetic pool2d.py) and LRN
(lrn.py). Each lives in the module that has its one reason to change; this one only names them, for
``from netdef.layers.vision import ConvolutionLayer`` and the like.
"""
from .convolution import ConvolutionLayer, DeconvolutionLayer, Im2colLayer, conv_geometry
from .lrn import LRNLayer, lrn_across_backward, lrn_across_forward, lrn_within_backward, lrn_within_forward
from .pool2d import (Pool2D, ave_pool_backward, ave_pool_forward, max_mask_flat, max_pool_backward, max_pool_forward,
                     pool_output_size, pooled_shape)
from .pooling import PoolingLayer, SPPLayer

__all__ = ["ConvolutionLayer", "DeconvolutionLayer", "Im2colLayer", "conv_geometry", "LRNLayer", "lrn_across_backward",
           "lrn_across_forward", "lrn_within_backward", "lrn_within_forward", "Pool2D", "ave_pool_backward",
           "ave_pool_forward", "max_mask_flat", "max_pool_backward", "max_pool_forward", "pool_output_size",
           "pooled_shape", "PoolingLayer", "SPPLayer"]
