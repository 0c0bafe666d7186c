"""Losses and metrics: Caffe's LossLayer family, plus Softmax, Accuracy and ArgMax.

Conventions shared by the loss layers (Caffe's):
- ``top[0]`` is a scalar (shape ``()``) holding the *unweighted* loss. The loss weight is not known
  here: it arrives in backward as ``top[0].diff`` (a 0-d array) and scales every bottom gradient.
- Labels are given as floats and read as integers by truncation (C++ ``static_cast<int>``).
  Label bottoms take no gradient: ``allow_force_backward`` is False for them, and asking for their
  gradient is an error, as in Caffe ("cannot backpropagate to label inputs").
- ``loss_param.normalization`` says what the summed loss is divided by: FULL (every position,
  ignored ones too), VALID (the positions not ignored), BATCH_SIZE (the outer count N), NONE (1);
  the divisor is never below 1. When ``normalization`` is unset but the legacy ``normalize`` is set,
  ``normalize: true`` means VALID and ``normalize: false`` means BATCH_SIZE.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from ..files import PROTOBUF_LIMIT, read_input_file
from ..proto import netdef_pb2 as pb
from .base import Layer, register_layer

_Norm = pb.LossParameter
# C's FLT_MIN: SoftmaxWithLoss clips probabilities here before the log (in both precisions, as Caffe).
FLT_MIN = float(np.finfo(np.float32).tiny)
# Caffe's kLOG_THRESHOLD for MultinomialLogisticLoss and InfogainLoss.
LOG_THRESHOLD = 1e-20


def _xp(array):
    return backend.get_array_module(array)


def normalization_mode(loss_param, default: int) -> int:
    """The effective normalization: the explicit field, else the legacy ``normalize``, else ``default``."""
    if loss_param.HasField("normalization"):
        return loss_param.normalization
    if loss_param.HasField("normalize"):
        return _Norm.VALID if loss_param.normalize else _Norm.BATCH_SIZE
    return default


def normalizer(xp, mode: int, outer: int, inner: int, valid_count=None):
    """Caffe's LossLayer::GetNormalizer, clamped below at 1. ``valid_count`` may be a device scalar."""
    if mode == _Norm.FULL:
        return float(max(1, outer * inner))
    if mode == _Norm.VALID:
        if valid_count is None:
            return float(max(1, outer * inner))
        return xp.maximum(valid_count, 1)
    if mode == _Norm.BATCH_SIZE:
        return float(max(1, outer))
    if mode == _Norm.NONE:
        return 1.0
    raise ValueError(f"unknown normalization mode {mode}")


def _softmax(x, axis: int):
    xp = _xp(x)
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _as_int_labels(labels):
    # astype truncates toward zero, which is what static_cast<int> does to a float label.
    return labels.astype(_xp(labels).int64)


def _stable_argsort(xp, a):
    if xp is np:
        return np.argsort(a, axis=-1, kind="stable")
    return xp.argsort(a, axis=-1)  # CuPy's sort is stable


def _zero_gradients(propagate_down, bottom):
    """Metrics have no gradient; where one is asked for anyway (force_backward), it is zero."""
    for i, wanted in enumerate(propagate_down):
        if wanted:
            bottom[i].diff = _xp(bottom[i].data).zeros(bottom[i].shape, dtype=bottom[i].dtype)


