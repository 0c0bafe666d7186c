"""Split insertion, as Caffe's insert_splits: a blob read by several layers gets a Split layer.

Layers *write* bottom diffs, so a blob with two consumers needs a layer that owns the sum of their
gradients. The Split layer and blob names are Caffe's (``<blob>_<layer>_<top index>_split[_<k>]``), so
``net.blobs`` lists the same names as pycaffe does. A top with an explicit non-zero ``loss_weight`` that
is also read by other layers keeps its loss on the Split's first top.
"""
from __future__ import annotations

from .proto import netdef_pb2 as pb


def split_layer_name(layer_name: str, blob_name: str, top_index: int) -> str:
    return f"{blob_name}_{layer_name}_{top_index}_split"


def split_blob_name(layer_name: str, blob_name: str, top_index: int, split_index: int) -> str:
    return f"{blob_name}_{layer_name}_{top_index}_split_{split_index}"


def insert_splits(layers: list[pb.LayerParameter]) -> tuple[list[pb.LayerParameter], list[int | None]]:
    """(layers with Split layers added, for each output layer the index of its input layer or None)."""
    last_top: dict[str, tuple[int, int]] = {}       # blob name -> (layer, top index) that last wrote it
    source_of: dict[tuple[int, int], tuple[int, int]] = {}  # (layer, bottom index) -> (layer, top index)
    reads: dict[tuple[int, int], int] = {}
    loss_weight: dict[tuple[int, int], float] = {}
    for i, layer in enumerate(layers):
        for j, bottom in enumerate(layer.bottom):
            if bottom not in last_top:
                continue  # the net builder reports the unknown bottom with its file position
            source_of[(i, j)] = last_top[bottom]
            reads[last_top[bottom]] = reads.get(last_top[bottom], 0) + 1
        for j, top in enumerate(layer.top):
            last_top[top] = (i, j)
            if j < len(layer.loss_weight) and layer.loss_weight[j]:
                loss_weight[(i, j)] = layer.loss_weight[j]
                reads[(i, j)] = reads.get((i, j), 0) + 1

    out: list[pb.LayerParameter] = []
    origin: list[int | None] = []
    next_split: dict[tuple[int, int], int] = {}
    for i, original in enumerate(layers):
        layer = pb.LayerParameter()
        layer.CopyFrom(original)
        for j, bottom in enumerate(layer.bottom):
            src = source_of.get((i, j))
            if src is not None and reads[src] > 1:
                producer = layers[src[0]].name
                k = next_split.get(src, 0)
                layer.bottom[j] = split_blob_name(producer, bottom, src[1], k)
                next_split[src] = k + 1
        out.append(layer)
        origin.append(i)
        for j, top in enumerate(layer.top):
            count = reads.get((i, j), 0)
            if count <= 1:
                continue
            split = pb.LayerParameter(name=split_layer_name(layer.name, top, j), type="Split")
            split.bottom.append(top)
            split.top.extend(split_blob_name(layer.name, top, j, k) for k in range(count))
            weight = loss_weight.get((i, j), 0.0)
            if weight:
                split.loss_weight.extend([weight] + [0.0] * (count - 1))
                # The loss moves to the split's first top, which nothing reads. (Caffe clears all of
                # the layer's loss weights here; clearing only this top's keeps the others.)
                layer.loss_weight[j] = 0.0
                next_split[(i, j)] = next_split.get((i, j), 0) + 1
            out.append(split)
            origin.append(None)
    return out, origin
