"""The GPU precision setting (strict float32 or TensorFloat-32): netdef.set_precision, the solver
file's ``precision`` field and ``--precision``. Whether the GPU honours it is tests/test_gpu_cudnn.py's;
here, that every entry point sets it, refuses what it does not know, and leaves the CPU alone."""
from __future__ import annotations

import subprocess
import sys

import pytest

import netdef
from netdef import backend
from netdef.solver.updates import SolverConfigError

NET = """
layer { name: "d" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }
                           data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture(autouse=True)
def strict_afterwards():
    yield
    backend.set_precision("float32")


def _solver_file(tmp_path, extra: str = "") -> str:
    (tmp_path / "net.prototxt").write_text(NET)
    path = tmp_path / "solver.prototxt"
    path.write_text(f'net: "{tmp_path / "net.prototxt"}"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 2\n'
                    f'solver_mode: CPU\n{extra}')
    return str(path)


def test_strict_float32_is_the_default_and_unknown_names_are_refused():
    assert backend.precision() == "float32"
    netdef.set_precision("tf32")
    assert backend.precision() == "tf32"
    with pytest.raises(ValueError, match="float32, tf32"):
        netdef.set_precision("fp16")
    assert backend.precision() == "tf32"


def test_the_solver_file_sets_it_and_a_bad_value_names_the_field(tmp_path):
    netdef.get_solver(_solver_file(tmp_path, 'precision: "tf32"'))
    assert backend.precision() == "tf32"
    netdef.get_solver(_solver_file(tmp_path, 'precision: "float32"'))
    assert backend.precision() == "float32"
    with pytest.raises(SolverConfigError, match="precision must be one of float32, tf32, got 'half'"):
        netdef.get_solver(_solver_file(tmp_path, 'precision: "half"'))


def test_a_solver_file_without_it_keeps_the_process_setting(tmp_path):
    netdef.set_precision("tf32")
    netdef.get_solver(_solver_file(tmp_path))
    assert backend.precision() == "tf32"


def test_the_flag_is_checked_and_trains_on_the_cpu(tmp_path):
    solver = _solver_file(tmp_path, 'precision: "float32"')
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "train", solver, "--precision", "tf32"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    refused = subprocess.run([sys.executable, "-m", "netdef.cli", "train", solver, "--precision", "bf16"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "precision" in refused.stderr and "bf16" in refused.stderr
