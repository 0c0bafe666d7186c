"""A built netdef Net run by PyTorch: the peer every CPU benchmark compares against.

``TorchMirror(net, torch)`` walks the net's layers (split layers included) and runs each with PyTorch's
own operator for it, with a copy of the net's weights, so both frameworks compute the same net on the
same values. It is the model a PyTorch user would write, not a layer-by-layer imitation of Caffe: a
Scale layer working in place on a BatchNorm's top is folded into that BatchNorm (PyTorch's affine
batch norm), and in-place ReLUs run in place. Layer types outside the zoo's raise NotImplementedError.

``TorchMirror(net, torch, device="cuda:0")`` puts the weights (and BatchNorm's running statistics) on
that device; the net's blobs may be NumPy or CuPy arrays (copied through the host). A TRAIN net with
several losses (GoogLeNet's auxiliary heads) returns their sum weighted by each layer's loss_weight,
as netdef's backward starts from.
"""
from __future__ import annotations

from netdef.backend import to_host
from netdef.proto import netdef_pb2 as pb


class TorchMirror:
    """Callable: ``mirror({"data": x, "label": y})`` -> the loss (TRAIN nets, ending in SoftmaxWithLoss;
    the weighted sum of several) or the last top (deploy nets); ``mirror.train(flag)`` picks batch
    statistics and dropout; ``mirror.params`` are the learnable tensors, on ``device``."""

    def __init__(self, net, torch, device="cpu"):
        self.torch = torch
        self.device = device
        self.F = torch.nn.functional
        self.training = True
        self.params = []
        self.steps = []
        self.losses = []  # (top, loss_weight) of every layer that adds to the objective
        layers = list(net.layers)
        folded = set()
        for li, layer in enumerate(layers):
            if li in folded:
                continue
            lp = layer.layer_param
            if lp.type == "Input":
                continue  # its tops are the caller's inputs
            scale = None
            if lp.type == "BatchNorm" and li + 1 < len(layers):
                nxt = layers[li + 1].layer_param
                if nxt.type == "Scale" and list(nxt.bottom) == list(lp.top) and list(nxt.top) == list(lp.top):
                    scale = layers[li + 1]
                    folded.add(li + 1)
            self.steps.append((list(lp.bottom), list(lp.top), self._op(layer, scale)))
            weight = lp.loss_weight[0] if lp.loss_weight else (1.0 if lp.type.endswith("Loss") else 0.0)
            if weight and lp.top:
                self.losses.append((lp.top[0], weight))
        self.output = list(layers[-1].layer_param.top)[0]

    def train(self, flag: bool) -> None:
        self.training = flag

    def zero_grad(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    def __call__(self, inputs: dict):
        blobs = dict(inputs)
        for bottoms, tops, op in self.steps:
            values = op(*[blobs[b] for b in bottoms])
            if not isinstance(values, tuple):
                values = (values,)
            for name, value in zip(tops, values):
                blobs[name] = value
        if self.losses and self.losses != [(self.output, 1.0)]:
            return sum(weight * blobs[top] for top, weight in self.losses)
        return blobs[self.output]

    # ---------------------------------------------------------------------------------- operators
    def _param(self, blob, grad=True):
        t = self.torch.from_numpy(to_host(blob.data).copy()).to(self.device)
        if grad:
            t.requires_grad_(True)
            self.params.append(t)
        return t

    def _op(self, layer, scale):
        lp = layer.layer_param
        F, torch = self.F, self.torch
        kind = lp.type
        in_place = bool(lp.top) and list(lp.top)[:1] == list(lp.bottom)[:1]
        if kind == "Split":
            return lambda x: (x,) * len(lp.top)
        if kind == "Convolution":
            cp = lp.convolution_param
            w = self._param(layer.blobs[0])
            b = self._param(layer.blobs[1]) if cp.bias_term else None
            stride = layer.geom.stride
            pad = layer.geom.pad
            dilation = layer.geom.dilation
            return lambda x: F.conv2d(x, w, b, stride, pad, dilation, layer.group)
        if kind == "InnerProduct":
            w = self._param(layer.blobs[0])
            b = self._param(layer.blobs[1]) if lp.inner_product_param.bias_term else None
            axis = lp.inner_product_param.axis
            return lambda x: F.linear(x.flatten(axis), w, b)
        if kind == "ReLU":
            slope = lp.relu_param.negative_slope
            if slope:
                return lambda x: F.leaky_relu(x, slope, inplace=in_place)
            return lambda x: F.relu(x, inplace=in_place)
        if kind == "Pooling":
            return self._pooling(layer)
        if kind == "LRN":
            p = lp.lrn_param
            if p.norm_region == pb.LRNParameter.WITHIN_CHANNEL:
                # (1 + alpha/n^2 * sum of x^2 over the n x n window)^-beta; the mean over a window
                # padded with zeros is that sum / n^2.
                n = p.local_size
                return lambda x: x * (1 + p.alpha * F.avg_pool2d(x * x, n, 1, n // 2)) ** -p.beta
            return lambda x: F.local_response_norm(x, p.local_size, p.alpha, p.beta, p.k)
        if kind == "Dropout":
            ratio = lp.dropout_param.dropout_ratio
            return lambda x: F.dropout(x, ratio, self.training)
        if kind == "BatchNorm":
            return self._batch_norm(layer, scale)
        if kind == "Scale":
            w = self._param(layer.blobs[0])
            b = self._param(layer.blobs[1]) if len(layer.blobs) > 1 else None
            return lambda x: x * w.view(1, -1, 1, 1) + (0 if b is None else b.view(1, -1, 1, 1))
        if kind == "Eltwise":
            op = lp.eltwise_param.operation
            if op == pb.EltwiseParameter.SUM and not lp.eltwise_param.coeff:
                return lambda *xs: sum(xs[1:], xs[0])
            if op == pb.EltwiseParameter.PROD:
                return lambda *xs: torch.stack(xs).prod(0)
            if op == pb.EltwiseParameter.MAX:
                return lambda *xs: torch.stack(xs).amax(0)
            raise NotImplementedError("Eltwise with coefficients")
        if kind == "Concat":
            axis = lp.concat_param.axis
            return lambda *xs: torch.cat(xs, axis)
        if kind == "Flatten":
            return lambda x: x.flatten(lp.flatten_param.axis)
        if kind == "Softmax":
            return lambda x: F.softmax(x, 1)
        if kind == "SoftmaxWithLoss":
            return lambda x, label: F.cross_entropy(x, label.long())
        raise NotImplementedError(f"no PyTorch mirror for layer type {kind!r}")

    def _pooling(self, layer):
        F = self.F
        pp = layer.layer_param.pooling_param
        ceil = pp.round_mode != pb.PoolingParameter.FLOOR
        if pp.pool == pb.PoolingParameter.MAX:
            def run(x):
                kernel = x.shape[2:] if layer.global_pooling else layer.kernel
                return F.max_pool2d(x, kernel, layer.stride, layer.pad, ceil_mode=ceil)
            return run
        if pp.pool == pb.PoolingParameter.AVE:
            def run(x):
                kernel = x.shape[2:] if layer.global_pooling else layer.kernel
                return F.avg_pool2d(x, kernel, layer.stride, layer.pad, ceil_mode=ceil, count_include_pad=True)
            return run
        raise NotImplementedError("STOCHASTIC pooling")

    def _batch_norm(self, layer, scale):
        F = self.F
        bp = layer.layer_param.batch_norm_param
        channels = layer.blobs[0].shape[0]
        mean = self.torch.zeros(channels, device=self.device)
        var = self.torch.ones(channels, device=self.device)
        w = b = None
        if scale is not None:
            w = self._param(scale.blobs[0])
            b = self._param(scale.blobs[1]) if len(scale.blobs) > 1 else None
        momentum = 1 - bp.moving_average_fraction
        return lambda x: F.batch_norm(x, mean, var, w, b, self.training, momentum, bp.eps)
