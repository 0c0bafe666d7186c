"""Training: Caffe's solvers (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam) with Caffe's exact
update rules, learning-rate policies, display/test/snapshot behaviour and snapshot files::

    from netdef.solver import get_solver
    solver = get_solver("lenet_solver.prototxt")
    solver.solve()                      # or solver.step(n); solver.restore("x.solverstate")

See solver.py for the order of operations inside an iteration and the hook points for distributed
training, snapshot.py for the snapshot files, updates.py and lr_policy.py for the formulas.
"""
from .lr_policy import LRPolicyError, learning_rate
from .snapshot import SnapshotError
from .solver import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    NonFiniteError,
    NonFiniteLossError,
    NonFiniteParamsError,
    RMSPropSolver,
    SGDSolver,
    SignalHandlers,
    Solver,
    SolverAction,
    get_solver,
    install_signal_handlers,
    read_solver_param,
)
from .updates import SolverConfigError, UpdateRule, register_update_rule, registered_update_rules

__all__ = [
    "AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "LRPolicyError", "NesterovSolver", "NonFiniteError",
    "NonFiniteLossError", "NonFiniteParamsError", "RMSPropSolver", "SGDSolver", "SignalHandlers", "SnapshotError",
    "Solver", "SolverAction", "SolverConfigError", "UpdateRule", "get_solver", "install_signal_handlers",
    "learning_rate", "read_solver_param", "register_update_rule", "registered_update_rules",
]
