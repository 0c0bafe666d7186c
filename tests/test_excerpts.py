"""Messages that quote a file stay short and printable (issue 32, class 7)."""
import subprocess
import sys

import pytest

import netdef
from netdef.excerpts import excerpt, safe_line
from netdef.proto.io import ProtoFileError

ESC = "\x1b"


def test_excerpt_keeps_head_and_tail_and_escapes_controls():
    quoted = excerpt("start" + "x" * 10_000 + ESC + "[2J" + "end")
    assert quoted.startswith("start") and quoted.endswith("\\x1b[2Jend")
    assert "characters left out" in quoted and len(quoted) < 120
    assert ESC not in quoted


def test_safe_line_is_one_printable_line():
    line = safe_line("layer 'a\nb\rc\x00d\u2028e'\twith a tab")
    assert line == "layer 'a b c\\x00d e' with a tab"


@pytest.mark.parametrize("body, column", [
    # an unknown field named by a 2 MB token
    ('name: "x" layer { name: "a" type: "Input" top: "d" ' + "q" * 2_000_000 + " }\n", 52),
    # a string that never ends: protobuf repeats the whole line, twice
    ('name: "' + "z" * 2_000_000 + "\n", 7),
    # terminal escapes where a token should be
    (f'name: "x{ESC}[31mRED" {ESC}[2J layer {{ }}\n', 19),
])
def test_parse_error_quotes_a_short_escaped_excerpt(tmp_path, body, column):
    path = tmp_path / "net.prototxt"
    path.write_text(body)
    with pytest.raises(ProtoFileError) as error:
        netdef.Net(str(path), netdef.TEST)
    message = str(error.value)
    assert message.startswith(f"{path}:1:{column}: ")
    assert len(message) < 400 + len(str(path))
    assert ESC not in message and "\n" not in message


def test_command_line_prints_one_bounded_printable_line(tmp_path):
    (tmp_path / "net.prototxt").write_text('name: "' + ESC + "]0;owned" + "\a" + "z" * 3_000_000 + "\n")
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "time", "--model", "net.prototxt"],
                          cwd=tmp_path, capture_output=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith(b"netdef: error: net.prototxt:1:7: String missing ending quote")
    assert done.stderr.count(b"\n") == 1 and len(done.stderr) < 500
    assert not any(byte < 0x20 for byte in done.stderr[:-1])
    assert done.stdout == b""