class LossLayer(Layer):
    """Base of the loss layers: a scalar top, bottoms 0 and 1 with the same first dimension, and
    no gradient into the label (bottom 1)."""

    is_loss = True
    exact_num_bottom = 2
    exact_num_top = 1
    #: Bottoms that hold labels (or other non-differentiable inputs).
    label_bottoms: tuple[int, ...] = (1,)
    #: On a GPU, the last forward's label check, read at the next (``_check_label_range``).
    _pending_label_check = None

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index not in self.label_bottoms

    def reshape(self, bottom, top):
        if bottom[0].shape[:1] != bottom[1].shape[:1]:
            raise self.error(f"the data and label should have the same first dimension: "
                             f"{bottom[0].shape} vs {bottom[1].shape}")
        top[0].reshape(())

    def reshape_one_label_per_item(self, bottom, top):
        """reshape() of the losses whose bottom 1 holds one class label per item (N x C scores)."""
        LossLayer.reshape(self, bottom, top)
        if bottom[1].count != bottom[1].shape[0]:
            raise self.error(f"labels must be one value per item, got shape {bottom[1].shape}")

    def _scores_and_labels(self, bottom):
        """bottom 0 as an (N, C) matrix and bottom 1 as checked integer labels; sets ``self.num``."""
        x = bottom[0].data
        self.num = bottom[0].shape[0]
        scores = x.reshape(self.num, -1)
        labels = _as_int_labels(bottom[1].data.reshape(-1))
        xp = _xp(x)
        self._check_label_range(xp, labels, xp.ones(labels.shape, dtype=bool), scores.shape[1])
        return scores, labels

    def _refuse_label_gradients(self, propagate_down):
        for i in self.label_bottoms:
            if i < len(propagate_down) and propagate_down[i]:
                raise self.error(f"cannot backpropagate to label input bottom[{i}]")

    def _check_label_range(self, xp, labels, valid, num_labels: int):
        # Caffe only DCHECKs this; an out-of-range label would silently index elsewhere here.
        bad = valid & ((labels < 0) | (labels >= num_labels))
        if xp is np:
            if bool(bad.any()):
                first = int(labels[bad].ravel()[0])
                raise self.error(f"label {first} out of range [0, {num_labels})")
            return
        # On a GPU, reading the answer at once would make the host wait for the whole forward pass so
        # far, with nothing queued behind it (benchmarks/README.md, "The first GPU figures"). The check
        # runs on the device and its answer is read at this layer's next forward, when the device has
        # long finished it: a bad batch stops training one forward later.
        self._raise_pending_label_error()
        flat_bad = bad.ravel()
        self._pending_label_check = (flat_bad.any(), labels.ravel()[xp.argmax(flat_bad)], num_labels)

    def _raise_pending_label_error(self) -> None:
        """Raise for the labels of the last forward on a GPU, if any was out of range."""
        pending, self._pending_label_check = self._pending_label_check, None
        if pending is not None and bool(pending[0]):
            raise self.error(f"label {int(pending[1])} out of range [0, {pending[2]}) (the batch before this "
                             f"one: on a GPU the check is read one forward later)")


