"""What a net costs, layer by layer: top shapes, parameters, multiply-adds and activation memory.

    summary = summarize(netdef.Net("deploy.prototxt", netdef.TEST))
    print(format_summary(summary))           # what `netdef summary MODEL` prints

Conventions (Caffe never had such a table; these are the ones papers quote):

- One multiply-add (MAC) is one multiplication and the addition that accumulates it. Only the layers
  whose work is products count: Convolution (top elements x input channels per group x kernel
  elements), Deconvolution (bottom elements x output channels per group x kernel elements) and
  InnerProduct (top elements x inputs per output). Every other layer (ReLU, pooling, BatchNorm, Scale,
  Eltwise, LRN, Softmax...) counts 0: their work is a few operations per element, not per weight, and
  the published figures (ResNet's 3.8 G, MobileNet's 569 M) leave them out too. Biases are not counted.
- Parameters are the elements of a layer's parameter blobs (what a .caffemodel stores), a blob shared
  by several layers counted at its first. The learnable ones are those the solver updates (lr_mult not
  0); the rest are BatchNorm's statistics and frozen layers.
- Activation memory is the bytes of the tops a layer writes: an in-place top (ReLU over its bottom) is
  the bottom's blob, counted once, and a top that is a view of its bottom's data (Split, Flatten,
  Reshape) holds no memory of its own. Gradients (diffs) of the same size come on top in training.
"""
from __future__ import annotations

import dataclasses
import math

from . import backend
from .net import Net


@dataclasses.dataclass(frozen=True)
class LayerSummary:
    name: str
    type: str
    tops: tuple               # ((blob name, shape), ...)
    params: int               # elements of the layer's own parameter blobs
    learnable_params: int     # of which the solver updates (lr_mult != 0)
    param_bytes: int
    macs: int                 # multiply-adds of one forward pass over the whole batch
    activation_bytes: int     # bytes of the tops this layer adds to the net's memory


@dataclasses.dataclass(frozen=True)
class NetSummary:
    name: str
    batch: int                # images per forward pass: the first axis of the net's first top
    layers: tuple

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def learnable_params(self) -> int:
        return sum(layer.learnable_params for layer in self.layers)

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def macs(self) -> int:
        return sum(layer.macs for layer in self.layers)

    @property
    def macs_per_image(self) -> float:
        return self.macs / self.batch

    @property
    def activation_bytes(self) -> int:
        return sum(layer.activation_bytes for layer in self.layers)


# ============================================================================================ counting
def layer_macs(layer, bottoms, tops) -> int:
    """Multiply-adds of one forward pass of ``layer`` (module docstring)."""
    if not layer.blobs:
        return 0
    weights = layer.blobs[0]
    if layer.type == "Convolution":
        # weights: num_output x (channels / group) x kernel; each top element sums that many products.
        return tops[0].count * (weights.count // weights.shape[0]) * len(tops)
    if layer.type == "Deconvolution":
        # weights: channels x (num_output / group) x kernel; each bottom element spreads over that many.
        return sum(bottom.count for bottom in bottoms) * (weights.count // weights.shape[0])
    if layer.type == "InnerProduct":
        outputs = layer.layer_param.inner_product_param.num_output
        return tops[0].count * (weights.count // outputs)
    return 0


def _holds_own_memory(top, bottoms) -> bool:
    """False for an in-place top (it is a bottom's blob) and for a view of a bottom's data."""
    for bottom in bottoms:
        if top is bottom:
            return False
        if top.has_data and bottom.has_data:
            xp = backend.get_array_module(top.data)
            if xp.may_share_memory(top.data, bottom.data):
                return False
    return True


def _blob_bytes(blob) -> int:
    return blob.count * blob.dtype(0).itemsize


def summarize(net: Net) -> NetSummary:
    """The per-layer figures of a built net (its current shapes)."""
    rows = []
    counted: set[int] = set()   # learnable-parameter ids already counted (shared blobs count once)
    for li, layer in enumerate(net.layers):
        bottoms = [net.blobs[name] for name in net.bottom_names[layer.name]]
        tops = [net.blobs[name] for name in net.top_names[layer.name]]
        params = learnable = param_bytes = 0
        for blob, param_id in zip(layer.blobs, net.layer_learnable_ids(li)):
            if param_id in counted:
                continue
            counted.add(param_id)
            params += blob.count
            param_bytes += _blob_bytes(blob)
            if net.params_lr[param_id] != 0:
                learnable += blob.count
        activation = sum(_blob_bytes(top) for top in tops if _holds_own_memory(top, bottoms))
        top_shapes = tuple((name, net.blobs[name].shape) for name in net.top_names[layer.name])
        rows.append(LayerSummary(layer.name, layer.type, top_shapes, params, learnable, param_bytes,
                                 layer_macs(layer, bottoms, tops), activation))
    first_top = rows[0].tops[0][1] if rows and rows[0].tops else ()
    batch = first_top[0] if first_top else 1
    return NetSummary(net.name, batch, tuple(rows))


# ============================================================================================ printing
def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:g}"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:g} B"


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def format_summary(summary: NetSummary) -> str:
    """The table `netdef summary` prints: a row a layer (a row more for each further top), then totals.
    The Split layers the net inserted where a blob feeds several layers are left out: they share their
    bottom's data and cost nothing here."""
    rows = [("layer", "type", "top shape", "params", "MACs", "activations")]
    for layer in summary.layers:
        if layer.type == "Split":
            continue
        tops = layer.tops or (("", ()),)
        for i, (_, shape) in enumerate(tops):
            first = i == 0
            rows.append((layer.name if first else "", layer.type if first else "", _shape(shape) if tops[0][0] else "",
                         f"{layer.params:,}" if first and layer.params else "",
                         _count(layer.macs) if first and layer.macs else "",
                         _bytes(layer.activation_bytes) if first and layer.activation_bytes else ""))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if c < 3 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths)))
             .rstrip() for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    fixed = summary.params - summary.learnable_params
    lines += [
        "",
        f"net {summary.name!r}, batch {summary.batch}",
        f"parameters:        {summary.params:,} ({summary.learnable_params:,} learnable"
        + (f", {fixed:,} fixed: BatchNorm statistics or lr_mult 0)" if fixed else ")"),
        f"parameter memory:  {_bytes(summary.param_bytes)}",
        f"multiply-adds:     {summary.macs:,} per batch, {math.floor(summary.macs_per_image):,} per image "
        f"({_count(summary.macs_per_image)}; convolutions and inner products only, 1 MAC = 1 multiply-add)",
        f"activation memory: {_bytes(summary.activation_bytes)} per batch (tops, in-place ones once; "
        f"training adds as much again for their gradients)",
    ]
    return "\n".join(lines)
