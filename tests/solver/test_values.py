"""Solver rates checked when the file is read (issue 32, class 10; an empty solver, class 11)."""
import subprocess
import sys

import pytest

from netdef.solver.solver import read_solver_param
from netdef.solver.updates import SolverConfigError

# The net file does not exist: a check made later than reading would fail on it (or train) instead.
SOLVER = """
net: "missing_net.prototxt"
base_lr: 0.01
momentum: 0.9
lr_policy: "fixed"
max_iter: 10
snapshot: 5
snapshot_prefix: "snaps/run"
"""


def solver_with(line: str) -> str:
    """SOLVER with ``line`` (``field: value``) in place of that field's own line."""
    field = line.split(":")[0]
    kept = [own for own in SOLVER.splitlines() if not own.startswith(field + ":")]
    return "\n".join(kept + [line]) + "\n"


@pytest.mark.parametrize("line, field, rule", [
    ("base_lr: nan", "base_lr is nan", "a finite number >= 0"),
    ("base_lr: -0.1", "base_lr is -0.1", "a finite number >= 0"),
    ("weight_decay: inf", "weight_decay is inf", "a finite number >= 0"),
    ("momentum: 1.5", "momentum is 1.5", "a finite number between 0 and 1"),
    ("momentum: -inf", "momentum is -inf", "a finite number between 0 and 1"),
    ("momentum2: 1", "momentum2 is 1", "a finite number in [0, 1)"),
    ("delta: 0", "delta is 0", "a finite number > 0"),
    ("gamma: nan", "gamma is nan", "a finite number"),
    ("clip_gradients: inf", "clip_gradients is inf", "a finite number"),
])
def test_rate_out_of_range_is_refused_when_read(tmp_path, line, field, rule):
    path = tmp_path / "solver.prototxt"
    path.write_text(solver_with(line))
    with pytest.raises(SolverConfigError) as error:
        read_solver_param(str(path))
    assert str(error.value) == f"{path}: {field}; it must be {rule}"


def test_a_solver_given_as_a_message_is_named_so():
    with pytest.raises(SolverConfigError, match=r"^<solver prototxt string>: base_lr is nan"):
        read_solver_param('net: "x" base_lr: nan')


@pytest.mark.parametrize("text, message", [
    ("", "solver.prototxt: no net to train: the solver must give one of net, net_param, train_net, "
         "train_net_param"),
    ('net: "a" train_net: "b" lr_policy: "nope"', "solver.prototxt: more than one net to train: the solver "
                                                  "gives net, train_net; give exactly one of net, net_param, "
                                                  "train_net, train_net_param"),
])
def test_command_line_names_the_missing_net_first(tmp_path, text, message):
    (tmp_path / "solver.prototxt").write_text(text)
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "train", "solver.prototxt"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == f"netdef: error: {message}\n"


def test_command_line_refuses_nan_rate_before_any_work(tmp_path):
    (tmp_path / "snaps").mkdir()
    (tmp_path / "solver.prototxt").write_text(solver_with("base_lr: nan"))
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "train", "solver.prototxt"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == ("netdef: error: solver.prototxt: base_lr is nan; it must be a finite number >= 0\n")
    assert list((tmp_path / "snaps").iterdir()) == []
