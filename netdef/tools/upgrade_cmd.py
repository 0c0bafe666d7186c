"""``netdef upgrade IN OUT``: a legacy Caffe file rewritten in the current format.

Caffe ships three tools for this (upgrade_net_proto_text, upgrade_net_proto_binary,
upgrade_solver_proto_text); this is one, which tells the kind of file from its contents:

- a binary NetParameter (a ``.caffemodel``), possibly with V1 ``layers`` or V0 layers inside: written
  back in binary, as V2 ``layer`` messages with their blobs;
- a prototxt net (V0 ``layers { layer { type: "conv" ... } }``, V1 ``layers { type: CONVOLUTION }``,
  ``input_dim`` inputs, transform fields inside ``data_param``): written back as prototxt;
- a prototxt solver with the legacy ``solver_type`` enum: written back with ``type: "SGD"``.

The steps themselves are ``netdef.upgrade``'s, the same that every net load runs. ``OUT`` is written
atomically and never replaces an existing file unless asked.
"""
from __future__ import annotations

import dataclasses
import os

from google.protobuf import message as _message
from google.protobuf import text_format

from ..files import PROTOBUF_LIMIT, read_input_file
from ..proto import io as proto_io
from ..proto import netdef_pb2 as pb
from ..upgrade import upgrade_net, upgrade_solver


class UpgradeCommandError(ValueError):
    """An input that is no Caffe net or solver, or an output that would replace a file."""


@dataclasses.dataclass(frozen=True)
class Upgraded:
    kind: str        # "binary net", "text net" or "text solver"
    changed: bool    # False when the input was already in the current format


def upgrade_file(source, destination, overwrite: bool = False) -> Upgraded:
    """Read ``source``, upgrade it, write ``destination`` in the same encoding (binary or text)."""
    source, destination = os.fspath(source), os.fspath(destination)
    if os.path.lexists(destination) and not overwrite:
        raise UpgradeCommandError(f"{destination} exists; not replacing it (pass --overwrite to replace it)")
    data = read_input_file(source, "file to upgrade", PROTOBUF_LIMIT)
    text = _as_text(data)
    if text is not None:
        message, kind = _parse_text(text, source)
    else:
        message, kind = _parse_binary(data, source), "binary net"
    before = message.SerializeToString(deterministic=True)
    if isinstance(message, pb.SolverParameter):
        upgrade_solver(message)
    else:
        upgrade_net(message, source)
    changed = message.SerializeToString(deterministic=True) != before
    if kind == "binary net":
        proto_io.write_binary(destination, message)
    else:
        proto_io.write_text(destination, message)
    return Upgraded(kind, changed)


def _as_text(data: bytes) -> str | None:
    """The contents as text when they are UTF-8 without control bytes other than whitespace (a binary
    protobuf of any size holds tag and length bytes below 0x20); None for a binary file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(c) < 0x20 and c not in "\t\n\r\f\v" for c in text):
        return None
    return text


def _parse_text(text: str, source: str):
    """A text net, or failing that a text solver; the error names the file and the net parser's
    position, since a net is what most legacy files are."""
    try:
        return proto_io.parse_text(text, pb.NetParameter(), source), "text net"
    except proto_io.ProtoFileError as net_error:
        try:
            return text_format.Parse(text, pb.SolverParameter()), "text solver"
        except text_format.ParseError:
            raise UpgradeCommandError(f"not a Caffe net or solver prototxt: {net_error}") from None


def _parse_binary(data: bytes, source: str) -> pb.NetParameter:
    net = pb.NetParameter()
    try:
        net.ParseFromString(data)
    except _message.DecodeError as exc:
        raise UpgradeCommandError(f"{source}: neither a prototxt nor a binary Caffe net ({exc})") from None
    return net
