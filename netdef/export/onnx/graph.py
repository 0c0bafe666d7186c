"""The ONNX graph under construction: nodes, initializers, inputs and outputs, with unique names.

ONNX names every tensor once (static single assignment) where Caffe reuses a blob's name for each
in-place rewrite; the plan (plan.py) gives every version of a blob its own tensor name, and the
converters ask this class for the names of their intermediate tensors and weights.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ... import backend

#: The ONNX operator set the exported graphs use (ONNX 1.12, 2022; checked with onnxruntime 1.32): its
#: Softmax works along one axis as Caffe's does (from opset 13 on), Split takes its sizes as an input.
OPSET = 17
#: The file format version that goes with opset 17 (ONNX 1.12), so that older runtimes read the file.
IR_VERSION = 8


def unique_name(hint: str, taken: set[str]) -> str:
    """``hint``, or ``hint_1``, ``hint_2``... whichever is not in ``taken`` first; added to ``taken``."""
    name, k = hint, 1
    while name in taken:
        name, k = f"{hint}_{k}", k + 1
    taken.add(name)
    return name


class OnnxGraph:
    """Collects the graph; ``model()`` returns the finished, checked ModelProto."""

    def __init__(self, reserved_names=()):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._tensor_names: set[str] = set(reserved_names)
        self._node_names: set[str] = set()

    # ------------------------------------------------------------------ names
    def tensor_name(self, hint: str) -> str:
        """A tensor name not used yet, ``hint`` itself when it is free."""
        return unique_name(hint, self._tensor_names)

    # ------------------------------------------------------------------ contents
    def node(self, op: str, inputs: list[str], outputs: list[str], **attributes) -> list[str]:
        """Add one node (named after its first output); returns its outputs."""
        name = unique_name(outputs[0], self._node_names)
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attributes))
        return outputs

    def step(self, op: str, inputs: list[str], hint: str, **attributes) -> str:
        """Add a node with one new intermediate output named after ``hint``; returns that name."""
        return self.node(op, inputs, [self.tensor_name(hint)], **attributes)[0]

    def chain(self, x: str, ops: list[tuple], out: str, hint: str) -> str:
        """Apply ``ops`` one after the other to tensor ``x``, the last writing ``out``. Each op is
        (op type, extra inputs after the running tensor, attributes); no ops is an Identity."""
        if not ops:
            return self.node("Identity", [x], [out])[0]
        for k, (op, extra, attributes) in enumerate(ops):
            target = out if k == len(ops) - 1 else self.tensor_name(f"{hint}/{op.lower()}")
            x = self.node(op, [x, *extra], [target], **attributes)[0]
        return x

    def weight(self, hint: str, array) -> str:
        """A float32 initializer holding ``array`` (a NumPy or CuPy array); returns its name."""
        values = np.ascontiguousarray(backend.to_host(array), dtype=np.float32)
        return self._initializer(hint, values)

    def ints(self, hint: str, values) -> str:
        """An int64 initializer (shapes, split sizes, axes); returns its name."""
        return self._initializer(hint, np.asarray(values, dtype=np.int64))

    def _initializer(self, hint: str, values: np.ndarray) -> str:
        name = self.tensor_name(hint)
        self.initializers.append(numpy_helper.from_array(values, name))
        return name

    def add_input(self, name: str, shape) -> None:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))

    def add_output(self, name: str, shape) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))

    def model(self, graph_name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name or "netdef", self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, producer_name="netdef", opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model
