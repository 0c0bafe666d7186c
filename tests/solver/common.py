"""Shared pieces of the solver tests: the Caffe solver oracles and small nets."""
from __future__ import annotations

import pathlib
import re

import numpy as np

from netdef.solver import get_solver
from tests.helpers import SHARED, shared_path

SOLVER_CASES = SHARED / "fixtures" / "caffe-ref" / "solvers"


def oracle_case_names() -> list[str]:
    if not SOLVER_CASES.exists():
        return []
    return sorted(p.stem for p in SOLVER_CASES.glob("*.npz") if p.stem != "snapshot_expected")


def load_case(name: str):
    return np.load(shared_path("fixtures", "caffe-ref", "solvers", f"{name}.npz"))


def iter_size_of(solver_text: str) -> int:
    m = re.search(r"iter_size:\s*(\d+)", solver_text)
    return int(m.group(1)) if m else 1


class Feeder:
    """Replaces the Input layer's forward so that each forward pass takes the oracle's next batch
    (Caffe's generator wrote them through a before_forward callback on layer 0)."""

    def __init__(self, case, net, iter_size: int = 1):
        self.case = case
        self.iter_size = iter_size
        self.k = 1
        self.j = 0
        net.layers[0].forward = self.forward

    def start(self, k: int) -> None:
        self.k, self.j = k, 0

    def forward(self, bottom, top):
        suffix = f"/{self.k}" + (f"/{self.j}" if self.iter_size > 1 else "")
        top[0].data = self.case["data" + suffix]
        top[1].data = self.case["target" + suffix]
        self.j += 1


def write_case_files(case, folder: pathlib.Path, solver_text: str | None = None) -> pathlib.Path:
    (folder / "solver_net.prototxt").write_text(str(case["net_prototxt"]))
    path = folder / "solver.prototxt"
    path.write_text(solver_text if solver_text is not None else str(case["solver_prototxt"]))
    return path


def oracle_solver(case, folder: pathlib.Path, solver_text: str | None = None):
    """A solver for an oracle case with Caffe's initial params, and its Feeder."""
    solver = get_solver(str(write_case_files(case, folder, solver_text)))
    solver.net.params["ip"][0].data[...] = case["w/0"]
    solver.net.params["ip"][1].data[...] = case["b/0"]
    feeder = Feeder(case, solver.net, iter_size_of(str(case["solver_prototxt"])))
    return solver, feeder


def close_to_oracle(actual, expected, rtol=1e-6, scale_atol=1e-6):
    """|a - e| <= rtol*|e| + scale_atol*max|e|: relative, with a floor at the blob's scale for
    entries near zero (where float32 cancellation makes a relative test meaningless)."""
    expected = np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=scale_atol * float(np.abs(expected).max()))


RANDOM_NET = """
name: "random_net"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 8 dim: 5 } shape { dim: 8 dim: 2 }
                     data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "drop" type: "Dropout" bottom: "ip1" top: "ip1" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "loss" }
"""


def params_of(net) -> list[np.ndarray]:
    return [np.array(b.data, copy=True) for b in net.learnable_params]