# ---------------------------------------------------------------------------------------------- Softmax
@register_layer("Softmax")
class SoftmaxLayer(Layer):
    """Softmax over one axis (numerically stable: the maximum is subtracted first).

    bottom[0]: (N x C x H x W ...) x.   top[0]: same shape,
        y_c = exp(x_c) / sum_c' exp(x_c')   along ``softmax_param.axis`` (default 1).
    dx = (dy - sum_c(dy * y)) * y.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        self.axis = bottom[0].canonical_axis(self.layer_param.softmax_param.axis)
        top[0].reshape_like(bottom[0])

    def forward(self, bottom, top):
        top[0].data = _softmax(bottom[0].data, self.axis)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y, dy = top[0].data, top[0].diff
        dot = (dy * y).sum(axis=self.axis, keepdims=True)
        bottom[0].diff = (dy - dot) * y


# ---------------------------------------------------------------------------------------------- SoftmaxWithLoss
@register_layer("SoftmaxWithLoss")
class SoftmaxWithLossLayer(LossLayer):
    """Softmax followed by the multinomial logistic loss, with a stable gradient.

    bottom[0]: (N x C x H x W ...) scores x; the softmax runs over ``softmax_param.axis`` (default 1).
    bottom[1]: labels, N x H x W values in {0..C-1} (any shape with that count, e.g. N x 1 x H x W).
    top[0]:    () loss = -sum_{valid n,h,w} log(max(p[n, label, h, w], FLT_MIN)) / normalizer,
               where positions whose label equals ``loss_param.ignore_label`` are not valid.
    top[1]:    (optional) the probabilities p, shape of bottom[0].
    dx = (p - onehot(label)) * valid * loss_weight / normalizer.
    Normalization defaults to VALID.
    """

    exact_num_top = None
    min_top = 1
    max_top = 2

    def setup(self, bottom, top):
        lp = self.layer_param.loss_param
        self.has_ignore = lp.HasField("ignore_label")
        self.ignore_label = lp.ignore_label
        self.mode = normalization_mode(lp, _Norm.VALID)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        x = bottom[0]
        self.axis = x.canonical_axis(self.layer_param.softmax_param.axis)
        self.outer = x.count_range(0, self.axis)
        self.inner = x.count_range(self.axis + 1)
        self.channels = x.shape[self.axis]
        if self.outer * self.inner != bottom[1].count:
            raise self.error(
                f"number of labels must match number of predictions: scores {x.shape} with softmax axis "
                f"{self.axis} need {self.outer * self.inner} labels, got {bottom[1].count} ({bottom[1].shape})")
        if len(top) > 1:
            top[1].reshape_like(x)

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = _xp(x)
        prob = _softmax(x.reshape(self.outer, self.channels, self.inner), 1)
        labels = _as_int_labels(bottom[1].data.reshape(self.outer, self.inner))
        valid = labels != self.ignore_label if self.has_ignore else xp.ones(labels.shape, dtype=bool)
        self._check_label_range(xp, labels, valid, self.channels)
        safe = xp.where(valid, labels, 0)
        p_true = xp.take_along_axis(prob, safe[:, None, :], axis=1)[:, 0, :]
        log_p = xp.log(xp.maximum(p_true, FLT_MIN))
        self.norm = normalizer(xp, self.mode, self.outer, self.inner, valid.sum())
        top[0].data = -xp.where(valid, log_p, 0).sum() / self.norm
        self.prob, self.safe, self.valid = prob, safe, valid
        if len(top) > 1:
            top[1].data = prob.reshape(x.shape)

    def backward(self, top, propagate_down, bottom):
        self._refuse_label_gradients(propagate_down)
        if not propagate_down[0]:
            return
        xp = _xp(self.prob)
        onehot = xp.arange(self.channels)[None, :, None] == self.safe[:, None, :]
        grad = (self.prob - onehot) * self.valid[:, None, :]
        bottom[0].diff = grad * (top[0].diff / self.norm)


# ---------------------------------------------------------------------------------------------- SigmoidCrossEntropyLoss
@register_layer("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(LossLayer):
    """Cross-entropy of sigmoid(x) against targets in [0, 1].

    bottom[0]: (N x C x H x W ...) scores x.   bottom[1]: targets t, same count.
    top[0]:    () loss = -sum_valid [t log s(x) + (1 - t) log(1 - s(x))] / normalizer, computed stably as
               sum_valid [max(x, 0) - x t + log(1 + exp(-|x|))]; a target whose integer value equals
               ``loss_param.ignore_label`` is not valid.
    dx = (s(x) - t) * valid * loss_weight / normalizer.
    Normalization defaults to BATCH_SIZE (divide by N), unlike SoftmaxWithLoss.
    """

    def setup(self, bottom, top):
        lp = self.layer_param.loss_param
        self.has_ignore = lp.HasField("ignore_label")
        self.ignore_label = lp.ignore_label
        self.mode = normalization_mode(lp, _Norm.BATCH_SIZE)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count != bottom[1].count:
            raise self.error(f"SIGMOID_CROSS_ENTROPY_LOSS layer inputs must have the same count: "
                             f"{bottom[0].shape} vs {bottom[1].shape}")

    def forward(self, bottom, top):
        x = bottom[0].data
        t = bottom[1].data.reshape(x.shape)
        xp = _xp(x)
        e = xp.exp(-xp.abs(x))
        per_item = xp.maximum(x, 0) - x * t + xp.log1p(e)
        if self.has_ignore:
            valid = _as_int_labels(t) != self.ignore_label
            total = xp.where(valid, per_item, 0).sum()
            count = valid.sum()
        else:
            valid = None
            total = per_item.sum()
            count = None
        outer = bottom[0].shape[0] if bottom[0].num_axes else 1
        self.norm = normalizer(xp, self.mode, outer, bottom[0].count // max(outer, 1), count)
        top[0].data = total / self.norm
        self.sigmoid = xp.where(x >= 0, 1 / (1 + e), e / (1 + e))
        self.valid = valid

    def backward(self, top, propagate_down, bottom):
        self._refuse_label_gradients(propagate_down)
        if not propagate_down[0]:
            return
        grad = self.sigmoid - bottom[1].data.reshape(self.sigmoid.shape)
        if self.valid is not None:
            grad = grad * self.valid
        bottom[0].diff = grad * (top[0].diff / self.norm)


# ---------------------------------------------------------------------------------------------- EuclideanLoss
@register_layer("EuclideanLoss")
class EuclideanLossLayer(LossLayer):
    """Half the mean squared distance.

    bottom[0]: (N x C x H x W ...) a.   bottom[1]: b, same count per item.
    top[0]:    () loss = sum (a - b)^2 / (2N).
    da = (a - b) * loss_weight / N;  db = -da  (both bottoms take a gradient).
    """

    label_bottoms = ()

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count_range(1) != bottom[1].count_range(1):
            raise self.error(f"inputs must have the same dimension: {bottom[0].shape} vs {bottom[1].shape}")

    def forward(self, bottom, top):
        a = bottom[0].data
        self.diff_ = a - bottom[1].data.reshape(a.shape)
        self.num = bottom[0].shape[0]
        top[0].data = (self.diff_ * self.diff_).sum() / self.num / 2

    def backward(self, top, propagate_down, bottom):
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                bottom[i].diff = self.diff_ * (sign * top[0].diff / self.num)


# ---------------------------------------------------------------------------------------------- HingeLoss
@register_layer("HingeLoss")
class HingeLossLayer(LossLayer):
    """One-versus-all hinge loss.

    bottom[0]: (N x C x ...) scores x (flattened to N x D).   bottom[1]: N labels in {0..D-1}.
    top[0]:    () loss = sum_{n,k} m_nk / N (L1) or sum m_nk^2 / N (L2),
               m_nk = max(0, 1 - t_nk x_nk), t_nk = +1 if k == label_n else -1.
    dx_nk = -t_nk * [m_nk > 0] * w / N (L1) or -t_nk * 2 m_nk * w / N (L2), w = loss_weight.
    """

    def setup(self, bottom, top):
        self.norm = self.layer_param.hinge_loss_param.norm

    reshape = LossLayer.reshape_one_label_per_item

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = _xp(x)
        xm, labels = self._scores_and_labels(bottom)
        # sign_nk = -t_nk; Caffe negates the label entry and keeps the others.
        sign = xp.where(xp.arange(xm.shape[1])[None, :] == labels[:, None], -1.0, 1.0).astype(x.dtype)
        margin = xp.maximum(0, 1 + sign * xm)
        self.sign, self.margin = sign, margin
        if self.norm == pb.HingeLossParameter.L2:
            top[0].data = (margin * margin).sum() / self.num
        else:
            top[0].data = margin.sum() / self.num

    def backward(self, top, propagate_down, bottom):
        self._refuse_label_gradients(propagate_down)
        if not propagate_down[0]:
            return
        xp = _xp(self.margin)
        if self.norm == pb.HingeLossParameter.L2:
            grad = self.sign * self.margin * (2 * top[0].diff / self.num)
        else:
            grad = self.sign * (self.margin > 0) * (top[0].diff / self.num)
        bottom[0].diff = xp.asarray(grad).reshape(bottom[0].shape)


# ---------------------------------------------------------------------------------------------- MultinomialLogisticLoss
@register_layer("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(LossLayer):
    """Negative log-likelihood of given probabilities.

    bottom[0]: (N x C x 1 x 1, or N x C) probabilities p.   bottom[1]: N labels in {0..C-1}.
    top[0]:    () loss = -sum_n log(max(p[n, label_n], 1e-20)) / N.
    dp[n, label_n] = -loss_weight / (N * max(p[n, label_n], 1e-20)); every other entry 0.
    """

    reshape = LossLayer.reshape_one_label_per_item

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = _xp(x)
        xm, labels = self._scores_and_labels(bottom)
        self.p_true = xp.maximum(xp.take_along_axis(xm, labels[:, None], axis=1)[:, 0], LOG_THRESHOLD)
        self.labels = labels
        top[0].data = -xp.log(self.p_true).sum() / self.num

    def backward(self, top, propagate_down, bottom):
        self._refuse_label_gradients(propagate_down)
        if not propagate_down[0]:
            return
        xp = _xp(self.p_true)
        dim = bottom[0].count // self.num
        onehot = xp.arange(dim)[None, :] == self.labels[:, None]
        value = -top[0].diff / (self.num * self.p_true)
        bottom[0].diff = (onehot * value[:, None]).reshape(bottom[0].shape)


# ---------------------------------------------------------------------------------------------- InfogainLoss
def read_blob_proto(path: str) -> np.ndarray:
    """A binary BlobProto file as a float64 array of its shape (legacy num/channels/height/width too)."""
    blob = pb.BlobProto()
    blob.ParseFromString(read_input_file(path, "infogain matrix file", PROTOBUF_LIMIT))
    values = np.asarray(blob.double_data if len(blob.double_data) else blob.data, dtype=np.float64)
    if blob.HasField("shape"):
        shape = tuple(int(d) for d in blob.shape.dim)
    else:
        shape = (blob.num, blob.channels, blob.height, blob.width)
    if int(np.prod(shape)) != values.size:
        shape = (values.size,)
    return values.reshape(shape)


@register_layer("InfogainLoss")
class InfogainLossLayer(LossLayer):
    """Multinomial logistic loss weighted by an "infogain" matrix H; this Caffe version applies the
    softmax itself, so bottom 0 holds scores.

    bottom[0]: (N x C x H x W ...) scores x; softmax over ``infogain_loss_param.axis`` (default 1).
    bottom[1]: labels, one per position (N x H x W values in {0..C-1}).
    bottom[2]: (optional) C x C matrix H; otherwise read from ``infogain_loss_param.source``
               (a binary BlobProto file).
    top[0]:    () loss = -sum_{valid positions} sum_l H[label, l] log(max(p_l, 1e-20)) / normalizer.
    top[1]:    (optional) the probabilities p, shape of bottom[0].
    dx_l = (p_l * sum_k H[label, k] - H[label, l]) * valid * loss_weight / normalizer.
    Normalization as SoftmaxWithLoss (default VALID); neither the labels nor H take a gradient.
    """

    exact_num_bottom = None
    min_bottom = 2
    max_bottom = 3
    exact_num_top = None
    min_top = 1
    max_top = 2
    label_bottoms = (1, 2)

    def setup(self, bottom, top):
        lp = self.layer_param.loss_param
        self.has_ignore = lp.HasField("ignore_label")
        self.ignore_label = lp.ignore_label
        self.mode = normalization_mode(lp, _Norm.VALID)
        self.infogain = None
        if len(bottom) < 3:
            param = self.layer_param.infogain_loss_param
            if not param.source:
                raise self.error("infogain matrix source must be specified (infogain_loss_param.source) "
                                 "when there is no third bottom")
            try:
                values = read_blob_proto(param.source)
            except OSError as exc:
                raise self.error(f"cannot read infogain matrix {param.source!r}: {exc}") from exc
            self.infogain = backend.to_device(values.astype(bottom[0].dtype), like=bottom[0].data)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        x = bottom[0]
        self.axis = x.canonical_axis(self.layer_param.infogain_loss_param.axis)
        self.outer = x.count_range(0, self.axis)
        self.inner = x.count_range(self.axis + 1)
        self.channels = x.shape[self.axis]
        if self.outer * self.inner != bottom[1].count:
            raise self.error(f"number of labels must match number of predictions: scores {x.shape} need "
                             f"{self.outer * self.inner} labels, got {bottom[1].count}")
        h_count = bottom[2].count if len(bottom) > 2 else self.infogain.size
        if h_count != self.channels * self.channels:
            raise self.error(f"infogain matrix has {h_count} values, expected {self.channels}^2")
        if len(top) > 1:
            top[1].reshape_like(x)

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = _xp(x)
        H = (bottom[2].data if len(bottom) > 2 else self.infogain).reshape(self.channels, self.channels)
        prob = _softmax(x.reshape(self.outer, self.channels, self.inner), 1)
        labels = _as_int_labels(bottom[1].data.reshape(self.outer, self.inner))
        valid = labels != self.ignore_label if self.has_ignore else xp.ones(labels.shape, dtype=bool)
        self._check_label_range(xp, labels, valid, self.channels)
        safe = xp.where(valid, labels, 0)
        h_rows = xp.moveaxis(H[safe], 2, 1)  # (outer, C, inner): row H[label] at each position
        terms = h_rows * xp.log(xp.maximum(prob, LOG_THRESHOLD))
        self.norm = normalizer(xp, self.mode, self.outer, self.inner, valid.sum())
        top[0].data = -(terms * valid[:, None, :]).sum() / self.norm
        self.prob, self.h_rows, self.valid = prob, h_rows, valid
        if len(top) > 1:
            top[1].data = prob.reshape(x.shape)

    def backward(self, top, propagate_down, bottom):
        self._refuse_label_gradients(propagate_down)
        if not propagate_down[0]:
            return
        row_sums = self.h_rows.sum(axis=1, keepdims=True)
        grad = (self.prob * row_sums - self.h_rows) * self.valid[:, None, :]
        bottom[0].diff = grad * (top[0].diff / self.norm)


# ---------------------------------------------------------------------------------------------- ContrastiveLoss
@register_layer("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    """Contrastive loss of Hadsell, Chopra and LeCun (2006) over pairs of feature vectors.

    bottom[0]: (N x C x 1 x 1) a.   bottom[1]: (N x C x 1 x 1) b.
    bottom[2]: (N x 1 x 1 x 1) similarity y (nonzero integer value: similar pair).
    top[0]:    () loss = sum_n [y_n d_n^2 + (1 - y_n) max(margin - d_n, 0)^2] / (2N), d_n = ||a_n - b_n||;
               legacy_version uses max(margin - d_n^2, 0) for dissimilar pairs.
    Gradient as Caffe computes it: similar da = w/N (a - b); dissimilar, when the hinge is active,
    da = -w/N (margin - d)/(d + 1e-4) (a - b) (legacy: -w/N (a - b)); db = -da; w = loss_weight.
    """

    exact_num_bottom = 3
    label_bottoms = (2,)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].shape != bottom[1].shape:
            raise self.error(f"the two feature bottoms must have the same shape: {bottom[0].shape} vs {bottom[1].shape}")
        if bottom[2].count != bottom[0].shape[0]:
            raise self.error(f"similarity bottom must hold one value per pair, got shape {bottom[2].shape}")

    def forward(self, bottom, top):
        param = self.layer_param.contrastive_loss_param
        a = bottom[0].data
        xp = _xp(a)
        self.num = bottom[0].shape[0]
        self.diff_ = (a - bottom[1].data).reshape(self.num, -1)
        self.dist_sq = (self.diff_ * self.diff_).sum(axis=1)
        self.similar = _as_int_labels(bottom[2].data.reshape(-1)) != 0
        margin = param.margin
        if param.legacy_version:
            dissimilar = xp.maximum(margin - self.dist_sq, 0)
        else:
            dissimilar = xp.maximum(margin - xp.sqrt(self.dist_sq), 0) ** 2
        top[0].data = xp.where(self.similar, self.dist_sq, dissimilar).sum() / self.num / 2

    def backward(self, top, propagate_down, bottom):
        self._refuse_label_gradients(propagate_down)
        if not (propagate_down[0] or propagate_down[1]):
            return
        param = self.layer_param.contrastive_loss_param
        xp = _xp(self.diff_)
        margin = param.margin
        if param.legacy_version:
            active = (margin - self.dist_sq) > 0
            dissimilar = -active.astype(self.diff_.dtype)
        else:
            dist = xp.sqrt(self.dist_sq)
            mdist = margin - dist
            # Caffe's 1e-4 keeps the division finite when the pair coincides.
            dissimilar = xp.where(mdist > 0, -mdist / (dist + 1e-4), 0)
        coeff = xp.where(self.similar, 1.0, dissimilar).astype(self.diff_.dtype)
        grad = (coeff[:, None] * self.diff_).reshape(bottom[0].shape) * (top[0].diff / self.num)
        if propagate_down[0]:
            bottom[0].diff = grad
        if propagate_down[1]:
            bottom[1].diff = -grad


# ---------------------------------------------------------------------------------------------- Accuracy
@register_layer("Accuracy")
class AccuracyLayer(Layer):
    """Top-k classification accuracy (a metric: no backward, not a loss).

    bottom[0]: (N x C x H x W ...) scores; classes along ``accuracy_param.axis`` (default 1).
    bottom[1]: labels, one per position (N x H x W values in {0..C-1}).
    top[0]:    () fraction of valid positions whose true class is in the top k, where a class counts
               as better than the true class when its score is >= the true class's score (so ties
               count against the prediction); positions labelled ``ignore_label`` are left out; 0 if none.
    top[1]:    (optional) (C) the same accuracy per true class; 0 for a class with no position.
    Caffe has no backward here; if force_backward asks for a gradient anyway, it is zero.
    """

    exact_num_bottom = 2
    min_top = 1
    max_top = 2

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def setup(self, bottom, top):
        param = self.layer_param.accuracy_param
        self.top_k = int(param.top_k)
        self.has_ignore = param.HasField("ignore_label")
        self.ignore_label = param.ignore_label

    def reshape(self, bottom, top):
        x = bottom[0]
        if self.top_k > x.count // max(bottom[1].count, 1):
            raise self.error("top_k must be less than or equal to the number of classes")
        self.axis = x.canonical_axis(self.layer_param.accuracy_param.axis)
        self.outer = x.count_range(0, self.axis)
        self.inner = x.count_range(self.axis + 1)
        self.channels = x.shape[self.axis]
        if self.outer * self.inner != bottom[1].count:
            raise self.error(f"number of labels must match number of predictions: scores {x.shape} need "
                             f"{self.outer * self.inner} labels, got {bottom[1].count}")
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape(self.channels)

    def forward(self, bottom, top):
        scores = bottom[0].data.reshape(self.outer, self.channels, self.inner)
        xp = _xp(scores)
        labels = _as_int_labels(bottom[1].data.reshape(self.outer, self.inner))
        valid = labels != self.ignore_label if self.has_ignore else xp.ones(labels.shape, dtype=bool)
        bad = valid & ((labels < 0) | (labels >= self.channels))
        if bool(bad.any()):
            raise self.error(f"label out of range [0, {self.channels})")
        safe = xp.where(valid, labels, 0)
        true_score = xp.take_along_axis(scores, safe[:, None, :], axis=1)
        # The true class compares >= with itself, hence the -1.
        better = (scores >= true_score).sum(axis=1) - 1
        correct = valid & (better < self.top_k)
        count = valid.sum()
        hits = correct.sum()
        top[0].data = xp.where(count > 0, hits / xp.maximum(count, 1), 0)
        if len(top) > 1:
            flat = safe.ravel()
            per_class_n = xp.bincount(flat, weights=valid.ravel().astype(np.float64), minlength=self.channels)
            per_class_hits = xp.bincount(flat, weights=correct.ravel().astype(np.float64), minlength=self.channels)
            top[1].data = xp.where(per_class_n > 0, per_class_hits / xp.maximum(per_class_n, 1), 0)

    def backward(self, top, propagate_down, bottom):
        _zero_gradients(propagate_down, bottom)


# ---------------------------------------------------------------------------------------------- ArgMax
@register_layer("ArgMax")
class ArgMaxLayer(Layer):
    """Indices (and optionally values) of the top_k largest entries (no backward).

    bottom[0]: (N x C x H x W ...) x.
    Without ``argmax_param.axis``: entries of each item (flattened over all axes after the first)
        top[0] = (N x 1 x k) indices, or (N x 2 x k) = (indices; values) with out_max_val
        (extra trailing axes of size 1 when the bottom has more than 3 axes).
    With ``axis``: top[0] = bottom's shape with that axis replaced by k, holding the indices, or
        only the values with out_max_val.
    Order: decreasing value; equal values in decreasing index order (Caffe sorts (value, index)
    pairs in descending order). Indices are written as floats.
    Caffe has no backward here; if force_backward asks for a gradient anyway, it is zero.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def allow_force_backward(self, bottom_index: int) -> bool:
        return False

    def setup(self, bottom, top):
        param = self.layer_param.argmax_param
        self.out_max_val = bool(param.out_max_val)
        self.top_k = int(param.top_k)
        self.has_axis = param.HasField("axis")
        if self.top_k < 1:
            raise self.error("top_k must be at least 1")

    def reshape(self, bottom, top):
        x = bottom[0]
        if self.has_axis:
            self.axis = x.canonical_axis(self.layer_param.argmax_param.axis)
            if self.top_k > x.shape[self.axis]:
                raise self.error(f"top_k {self.top_k} exceeds the size {x.shape[self.axis]} of axis {self.axis}")
            shape = list(x.shape)
            shape[self.axis] = self.top_k
        else:
            if self.top_k > x.count_range(1):
                raise self.error(f"top_k {self.top_k} exceeds the {x.count_range(1)} entries per item")
            shape = [1] * max(3, x.num_axes)
            shape[0] = x.shape[0]
            shape[1] = 2 if self.out_max_val else 1
            shape[2] = self.top_k
        top[0].reshape(tuple(shape))

    def _top_k(self, values):
        """Indices and values of the top k along the last axis, in Caffe's order."""
        xp = _xp(values)
        dim = values.shape[-1]
        # Sorting the reversed row stably by decreasing value puts equal values in decreasing
        # original index order, as std::greater on (value, index) pairs does.
        order = _stable_argsort(xp, -values[..., ::-1])[..., : self.top_k]
        idx = dim - 1 - order
        return idx, xp.take_along_axis(values, idx, axis=-1)

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = _xp(x)
        if self.has_axis:
            idx, val = self._top_k(xp.moveaxis(x, self.axis, -1))
            out = val if self.out_max_val else idx.astype(x.dtype)
            top[0].data = xp.moveaxis(out, -1, self.axis)
        else:
            idx, val = self._top_k(x.reshape(x.shape[0], -1))
            if self.out_max_val:
                out = xp.stack([idx.astype(x.dtype), val], axis=1)
            else:
                out = idx.astype(x.dtype)[:, None, :]
            top[0].data = out.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        _zero_gradients(propagate_down, bottom)
