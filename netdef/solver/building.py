"""From a solver file to what the loop trains: the SolverParameter read, upgraded and checked, the
device and precision it asks for, and the train and test nets it names.

Paths in the solver file (``net``, ``train_net``, ``test_net``, ``weights``) are opened as Caffe opens
them, relative to the working directory; a path not found there is then tried relative to the solver
file's folder (an INFO log line says so). ``snapshot_prefix`` is used as given (relative to the working
directory), as in Caffe; when a solver file leaves it out it is the solver file's path without its
extension, and when it names a folder the solver file's name is appended (Caffe's
UpgradeSnapshotPrefixProperty).
"""
from __future__ import annotations

import logging
import os

from .. import backend
from ..files import InputFileError, check_file_name
from ..layers.base import TEST, TRAIN
from ..net import Net
from ..proto import io as proto_io
from ..proto import netdef_pb2 as pb
from ..upgrade import upgrade_solver
from . import lr_policy
from .updates import SolverConfigError
from .values import check_solver_values, train_net_field

logger = logging.getLogger("netdef")


# ============================================================================================ the parameters
def read_solver_param(source) -> tuple[pb.SolverParameter, str | None]:
    """(upgraded SolverParameter, solver file path or None) from a path, prototxt text or a message."""
    if isinstance(source, pb.SolverParameter):
        param = pb.SolverParameter()
        param.CopyFrom(source)
        path = None
    else:
        text_or_path = os.fspath(source) if isinstance(source, os.PathLike) else source
        if not isinstance(text_or_path, str):
            raise TypeError(f"a solver is a prototxt path, prototxt text or a SolverParameter, not {type(source).__name__}")
        param = proto_io.read_text(text_or_path, pb.SolverParameter)
        path = None if proto_io.looks_like_text_message(text_or_path) else text_or_path
    if param.HasField("solver_type") and param.HasField("type"):
        raise SolverConfigError("Failed to upgrade solver: old solver_type field (enum) and new type field (string) "
                                "cannot be both specified in solver proto text.")
    upgrade_solver(param)
    check_solver_values(param, _solver_name(source, path))
    if path is not None:
        _upgrade_snapshot_prefix(param, path)
    return param, path


def _solver_name(source, path: str | None) -> str:
    """What errors call a solver: its file, or what it was given as."""
    if path is not None:
        return path
    return "<SolverParameter>" if isinstance(source, pb.SolverParameter) else "<solver prototxt string>"


def _upgrade_snapshot_prefix(param: pb.SolverParameter, solver_file: str) -> None:
    """Caffe's UpgradeSnapshotPrefixProperty."""
    stem = os.path.splitext(os.path.basename(solver_file))[0]
    if not param.HasField("snapshot_prefix"):
        param.snapshot_prefix = os.path.splitext(solver_file)[0]
        logger.info("snapshot_prefix was not specified and is set to %s", param.snapshot_prefix)
    elif os.path.isdir(param.snapshot_prefix):
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, stem)
        logger.info("snapshot_prefix was a directory and is replaced to %s", param.snapshot_prefix)


def check_training_values(param: pb.SolverParameter, rule_class) -> None:
    """What Caffe's Solver and the update rule's constructor CHECK before training."""
    if param.average_loss < 1:
        raise SolverConfigError(f"average_loss should be non-negative (>= 1), got {param.average_loss}")
    if param.iter_size < 1:
        raise SolverConfigError(f"iter_size must be >= 1, got {param.iter_size}")
    if param.display < 0 or param.snapshot < 0 or param.test_interval < 0:
        raise SolverConfigError("display, snapshot and test_interval must not be negative")
    lr_policy.validate(param)
    if param.weight_decay and param.regularization_type not in ("L1", "L2"):
        raise SolverConfigError(f"Unknown regularization type: {param.regularization_type!r} (L1 or L2)")
    try:
        # Used by every snapshot, also the one at the end or on a signal (snapshot: 0 included).
        check_file_name(param.snapshot_prefix, "snapshot_prefix")
    except InputFileError as exc:
        raise SolverConfigError(str(exc)) from None
    if param.snapshot and not param.HasField("snapshot_prefix"):
        raise SolverConfigError("In solver params, snapshot is specified but snapshot_prefix is not")
    if param.snapshot:
        folder = os.path.dirname(param.snapshot_prefix) or "."
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise SolverConfigError(f"Cannot write to snapshot prefix {param.snapshot_prefix!r}.  Make sure "
                                    f"that the directory exists and is writable.")
    rule_class.validate(param)


# ============================================================================================ device
def set_up_device(param: pb.SolverParameter) -> None:
    """solver_mode/device_id, when the file sets solver_mode (pycaffe leaves the mode alone)."""
    if not param.HasField("solver_mode"):
        return
    if param.solver_mode == pb.SolverParameter.GPU:
        problem = backend.gpu_problem(param.device_id)
        if problem is None:
            backend.set_device("gpu", param.device_id)
            logger.info("Using GPU %d", param.device_id)
        else:
            # As `netdef VERB --gpu N` (cli.py): a solver written for a GPU still trains here.
            logger.warning("solver_mode: GPU (device_id: %d): no usable GPU, %s; training on the CPU "
                           "(set solver_mode: CPU to say so)", param.device_id, problem)
            backend.set_device("cpu")
    else:
        backend.set_device("cpu")


