"""Training: Caffe's solvers (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam) with Caffe's exact
update rules, learning-rate policies, display/test/snapshot behaviour and snapshot files::

    from netdef.solver import get_solver
    solver = get_solver("lenet_solver.prototxt")
    solver.solve()                      # or solver.step(n); solver.restore("x.solverstate")

See solver.py for the loop and the modules it composes, parallel.py for the calls of one iteration
in order, snapshot.py for the snapshot files, updates.py, step.py and lr_policy.py for the formulas.
"""
from .building import read_solver_param
from .callbacks import SolverCallback
from .lr_policy import LRPolicyError, learning_rate
from .nonfinite import NonFiniteError, NonFiniteLossError, NonFiniteParamsError
from .signals import SignalHandlers, SolverAction, install_signal_handlers
from .snapshot import SnapshotError
from .solver import Solver
from .solver_types import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
    get_solver,
)
from .updates import SolverConfigError, UpdateRule, register_update_rule, registered_update_rules

__all__ = [
    "AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "LRPolicyError", "NesterovSolver", "NonFiniteError",
    "NonFiniteLossError", "NonFiniteParamsError", "RMSPropSolver", "SGDSolver", "SignalHandlers", "SnapshotError",
    "Solver", "SolverAction", "SolverCallback", "SolverConfigError", "UpdateRule", "get_solver", "install_signal_handlers",
    "learning_rate", "read_solver_param", "register_update_rule", "registered_update_rules",
]
