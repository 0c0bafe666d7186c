"""A net built without its data: ``--data_shape`` of ``netdef summary`` and ``netdef time``.

Each layer that reads records from files (``FILE_DATA_LAYERS``) becomes an Input of the same name,
tops and phase rules, so that a train_val whose LMDBs are not on this machine can still be
summarized or timed:

    net = build_net("models/resnet50/train_val.prototxt", netdef.TRAIN, data_shape=(3, 224, 224))

Errors name the prototxt's file and line as ``netdef.Net(path)`` would. Without ``data_shape`` the
net is built as it is, and a data layer that cannot be set up (its DB missing or unreadable, its
mean file absent) is reported with the hint to give ``--data_shape``: only that failure, because
only there would the flag help.
"""
from __future__ import annotations

from .net import Net, NetError
from .proto import io as proto_io
from .proto import netdef_pb2 as pb
from .upgrade import upgrade_net

# Layers that read their records from files, and the field holding their batch size.
FILE_DATA_LAYERS = {"Data": "data_param", "ImageData": "image_data_param", "HDF5Data": "hdf5_data_param",
                    "WindowData": "window_data_param"}

HINT = "to build the net without its data, give --data_shape C,H,W: each data layer becomes an Input of that shape"


class DataShapeError(ValueError):
    """A ``--data_shape`` that is not C,H,W or N,C,H,W of positive whole numbers."""


def parse_data_shape(text: str) -> tuple[int, ...]:
    """``"3,224,224"`` (C,H,W: the batch is each data layer's batch_size) or ``"N,C,H,W"``."""
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise DataShapeError(f"--data_shape: {text!r} is not comma-separated whole numbers (C,H,W or N,C,H,W)") from None
    if len(dims) not in (3, 4) or min(dims) < 1:
        raise DataShapeError(f"--data_shape: {text!r} must be C,H,W or N,C,H,W of positive numbers")
    return dims


def with_data_as_input(param: pb.NetParameter, data_shape: tuple[int, ...]) -> pb.NetParameter:
    """``param`` with every layer that reads records from files (FILE_DATA_LAYERS) replaced by an Input
    of the same name, tops and phase rules: its first top ``data_shape`` (N from the layer's batch_size
    when only C,H,W are given), every other top (labels) N. The layers keep their order and number."""
    out = pb.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for layer in param.layer:
        if layer.type not in FILE_DATA_LAYERS:
            out.layer.add().CopyFrom(layer)
            continue
        batch = getattr(layer, FILE_DATA_LAYERS[layer.type]).batch_size
        shape = data_shape if len(data_shape) == 4 else (batch,) + data_shape
        replacement = out.layer.add(name=layer.name, type="Input", top=layer.top, include=layer.include,
                                    exclude=layer.exclude)
        replacement.input_param.shape.add(dim=shape)
        for _ in layer.top[1:]:
            replacement.input_param.shape.add(dim=shape[:1])
    return out


def build_net(model_path: str, phase: int, *, stages=(), level: int = 0,
              data_shape: tuple[int, ...] | None = None) -> Net:
    """The net of the prototxt ``model_path`` in ``phase`` (netdef.TRAIN or TEST), its file data layers
    replaced by Inputs when ``data_shape`` is given (so that no LMDB need exist)."""
    if data_shape is None:
        try:
            return Net(model_path, phase, stages=stages, level=level)
        except NetError as exc:
            if exc.layer_type in FILE_DATA_LAYERS:
                raise NetError(f"{exc} ({HINT})", layer_type=exc.layer_type) from exc
            raise
    param, _, source = proto_io.read_net_param(model_path)
    try:
        upgrade_net(param, source)   # V1 'layers' become 'layer', so that their data layers are found
    except ValueError as exc:
        raise NetError(str(exc)) from None
    return Net(with_data_as_input(param, data_shape), phase, stages=stages, level=level, read_from=model_path)