def set_up_precision(param: pb.SolverParameter) -> None:
    """``precision`` when the file (or --precision) sets it; otherwise the process's setting stays
    (``netdef.set_precision``), strict float32 unless a script changed it."""
    if param.HasField("precision"):
        backend.set_precision(param.precision)
    if backend.device() == "gpu":
        logger.info("GPU precision: %s", "TensorFloat-32 convolutions and matrix products"
                    if backend.precision() == "tf32" else "strict float32")


# ============================================================================================ the nets
class NetBuilder:
    """Builds the nets a SolverParameter names, with Caffe's rules for their states and paths."""

    def __init__(self, param: pb.SolverParameter, solver_file: str | None):
        self.param = param
        self.solver_file = solver_file

    def resolve(self, path: str, what: str) -> str:
        # lexists: a link that leads nowhere (a loop) is the file meant; opening it will say what is wrong.
        if os.path.lexists(path):
            return path
        if self.solver_file and not os.path.isabs(path):
            beside = os.path.join(os.path.dirname(os.path.abspath(self.solver_file)), path)
            if os.path.lexists(beside):
                logger.info("%s %s is not in the working directory; using %s (relative to the solver file's folder)",
                            what, path, beside)
                return beside
        tried = f"the working directory {os.getcwd()!r}"
        if self.solver_file:
            tried += f" and the solver file's folder {os.path.dirname(os.path.abspath(self.solver_file))!r}"
        raise FileNotFoundError(f"{what} {path!r} not found (tried {tried})")

    def train_net(self) -> Net:
        p = self.param
        field = train_net_field(p, self.solver_file or "<solver>")
        train_state = p.train_state if p.HasField("train_state") else None
        if field in ("net_param", "train_net_param"):
            logger.info("Creating training net specified in %s.", field)
            return self._make_net(getattr(p, field), None, TRAIN, train_state)
        path = self.resolve(getattr(p, field), f"{field} file")
        logger.info("Creating training net from %s file: %s", field, path)
        return self._make_net(path, proto_io.read_text(path, pb.NetParameter), TRAIN, train_state)

    def test_nets(self) -> list[Net]:
        p = self.param
        generic = int(p.HasField("net")) + int(p.HasField("net_param"))
        if generic > 1:
            raise SolverConfigError("Both net_param and net_file may not be specified.")
        num_listed = len(p.test_net_param) + len(p.test_net)
        if generic:
            if len(p.test_iter) < num_listed:
                raise SolverConfigError("test_iter must be specified for each test network.")
        elif len(p.test_iter) != num_listed:
            raise SolverConfigError(f"test_iter must be specified for each test network ({num_listed} test nets, "
                                    f"{len(p.test_iter)} test_iter values).")
        instances = len(p.test_iter) if generic else num_listed
        if p.test_state and len(p.test_state) != instances:
            raise SolverConfigError("test_state must be unspecified or specified once per test net.")
        if instances and p.test_interval <= 0:
            raise SolverConfigError(f"test nets need test_interval > 0, got {p.test_interval}")
        sources = []
        for net_param in p.test_net_param:
            sources.append(("test_net_param", net_param, None))
        for name in p.test_net:
            path = self.resolve(name, "test_net file")
            sources.append((f"test_net file: {path}", path, proto_io.read_text(path, pb.NetParameter)))
        for _ in range(instances - num_listed):
            if p.HasField("net_param"):
                sources.append(("net_param", p.net_param, None))
            else:
                path = self.resolve(p.net, "net file")
                sources.append((f"net file: {path}", path, proto_io.read_text(path, pb.NetParameter)))
        nets = []
        for i, (what, source, file_param) in enumerate(sources):
            logger.info("Creating test net (#%d) specified by %s", i, what)
            nets.append(self._make_net(source, file_param, TEST, p.test_state[i] if p.test_state else None))
        return nets

    def _make_net(self, source, file_param: pb.NetParameter | None, phase: int, extra_state: pb.NetState | None):
        """A Net with Caffe's state precedence: phase default < the net's own state < the solver's state."""
        own = file_param if file_param is not None else source
        state = pb.NetState()
        state.phase = phase
        state.MergeFrom(own.state)
        if extra_state is not None:
            state.MergeFrom(extra_state)
        if isinstance(source, str) and list(state.stage) == list(own.state.stage) and state.level == own.state.level:
            # From the path, so that errors name the file and line.
            net = Net(source, state.phase)
        else:
            base_dir = os.path.dirname(os.path.abspath(source)) if isinstance(source, str) else (
                os.path.dirname(os.path.abspath(self.solver_file)) if self.solver_file else None)
            param = pb.NetParameter()
            param.CopyFrom(own)
            param.state.CopyFrom(state)
            net = Net(param, state.phase, base_dir=base_dir)
        for weights in self.param.weights:
            for name in (n.strip() for n in weights.split(",")):
                logger.info("Finetuning from %s", name)
                net.copy_from(self.resolve(name, "weights file"))
        return net
