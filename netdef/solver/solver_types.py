"""pycaffe's way in: ``get_solver`` reads a solver file and builds the solver class of its ``type``,
one per built-in update rule (``SGDSolver``, ``AdamSolver``, ...), each a ``Solver`` named by its rule's
registered type; a rule registered with ``register_update_rule`` gets the generic ``Solver``."""
from __future__ import annotations

from ..registry import Registry
from . import updates
from .building import read_solver_param
from .parallel import Parallel
from .solver import Solver
from .updates import update_rule_class


# pycaffe's solver classes, one per built-in update rule, named by the rule's registered type.
class SGDSolver(Solver):
    solver_type = updates.SGDUpdate.type_name


class NesterovSolver(Solver):
    solver_type = updates.NesterovUpdate.type_name


class AdaGradSolver(Solver):
    solver_type = updates.AdaGradUpdate.type_name


class RMSPropSolver(Solver):
    solver_type = updates.RMSPropUpdate.type_name


class AdaDeltaSolver(Solver):
    solver_type = updates.AdaDeltaUpdate.type_name


class AdamSolver(Solver):
    solver_type = updates.AdamUpdate.type_name


#: Solver type names -> pycaffe's per-type solver classes (``get_solver`` builds the generic Solver
#: for a registered update rule without one).
SOLVER_CLASSES: Registry[type] = Registry("pycaffe solver type", {cls.solver_type: cls for cls in (
    SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver, AdaDeltaSolver, AdamSolver)})


def get_solver(solver, *, solver_file: str | None = None, parallel: Parallel | None = None) -> Solver:
    """pycaffe's ``caffe.get_solver``: the solver class for the file's ``type`` (or legacy
    ``solver_type``); types registered with ``register_update_rule`` get the generic Solver.
    ``parallel``: see ``parallel.py`` (one process by default)."""
    param, path = read_solver_param(solver)
    cls = SOLVER_CLASSES.get(param.type) if param.type in SOLVER_CLASSES else Solver
    update_rule_class(param.type)  # unknown type: a clear error before anything is built
    return cls(param, solver_file=path or solver_file, parallel=parallel)
