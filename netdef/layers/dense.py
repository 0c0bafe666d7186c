"""Fully connected layers: InnerProduct and Embed (a lookup table)."""
from __future__ import annotations

from .. import backend
from ..blob import Blob
from ..fillers import fill
from . import fusion
from .matmul import matmul
from .base import Layer, register_layer


def _param_blobs(layer: Layer, shapes: list[tuple], fillers: list, dtype) -> None:
    """Create ``layer.blobs`` with ``shapes`` filled by ``fillers``, or, when blobs were loaded
    before setup, only check their shapes (Caffe's "Skipping parameter initialization")."""
    if layer.blobs:
        if len(layer.blobs) != len(shapes):
            raise layer.error(f"has {len(layer.blobs)} parameter blobs, expected {len(shapes)}")
        for j, (blob, shape) in enumerate(zip(layer.blobs, shapes)):
            if tuple(blob.shape) != tuple(shape):
                raise layer.error(f"parameter blob {j} has shape {blob.shape}, expected {tuple(shape)}")
        return
    blobs = []
    for shape, filler in zip(shapes, fillers):
        blob = Blob(shape, dtype=dtype)
        fill(blob, filler)
        blobs.append(blob)
    layer.blobs = blobs


# Rows of an inner product's weight gradient computed per block (InnerProductLayer._add_weight_gradient):
# large enough that each block is an efficient matrix product, small enough to stay in the L2/L3 cache.
_WEIGHT_GRADIENT_BLOCK_BYTES = 16 << 20


