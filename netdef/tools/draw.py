"""``netdef draw MODEL OUT.{png,svg,pdf,dot}``: a picture of a net definition, laid out by Graphviz.

As Caffe's python/draw_net.py: layers are boxes (name, type and the parameters that say what the layer
does: kernel, stride, pad, outputs, pooling method), coloured by family, and blobs are octagons, with
an edge from each bottom blob to the layer and from the layer to each top. The definition is drawn,
not a built net, so a model whose data files are elsewhere draws too; ``phase`` keeps the layers of
one phase (TRAIN or TEST, as the net would be built), None keeps every layer.

In-place layers (a ReLU, BatchNorm or Scale whose top is its bottom) would otherwise point back at
the blob they read; they are listed inside the box of the layer that produced the blob (or inside the
blob's octagon when a net input is modified in place), in order, so the picture keeps the data flow.

The layout is Graphviz's ``dot`` program, run on the DOT text; ``OUT.dot`` writes that text alone.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

from .. import files
from ..net import layer_included
from ..proto import io as proto_io
from ..proto import netdef_pb2 as pb
from ..upgrade import upgrade_net

FORMATS = ("png", "svg", "pdf", "dot")
RANKDIRS = ("LR", "TB", "BT", "RL")
# Caffe's draw_net colours.
_COLOURS = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
            "InnerProduct": "#CC33FF"}
_DEFAULT_COLOUR = "#6495ED"
_BLOB_COLOUR = "#E0E0E0"
DOT_MISSING = ("Graphviz's 'dot' program is not on PATH; netdef draw needs it: install the graphviz package "
               "(apt-get install graphviz, dnf install graphviz, brew install graphviz or conda install graphviz)")


class DrawError(ValueError):
    """A drawing that cannot be made: an unknown format, a missing ``dot``, an output that exists."""


@dataclasses.dataclass
class _Node:
    ident: str
    lines: list


def describe_layer(layer: pb.LayerParameter) -> list[str]:
    """The lines of a layer's box: name, type, then what its parameters make it do."""
    lines = [layer.name, f"({layer.type})"]
    if layer.type in ("Convolution", "Deconvolution"):
        cp = layer.convolution_param
        lines.append(_window(_sizes(cp.kernel_size, cp.kernel_h, cp.kernel_w), _sizes(cp.stride, cp.stride_h,
                                                                                      cp.stride_w, 1),
                             _sizes(cp.pad, cp.pad_h, cp.pad_w, 0)))
        lines.append(f"{cp.num_output} outputs" + (f", group {cp.group}" if cp.group > 1 else ""))
    elif layer.type == "Pooling":
        pp = layer.pooling_param
        method = pb.PoolingParameter.PoolMethod.Name(pp.pool)
        if pp.global_pooling:
            lines.append(f"{method} global")
        else:
            kernel = (pp.kernel_h, pp.kernel_w) if pp.HasField("kernel_h") else (pp.kernel_size, pp.kernel_size)
            stride = (pp.stride_h, pp.stride_w) if pp.HasField("stride_h") else (pp.stride, pp.stride)
            pad = (pp.pad_h, pp.pad_w) if pp.HasField("pad_h") else (pp.pad, pp.pad)
            lines.append(f"{method} {_window(kernel, stride, pad)}")
    elif layer.type == "InnerProduct":
        lines.append(f"{layer.inner_product_param.num_output} outputs")
    elif layer.type == "LRN":
        lines.append(f"size {layer.lrn_param.local_size}")
    elif layer.type == "Dropout":
        lines.append(f"ratio {layer.dropout_param.dropout_ratio:g}")
    elif layer.type == "Eltwise":
        lines.append(pb.EltwiseParameter.EltwiseOp.Name(layer.eltwise_param.operation))
    return lines


def _sizes(repeated, h: int, w: int, default: int | None = None) -> tuple:
    """(h, w) of a convolution's kernel/stride/pad: the _h/_w pair when given, else the repeated field."""
    if h or w:
        return h, w
    values = list(repeated) or ([default] if default is not None else [])
    if not values:
        return ()
    return (values[0], values[-1]) if len(values) <= 2 else tuple(values)


def _window(kernel, stride, pad) -> str:
    """"5x5 stride 2 pad 1": the kernel in full, a stride or pad once when it is the same on every axis."""
    def text(values):
        return "x".join(str(v) for v in values) if len(set(values)) > 1 else str(values[0]) if values else "?"

    out = "x".join(str(k) for k in kernel) if kernel else "?"
    if stride and max(stride) > 1:
        out += f" stride {text(stride)}"
    if pad and max(pad) > 0:
        out += f" pad {text(pad)}"
    return out


