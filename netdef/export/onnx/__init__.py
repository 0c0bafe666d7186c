"""ONNX export: a built TEST-phase net as an ONNX graph (opset 17) with its weights.

    import netdef
    from netdef.export.onnx import export_onnx
    net = netdef.Net("deploy.prototxt", netdef.TEST, weights="model.caffemodel")
    export_onnx(net, "model.onnx")

The graph takes the net's data blobs as inputs, of the net's shapes, and gives its outputs under
the blobs' names; plan.py says which layers go in, registry.py which Caffe types have an ONNX
counterpart, and one module per family (vision, dense, neuron, normalization, shape, scores) writes
their nodes. Needs the ``onnx`` package (the ``onnx`` extra).
"""
from __future__ import annotations

try:
    import onnx
except ImportError as exc:  # the one line the command prints
    raise ImportError("ONNX export needs the onnx package: pip install 'netdef-trainer[onnx]' "
                      "(or pip install onnx)") from exc

from ...files import write_bytes_atomically
from ...layers.base import TEST
from .graph import OPSET, OnnxGraph
from .plan import OnnxExportError, Plan, plan_export
from .registry import CONVERTERS, INPUT_TYPES

__all__ = ["OPSET", "OnnxExportError", "export_onnx", "supported_types", "to_onnx"]


def supported_types() -> list[str]:
    """The Caffe layer types the export writes (data layers become graph inputs)."""
    return sorted(set(CONVERTERS.names()) | INPUT_TYPES)


def to_onnx(net, outputs=None) -> tuple[onnx.ModelProto, Plan]:
    """The ONNX model of ``net`` (built in the TEST phase) and the plan it followed. ``outputs``
    names the blobs to export (default: the net's outputs that are not losses or metrics)."""
    if net.phase != TEST:
        raise OnnxExportError(f"{net.source}: export the TEST-phase net (this one was built for TRAIN)")
    plan = plan_export(net, outputs)
    graph = OnnxGraph(plan.tensor_names)
    for name, shape in plan.inputs:
        graph.add_input(name, shape)
    for step in plan.steps:
        CONVERTERS.get(step.layer.type)(graph, step)
    for name, shape in plan.outputs:
        graph.add_output(name, shape)
    return graph.model(net.name), plan


def export_onnx(net, path, outputs=None, overwrite: bool = False) -> Plan:
    """Write ``net`` as an ONNX file (atomically); an existing file is replaced only with ``overwrite``."""
    import os

    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(f"{path} exists; choose another name or allow replacing it (--overwrite)")
    model, plan = to_onnx(net, outputs)
    write_bytes_atomically(path, model.SerializeToString())
    return plan
