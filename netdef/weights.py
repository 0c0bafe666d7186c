"""Parameters to and from Caffe's files: ``.caffemodel`` (binary NetParameter, V2 or legacy V1) and
Caffe's HDF5 weights (``.caffemodel.h5``).

Loading matches layers by name as Caffe's CopyTrainedLayersFrom does: source layers absent from the
net are ignored, a layer's blob count and every blob's shape must agree (legacy 4-D num/channels/height/
width dims compare against the blob's trailing axes, as Caffe's ShapeEquals does).

The HDF5 layout is Caffe's Net::ToHDF5: a group ``/data/<layer>`` for every layer (empty for layers
without parameters) holding datasets ``0``, ``1``... (float32) only for the parameters the layer owns;
a parameter shared by ``param { name }`` is stored once, under the first layer that uses it. With
``write_diff`` a group ``/diff/<layer>`` holds the gradients of every parameter, shared or not.
Loading follows CopyTrainedLayersFromHDF5: shapes must match exactly, and a dataset may be missing only
for a parameter the layer shares with an earlier one.

Writes are atomic (see ``netdef.files``). The solver's snapshots use these functions; this module never
depends on the solver.
"""
from __future__ import annotations

import logging
import os
import pathlib

import numpy as np

from . import backend
from . import files
from .blob import Blob
from .data.hdf5 import read_dataset
from .proto import io as proto_io
from .proto import netdef_pb2 as pb
from .upgrade import upgrade_net

logger = logging.getLogger("netdef")


class WeightsError(ValueError):
    """Weights that do not fit the net; the message names the file, layer and blob index."""


def proto_shape(proto: pb.BlobProto) -> tuple[int, ...]:
    """The shape stored in a BlobProto: ``shape`` or the legacy 4-D fields."""
    if proto.HasField("shape"):
        return tuple(int(d) for d in proto.shape.dim)
    if any(proto.HasField(f) for f in ("num", "channels", "height", "width")):
        return (proto.num, proto.channels, proto.height, proto.width)
    return (len(proto.double_data) or len(proto.data),)