@register_layer("InnerProduct")
class InnerProductLayer(Layer):
    """Fully connected layer: a matrix product over the axes from ``axis`` on.

    bottom[0]: (d_0 x ... x d_{axis-1} x d_axis x ... x d_{n-1}) x, read as an (M x K) matrix with
        M = d_0 ... d_{axis-1} and K = d_axis ... d_{n-1}.
    top[0]: (d_0 x ... x d_{axis-1} x num_output) y = x W^T + b.
    blobs[0]: W, (num_output x K), or (K x num_output) when transpose is true (then y = x W + b).
    blobs[1]: b, (num_output), when bias_term.
    dL/dx = dL/dy W;  dL/dW += (dL/dy)^T x;  dL/db += sum over the M rows of dL/dy.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        param = self.layer_param.inner_product_param
        if not param.HasField("num_output") or param.num_output == 0:
            raise self.error("inner_product_param.num_output must be set and positive")
        self.num_output = int(param.num_output)
        self.bias_term = bool(param.bias_term)
        self.transpose = bool(param.transpose)
        self.axis = bottom[0].canonical_axis(param.axis)
        self.K = bottom[0].count_range(self.axis)
        weight_shape = (self.K, self.num_output) if self.transpose else (self.num_output, self.K)
        shapes, fillers = [weight_shape], [param.weight_filler]
        if self.bias_term:
            shapes.append((self.num_output,))
            fillers.append(param.bias_filler)
        _param_blobs(self, shapes, fillers, bottom[0].dtype)

    def reshape(self, bottom, top):
        axis = bottom[0].canonical_axis(self.layer_param.inner_product_param.axis)
        k = bottom[0].count_range(axis)
        if k != self.K:
            raise self.error(f"input size incompatible with inner product parameters: bottom {bottom[0].shape} "
                             f"gives K = {k} from axis {axis}, the weights expect K = {self.K}")
        self.axis = axis
        self.M = bottom[0].count_range(0, axis)
        top[0].reshape(tuple(bottom[0].shape[:axis]) + (self.num_output,))

    def replayable(self) -> bool:
        return True

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.M, self.K)
        w = self.blobs[0].data
        y = matmul(x, w if self.transpose else w.T)
        if self.bias_term:
            y += self.blobs[1].data
        top[0].data = y

    def forward_mapped(self, bottom, top, channel_map):
        # The product is a fresh array: mapped there in place.
        return fusion.forward_then_map(self, bottom, top, channel_map)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(self.M, self.num_output)
        if self.param_propagate_down[0]:
            x = bottom[0].data.reshape(self.M, self.K)
            self._add_weight_gradient(x, dy)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff += dy.sum(axis=0)
        if propagate_down[0]:
            w = self.blobs[0].data
            bottom[0].diff = matmul(dy, w.T if self.transpose else w)

    def _add_weight_gradient(self, x, dy):
        """diff += dy^T x (x^T dy when transposed), a block of the weights at a time: the whole
        product at once is a temporary as large as the weights (392 MiB for VGG-16's fc6), which set
        the net's peak memory. Each element is the same dot product over the M rows either way. The
        blocks split the longer side, so the operand every block reads again is the smaller one."""
        diff, overwrite = self.blobs[0].diff_for_accumulation()
        a, b = (x.T, dy) if self.transpose else (dy.T, x)  # diff (rows x cols) += a (rows x M) @ b (M x cols)
        xp = backend.get_array_module(diff)
        if overwrite:
            # Right after the solver's clear: the product itself, written where the sum would go (the
            # same values as 0 + product), without the pass that zeroes the weights' worth of memory
            # or the one that reads it back.
            matmul(a, b, out=diff)
            return
        rows, cols = diff.shape
        if rows * cols * diff.itemsize <= _WEIGHT_GRADIENT_BLOCK_BYTES:
            diff += matmul(a, b)
            return
        if cols >= rows:
            width = max(1, _WEIGHT_GRADIENT_BLOCK_BYTES // (rows * diff.itemsize))
            part = self.scratch.get("inner_product_dw", (rows, width), diff.dtype, xp)
            for start in range(0, cols, width):
                stop = min(start + width, cols)
                product = part[:, :stop - start]
                matmul(a, b[:, start:stop], out=product)
                diff[:, start:stop] += product
        else:
            height = max(1, _WEIGHT_GRADIENT_BLOCK_BYTES // (cols * diff.itemsize))
            part = self.scratch.get("inner_product_dw", (height, cols), diff.dtype, xp)
            for start in range(0, rows, height):
                stop = min(start + height, rows)
                product = part[:stop - start]
                matmul(a[start:stop], b, out=product)
                diff[start:stop] += product


@register_layer("Embed")
class EmbedLayer(Layer):
    """Lookup table: each index selects one row of the weight matrix.

    bottom[0]: (any shape S) integer indices in [0, input_dim), given as floats.
    top[0]: (S x num_output) y[s] = W[x[s]] + b.
    blobs[0]: W, (input_dim x num_output).  blobs[1]: b, (num_output), when bias_term.
    dL/dW[i] += sum over positions s with x[s] = i of dL/dy[s] (repeated indices add);
    dL/db += sum over all positions of dL/dy. The indices get no gradient.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        param = self.layer_param.embed_param
        if not param.HasField("num_output") or param.num_output == 0:
            raise self.error("embed_param.num_output must be set and positive")
        if not param.HasField("input_dim") or param.input_dim == 0:
            raise self.error("embed_param.input_dim must be set and positive")
        self.num_output = int(param.num_output)
        self.input_dim = int(param.input_dim)
        self.bias_term = bool(param.bias_term)
        shapes, fillers = [(self.input_dim, self.num_output)], [param.weight_filler]
        if self.bias_term:
            shapes.append((self.num_output,))
            fillers.append(param.bias_filler)
        _param_blobs(self, shapes, fillers, bottom[0].dtype)

    def allow_force_backward(self, bottom_index):
        return False

    def reshape(self, bottom, top):
        top[0].reshape(tuple(bottom[0].shape) + (self.num_output,))

    def _indices(self, bottom):
        x = bottom[0].data.reshape(-1)
        xp = backend.get_array_module(x)
        idx = x.astype(xp.int64)
        if idx.size:
            bad = (idx < 0) | (idx >= self.input_dim) | (idx != x)
            if bool(bad.any()):
                first = x[xp.argmax(bad)]
                raise self.error(f"index {float(first)} is not an integer in [0, {self.input_dim})")
        return idx

    def forward(self, bottom, top):
        idx = self._indices(bottom)
        y = self.blobs[0].data[idx]
        if self.bias_term:
            y = y + self.blobs[1].data
        top[0].data = y

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("cannot back-propagate to the indices (bottom 0)")
        dy = top[0].diff.reshape(-1, self.num_output)
        xp = backend.get_array_module(dy)
        if self.param_propagate_down[0]:
            idx = self._indices(bottom)
            # One flat bincount scatters every row at once and adds repeated indices, on NumPy and
            # CuPy alike (np.add.at has no CuPy twin under that name).
            flat = (idx[:, None] * self.num_output + xp.arange(self.num_output)).reshape(-1)
            grad = xp.bincount(flat, weights=dy.reshape(-1), minlength=self.input_dim * self.num_output)
            self.blobs[0].diff += grad.reshape(self.input_dim, self.num_output).astype(dy.dtype)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff += dy.sum(axis=0)