def net_to_dot(net: pb.NetParameter, rankdir: str = "LR", phase: int | None = None) -> str:
    """The DOT text of ``net`` (upgraded already), with the layers of ``phase`` (None: all)."""
    if rankdir not in RANKDIRS:
        raise DrawError(f"--rankdir must be one of {', '.join(RANKDIRS)}, got {rankdir!r}")
    layers = list(net.layer)
    if phase is not None:
        state = pb.NetState(phase=phase)
        state.MergeFrom(net.state)
        state.phase = phase
        layers = [layer for layer in layers if layer_included(layer, state)]
    layer_nodes: list[tuple[_Node, pb.LayerParameter]] = []
    blob_nodes: dict[str, _Node] = {}       # one node per blob name (a TRAIN and a TEST data layer share it)
    producer: dict[str, _Node] = {}         # the layer node that last wrote each blob
    edges: list[tuple[str, str]] = []
    all_blob_nodes: list[_Node] = []

    def blob(name: str) -> _Node:
        if name not in blob_nodes:
            node = _Node(f"blob{len(all_blob_nodes)}", [name])
            blob_nodes[name] = node
            all_blob_nodes.append(node)
        return blob_nodes[name]

    for index, layer in enumerate(layers):
        if layer.top and list(layer.top) == list(layer.bottom):
            host = producer.get(layer.top[0]) or blob(layer.top[0])
            host.lines.append(f"+ {layer.name} ({layer.type})")
            continue
        node = _Node(f"layer{index}", describe_layer(layer))
        layer_nodes.append((node, layer))
        for name in layer.bottom:
            edges.append((blob(name).ident, node.ident))
        for name in layer.top:
            edges.append((node.ident, blob(name).ident))
            producer[name] = node
    out = [f'digraph "{_escape(net.name or "net")}" {{', f"  rankdir={rankdir};",
           '  node [fontname="Helvetica", fontsize=11];', '  edge [color="#555555"];']
    for node, layer in layer_nodes:
        colour = _COLOURS.get(layer.type, _DEFAULT_COLOUR)
        out.append(f'  {node.ident} [shape=box, style="rounded,filled", fillcolor="{colour}", '
                   f'label="{_label(node.lines)}"];')
    for node in all_blob_nodes:
        out.append(f'  {node.ident} [shape=octagon, style=filled, fillcolor="{_BLOB_COLOUR}", '
                   f'label="{_label(node.lines)}"];')
    out.extend(f"  {a} -> {b};" for a, b in edges)
    out.append("}")
    return "\n".join(out) + "\n"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _label(lines: list[str]) -> str:
    return "\\n".join(_escape(line) for line in lines)


def draw(model, output, rankdir: str = "LR", phase: int | None = None, overwrite: bool = False) -> None:
    """Draw the net in the prototxt ``model`` to ``output``, whose extension gives the format."""
    output = os.fspath(output)
    fmt = os.path.splitext(output)[1].lstrip(".").lower()
    if fmt not in FORMATS:
        raise DrawError(f"{output}: the file name must end in one of .{', .'.join(FORMATS)} (the format to draw)")
    if os.path.lexists(output) and not overwrite:
        raise DrawError(f"{output} exists; not replacing it (pass --overwrite to replace it)")
    param, _, name = proto_io.read_net_param(model)
    upgrade_net(param, name)
    text = net_to_dot(param, rankdir=rankdir, phase=phase)
    if fmt == "dot":
        files.write_bytes_atomically(output, text.encode("utf-8"))
        return
    files.write_bytes_atomically(output, render(text, fmt))


def render(dot_text: str, fmt: str) -> bytes:
    """Graphviz's rendering of ``dot_text`` in ``fmt`` (png, svg, pdf)."""
    program = shutil.which("dot")
    if program is None:
        raise DrawError(DOT_MISSING)
    done = subprocess.run([program, f"-T{fmt}"], input=dot_text.encode("utf-8"), capture_output=True)
    if done.returncode != 0:
        detail = " ".join(done.stderr.decode(errors="replace").split())
        raise DrawError(f"Graphviz's dot failed (exit status {done.returncode}): {detail}")
    return done.stdout