def legacy_dims(shape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """Caffe's LegacyShape(-4..-1): the trailing four axes, 1 where absent; None beyond 4 axes."""
    if len(shape) > 4:
        return None
    return (1,) * (4 - len(shape)) + tuple(shape)


def shape_matches(proto: pb.BlobProto, shape: tuple[int, ...]) -> bool:
    if proto.HasField("shape") or not any(proto.HasField(f) for f in ("num", "channels", "height", "width")):
        return proto_shape(proto) == tuple(shape)
    return legacy_dims(tuple(shape)) == (proto.num, proto.channels, proto.height, proto.width)


def proto_values(proto: pb.BlobProto, diff: bool = False) -> np.ndarray:
    doubles = proto.double_diff if diff else proto.double_data
    floats = proto.diff if diff else proto.data
    if len(doubles):
        return np.asarray(doubles, dtype=np.float64)
    return np.asarray(floats, dtype=np.float32)


def blob_from_proto(proto: pb.BlobProto, name: str = "") -> Blob:
    shape = proto_shape(proto)
    blob = Blob(shape, name=name)
    values = proto_values(proto)
    if values.size != blob.count:
        raise WeightsError(f"blob {name!r}: {values.size} values stored for shape {shape}")
    blob.data[...] = backend.to_device(values.reshape(shape).astype(blob.dtype), like=blob.data)
    return blob


def blob_to_proto(blob: Blob, write_diff: bool = False) -> pb.BlobProto:
    proto = pb.BlobProto()
    proto.shape.dim.extend(blob.shape)
    proto.data.extend(backend.to_host(blob.data).astype(np.float32).ravel().tolist())
    if write_diff:
        proto.diff.extend(backend.to_host(blob.diff).astype(np.float32).ravel().tolist())
    return proto


def _fill_from(blob: Blob, values: np.ndarray) -> None:
    blob.data[...] = backend.to_device(np.asarray(values).reshape(blob.shape).astype(blob.dtype), like=blob.data)


def _is_hdf5(path: pathlib.Path) -> bool:
    """Whether ``path`` starts with HDF5's signature; a WeightsError unless it is a regular file."""
    try:
        with files.open_input_file(path, "weights file") as handle:
            return handle.read(8) == b"\x89HDF\r\n\x1a\n"
    except files.InputFileError as exc:
        raise WeightsError(str(exc)) from None


def copy_from(net, path) -> None:
    """Copy parameters from a Caffe weights file into ``net``, by layer name."""
    path = pathlib.Path(path)
    # lexists: a link that leads nowhere (a loop, a missing target) is there, and opening it says why.
    if not os.path.lexists(path):
        raise WeightsError(f"{path}: no such weights file")
    if _is_hdf5(path):
        copy_from_hdf5(net, path)
        return
    source = proto_io.read_binary(path, pb.NetParameter)
    upgrade_net(source, str(path))
    layers = net.layer_dict
    for src in source.layer:
        target = layers.get(src.name)
        if target is None:
            logger.info("Ignoring source layer %s", src.name)
            continue
        if not src.blobs:
            continue
        if len(src.blobs) != len(target.blobs):
            raise WeightsError(f"{path}: layer {src.name!r} has {len(src.blobs)} blobs in the file but "
                               f"{len(target.blobs)} in the net ({target.type})")
        for j, (proto, blob) in enumerate(zip(src.blobs, target.blobs)):
            if not shape_matches(proto, blob.shape):
                raise WeightsError(f"{path}: cannot copy param {j} of layer {src.name!r}: shape mismatch; the "
                                   f"file has {proto_shape(proto)}, the net has {blob.shape}. To learn this "
                                   f"layer's parameters from scratch rather than copying from a saved net, "
                                   f"rename the layer.")
            values = proto_values(proto)
            if values.size != blob.count:
                raise WeightsError(f"{path}: layer {src.name!r} param {j}: {values.size} values for {blob.shape}")
            _fill_from(blob, values)


def share_with(net, other) -> None:
    """Use ``other``'s parameter blobs in ``net`` for layers of the same name (same shapes required)."""
    theirs = other.layer_dict
    for li, layer in enumerate(net.layers):
        source = theirs.get(layer.name)
        if source is None or not layer.blobs:
            continue
        if len(source.blobs) != len(layer.blobs):
            raise WeightsError(f"cannot share layer {layer.name!r}: {len(source.blobs)} vs {len(layer.blobs)} blobs")
        for j, blob in enumerate(source.blobs):
            if blob.shape != layer.blobs[j].shape:
                raise WeightsError(f"cannot share param {j} of layer {layer.name!r}: {blob.shape} vs "
                                   f"{layer.blobs[j].shape}")
            layer.blobs[j] = blob
        if layer.name in net.params:
            net.params[layer.name] = layer.blobs
    # Learnable parameter lists point at the shared blobs too.
    for pid, owner in enumerate(net.learnable_params):
        for li in range(len(net.layers)):
            ids = net.layer_learnable_ids(li)
            for j, lid in enumerate(ids):
                if lid == pid:
                    net.learnable_params[pid] = net.layers[li].blobs[j]
                    break
            else:
                continue
            break


def to_proto(net, write_diff: bool = False) -> pb.NetParameter:
    """The net's definition with every layer's blobs, as Caffe's Net::ToProto writes it."""
    out = pb.NetParameter()
    out.name = net.name
    for layer in net.layers:
        lp = out.layer.add()
        lp.CopyFrom(layer.layer_param)
        del lp.blobs[:]
        for blob in layer.blobs:
            lp.blobs.append(blob_to_proto(blob, write_diff))
    return out


def save(net, path, write_diff: bool = False) -> None:
    proto_io.write_binary(path, to_proto(net, write_diff))


# ============================================================================================ HDF5
def _import_h5py(path):
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a test dependency
        raise WeightsError(f"{path}: HDF5 weights need h5py (pip install h5py)") from None
    return h5py


def _owned_params(net) -> list[list[bool]]:
    """Per layer, per blob: whether the layer owns the parameter (Caffe's param_owners_ == -1), i.e.
    no earlier layer uses the same parameter."""
    seen: set = set()
    owned = []
    for li, layer in enumerate(net.layers):
        row = []
        for lid in net.layer_learnable_ids(li):
            row.append(lid not in seen)
            seen.add(lid)
        owned.append(row)
    return owned


def write_model_hdf5(handle, net, write_diff: bool = False) -> None:
    """Caffe's Net::ToHDF5 into an open, empty h5py file (the layout is in the module docstring)."""
    owned = _owned_params(net)
    data = handle.create_group("data")
    diff = handle.create_group("diff") if write_diff else None
    for li, layer in enumerate(net.layers):
        layer_data = data.create_group(layer.name)
        layer_diff = diff.create_group(layer.name) if diff is not None else None
        for j, blob in enumerate(layer.blobs):
            if owned[li][j]:
                layer_data.create_dataset(str(j), data=backend.to_host(blob.data).astype(np.float32))
            if layer_diff is not None:
                layer_diff.create_dataset(str(j), data=backend.to_host(blob.diff).astype(np.float32))


def save_hdf5(net, path, write_diff: bool = False) -> None:
    """Write ``net``'s parameters as Caffe's ``.caffemodel.h5``, atomically."""
    _import_h5py(path)
    files.write_hdf5_atomically(path, lambda handle: write_model_hdf5(handle, net, write_diff))


def copy_from_hdf5(net, path) -> None:
    """Caffe's CopyTrainedLayersFromHDF5: copy ``/data/<layer>/<i>`` into ``net`` by layer name."""
    h5py = _import_h5py(path)
    owned = _owned_params(net)
    index = {layer.name: li for li, layer in enumerate(net.layers)}
    with h5py.File(path, "r") as handle:
        if "data" not in handle:
            raise WeightsError(f"{path}: not a Caffe HDF5 weights file (no /data group)")
        data = handle["data"]
        for name in data:
            li = index.get(name)
            if li is None:
                logger.info("Ignoring source layer %s", name)
                continue
            layer = net.layers[li]
            group = data[name]
            if len(group) > len(layer.blobs):
                raise WeightsError(f"{path}: incompatible number of blobs for layer {name!r}: {len(group)} in the "
                                   f"file, {len(layer.blobs)} in the net")
            for j, blob in enumerate(layer.blobs):
                if str(j) not in group:
                    # Caffe stores a shared parameter once, under its owner, which loads it.
                    if not owned[li][j]:
                        continue
                    raise WeightsError(f"{path}: incompatible number of blobs for layer {name!r}: param {j} is "
                                       f"missing")
                dataset = group[str(j)]
                # The shape the file declares is compared before anything is read: it can declare far
                # more than it holds (netdef/data/hdf5.py).
                if tuple(dataset.shape) != tuple(blob.shape):
                    raise WeightsError(f"{path}: cannot copy param {j} of layer {name!r}: shape mismatch; the "
                                       f"file has {tuple(dataset.shape)}, the net has {blob.shape}")
                _fill_from(blob, read_dataset(dataset, path))
