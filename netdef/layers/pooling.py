"""The pooling layers, Caffe's: Pooling (MAX, AVE, STOCHASTIC over the two spatial axes) and SPP (a
pyramid of poolings, concatenated). Their arithmetic is ``Pool2D``'s (pool2d.py); here are the
parameters, the shapes and the tops."""
from __future__ import annotations

from .. import backend
from ..proto import netdef_pb2 as pb
from .base import TRAIN, Layer, register_layer
from .pool2d import Pool2D, max_mask_flat, pooled_shape

_Pool = pb.PoolingParameter


@register_layer("Pooling")
class PoolingLayer(Layer):
    """Caffe's PoolingLayer (MAX, AVE, STOCHASTIC) over the two spatial axes.

    bottom: (N x C x H x W).
    top[0]: (N x C x H_out x W_out), H_out = ceil((H + 2 pad_h - kernel_h) / stride_h) + 1 (floor with
            round_mode FLOOR), minus one when there is padding and the last window would start at or
            after H + pad_h (likewise W). global_pooling: the kernel is the whole H x W.
    top[1]: (MAX only, optional) the mask: flat index h*W + w of each window's maximum, as float.

    MAX: y = max over the window's input cells (the first maximum in row-major order wins).
    AVE: y = sum over the window's input cells / (window clipped to [-pad, H + pad)).
    STOCHASTIC: TRAIN samples a cell with probability x / sum(x) over the window (non-negative inputs);
                TEST outputs sum(x^2) / sum(x). No padding.
    """

    exact_num_bottom = 1
    min_top = 1
    max_top = 2

    def setup(self, bottom, top):
        pp = self.layer_param.pooling_param
        self.method = pp.pool
        if len(top) > 1 and self.method != _Pool.MAX:
            raise self.error("only MAX pooling has a second top (the argmax mask)")
        self.global_pooling = pp.global_pooling
        has_k = pp.HasField("kernel_size")
        has_hw = pp.HasField("kernel_h") and pp.HasField("kernel_w")
        if self.global_pooling:
            if has_k or pp.HasField("kernel_h") or pp.HasField("kernel_w"):
                raise self.error("with global_pooling: true the filter size cannot be specified")
        else:
            if not has_k and not has_hw:
                raise self.error("for non-square filters both kernel_h and kernel_w are required")
            if has_k and has_hw:
                raise self.error("filter size is kernel_size OR kernel_h and kernel_w; not both")
        if not ((not pp.HasField("pad") and pp.HasField("pad_h") and pp.HasField("pad_w"))
                or (not pp.HasField("pad_h") and not pp.HasField("pad_w"))):
            raise self.error("pad is pad OR pad_h and pad_w are required")
        if not ((not pp.HasField("stride") and pp.HasField("stride_h") and pp.HasField("stride_w"))
                or (not pp.HasField("stride_h") and not pp.HasField("stride_w"))):
            raise self.error("stride is stride OR stride_h and stride_w are required")
        if has_k:
            self.kernel = (pp.kernel_size, pp.kernel_size)
        elif has_hw:
            self.kernel = (pp.kernel_h, pp.kernel_w)
        self.pad = (pp.pad_h, pp.pad_w) if pp.HasField("pad_h") else (pp.pad, pp.pad)
        self.stride = (pp.stride_h, pp.stride_w) if pp.HasField("stride_h") else (pp.stride, pp.stride)
        if not self.global_pooling and min(self.kernel) <= 0:
            raise self.error(f"filter dimensions must be nonzero, got {self.kernel}")
        if min(self.stride) <= 0:
            raise self.error(f"stride must be nonzero, got {self.stride}")
        if self.global_pooling and (any(self.pad) or self.stride != (1, 1)):
            raise self.error("with global_pooling: true only pad = 0 and stride = 1 are allowed")
        if any(self.pad):
            if self.method not in (_Pool.MAX, _Pool.AVE):
                raise self.error("padding is implemented only for average and max pooling")
            if not self.global_pooling and (self.pad[0] >= self.kernel[0] or self.pad[1] >= self.kernel[1]):
                raise self.error(f"pad {self.pad} must be smaller than the kernel {self.kernel}")
        self.floor = pp.round_mode == _Pool.FLOOR
        self.pool = None

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width); got {bottom[0].shape}")
        n, c, h, w = bottom[0].shape
        kernel = (h, w) if self.global_pooling else self.kernel
        out = pooled_shape(h, w, kernel, self.stride, self.pad, self.floor)
        if min(out) <= 0:
            raise self.error(f"pooled size {out} is not positive for input {h}x{w}, kernel {kernel}")
        if self.pool is None or (self.pool.kernel, self.pool.in_hw, self.pool.out) != (tuple(kernel), (h, w), out):
            self.pool = Pool2D(self.method, kernel, self.stride, self.pad, (h, w), out)
        for t in top:
            t.reshape(n, c, *out)

    def replayable(self) -> bool:
        # A stochastic pooling in training draws its cells from the host's generator.
        return self.method != _Pool.STOCHASTIC or self.phase != TRAIN

    def forward(self, bottom, top):
        y = top[0].data if top[0].has_data else None
        top[0].data = self.pool.forward(bottom[0].data, train=self.phase == TRAIN, out=y)
        if len(top) > 1:
            top[1].data = max_mask_flat(self.pool.state[1], self.pool).astype(top[1].dtype)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:  # Pool2D.backward writes every element of the bottom's gradient
            self.pool.backward(top[0].diff, bottom[0].shape, bottom[0].diff_to_overwrite())


