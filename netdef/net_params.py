"""A net's learnable parameters: sharing by ``param { name }`` and each parameter's lr and decay
multipliers, as Caffe's ``Net::AppendParam``.

A layer's parameter blob named by ``param { name: ... }`` after an earlier layer's of that name is
that layer's blob (same shape), or a view of its data and gradient (``share_mode: PERMISSIVE``, same
count); it adds no learnable parameter of its own. A parameter whose layer does not propagate down to
it (BatchNorm's statistics) or whose ``lr_mult`` is 0 is fixed: its learning rate and decay are 0.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from .blob import Blob
from .proto import netdef_pb2 as pb


class ParamSharingError(ValueError):
    """A ``param`` specification that cannot hold; the message starts with the layer's name (the net
    puts the file and line before it)."""


@dataclass
class NetParams:
    """What ``share_params`` builds: the net's attributes of those names (pycaffe's ``params``, Caffe's
    ``learnable_params``, ``params_lr``, ``params_weight_decay``) and, per layer and parameter blob,
    the index into ``learnable_params`` of the blob it uses (``learnable_id_of``)."""
    params: "collections.OrderedDict[str, list[Blob]]" = field(default_factory=collections.OrderedDict)
    learnable_params: list[Blob] = field(default_factory=list)
    params_lr: list[float] = field(default_factory=list)
    params_weight_decay: list[float] = field(default_factory=list)
    learnable_id_of: list[list[int]] = field(default_factory=list)


def share_params(layers, layer_params, where_of) -> NetParams:
    """The parameters of ``layers`` (built from ``layer_params``, in order), shared as their ``param``
    specifications say; ``where_of(li)`` is the file and line of layer ``li``, for errors. Shared
    blobs are replaced in ``layer.blobs`` and fixed ones get ``param_propagate_down`` False."""
    out = NetParams()
    owner_index: dict[str, int] = {}
    for li, (layer, layer_param) in enumerate(zip(layers, layer_params)):
        where = where_of(li)
        ids = []
        if layer.blobs:
            out.params[layer.name] = layer.blobs
        if len(layer_param.param) > len(layer.blobs):
            raise ParamSharingError(f"{where}: layer {layer.name!r} has {len(layer_param.param)} param specs but "
                                    f"only {len(layer.blobs)} parameter blobs")
        for j, blob in enumerate(layer.blobs):
            blob.name = blob.name or f"{layer.name}[{j}]"
            spec = layer_param.param[j] if j < len(layer_param.param) else pb.ParamSpec()
            fixed = not layer.param_propagate_down[j]  # e.g. BatchNorm's statistics
            lr = 0.0 if fixed else spec.lr_mult
            if spec.lr_mult == 0 or fixed:
                layer.param_propagate_down[j] = False
            if spec.name and spec.name in owner_index:
                owner_id = owner_index[spec.name]
                _share(layer, j, blob, spec, lr, out.learnable_params[owner_id], out.params_lr[owner_id], where)
                ids.append(owner_id)
                continue
            ids.append(len(out.learnable_params))
            if spec.name:
                owner_index[spec.name] = len(out.learnable_params)
            out.learnable_params.append(blob)
            out.params_lr.append(lr)
            out.params_weight_decay.append(0.0 if fixed else spec.decay_mult)
        out.learnable_id_of.append(ids)
    return out


def _share(layer, j: int, blob: Blob, spec, lr: float, owner: Blob, owner_lr: float, where: str) -> None:
    """Make parameter ``j`` of ``layer`` (``blob``) the ``owner`` blob, or a view of it."""
    if spec.share_mode == pb.ParamSpec.PERMISSIVE:
        if owner.count != blob.count:
            raise ParamSharingError(f"{where}: layer {layer.name!r} shares parameter {spec.name!r} with count "
                                    f"{blob.count}, but its owner has count {owner.count} ({owner.shape})")
    elif owner.shape != blob.shape:
        raise ParamSharingError(f"{where}: layer {layer.name!r} shares parameter {spec.name!r} with shape "
                                f"{blob.shape}, but its owner has shape {owner.shape} "
                                f"(use share_mode: PERMISSIVE to share by count)")
    if spec.HasField("lr_mult") and owner_lr != lr:
        raise ParamSharingError(f"{where}: layer {layer.name!r}: shared parameter {spec.name!r} has lr_mult "
                                f"{lr} but its owner has {owner_lr}")
    if owner.shape == blob.shape:
        layer.blobs[j] = owner
    else:
        blob.share_data(owner)
        blob.share_diff(owner)
