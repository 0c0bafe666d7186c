"""The compiled schema (netdef_pb2) against Caffe's wire format, row by row.

../shared/reference/caffe-wire-format.tsv lists every field (message, name, number, label, type,
default, packing) and every enum value of Caffe's caffe.proto. netdef.proto must match each row, and
may only add fields numbered 10000 and up (plus its own messages reachable only through those).
"""
from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

from netdef.proto import netdef_pb2 as pb
from tests.helpers import SHARED, shared_path

TABLE = SHARED / "reference" / "caffe-wire-format.tsv"
PACKAGE = "netdef"
FIRST_NETDEF_NUMBER = 10000

SCALAR_TYPES = {
    "double": FD.TYPE_DOUBLE, "float": FD.TYPE_FLOAT, "int64": FD.TYPE_INT64, "uint64": FD.TYPE_UINT64,
    "int32": FD.TYPE_INT32, "fixed64": FD.TYPE_FIXED64, "fixed32": FD.TYPE_FIXED32, "bool": FD.TYPE_BOOL,
    "string": FD.TYPE_STRING, "bytes": FD.TYPE_BYTES, "uint32": FD.TYPE_UINT32, "sfixed32": FD.TYPE_SFIXED32,
    "sfixed64": FD.TYPE_SFIXED64, "sint32": FD.TYPE_SINT32, "sint64": FD.TYPE_SINT64,
}
INT_TYPES = {"int64", "uint64", "int32", "fixed64", "fixed32", "uint32", "sfixed32", "sfixed64", "sint32", "sint64"}
COLUMNS = ["kind", "message", "name", "number", "label", "type", "default", "packed"]


def load_rows() -> list[dict]:
    if not TABLE.exists():
        return []
    rows = []
    for line in TABLE.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if cells[0] == "kind":
            assert cells == COLUMNS, f"unexpected header {cells}"
            continue
        cells += [""] * (len(COLUMNS) - len(cells))
        rows.append(dict(zip(COLUMNS, cells)))
    return rows


ROWS = load_rows()
FIELD_ROWS = [r for r in ROWS if r["kind"] == "field"]
ENUM_ROWS = [r for r in ROWS if r["kind"] == "enum"]
POOL = pb.DESCRIPTOR.pool


def message(name: str):
    return POOL.FindMessageTypeByName(f"{PACKAGE}.{name}")


def enum(name: str):
    return POOL.FindEnumTypeByName(f"{PACKAGE}.{name}")


def all_messages():
    """Every message type of the file, nested ones included."""
    out, stack = [], list(pb.DESCRIPTOR.message_types_by_name.values())
    while stack:
        m = stack.pop()
        out.append(m)
        stack.extend(m.nested_types)
    return out


def label_of(field) -> str:
    if field.is_repeated:
        return "repeated"
    return "required" if field.is_required else "optional"


def test_table_present_and_complete():
    shared_path("reference", "caffe-wire-format.tsv")
    assert len(FIELD_ROWS) > 400 and len(ENUM_ROWS) > 100, (len(FIELD_ROWS), len(ENUM_ROWS))
    assert {r["kind"] for r in ROWS} == {"field", "enum"}


def test_package_is_netdef():
    assert pb.DESCRIPTOR.package == "netdef"
    assert pb.NetParameter.DESCRIPTOR.full_name == "netdef.NetParameter"


@pytest.mark.parametrize("row", FIELD_ROWS, ids=[f"{r['message']}.{r['name']}" for r in FIELD_ROWS])
def test_field(row):
    try:
        msg = message(row["message"])
    except KeyError:
        pytest.fail(f"message {row['message']} is missing")
    field = msg.fields_by_name.get(row["name"])
    assert field is not None, f"{row['message']} has no field {row['name']}"
    where = f"{row['message']}.{row['name']}"
    assert field.number == int(row["number"]), f"{where}: number {field.number}, Caffe {row['number']}"
    assert label_of(field) == row["label"], f"{where}: label {label_of(field)}, Caffe {row['label']}"

    kind = row["type"]
    if kind.startswith("message "):
        assert field.type == FD.TYPE_MESSAGE, f"{where}: not a message field"
        assert field.message_type.full_name == f"{PACKAGE}.{kind.split(' ', 1)[1]}", where
    elif kind.startswith("enum "):
        assert field.type == FD.TYPE_ENUM, f"{where}: not an enum field"
        assert field.enum_type.full_name == f"{PACKAGE}.{kind.split(' ', 1)[1]}", where
    else:
        assert kind in SCALAR_TYPES, f"unknown type {kind!r} in the table"
        assert field.type == SCALAR_TYPES[kind], f"{where}: type {field.type}, Caffe {kind}"

    default = row["default"]
    if default == "":
        assert not field.has_default_value, f"{where}: has default {field.default_value!r}, Caffe has none"
    else:
        assert field.has_default_value, f"{where}: no explicit default, Caffe has {default!r}"
        value = field.default_value
        if kind in ("float", "double"):
            assert np.float32(value) == np.float32(float(default)), f"{where}: default {value}, Caffe {default}"
        elif kind in INT_TYPES:
            assert value == int(default), f"{where}: default {value}, Caffe {default}"
        elif kind == "bool":
            assert default in ("True", "False"), f"bad bool default {default!r} in the table"
            assert value is (default == "True"), f"{where}: default {value}, Caffe {default}"
        elif kind.startswith("enum "):
            assert field.enum_type.values_by_number[value].name == default, f"{where}: default {value}, Caffe {default}"
        else:
            assert value == default, f"{where}: default {value!r}, Caffe {default!r}"

    assert row["packed"] in ("", "packed"), f"bad packed cell {row['packed']!r}"
    packed = field.is_packed if hasattr(field, "is_packed") else field.GetOptions().packed
    assert bool(packed) == (row["packed"] == "packed"), f"{where}: packed {packed}, Caffe {row['packed'] or 'not packed'}"