@register_layer("SPP")
class SPPLayer(Layer):
    """Caffe's SPPLayer (spatial pyramid pooling).

    bottom: (N x C x H x W).
    top:    (N x sum_l C * bins_l^2) for pyramid_height > 1: level l (bins = 2^l) pools with
            kernel = stride = ceil(H / bins), pad = (kernel * bins - H + 1) / 2 (integer division),
            Pooling's output rounding; each level is flattened and the levels are concatenated.
            pyramid_height 1: the single level's pooled (N x C x 1 x 1) blob.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        sp = self.layer_param.spp_param
        if not sp.HasField("pyramid_height") or sp.pyramid_height < 1:
            raise self.error("spp_param.pyramid_height must be at least 1")
        self.height = int(sp.pyramid_height)
        self.method = int(sp.pool)  # SPP's PoolMethod numbers are Pooling's
        self.levels = []
        self.in_shape = None

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width); got {bottom[0].shape}")
        n, c, h, w = bottom[0].shape
        if self.in_shape != (h, w):
            self.levels = []
            for level in range(self.height):
                bins = 2 ** level
                kernel = (-(-h // bins), -(-w // bins))
                pad = ((kernel[0] * bins - h + 1) // 2, (kernel[1] * bins - w + 1) // 2)
                if pad[0] >= kernel[0] or pad[1] >= kernel[1]:
                    raise self.error(f"level {level}: pad {pad} >= kernel {kernel} for a {h}x{w} input "
                                     f"(too many bins for the input size)")
                if any(pad) and self.method not in (_Pool.MAX, _Pool.AVE):
                    raise self.error(f"level {level}: padding is implemented only for average and max pooling")
                out = pooled_shape(h, w, kernel, kernel, pad)
                self.levels.append(Pool2D(self.method, kernel, kernel, pad, (h, w), out))
            self.in_shape = (h, w)
        if self.height == 1:
            top[0].reshape(n, c, *self.levels[0].out)
        else:
            top[0].reshape(n, sum(c * p.out[0] * p.out[1] for p in self.levels))

    def forward(self, bottom, top):
        x = bottom[0].data
        train = self.phase == TRAIN
        if self.height == 1:
            top[0].data = self.levels[0].forward(x, train)
            return
        xp = backend.get_array_module(x)
        n = x.shape[0]
        top[0].data = xp.concatenate([p.forward(x, train).reshape(n, -1) for p in self.levels], axis=1)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = backend.get_array_module(top[0].diff)
        shape = bottom[0].shape
        n, c = shape[:2]
        if self.height == 1:
            self.levels[0].backward(top[0].diff, shape, bottom[0].diff)
            return
        dy = top[0].diff
        total = bottom[0].diff
        part = xp.empty(shape, dtype=dy.dtype)
        start = 0
        for k, p in enumerate(self.levels):
            size = c * p.out[0] * p.out[1]
            level_dy = xp.ascontiguousarray(dy[:, start:start + size]).reshape((n, c) + p.out)
            p.backward(level_dy, shape, total if k == 0 else part)
            if k:
                total += part
            start += size
