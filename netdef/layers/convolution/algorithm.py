"""The interface every convolution algorithm implements (``ConvolutionAlgorithm``), and the base of the
two whose products leave the bias to a pass of their own (``BiasAfterProducts``)."""
from __future__ import annotations

import math

from .. import fusion
from .base import ConvolutionShape


class AlgorithmRefused(Exception):
    """An algorithm cannot compute the shapes it was planned for after all (cuDNN found no plan when it
    came to build one). Raised before the call has added to any gradient; ``str()`` is the reason the
    log gives. The layer plans again without that algorithm (``ConvolutionLayer.refused``) and repeats
    the call."""

    def __init__(self, algorithm: str, reason: str):
        super().__init__(reason)
        self.algorithm = algorithm


class ConvolutionAlgorithm:
    """One way to compute a Convolution layer's output and gradients, made by planner.py for one input
    shape (``self.shape``, a ``ConvolutionShape``) and dtype, and replaced when the shape changes.

    - ``name``: the layer's ``algorithm`` ("columns", "rows", "direct", "pointwise", "depthwise",
      "cudnn"); ``summary()``: that and the choices made for these shapes, as ``algorithm_summary()``
      states them ("direct/col2im", ...); ``input_gradient``: how the input gradient is computed where
      the algorithm chose between ways for these shapes, else None.
    - ``forward(layer, bottom, top)`` and ``backward(layer, top, propagate_down, bottom)``: the
      layer's, with Caffe's contract (parameter gradients added to, bottom gradients written).
      ``forward_mapped(layer, bottom, top, channel_map)``: ``Layer.forward_mapped``'s; by default the
      forward and then the map.
    - ``kept_bytes()``: the memory the algorithm holds between calls (its own arrays; temporaries live
      in the net's scratch, layers/scratch.py).

    Each call gets the layer for what can change between calls: its parameters (``blobs``,
    ``param_propagate_down``, ``add_bias``, ``add_bias_gradient``) and ``scratch``, which the net shares
    among its layers after they are planned. What the algorithm keeps from one call to the next (the
    column matrices of the last chunk, planned kernels) is an attribute of its own."""

    name = ""
    input_gradient: str | None = None

    def __init__(self, shape: ConvolutionShape):
        self.shape = shape

    def summary(self) -> str:
        return self.name if self.input_gradient is None else f"{self.name}/{self.input_gradient}"

    def forward(self, layer, bottom, top) -> None:
        raise NotImplementedError

    def forward_mapped(self, layer, bottom, top, channel_map) -> bool:
        # Every algorithm writes the output into the top's array itself: mapped there in place.
        return fusion.forward_then_map(layer, bottom, top, channel_map)

    def backward(self, layer, top, propagate_down, bottom) -> None:
        raise NotImplementedError

    def kept_bytes(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.summary()} for {self.shape}>"


class BiasAfterProducts(ConvolutionAlgorithm):
    """An algorithm whose products write the output without the bias, which a pass of its own adds:
    where the net maps the output in place (``forward_mapped``), the map adds the bias instead, and
    the products apply it as they write each block where they can (``mapped_products``)."""

    def products(self, layer, bottom, top) -> None:
        """Each top = the convolution of its bottom, without the bias."""
        raise NotImplementedError

    def mapped_products(self, layer, bottom, top, channel_map) -> bool:
        """The products into the one top, with ``channel_map`` (None: none) applied as they are written
        where the kernels can: whether it was (False: the products are written, unmapped)."""
        raise NotImplementedError

    def forward(self, layer, bottom, top):
        self.products(layer, bottom, top)
        for t in top:
            layer.add_bias(t.data.reshape(self.shape.y_shape))

    def forward_mapped(self, layer, bottom, top, channel_map):
        if len(top) != 1:
            return fusion.forward_then_map(layer, bottom, top, channel_map)
        mapped = channel_map
        if layer.bias_term:
            s = self.shape
            dims = (s.num, s.num_output, math.prod(s.out_spatial))
            mapped = fusion.compose(fusion.ChannelMap(dims, shift=layer.blobs[1].data), channel_map)
            if mapped is None:
                return fusion.forward_then_map(layer, bottom, top, channel_map)
        if not self.mapped_products(layer, bottom, top, mapped if fusion.MAPS_IN_KERNELS else None):
            fusion.apply(mapped, top[0].data, top[0].data)
        return True
