"""What of a built TEST net goes into the ONNX graph: which layers, in which steps, under which names.

Outputs. By default the net's outputs (the blobs no layer reads) except those of loss layers and
metrics (Accuracy): a TEST net written for scoring (train_val.prototxt) exports its scores, and the
layers only the loss or the metric needs (the label's data layer, the loss, Accuracy) are left out.
A net whose every output is a loss or a metric is refused. Explicit outputs may name any blob.

Layers. Only the layers those outputs depend on are exported; any of them without an ONNX
counterpart makes the export fail, naming each such layer and its type. Data layers (Input, Data,
ImageData, ...) become graph inputs of the net's shapes for the tops that are needed.

Names. ONNX names each tensor once; a Caffe blob rewritten in place has one version per writer.
The last version of a blob keeps the blob's name (a graph input keeps it for its first version), so
that the graph's inputs and outputs are named as the prototxt's blobs; the earlier versions are
called ``blob/layer``.

Folding. A BatchNorm whose output only a channel-wise Scale reads becomes, with that Scale, one
ONNX BatchNormalization (Caffe splits the affine part off into the Scale layer).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from .graph import unique_name
from .registry import CONVERTERS, INPUT_TYPES, METRIC_TYPES


class OnnxExportError(ValueError):
    """A net, layer or setting that the ONNX export cannot express; the message names it."""


@dataclass
class Step:
    """One converter call: a layer (or a BatchNorm and the Scale folded into it) with the tensor
    names of its bottoms and tops and their shapes in the net."""

    layers: list
    bottoms: list[str]
    tops: list[str]
    bottom_shapes: list[tuple]
    top_shapes: list[tuple]
    source: str

    @property
    def layer(self):
        return self.layers[0]

    @property
    def name(self) -> str:
        return self.layer.name

    def refuse(self, reason: str) -> OnnxExportError:
        """The error for a setting of this layer that ONNX cannot express."""
        return OnnxExportError(f"{self.source}: layer {self.layer.name!r} ({self.layer.type}): {reason}")


@dataclass
class Plan:
    inputs: list[tuple[str, tuple]]
    steps: list[Step]
    outputs: list[tuple[str, tuple]]
    #: Layers of the net that no exported output needs (losses, metrics, label paths).
    left_out: list = field(default_factory=list)
    #: Every tensor name the plan gave out (the graph must not reuse them).
    tensor_names: set[str] = field(default_factory=set)


def plan_export(net, outputs=None) -> Plan:
    wanted = _wanted_outputs(net, outputs)
    kept, left_out = _needed_layers(net.layers, wanted)
    _check_supported(net, [layer for layer, _ in kept])
    plan = _name_tensors(net, kept, wanted)
    plan.left_out = left_out
    plan.steps = _fold_scales(plan.steps, {name for name, _ in plan.outputs})
    return plan


# ---------------------------------------------------------------------------------------------- outputs
def _is_loss_or_metric(layer, top: str) -> bool:
    if layer.is_loss or layer.type in METRIC_TYPES:
        return True
    weights = layer.layer_param.loss_weight
    tops = list(layer.layer_param.top)
    return bool(weights) and top in tops and weights[tops.index(top)] != 0


def _wanted_outputs(net, outputs) -> list[str]:
    if outputs:
        for name in outputs:
            if name not in net.blobs:
                raise OnnxExportError(f"{net.source}: no blob {name!r} to export as an output "
                                      f"(the net's outputs: {', '.join(net.outputs)})")
        return list(dict.fromkeys(outputs))
    last_writer = {}
    for layer in net.layers:
        for top in layer.layer_param.top:
            last_writer[top] = layer
    wanted = [name for name in net.outputs if not _is_loss_or_metric(last_writer[name], name)]
    if not wanted:
        raise OnnxExportError(f"{net.source}: every output of the TEST net ({', '.join(net.outputs)}) is a loss "
                              f"or a metric, which an ONNX graph for deployment leaves out; export the deploy "
                              f"net (deploy.prototxt), or name the blobs to export (--outputs)")
    return wanted


# ---------------------------------------------------------------------------------------------- layers
def _needed_layers(layers, wanted: list[str]):
    """(the layers the wanted blobs depend on, each with its needed tops, in order; the others)."""
    needed = set(wanted)
    kept, left_out = [], []
    for layer in reversed(layers):
        param = layer.layer_param
        hit = [top for top in param.top if top in needed]
        if not hit:
            left_out.append(layer)
            continue
        kept.append((layer, hit))
        needed.difference_update(param.top)
        needed.update(param.bottom)  # an in-place layer's blob stays needed before it
    return kept[::-1], left_out[::-1]


def _check_supported(net, layers) -> None:
    missing = [layer for layer in layers if layer.type not in CONVERTERS and layer.type not in INPUT_TYPES]
    if missing:
        named = ", ".join(f"{layer.name!r} ({layer.type})" for layer in missing)
        raise OnnxExportError(f"{net.source}: no ONNX counterpart for layer{'s' if len(missing) > 1 else ''} {named}, "
                              f"which the exported outputs need")


# ---------------------------------------------------------------------------------------------- names
def _name_tensors(net, kept, wanted: list[str]) -> Plan:
    input_blobs = {top for layer, hit in kept if layer.type in INPUT_TYPES for top in hit}
    writes = collections.Counter(top for layer, _ in kept for top in layer.layer_param.top)
    taken = set(writes) | {b for layer, _ in kept for b in layer.layer_param.bottom}
    seen: collections.Counter = collections.Counter()
    current: dict[str, str] = {}
    inputs, steps = [], []

    def shape(blob: str) -> tuple:
        return tuple(net.blobs[blob].shape)

    for layer, hit in kept:
        param = layer.layer_param
        if layer.type in INPUT_TYPES:
            for top in hit:
                seen[top] += 1
                current[top] = top
                inputs.append((top, shape(top)))
            continue
        bottoms = [current[b] for b in param.bottom]
        tops = []
        for top in param.top:
            seen[top] += 1
            keeps_name = seen[top] == writes[top] and top not in input_blobs
            name = top if keeps_name else unique_name(f"{top}/{layer.name}", taken)
            current[top] = name
            tops.append(name)
        steps.append(Step([layer], bottoms, tops, [shape(b) for b in param.bottom], [shape(t) for t in param.top],
                          net.source))
    outputs = [(current[name], shape(name)) for name in wanted]
    return Plan(inputs, steps, outputs, tensor_names=taken)


# ---------------------------------------------------------------------------------------------- folding
def _fold_scales(steps: list[Step], graph_outputs: set[str]) -> list[Step]:
    readers = collections.defaultdict(list)
    for index, step in enumerate(steps):
        for bottom in step.bottoms:
            readers[bottom].append(index)
    folded: dict[int, Step] = {}
    absorbed: set[int] = set()
    for index, step in enumerate(steps):
        if step.layer.type != "BatchNorm" or step.tops[0] in graph_outputs:
            continue
        reader = readers[step.tops[0]]
        if len(reader) == 1 and _channel_scale(steps[reader[0]], step.top_shapes[0]):
            scale = steps[reader[0]]
            folded[index] = Step(step.layers + scale.layers, step.bottoms, scale.tops, step.bottom_shapes,
                                 scale.top_shapes, step.source)
            absorbed.add(reader[0])
    return [folded.get(i, step) for i, step in enumerate(steps) if i not in absorbed]


def _channel_scale(step: Step, shape: tuple) -> bool:
    """Whether ``step`` is a Scale layer with a learned scale per channel of an (N x C ...) input."""
    layer = step.layer
    if layer.type != "Scale" or len(step.bottoms) != 1 or len(shape) < 2:
        return False
    axis = layer.layer_param.scale_param.axis
    return (axis + len(shape) if axis < 0 else axis) == 1 and tuple(layer.blobs[0].shape) == (shape[1],)
