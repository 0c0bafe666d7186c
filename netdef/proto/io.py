"""Reading and writing Caffe's protobuf files, text and binary, with errors that name the file.

Text errors carry the file, line and column (``lenet.prototxt:12:5: ...``). Writes are atomic (see
``netdef.files``): a run killed mid-write never leaves a torn file behind.
"""
from __future__ import annotations

import os
import pathlib

from google.protobuf import message as _message
from google.protobuf import text_format

from ..excerpts import EXCERPT_CHARACTERS, excerpt
from ..files import PROTOBUF_LIMIT, InputFileError, read_input_file, write_bytes_atomically
from . import netdef_pb2 as pb


class ProtoFileError(ValueError):
    """A protobuf file (or text) that cannot be read; the message names the file and position."""


def looks_like_text_message(source: str) -> bool:
    """True when ``source`` is prototxt content rather than a path."""
    if "{" in source or "\n" in source:
        return True
    return ":" in source and not os.path.exists(source)


def _source_text(source) -> tuple[str, str]:
    """(text, name used in error messages) for a path or for prototxt content."""
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not looks_like_text_message(source)):
        path = pathlib.Path(source)
        try:
            return read_input_file(path, "prototxt", PROTOBUF_LIMIT).decode("utf-8"), str(path)
        except InputFileError as exc:
            raise ProtoFileError(str(exc)) from None
        except UnicodeDecodeError as exc:
            raise ProtoFileError(f"{path}: not a text prototxt ({exc}); is it a binary file?") from None
    return source, "<prototxt string>"


def parse_text(text: str, message, name: str = "<prototxt string>"):
    """Parse prototxt ``text`` into ``message``; errors say ``name:line:column: what``."""
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ProtoFileError(_parse_error_message(exc, text, name)) from None
    missing = message.FindInitializationErrors()
    if missing:
        raise ProtoFileError(f"{_where_missing(text, name, missing[0])}: missing required field {missing[0]}")
    return message


def _parse_error_message(exc, text: str, name: str) -> str:
    """``name:line:column: what, near '...'``, quoting only a short, escaped excerpt of the file.

    protobuf's own message repeats the whole offending line (``'<line>': what``), which for a one-line
    file is the whole file, terminal escape sequences included; it is replaced by the few characters
    around the column."""
    line, column = exc.GetLine(), exc.GetColumn()
    detail = str(exc)
    if line is None:
        return f"{name}: {excerpt(detail, 2 * EXCERPT_CHARACTERS)}"
    # The library prefixes "line:column : ", then often "'<the line>': "; keep the explanation after them.
    detail = detail.split(" : ", 1)[-1] if detail.startswith(f"{line}:") else detail
    line_text = _line_of(text, line)
    echoed = f"'{line_text}': "
    if detail.startswith(echoed):
        detail = detail[len(echoed):]
    where = f"{name}:{line}:{column}"
    start = max(column - 1 - EXCERPT_CHARACTERS // 4, 0)
    near = excerpt(line_text[start:start + EXCERPT_CHARACTERS])
    return f"{where}: {excerpt(detail, 2 * EXCERPT_CHARACTERS)}, near '{near}'"


def _line_of(text: str, number: int) -> str:
    """Line ``number`` (1-based) of ``text``, split on newlines as protobuf's parser splits it."""
    start = 0
    for _ in range(number - 1):
        start = text.find("\n", start) + 1
        if start == 0:
            return ""
    end = text.find("\n", start)
    return text[start:] if end < 0 else text[start:end]


def _where_missing(text: str, name: str, field_path: str) -> str:
    """``file:line`` of the top-level layer block a missing field's path starts in (``layer[3].x``)."""
    head = field_path.split(".", 1)[0]
    if "[" in head:
        field, index = head[:-1].split("[")
        if field in ("layer", "layers"):
            lines = top_level_block_lines(text, (field,))
            if int(index) < len(lines):
                return f"{name}:{lines[int(index)]}"
    return name


def read_text(source, message_type):
    """A ``message_type`` read from a prototxt path or prototxt content."""
    text, name = _source_text(source)
    return parse_text(text, message_type(), name)


def read_binary(path, message_type):
    """A ``message_type`` read from a binary protobuf file (``.caffemodel``, ``.binaryproto``...)."""
    path = pathlib.Path(path)
    try:
        data = read_input_file(path, f"binary {message_type.__name__} file", PROTOBUF_LIMIT)
    except InputFileError as exc:
        raise ProtoFileError(str(exc)) from None
    message = message_type()
    try:
        message.ParseFromString(data)
    except _message.DecodeError as exc:
        raise ProtoFileError(f"{path}: not a binary {message_type.__name__} ({exc})") from None
    return message


def read_text_or_binary(path, message_type):
    """Caffe's ReadProtoFromTextFileOrDie/BinaryFile choice: binary first, then text."""
    path = pathlib.Path(path)
    try:
        return read_binary(path, message_type)
    except ProtoFileError:
        return read_text(path, message_type)


def write_binary(path, message) -> None:
    """Write ``message`` in binary, atomically."""
    write_bytes_atomically(path, message.SerializeToString())


def write_text(path, message) -> None:
    """Write ``message`` as prototxt, atomically."""
    write_bytes_atomically(path, text_format.MessageToString(message).encode("utf-8"))


def read_net_param(source) -> tuple[pb.NetParameter, str, str]:
    """(NetParameter, text, name) from a path, prototxt content or a NetParameter (not upgraded)."""
    if isinstance(source, pb.NetParameter):
        return source, "", "<NetParameter>"
    text, name = _source_text(source)
    return parse_text(text, pb.NetParameter(), name), text, name


def top_level_block_lines(text: str, field_names=("layer", "layers")) -> list[int]:
    """Line numbers (1-based) of each top-level ``layer {`` / ``layers {`` block, in order.

    The protobuf parser does not report where a message came from; the net builder uses this to put
    the file position into its errors. Comments and strings are skipped.
    """
    lines: list[int] = []
    depth = 0
    line = 1
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c in "\"'":
            quote = c
            i += 1
            while i < n and text[i] != quote:
                if text[i] == "\\":
                    i += 1
                elif text[i] == "\n":
                    line += 1
                i += 1
            i += 1
        elif c in "{<":
            depth += 1
            i += 1
        elif c in "}>":
            depth -= 1
            i += 1
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            if depth == 0 and text[i:j] in field_names:
                lines.append(line)
            i = j
        else:
            i += 1
    return lines
