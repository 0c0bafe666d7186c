"""Caffe's Convolution layer: the contract, the shapes and the parameters; the computing is the algorithm
planner.py chose for the input's shape."""
from __future__ import annotations

from ... import backend
from ..base import register_layer
from . import planner
from .algorithm import AlgorithmRefused, ConvolutionAlgorithm
from .base import ConvolutionBase


@register_layer("Convolution")
class ConvolutionLayer(ConvolutionBase):
    """Convolution (cross-correlation) with learned filters, Caffe's ConvolutionLayer.

    bottom[i]: (N x C x H x W), or any leading axes before ``axis`` and any number of spatial axes.
    top[i]:    (N x num_output x H_out x W_out), H_out = (H + 2 pad_h - (dilation_h (kernel_h - 1) + 1))
               / stride_h + 1 rounded down (likewise W).
    blobs:     weight (num_output x C/group x kernel_h x kernel_w); bias (num_output) if bias_term.

    y[n, o] = b[o] + sum_{c in group(o), i, j} W[o, c, i, j] x_pad[n, c, h*stride + i*dilation, ...].

    How it is computed is ``strategy`` (a ``ConvolutionAlgorithm``), planned when ``reshape`` sees an
    input shape, dtype or array module it has not planned for; ``algorithm`` names it and
    ``algorithm_summary()`` states its choices.
    """

    #: The algorithm planned for the current input (planner.py).
    strategy: ConvolutionAlgorithm | None = None
    _planned_for = None  # (array module, input shape, dtype) the strategy was planned for

    def setup(self, bottom, top):
        super().setup(bottom, top)
        #: {algorithm name: why it cannot run this layer}: cuDNN, once it had no plan for it.
        self.refused: dict[str, str] = {}

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        xp = backend.xp()
        key = (xp, bottom[0].shape, bottom[0].dtype)
        if key != self._planned_for:
            self.strategy = planner.plan(self, xp, bottom[0].dtype)
            self._planned_for = key

    def replayable(self) -> bool:
        return True

    @property
    def algorithm(self) -> str:
        """The algorithm's name: "columns", "rows", "direct", "pointwise", "depthwise" or "cudnn"."""
        return self.strategy.name

    @property
    def rows_input_gradient(self) -> str | None:
        """The row path's input gradient ("convolution" or "col2im"); None on another path."""
        return self.strategy.input_gradient if self.strategy.name == "rows" else None

    def algorithm_summary(self) -> str:
        """The algorithms chosen for these shapes, for benchmarks and logs: the path of the forward
        (and of the weight gradient), then how the input gradient is computed: "rows", "rows/col2im",
        "direct/direct", "direct+rows/convolution" (the direct forward, the row path's backward),
        "direct/rows-col2im" (the direct forward and weight gradient, the row path's col2im), ..."""
        return self.strategy.summary()

    def forward(self, bottom, top):
        self._by_strategy(lambda strategy: strategy.forward(self, bottom, top))

    def forward_mapped(self, bottom, top, channel_map):
        return self._by_strategy(lambda strategy: strategy.forward_mapped(self, bottom, top, channel_map))

    def backward(self, top, propagate_down, bottom):
        self._by_strategy(lambda strategy: strategy.backward(self, top, propagate_down, bottom))

    def _by_strategy(self, call):
        """``call(self.strategy)``; where the algorithm refuses the shapes after all (before it has added
        to any gradient), once more with the one planned without it."""
        try:
            return call(self.strategy)
        except AlgorithmRefused as refusal:
            self._plan_without(refusal)
            return call(self.strategy)

    def _plan_without(self, refusal: AlgorithmRefused) -> None:
        """The algorithm refused these shapes: this layer runs another from now on (the planner logs
        which, and why)."""
        self.refused[refusal.algorithm] = str(refusal)
        xp, _, dtype = self._planned_for
        self.strategy = planner.plan(self, xp, dtype)
