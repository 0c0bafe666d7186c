"""Recurrent layers: RNN, LSTM and LSTMUnit, with Caffe's parameter layout and semantics.

Caffe builds RNN and LSTM as an unrolled inner net; here the same computation runs as one loop over
the time steps, vectorized over the batch, with the learnable blobs in the order Caffe's unrolled
net owns them. Shapes: T time steps, N independent streams, D = ``recurrent_param.num_output``.

Sequence continuation: ``cont[t, n] = 0`` starts a new sequence in stream n at step t, by
multiplying the previous hidden state (and, for the LSTM, the previous cell state) by cont.

Hidden state across forward passes: without ``expose_hidden``, the state a pass starts from is
the state the previous pass ended with (zeros before the first pass, or after ``reset()``), as in
Caffe, where a stream of batches can continue sequences with cont = 1 at t = 0. No gradient flows
into the previous pass. With ``expose_hidden``, the initial state is given as extra bottoms and the
final state is given as extra tops.
"""
from __future__ import annotations

from .. import backend
from ..blob import Blob
from ..fillers import fill
from .base import Layer, register_layer


def _xp(array):
    return backend.get_array_module(array)


def _sigmoid(x):
    xp = _xp(x)
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _lstm_unit(c_prev, gates, cont):
    """One LSTM step on (N, D) cells and (N, 4D) gate inputs ordered i, f, o, g; cont (N, 1).
    The forget gate is cont * sigmoid(.), exactly 0 where cont is 0 (Caffe's LSTMUnit)."""
    xp = _xp(gates)
    d = c_prev.shape[-1]
    i = _sigmoid(gates[..., :d])
    f = xp.where(cont == 0, 0, cont * _sigmoid(gates[..., d:2 * d]))
    o = _sigmoid(gates[..., 2 * d:3 * d])
    g = xp.tanh(gates[..., 3 * d:])
    c = f * c_prev + i * g
    return c, o * xp.tanh(c), (i, f, o, g)


def _lstm_unit_backward(c_prev, c, acts, dc, dh):
    """Gradients of one LSTM step (Caffe's LSTMUnit backward): returns (dc_prev, dgates). The forget
    gate's term uses f (1 - f) with f = cont * sigmoid, which is the exact derivative for cont in {0, 1}."""
    xp = _xp(c)
    i, f, o, g = acts
    tanh_c = xp.tanh(c)
    dc_total = dc + dh * o * (1 - tanh_c * tanh_c)
    dgates = xp.concatenate([
        dc_total * g * i * (1 - i),
        dc_total * c_prev * f * (1 - f),
        dh * tanh_c * o * (1 - o),
        dc_total * i * (1 - g * g),
    ], axis=-1)
    return dc_total * f, dgates


