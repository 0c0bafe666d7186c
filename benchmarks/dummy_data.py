"""A zoo model's TRAIN net with its data layers replaced by DummyData, to time or train it without a
dataset (scaling_model.py, scaling_published.py):

    python benchmarks/dummy_data.py models/lenet/lenet_train_test.prototxt 64 1,28,28 > lenet_dummy.prototxt
"""
from __future__ import annotations

import sys

DATA_TYPES = {"Data", "ImageData", "HDF5Data", "WindowData", "MemoryData", "Input", "DummyData"}


def dummy_data_text(model_path: str, batch: int, shape: tuple[int, ...]) -> str:
    """The TRAIN-phase layers of ``model_path``, its data layers replaced by one DummyData layer
    whose tops are ``batch x shape`` constant images and ``batch`` labels (class 1)."""
    from netdef.net import layer_included
    from netdef.proto import io as proto_io
    from netdef.proto import netdef_pb2 as pb

    param, _, _ = proto_io.read_net_param(model_path)
    state = pb.NetState(phase=pb.TRAIN)
    out = pb.NetParameter(name=param.name)
    replaced = False
    for layer in param.layer:
        if not layer_included(layer, state):
            continue
        if layer.type in DATA_TYPES:
            if replaced:
                continue
            replaced = True
            dummy = out.layer.add(name=layer.name, type="DummyData")
            dummy.top.extend(layer.top)
            dummy.dummy_data_param.shape.add(dim=[batch, *shape])
            dummy.dummy_data_param.data_filler.add(type="constant", value=0.5)
            if len(layer.top) > 1:
                dummy.dummy_data_param.shape.add(dim=[batch])
                dummy.dummy_data_param.data_filler.add(type="constant", value=1)
            continue
        copy = out.layer.add()
        copy.CopyFrom(layer)
        del copy.include[:]
        del copy.exclude[:]
    if not replaced:
        raise ValueError(f"{model_path}: no data layer to replace")
    from google.protobuf import text_format

    return text_format.MessageToString(out)


if __name__ == "__main__":
    print(dummy_data_text(sys.argv[1], int(sys.argv[2]), tuple(int(d) for d in sys.argv[3].split(","))))
