"""The committed netdef_pb2.py is what `python -m netdef.proto.regenerate` makes from netdef.proto."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

from netdef.proto import regenerate

GENERATED = pathlib.Path(regenerate.__file__).resolve().parent / "netdef_pb2.py"


def test_generated_module_has_banner():
    text = GENERATED.read_text()
    assert text.startswith(regenerate.BANNER)
    assert "GENERATED" in text.splitlines()[0]


def test_generated_module_is_up_to_date():
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpc_tools (grpcio-tools, a test extra) is not installed: cannot regenerate netdef_pb2.py to compare")
    fresh = regenerate.generate_source()
    assert GENERATED.read_text() == fresh, (
        "netdef/proto/netdef_pb2.py is out of date with netdef.proto: run `python -m netdef.proto.regenerate`")