class RecurrentLayer(Layer):
    """Shared parts of RNN and LSTM: blob counts, bottoms, parameters and the carried state.

    bottom[0]: (T x N x ...) inputs x_t (everything after the first two axes is one input vector).
    bottom[1]: (T x N) continuation indicators cont (no gradient).
    bottom[2]: (optional, N x ...) static input added to every step through its own weight.
    then, with expose_hidden: the initial states (1 x N x D each).
    top[0]:    (T x N x D) outputs; then, with expose_hidden: the final states (1 x N x D each).
    """

    #: Names of the recurrent state blobs (h, then c for the LSTM).
    state_names: tuple[str, ...] = ()

    def _num_states(self) -> int:
        return len(self.state_names) if self.layer_param.recurrent_param.expose_hidden else 0

    def check_blob_counts(self, bottom, top):
        k = self._num_states()
        hi = 3 + k
        if not 2 <= len(bottom) <= hi:
            raise self.error(f"takes 2 to {hi} bottom blobs (x, cont, [x_static]"
                             f"{', ' + ', '.join(n + '_0' for n in self.state_names) if k else ''}), got {len(bottom)}")
        if len(top) != 1 + k:
            raise self.error(f"takes {1 + k} top blob(s), got {len(top)}")

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    # The weight layout each subclass owns: list of (name, shape, filler param or None for bias)
    def _param_layout(self, input_dim: int, static_dim: int | None):
        raise NotImplementedError

    def setup(self, bottom, top):
        param = self.layer_param.recurrent_param
        self.hidden = int(param.num_output)
        if self.hidden <= 0:
            raise self.error("recurrent_param.num_output must be positive")
        self.expose_hidden = bool(param.expose_hidden)
        self.static_input = len(bottom) > 2 + self._num_states()
        if bottom[0].num_axes < 2:
            raise self.error(f"bottom[0] must have at least 2 axes (#timesteps, #streams, ...), got {bottom[0].shape}")
        self.input_dim = bottom[0].count_range(2)
        self.static_dim = bottom[2].count_range(1) if self.static_input else None
        layout = self._param_layout(self.input_dim, self.static_dim)
        if self.blobs:
            if len(self.blobs) != len(layout):
                raise self.error(f"has {len(self.blobs)} stored blobs, expected {len(layout)}")
            for blob, (name, shape, _) in zip(self.blobs, layout):
                if tuple(blob.shape) != shape:
                    raise self.error(f"stored blob {name} has shape {blob.shape}, expected {shape}")
        else:
            self.blobs = []
            for name, shape, filler in layout:
                blob = Blob(shape, dtype=bottom[0].dtype, name=name)
                fill(blob, filler)
                self.blobs.append(blob)
        self._state = None

    def reshape(self, bottom, top):
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] must have at least 2 axes (#timesteps, #streams, ...), got {x.shape}")
        self.T, self.N = x.shape[0], x.shape[1]
        if cont.shape != (self.T, self.N):
            raise self.error(f"bottom[1] (cont) must have shape (T, N) = {(self.T, self.N)}, got {cont.shape}")
        if x.count_range(2) != self.input_dim:
            raise self.error(f"input size per step changed: {x.count_range(2)} vs {self.input_dim} at setup")
        if self.static_input:
            s = bottom[2]
            if s.num_axes < 1 or s.shape[0] != self.N or s.count_range(1) != self.static_dim:
                raise self.error(f"bottom[2] (static input) must have shape (N={self.N}, ...) with "
                                 f"{self.static_dim} values per stream, got {s.shape}")
        state_shape = (1, self.N, self.hidden)
        first_state = 2 + int(self.static_input)
        for j in range(self._num_states()):
            if bottom[first_state + j].shape != state_shape:
                raise self.error(f"bottom[{first_state + j}] ({self.state_names[j]}_0) must have shape "
                                 f"{state_shape}, got {bottom[first_state + j].shape}")
        top[0].reshape(self.T, self.N, self.hidden)
        for j in range(self._num_states()):
            top[1 + j].reshape(state_shape)

    def reset(self) -> None:
        """Forget the carried hidden state: the next forward starts from zeros."""
        self._state = None

    def _initial_states(self, bottom, xp, dtype):
        k = len(self.state_names)
        if self.expose_hidden:
            first = 2 + int(self.static_input)
            return [bottom[first + j].data.reshape(self.N, self.hidden) for j in range(k)]
        shape = (self.N, self.hidden)
        if self._state is None or any(s.shape != shape for s in self._state) or _xp(self._state[0]) is not xp:
            self._state = [xp.zeros(shape, dtype=dtype) for _ in range(k)]
        return self._state

    def _inputs(self, bottom):
        x = bottom[0].data.reshape(self.T, self.N, self.input_dim)
        cont = bottom[1].data.reshape(self.T, self.N, 1)
        xs = bottom[2].data.reshape(self.N, self.static_dim) if self.static_input else None
        return x, cont, xs

    def _add_param_grad(self, j: int, grad) -> None:
        if self.param_propagate_down[j]:
            self.blobs[j].diff += grad

    def _input_grads(self, propagate_down, bottom, dpre, w_x, w_s):
        """Write dx (and the static input's gradient) from the gradient of the per-step
        pre-activations dpre (T, N, K), and add the input weights' gradients."""
        if propagate_down[0]:
            bottom[0].diff = (dpre @ w_x).reshape(bottom[0].shape)
        if self.static_input and propagate_down[2]:
            bottom[2].diff = (dpre.sum(axis=0) @ w_s).reshape(bottom[2].shape)

    def _state_grads(self, propagate_down, bottom, grads):
        if not self.expose_hidden:
            return
        first = 2 + int(self.static_input)
        for j, g in enumerate(grads):
            if propagate_down[first + j]:
                bottom[first + j].diff = g.reshape(bottom[first + j].shape)


# ---------------------------------------------------------------------------------------------- RNN
@register_layer("RNN")
class RNNLayer(RecurrentLayer):
    """Elman recurrent net with a tanh output layer (Caffe's RNNLayer).

    Shapes as RecurrentLayer (one state, h). Blobs, in order: W_xh (D x I), b_h (D),
    [W_xh_static (D x I_static) with a static input], W_hh (D x D), W_ho (D x D), b_o (D).
        h_t = tanh(W_hh (cont_t * h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static])
        o_t = tanh(W_ho h_t + b_o)          top[0][t] = o_t;  (expose_hidden) top[1] = h_T.
    """

    state_names = ("h",)

    def _param_layout(self, input_dim, static_dim):
        p = self.layer_param.recurrent_param
        d = self.hidden
        layout = [("W_xh", (d, input_dim), p.weight_filler), ("b_h", (d,), p.bias_filler)]
        if static_dim is not None:
            layout.append(("W_xh_static", (d, static_dim), p.weight_filler))
        layout += [("W_hh", (d, d), p.weight_filler), ("W_ho", (d, d), p.weight_filler),
                   ("b_o", (d,), p.bias_filler)]
        return layout

    def _weights(self):
        b = [blob.data for blob in self.blobs]
        if self.static_input:
            return b[0], b[1], b[2], b[3], b[4], b[5]
        return b[0], b[1], None, b[2], b[3], b[4]

    def forward(self, bottom, top):
        x, cont, xs = self._inputs(bottom)
        xp = _xp(x)
        w_xh, b_h, w_s, w_hh, w_ho, b_o = self._weights()
        pre_x = x @ w_xh.T + b_h
        if xs is not None:
            pre_x = pre_x + (xs @ w_s.T)[None]
        (h,) = self._initial_states(bottom, xp, x.dtype)
        hs = xp.empty((self.T, self.N, self.hidden), dtype=x.dtype)
        h_conted = xp.empty_like(hs)
        for t in range(self.T):
            h_conted[t] = cont[t] * h
            h = xp.tanh(h_conted[t] @ w_hh.T + pre_x[t])
            hs[t] = h
        out = xp.tanh(hs @ w_ho.T + b_o)
        top[0].data = out
        if self.expose_hidden:
            top[1].data = h[None]
        else:
            self._state = [h.copy()]
        self._cache = (x, cont, xs, hs, h_conted, out)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to sequence indicators (bottom[1])")
        x, cont, xs, hs, h_conted, out = self._cache
        xp = _xp(x)
        w_xh, b_h, w_s, w_hh, w_ho, b_o = self._weights()
        d = self.hidden
        do = top[0].diff * (1 - out * out)
        dh_all = do @ w_ho
        if self.expose_hidden:
            dh_all[-1] += top[1].diff.reshape(self.N, d)
        da = xp.empty_like(hs)
        carry = xp.zeros((self.N, d), dtype=hs.dtype)
        for t in range(self.T - 1, -1, -1):
            da[t] = (dh_all[t] + carry) * (1 - hs[t] * hs[t])
            carry = cont[t] * (da[t] @ w_hh)
        flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
        j = 0
        self._add_param_grad(j, flat(da).T @ flat(x)); j += 1
        self._add_param_grad(j, da.sum(axis=(0, 1))); j += 1
        if self.static_input:
            self._add_param_grad(j, da.sum(axis=0).T @ xs); j += 1
        self._add_param_grad(j, flat(da).T @ flat(h_conted)); j += 1
        self._add_param_grad(j, flat(do).T @ flat(hs)); j += 1
        self._add_param_grad(j, do.sum(axis=(0, 1)))
        self._input_grads(propagate_down, bottom, da, w_xh, w_s)
        self._state_grads(propagate_down, bottom, [carry])


# ---------------------------------------------------------------------------------------------- LSTM
@register_layer("LSTM")
class LSTMLayer(RecurrentLayer):
    """Long short-term memory (Caffe's LSTMLayer, without peepholes).

    Shapes as RecurrentLayer (states h, then c). Blobs, in order: W_xc (4D x I), b_c (4D),
    [W_xc_static (4D x I_static) with a static input], W_hc (4D x D); gate rows ordered i, f, o, g.
        a_t = W_xc x_t + b_c + W_hc (cont_t * h_{t-1}) [+ W_xc_static x_static]
        i, f, o = sigmoid(a_i), cont_t * sigmoid(a_f), sigmoid(a_o);  g = tanh(a_g)
        c_t = f * c_{t-1} + i * g;   h_t = o * tanh(c_t)
    top[0][t] = h_t;  (expose_hidden) top[1] = h_T, top[2] = c_T.
    """

    state_names = ("h", "c")

    def _param_layout(self, input_dim, static_dim):
        p = self.layer_param.recurrent_param
        d4 = 4 * self.hidden
        layout = [("W_xc", (d4, input_dim), p.weight_filler), ("b_c", (d4,), p.bias_filler)]
        if static_dim is not None:
            layout.append(("W_xc_static", (d4, static_dim), p.weight_filler))
        layout.append(("W_hc", (d4, self.hidden), p.weight_filler))
        return layout

    def _weights(self):
        b = [blob.data for blob in self.blobs]
        if self.static_input:
            return b[0], b[1], b[2], b[3]
        return b[0], b[1], None, b[2]

    def forward(self, bottom, top):
        x, cont, xs = self._inputs(bottom)
        xp = _xp(x)
        w_xc, b_c, w_s, w_hc = self._weights()
        pre_x = x @ w_xc.T + b_c
        if xs is not None:
            pre_x = pre_x + (xs @ w_s.T)[None]
        h, c = self._initial_states(bottom, xp, x.dtype)
        shape = (self.T, self.N, self.hidden)
        hs, h_conted = xp.empty(shape, dtype=x.dtype), xp.empty(shape, dtype=x.dtype)
        cs = xp.empty((self.T + 1,) + shape[1:], dtype=x.dtype)  # cs[0] = c_0
        cs[0] = c
        acts = []
        for t in range(self.T):
            h_conted[t] = cont[t] * h
            c, h, a = _lstm_unit(cs[t], pre_x[t] + h_conted[t] @ w_hc.T, cont[t])
            cs[t + 1] = c
            hs[t] = h
            acts.append(a)
        top[0].data = hs
        if self.expose_hidden:
            top[1].data = h[None]
            top[2].data = c[None]
        else:
            self._state = [h.copy(), c.copy()]
        self._cache = (x, cont, xs, h_conted, cs, acts)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to sequence indicators (bottom[1])")
        x, cont, xs, h_conted, cs, acts = self._cache
        xp = _xp(x)
        w_xc, b_c, w_s, w_hc = self._weights()
        n, d = self.N, self.hidden
        dh_all = top[0].diff.copy()
        dc = xp.zeros((n, d), dtype=x.dtype)
        if self.expose_hidden:
            dh_all[-1] += top[1].diff.reshape(n, d)
            dc = dc + top[2].diff.reshape(n, d)
        dgates = xp.empty((self.T, n, 4 * d), dtype=x.dtype)
        dh_carry = xp.zeros((n, d), dtype=x.dtype)
        for t in range(self.T - 1, -1, -1):
            dc, dgates[t] = _lstm_unit_backward(cs[t], cs[t + 1], acts[t], dc, dh_all[t] + dh_carry)
            dh_carry = cont[t] * (dgates[t] @ w_hc)
        flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
        j = 0
        self._add_param_grad(j, flat(dgates).T @ flat(x)); j += 1
        self._add_param_grad(j, dgates.sum(axis=(0, 1))); j += 1
        if self.static_input:
            self._add_param_grad(j, dgates.sum(axis=0).T @ xs); j += 1
        self._add_param_grad(j, flat(dgates).T @ flat(h_conted))
        self._input_grads(propagate_down, bottom, dgates, w_xc, w_s)
        self._state_grads(propagate_down, bottom, [dh_carry, dc])


# ---------------------------------------------------------------------------------------------- LSTMUnit
@register_layer("LSTMUnit")
class LSTMUnitLayer(Layer):
    """One LSTM time step (Caffe's LSTMUnitLayer).

    bottom[0]: (1 x N x D) previous cell state c_{t-1}.
    bottom[1]: (1 x N x 4D) gate inputs, ordered i, f, o, g.
    bottom[2]: (1 x N) continuation indicators cont (no gradient).
    top[0]:    (1 x N x D) c_t = f * c_{t-1} + i * g, with f = cont * sigmoid(a_f) (0 where cont is 0).
    top[1]:    (1 x N x D) h_t = o * tanh(c_t).
    """

    exact_num_bottom = 3
    exact_num_top = 2

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 2

    def reshape(self, bottom, top):
        c_prev, gates, cont = bottom
        if c_prev.num_axes != 3 or gates.num_axes != 3 or cont.num_axes != 2:
            raise self.error(f"bottoms must have 3, 3 and 2 axes, got {c_prev.shape}, {gates.shape}, {cont.shape}")
        n, d = c_prev.shape[1], c_prev.shape[2]
        if c_prev.shape[0] != 1 or gates.shape != (1, n, 4 * d) or cont.shape != (1, n):
            raise self.error(f"expected shapes (1, N, D), (1, N, 4D), (1, N); got {c_prev.shape}, {gates.shape}, {cont.shape}")
        top[0].reshape_like(c_prev)
        top[1].reshape_like(c_prev)

    def forward(self, bottom, top):
        c_prev, gates, cont = bottom[0].data, bottom[1].data, bottom[2].data[..., None]
        c, h, acts = _lstm_unit(c_prev, gates, cont)
        self._cache = (c_prev, c, acts)
        top[0].data = c
        top[1].data = h

    def backward(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot backpropagate to sequence indicators (bottom[2])")
        if not (propagate_down[0] or propagate_down[1]):
            return
        c_prev, c, acts = self._cache
        dc_prev, dgates = _lstm_unit_backward(c_prev, c, acts, top[0].diff, top[1].diff)
        if propagate_down[0]:
            bottom[0].diff = dc_prev
        if propagate_down[1]:
            bottom[1].diff = dgates