@pytest.mark.parametrize("row", ENUM_ROWS, ids=[f"{r['message']}.{r['name']}" for r in ENUM_ROWS])
def test_enum_value(row):
    try:
        desc = enum(row["message"])
    except KeyError:
        pytest.fail(f"enum {row['message']} is missing")
    value = desc.values_by_name.get(row["name"])
    assert value is not None, f"enum {row['message']} has no value {row['name']}"
    assert value.number == int(row["number"]), f"{row['message']}.{row['name']} = {value.number}, Caffe {row['number']}"


def test_caffe_enums_have_no_extra_values():
    shared_path("reference", "caffe-wire-format.tsv")
    table: dict[str, set] = {}
    for r in ENUM_ROWS:
        table.setdefault(r["message"], set()).add(r["name"])
    for name, values in table.items():
        assert set(enum(name).values_by_name) == values, name


def test_additions_use_numbers_from_10000():
    shared_path("reference", "caffe-wire-format.tsv")
    caffe_fields: dict[str, set] = {}
    for r in FIELD_ROWS:
        caffe_fields.setdefault(r["message"], set()).add(r["name"])
    prefix = PACKAGE + "."
    caffe_messages = {prefix + m for m in caffe_fields}
    problems = []
    referenced_from: dict[str, list] = {}
    for msg in all_messages():
        for field in msg.fields:
            if field.message_type is not None:
                referenced_from.setdefault(field.message_type.full_name, []).append((msg.full_name, field))
        if msg.full_name not in caffe_messages:
            continue
        for field in msg.fields:
            if field.name not in caffe_fields[msg.full_name[len(prefix):]] and field.number < FIRST_NETDEF_NUMBER:
                problems.append(f"{msg.full_name}.{field.name} = {field.number} is not Caffe's and below {FIRST_NETDEF_NUMBER}")
    # netdef's own messages may only hang off netdef's numbers (or off other netdef messages).
    for msg in all_messages():
        if msg.full_name in caffe_messages:
            continue
        for owner, field in referenced_from.get(msg.full_name, []):
            if owner in caffe_messages and field.number < FIRST_NETDEF_NUMBER:
                problems.append(f"netdef message {msg.full_name} is used by Caffe's {owner}.{field.name} = {field.number}")
    assert not problems, "\n".join(problems)


def test_netdef_extensions_exist():
    # The additions the schema documents, so that the check above is not vacuous.
    assert pb.SolverParameter.DESCRIPTOR.fields_by_name["netdef_distributed"].number >= FIRST_NETDEF_NUMBER
    assert pb.SolverState.DESCRIPTOR.fields_by_name["netdef_state"].number >= FIRST_NETDEF_NUMBER


def test_binary_round_trip():
    net = pb.NetParameter(name="rt", force_backward=True)
    layer = net.layer.add(name="conv1", type="Convolution", bottom=["data"], top=["conv1"])
    layer.convolution_param.num_output = 8
    layer.convolution_param.kernel_size.append(3)
    layer.convolution_param.weight_filler.type = "xavier"
    layer.param.add(lr_mult=1.0, decay_mult=0.5)
    layer.include.add(phase=pb.TRAIN)
    blob = layer.blobs.add()
    blob.shape.dim.extend([2, 3])
    blob.data.extend([0.5, -1.0, 2.0, 0.0, 1.5, 3.25])
    wire = net.SerializeToString()
    back = pb.NetParameter.FromString(wire)
    assert back == net
    assert back.layer[0].convolution_param.kernel_size == [3]
    assert list(back.layer[0].blobs[0].data) == [0.5, -1.0, 2.0, 0.0, 1.5, 3.25]
    assert back.layer[0].include[0].phase == pb.TRAIN
    assert back.layer[0].param[0].decay_mult == 0.5


def test_wire_bytes_match_caffe_encoding():
    # NetParameter.layer is field 100, length-delimited: tag (100 << 3) | 2 = 802 = varint a2 06.
    assert pb.NetParameter(layer=[pb.LayerParameter(name="L")]).SerializeToString() == b"\xa2\x06\x03\x0a\x01L"
    # BlobShape.dim is packed: one length-delimited record, not one tag per value.
    assert pb.BlobShape(dim=[2, 3]).SerializeToString() == b"\x0a\x02\x02\x03"
    # BlobProto.data is packed float (field 5).
    assert pb.BlobProto(data=[1.0]).SerializeToString() == b"\x2a\x04" + np.float32(1.0).tobytes()
