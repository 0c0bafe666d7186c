"""README's first hour, run as a new user runs it from a checkout, offline: the first command's training
ends at the accuracy README quotes (and models/digits/README.md and models/README.md quote the same
figure), and README's `netdef time` example runs with the first command's data or, without it, with the
--data_shape its comment names. The commands are read from README, so an edit there is what is tested."""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
NETDEF = [sys.executable, "-m", "netdef.cli"]


def _netdef(args, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(NETDEF + args, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=None if env is None else {**os.environ, **env})


def _first_command() -> list[list[str]]:
    """The netdef commands of README's first line of code (after the install)."""
    line = next(line for line in README.splitlines() if "netdef prepare-digits" in line)
    return [shlex.split(part.strip())[1:] for part in line.split("&&") if part.strip().startswith("netdef ")]


def _time_example() -> tuple[list[str], str]:
    """README's `netdef time` line of the digits net: its arguments and the comment after them."""
    line = next(line for line in README.splitlines() if line.startswith("netdef time --model=models/digits/"))
    command, _, comment = line.partition("#")
    return shlex.split(command)[1:], comment


def _quoted_accuracy() -> float:
    return float(re.search(r"The first command ends with `Test net output #0: accuracy = ([\d.]+)`", README).group(1))


# OpenBLAS's kernel sets (``blas.kernel_set()``) that compute with AVX-512.
AVX512_KERNELS = {"skylakex", "cooperlake", "sapphirerapids"}


def _accuracy_quoted_for_this_cpu() -> float:
    """README's accuracy for the kernel set NumPy's OpenBLAS runs here: its AVX-512 one, or the first."""
    from netdef.layers.jit.blas import kernel_set

    if kernel_set() in AVX512_KERNELS:
        return float(re.search(r"AVX-512 kernels \(SkylakeX and later\), it ends with\s+`accuracy = ([\d.]+)`",
                               README).group(1))
    return _quoted_accuracy()


def test_the_zoos_readmes_quote_the_first_runs_accuracy():
    quoted = _quoted_accuracy()
    digits = (REPO / "models" / "digits" / "README.md").read_text(encoding="utf-8")
    assert f"reach a test accuracy of {quoted:.3f}" in digits
    index_row = next(line for line in (REPO / "models" / "README.md").read_text().splitlines()
                     if line.startswith("| [digits](digits/)"))
    assert f"| {100 * quoted:.1f}% |" in index_row


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                    reason="the first run's data comes with scikit-learn (the [digits] extra)")
def test_the_first_run_and_the_time_example_run_offline_in_a_checkout(tmp_path):
    shutil.copytree(REPO / "models" / "digits", tmp_path / "models" / "digits",
                    ignore=shutil.ignore_patterns("data"))
    prepare, train = _first_command()
    assert prepare[0] == "prepare-digits" and train[0] == "train"
    done = _netdef(prepare, tmp_path)
    assert done.returncode == 0, done.stderr
    # The defaults, as a user runs it: the thread count follows the load, and the bits do not.
    done = _netdef(train, tmp_path)
    assert done.returncode == 0, done.stderr
    # README's line, as the log prints it (a seeded run): the last test, at iteration 600 (0, 200, 400, 600).
    accuracies = re.findall(r"Test net output #0: accuracy = ([\d.]+)", done.stderr)
    assert len(accuracies) == 4 and float(accuracies[-1]) == _accuracy_quoted_for_this_cpu(), accuracies
    assert (tmp_path / "digits_iter_600.caffemodel").is_file() and (tmp_path / "digits_iter_600.solverstate").is_file()

    args, comment = _time_example()
    done = _netdef(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Average Forward-Backward: " in done.stderr

    # Without the first command's data: the error names --data_shape, and the comment's flag runs it.
    shutil.rmtree(tmp_path / "models" / "digits" / "data")
    missing = _netdef(args, tmp_path)
    assert missing.returncode == 1 and "give --data_shape C,H,W" in missing.stderr
    data_shape = re.search(r"add (--data_shape=\S+)", comment).group(1)
    done = _netdef(args + [data_shape], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Average Forward-Backward: " in done.stderr


def _resolve(dotted: str):
    """The module or attribute ``dotted`` names (``netdef.proto.caffe_pb2``, ``netdef.io.load_image``)."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def test_the_porting_sections_module_map_names_what_netdef_has():
    """Each row of README's pycaffe -> netdef table: the netdef module (or class) exists and has every
    pycaffe name the row lists; and the import caffe rule for Python layers is stated beside it."""
    table = README.split("| pycaffe | netdef |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) >= 5
    checked = 0
    for left, right in rows:
        targets = [t for t in re.findall(r"`([\w.]+)`", right) if t.startswith("netdef")]
        if not targets:
            assert re.search(r"`netdef [a-z-]+`", right), right   # a command-line verb
            continue
        for target in targets:
            _resolve(target)
        listed = re.search(r"\((.*)\)", left)
        for name in re.findall(r"`(\w+)`", listed.group(1)) if listed else []:
            assert hasattr(_resolve(targets[0]), name), f"{targets[0]} has no {name} (README's map)"
            checked += 1
    assert checked >= 25
    names = README.split("`Net` also has pycaffe's underscore names", 1)[1].split("\n\n", 1)[0]
    import netdef

    net = netdef.Net('layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }',
                     netdef.TEST)
    underscored = re.findall(r"`(_\w+)", names)
    assert len(underscored) >= 10 and all(hasattr(net, name) for name in underscored), underscored
    assert hasattr(net, "save_hdf5") and hasattr(net, "load_hdf5")
    assert hasattr(netdef.SGDSolver, "share_weights") and hasattr(netdef.SGDSolver, "lr")
    for name in ("solver_count", "solver_rank", "has_nccl", "set_solver_count", "NCCL"):
        assert f"`{name}" in names and hasattr(netdef, name), name
    assert "`netdef.proto.caffe_pb2`" in table
    rule = README.split("A Python layer module written for pycaffe loads unchanged", 1)[1].split("\n\n", 1)[0]
    assert "`import caffe`" in rule and "an installed Caffe wins" in rule and "at the top of the module" in rule
