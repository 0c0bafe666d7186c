"""A Convolution layer's three products through cuDNN: the output (fprop), the input gradient (dgrad)
and the weight gradient (wgrad), each an operation graph planned once per shape (plans.py).

Shapes, as Caffe's: x (N x C x spatial...), w (O x C/group x kernel...), y (N x O x out...), all
C-contiguous. cuDNN reads the group count from the weight's second axis (C / (C/group)). The bias
is not cuDNN's: the layer adds it (and sums its gradient) with CuPy, as for every other path.
"""
from __future__ import annotations

from .. import backend
from . import benchmark_limit, plans, workspace_limit


def contiguous_strides(shape) -> list[int]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


class CudnnConvolution:
    """The cuDNN plans of one convolution geometry (stride, pad, dilation; the kernel and the group
    count are the weights' shape); each method plans its graph for the arrays' shapes the first time
    it sees them."""

    def __init__(self, geometry):
        self.padding = list(geometry.pad)
        self.stride = list(geometry.stride)
        self.dilation = list(geometry.dilation)
        self._backward_planned: set = set()

    # Each product: the frontend's operation on the graph, its two inputs' ports.
    _OPERATIONS = {
        "fprop": lambda graph, a, b, attributes: graph.conv_fprop(image=a, weight=b, **attributes),
        "dgrad": lambda graph, a, b, attributes: graph.conv_dgrad(loss=a, filter=b, **attributes),
        "wgrad": lambda graph, a, b, attributes: graph.conv_wgrad(image=a, loss=b, **attributes),
    }

    def _run(self, operation: str, a, b, out) -> None:
        """out = the ``operation`` of ``a`` and ``b``, through the plan for their shapes."""
        attributes = {"padding": self.padding, "stride": self.stride, "dilation": self.dilation}

        def describe(graph, cudnn):
            first, second = (graph.tensor(name=name, dim=list(array.shape), stride=contiguous_strides(array.shape),
                                          data_type=plans.data_type(cudnn, array.dtype))
                             for name, array in (("a", a), ("b", b)))
            result = self._OPERATIONS[operation](graph, first, second, attributes)
            result.set_output(True).set_dim(list(out.shape)).set_stride(contiguous_strides(out.shape)) \
                  .set_data_type(plans.data_type(cudnn, out.dtype))
            return [first, second, result]

        key = (f"conv_{operation}", tuple(a.shape), tuple(b.shape), tuple(out.shape), tuple(self.padding),
               tuple(self.stride), tuple(self.dilation), str(a.dtype))
        plans.plan(key, describe, (a, b, out)).run(a, b, out)

    def forward(self, x, w, y) -> None:
        """y = conv(x, w), overwriting y."""
        self._run("fprop", x, w, y)

    def input_gradient(self, dy, w, dx) -> None:
        """dx = the gradient of the loss with respect to the input, overwriting dx."""
        self._run("dgrad", dy, w, dx)

    def weight_gradient(self, x, dy, dw) -> None:
        """dw = the gradient of the loss with respect to the weights, overwriting dw."""
        self._run("wgrad", x, dy, dw)

    def plan_backward(self, x, dy, w) -> None:
        """Plan both gradients for these shapes (timed on temporaries), so that ``Unsupported`` is
        raised here, before a backward has added anything anywhere."""
        settings = (tuple(x.shape), tuple(w.shape), str(x.dtype), backend.precision(), workspace_limit(),
                    benchmark_limit())
        if settings in self._backward_planned:
            return
        xp = backend.get_array_module(x)
        self.input_gradient(dy, w, xp.empty(x.shape, dtype=x.dtype))
        self.weight_gradient(x, dy, xp.empty(w.shape, dtype=w.dtype))
        self._backward_planned.add(settings)


def usable_for(num_spatial: int, dtype) -> str | None:
    """None where cuDNN can compute a convolution with ``num_spatial`` spatial axes of ``dtype``
    arrays; else why not."""
    import numpy as np

    if num_spatial not in (2, 3):
        return f"cuDNN convolves 2-D and 3-D inputs, not {num_spatial}-D"
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)):
        return f"cuDNN convolves float arrays, not {np.dtype(dtype)}"
    return None
