"""Snapshots: Caffe's ``.caffemodel`` + ``.solverstate`` pair (or ``.caffemodel.h5`` + ``.solverstate.h5``).

Contents are Caffe's, field for field, so Caffe restores netdef's snapshots and netdef restores Caffe's:

- ``<prefix>_iter_<N>.caffemodel``: the train net as Caffe's ``Net::ToProto`` writes it (every layer, its
  blobs, and diffs with ``snapshot_diff``).
- ``<prefix>_iter_<N>.solverstate``: SolverState {iter, learned_net (the model path exactly as written,
  i.e. the prefix as given, relative to the working directory when relative), history (the update
  rule's blobs in Caffe's order), current_step}.
- HDF5: the model is Caffe's ``Net::ToHDF5`` layout, written and read by ``netdef.weights`` (a group
  ``/data/<layer>`` for every layer, datasets ``<i>`` only for parameters a layer owns;
  ``/diff/<layer>/<i>`` for all with ``snapshot_diff``), the state holds datasets
  ``iter`` (int32, shape (1,)), ``learned_net`` (a null-terminated fixed-length string),
  ``current_step`` (int32, shape (1,)) and a group ``history`` with datasets ``0``, ``1``...

netdef adds what exact resumption needs, which Caffe ignores when reading: ``SolverState.netdef_state``
(field 10000; in HDF5 the dataset ``netdef_state`` holding the same serialized message as opaque bytes)
with the random generator's state and each data source's ``data_state()``; a run of several ranks
adds every rank's own (``rank_state``), so its snapshot is still one model file and one state file.
Under the asynchronous exchange rules (easgd, gossip, hybrid) the ranks' weights differ: the model file
then holds the model (``Parallel.model``: the centre variable, or rank 0's weights), and each rank's
own weights, update history and rule state go into its ``rank_state`` (``Parallel.snapshot``,
``restore_rank_state``).

Both files are first written completely to temporary files beside their targets, then renamed over
them, model first and state second (``netdef.files``): a failed or interrupted snapshot leaves the earlier files as they
were and no temporary file behind, and a state file never names a model that is not there yet. A
process killed outright cannot remove its temporary files: the next run with the same prefix does
(``remove_stale_temps``, by the rules of ``netdef.tempnames``).
"""
from __future__ import annotations

import json
import logging
import math
import os
import re

import numpy as np

from google.protobuf.message import DecodeError

from .. import backend
from .. import files, tempnames
from ..data.hdf5 import check_dataset_fits, read_dataset
from ..layers.base import LayerError
from ..proto import io as proto_io
from ..proto import netdef_pb2 as pb
from ..weights import WeightsError, blob_to_proto, copy_from, proto_shape, proto_values, write_model_hdf5

logger = logging.getLogger("netdef")

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


class SnapshotError(ValueError):
    """A snapshot that cannot be written or restored; the message names the file."""


# ============================================================================================ names
def snapshot_filename(param: pb.SolverParameter, iteration: int, extension: str) -> str:
    """Caffe's SnapshotFilename: ``<snapshot_prefix>_iter_<iter><extension>``."""
    return f"{param.snapshot_prefix}_iter_{iteration}{extension}"


def model_extension(param: pb.SolverParameter) -> str:
    return ".caffemodel.h5" if param.snapshot_format == pb.SolverParameter.HDF5 else ".caffemodel"


def state_extension(param: pb.SolverParameter) -> str:
    return ".solverstate.h5" if param.snapshot_format == pb.SolverParameter.HDF5 else ".solverstate"


# ============================================================================================ netdef state
_RNG_FORMAT = b"numpy-bitgen-json:"


def _rng_state_bytes() -> bytes:
    return _RNG_FORMAT + json.dumps(backend.rng().bit_generator.state).encode("ascii")


def _restore_rng(data: bytes, where: str) -> None:
    if not data.startswith(_RNG_FORMAT):
        logger.warning("%s: unknown random-state format; the random generator is not restored", where)
        return
    try:
        state = json.loads(data[len(_RNG_FORMAT):].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise SnapshotError(f"{where}: field rng_state: not a readable random-generator state (corrupt JSON "
                            f"after the {_RNG_FORMAT.decode()!r} header)") from None
    if not isinstance(state, dict):
        raise SnapshotError(f"{where}: field rng_state: the random-generator state must be a mapping")
    generator = backend.rng()
    if type(generator.bit_generator).__name__ != state.get("bit_generator"):
        backend.set_random_seed(0)  # a fresh default generator, whose state is then replaced
        generator = backend.rng()
    if type(generator.bit_generator).__name__ != state.get("bit_generator"):
        raise SnapshotError(f"{where}: field rng_state: the saved random state is for "
                            f"{str(state.get('bit_generator'))[:40]!r}, netdef's generator is "
                            f"{type(generator.bit_generator).__name__}")
    try:
        backend.set_generator_state(generator, state)
    except ValueError as exc:
        raise SnapshotError(f"{where}: field rng_state: not a valid {state['bit_generator']} state ({exc})") from None


def _data_sources(solver):
    """(cursor key, layer) for every data source that saves a state: the train net's by layer
    name, test net ``i``'s as ``test<i>/<layer name>``."""
    nets = [("", solver.net)] + [(f"test{i}/", net) for i, net in enumerate(solver.test_nets)]
    seen = set()
    for prefix, net in nets:
        for layer in net.data_sources():
            if id(layer) not in seen:
                seen.add(id(layer))
                yield prefix + layer.name, layer


#: The fields of a NetdefRankState that the solver itself fills; the parallel part may add others.
_SOLVER_RANK_FIELDS = frozenset({"rng_state", "data_cursor"})


def rank_state(solver) -> pb.NetdefRankState:
    """This process's own resume state as far as the solver knows it: its random generator and its
    data sources' positions (the parallel part adds its own in ``Parallel.snapshot``)."""
    state = pb.NetdefRankState()
    state.rng_state = _rng_state_bytes()
    for key, layer in _data_sources(solver):
        saved = layer.data_state()
        if saved is not None:
            cursor = state.data_cursor.add()
            cursor.layer = key
            cursor.state = bytes(saved)
    return state


def netdef_state(solver, rank_states: list[bytes]) -> pb.NetdefSolverState:
    """netdef's part of the state file. ``rank_states``: every rank's serialized NetdefRankState
    (one for a single process); the first also fills the top-level fields, which is all a single
    process's snapshot has."""
    state = pb.NetdefSolverState()
    first = pb.NetdefRankState.FromString(rank_states[0])
    state.rng_state = first.rng_state
    state.data_cursor.extend(first.data_cursor)
    window = solver.loss_window
    state.smoothed_loss = float(window.smoothed)
    state.loss_window.extend(float(v) for v in window.losses)
    state.loss_window_start = int(window.start)
    # One process's state is the fields above, unless its parallel part added its own (own weights...).
    added_by_parallel = any(field.name not in _SOLVER_RANK_FIELDS for field, _ in first.ListFields())
    if len(rank_states) > 1 or added_by_parallel:
        state.rank_state.extend(pb.NetdefRankState.FromString(s) for s in rank_states)
    return state


def _own_rank_state(solver, state: pb.NetdefSolverState, where: str) -> pb.NetdefRankState | None:
    """The state this process resumes from, or None (with a warning) when the snapshot was written
    by another number of processes: then each rank's data starts its new shard from the beginning."""
    rank, size = solver.parallel.rank, solver.parallel.size
    written_by = len(state.rank_state) or 1
    if written_by == size:
        if state.rank_state:
            return state.rank_state[rank]
        own = pb.NetdefRankState()
        own.rng_state = state.rng_state
        own.data_cursor.extend(state.data_cursor)
        return own
    if rank == 0:
        logger.warning("%s was written by %d rank(s) and this run has %d: each rank's data layers start their new "
                       "shard from the beginning", where, written_by, size)
    return None


def _check_loss_window(solver, state: pb.NetdefSolverState, where: str) -> None:
    if not math.isfinite(state.smoothed_loss):
        raise SnapshotError(f"{where}: field netdef_state.smoothed_loss is {state.smoothed_loss}, not a finite loss")
    if not all(math.isfinite(v) for v in state.loss_window):
        raise SnapshotError(f"{where}: field netdef_state.loss_window holds a loss that is not finite")
    if not 0 <= state.loss_window_start <= solver.iter:
        raise SnapshotError(f"{where}: field netdef_state.loss_window_start is {state.loss_window_start}; need "
                            f"0 <= it <= iter ({solver.iter})")


def apply_netdef_state(solver, state: pb.NetdefSolverState, where: str) -> None:
    """netdef's part of a state file (``where``), once its fields are checked. Call it after ``iter``
    is restored."""
    if state.HasField("smoothed_loss"):
        _check_loss_window(solver, state, where)
        if len(state.loss_window) > solver.param.average_loss:
            # average_loss was lowered since: the displayed loss restarts its average, as Caffe's always does.
            logger.info("%s holds a loss window of %d iterations, more than average_loss %d: the displayed loss "
                        "starts a new average", where, len(state.loss_window), solver.param.average_loss)
        else:
            solver.loss_window.resume(state.smoothed_loss, list(state.loss_window), state.loss_window_start)
    own = _own_rank_state(solver, state, where)
    solver.parallel.restore_rank_state(own, where, solver.history)
    if own is None:
        if state.HasField("rng_state"):
            _restore_rng(state.rng_state, where)
        # Rank 0's random state is now everywhere; keep the ranks' streams apart.
        backend.set_random_seed(int(backend.rng().integers(0, 2**31)) + solver.parallel.rank)
        return
    if own.HasField("rng_state"):
        _restore_rng(own.rng_state, where)
    layers = dict(_data_sources(solver))
    for cursor in own.data_cursor:
        layer = layers.get(cursor.layer)
        if layer is None:
            logger.warning("%s: no data layer %r in the nets; its saved position is ignored", where, cursor.layer)
            continue
        try:
            layer.restore_data_state(cursor.state)
        except LayerError as exc:
            raise SnapshotError(f"{where}: field data_cursor {cursor.layer!r}: {exc}") from None


# ============================================================================================ writing
def _h5_int(handle, name: str, value: int) -> None:
    handle.create_dataset(name, data=np.array([value], dtype=np.int32))


def _h5_string(handle, name: str, value: str) -> None:
    """A scalar null-terminated fixed-length string, as HDF5's H5LTmake_dataset_string writes it."""
    import h5py

    raw = value.encode("utf-8") + b"\0"
    string_type = h5py.h5t.C_S1.copy()
    string_type.set_size(len(raw))
    string_type.set_strpad(h5py.h5t.STR_NULLTERM)
    space = h5py.h5s.create(h5py.h5s.SCALAR)
    dataset = h5py.h5d.create(handle.id, name.encode("utf-8"), string_type, space)
    dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array(raw, dtype=f"S{len(raw)}"), mtype=string_type)


def _h5_read_int(handle, name: str) -> int:
    return int(np.asarray(handle[name][()]).reshape(-1)[0])


def _h5_read_string(handle, name: str) -> str:
    dataset = handle[name]
    check_dataset_fits(dataset, handle.filename)
    value = dataset[()]
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return str(value).rstrip("\0")


def remove_stale_temps(param: pb.SolverParameter) -> list[str]:
    """Remove the temporary snapshot files that a killed run with this ``snapshot_prefix`` left behind
    (only those ``netdef.tempnames.stale_temps`` proves abandoned); returns their paths."""
    folder, base = os.path.split(param.snapshot_prefix)
    target = re.compile(re.escape(base) + r"_iter_\d+\.(?:caffemodel|solverstate)(?:\.h5)?")
    removed = []
    for path in tempnames.stale_temps(folder, target):
        try:
            os.unlink(path)
        except OSError as exc:
            logger.warning("Cannot remove %s, left by an interrupted snapshot: %s", path, exc.strerror or exc)
            continue
        removed.append(path)
    if removed:
        logger.info("Removed %d temporary file(s) left by an interrupted snapshot: %s", len(removed),
                    ", ".join(removed))
    return removed


def snapshot_paths(param: pb.SolverParameter, iteration: int) -> tuple[str, str]:
    """(model path, state path) of the snapshot at ``iteration``."""
    return (snapshot_filename(param, iteration, model_extension(param)),
            snapshot_filename(param, iteration, state_extension(param)))


def write_snapshot(solver, rank_states: list[bytes]) -> tuple[str, str]:
    """Write the model and the solver state for ``solver.iter``; returns (model path, state path).
    ``rank_states``: every rank's serialized NetdefRankState (``rank_state(solver)`` for one process)."""
    param = solver.param
    hdf5 = param.snapshot_format == pb.SolverParameter.HDF5
    model_path, state_path = snapshot_paths(param, solver.iter)
    folder = os.path.dirname(model_path) or "."
    if not os.path.isdir(folder):
        raise SnapshotError(f"cannot write snapshot {model_path}: folder {folder!r} does not exist "
                            f"(check snapshot_prefix)")
    extra = netdef_state(solver, rank_states)
    # Both temporary files are complete before either rename (see the module docstring).
    temps = []
    try:
        if hdf5:
            logger.info("Snapshotting to HDF5 file %s", model_path)
            temps.append(files.hdf5_to_temp(model_path,
                                            lambda h: write_model_hdf5(h, solver.net, param.snapshot_diff)))
            logger.info("Snapshotting solver state to HDF5 file %s", state_path)
            temps.append(files.hdf5_to_temp(state_path, lambda h: _write_state_hdf5(h, solver, model_path, extra)))
        else:
            logger.info("Snapshotting to binary proto file %s", model_path)
            proto = solver.net.to_proto(param.snapshot_diff)
            temps.append(files.bytes_to_temp(model_path, proto.SerializeToString()))
            logger.info("Snapshotting solver state to binary proto file %s", state_path)
            state = _state_proto(solver, model_path, extra)
            temps.append(files.bytes_to_temp(state_path, state.SerializeToString()))
        files.replace(temps[0], model_path)
        files.replace(temps[1], state_path)
    except BaseException:
        for tmp in temps:
            files.remove_quietly(tmp)
        raise
    return model_path, state_path


def _state_proto(solver, model_path: str, extra: pb.NetdefSolverState) -> pb.SolverState:
    state = pb.SolverState()
    state.iter = solver.iter
    state.learned_net = model_path
    state.current_step = solver.current_step
    for blob in solver.history:
        state.history.append(blob_to_proto(blob))
    state.netdef_state.CopyFrom(extra)
    return state


def _write_state_hdf5(handle, solver, model_path: str, extra: pb.NetdefSolverState) -> None:
    _h5_int(handle, "iter", solver.iter)
    _h5_string(handle, "learned_net", model_path)
    _h5_int(handle, "current_step", solver.current_step)
    group = handle.create_group("history")
    for i, blob in enumerate(solver.history):
        group.create_dataset(str(i), data=backend.to_host(blob.data).astype(np.float32))
    handle.create_dataset("netdef_state", data=np.void(extra.SerializeToString()))


# ============================================================================================ reading
def _resolve_learned_net(learned_net: str, state_path: str) -> str:
    """Caffe opens learned_net relative to the working directory; netdef then tries it relative to the
    state file's folder, then the file of that name beside the state file (a moved snapshot pair)."""
    # lexists: a link that leads nowhere is the file meant; opening it will say what is wrong with it.
    if os.path.lexists(learned_net):
        return learned_net
    folder = os.path.dirname(os.path.abspath(state_path))
    candidates = [os.path.join(folder, learned_net), os.path.join(folder, os.path.basename(learned_net))]
    for candidate in candidates:
        if os.path.lexists(candidate):
            logger.info("learned_net %s is not in the working directory; using %s (beside the solver state)",
                        learned_net, candidate)
            return candidate
    raise SnapshotError(f"{state_path}: learned_net {learned_net!r} not found (tried it relative to the working "
                        f"directory {os.getcwd()!r} and {', '.join(repr(c) for c in candidates)})")


def _load_weights(net, path: str, state_path: str) -> None:
    """The learned_net's weights (either format, told apart by content as Caffe's reader does)."""
    try:
        copy_from(net, path)
    except WeightsError as exc:
        raise SnapshotError(f"{state_path}: cannot restore the learned_net weights: {exc}") from exc


def _set_history(solver, index: int, values: np.ndarray, shape, where: str) -> None:
    set_blob(solver.history[index], values, shape, f"{where}: history blob {index}", "solver's")


def set_blob(blob, values: np.ndarray, shape, what: str, whose: str) -> None:
    """Copy a snapshot's ``values`` (``what``: the file and field, for errors) into ``blob``, checked."""
    if not np.issubdtype(np.asarray(values).dtype, np.number):
        raise SnapshotError(f"{what} holds {np.asarray(values).dtype} values, not numbers")
    if values.size != blob.count:
        raise SnapshotError(f"{what} has shape {tuple(shape)} ({values.size} values), the {whose} is {blob.shape} "
                            f"({blob.count}); was the state written for another net or solver type?")
    if not np.isfinite(values).all():
        raise SnapshotError(f"{what} holds values that are not finite (NaN or infinity): the update rule would "
                            f"turn every weight into NaN")
    blob.data[...] = backend.to_device(np.asarray(values).reshape(blob.shape).astype(blob.dtype), like=blob.data)


def set_blobs(blobs, protos, what: str, whose: str) -> None:
    """``set_blob`` for each of ``blobs`` from the BlobProtos ``protos`` (as many, in order)."""
    if len(protos) != len(blobs):
        raise SnapshotError(f"{what}: {len(protos)} blobs, the {whose} has {len(blobs)}")
    for i, (blob, proto) in enumerate(zip(blobs, protos)):
        set_blob(blob, proto_values(proto), proto_shape(proto), f"{what} {i}", whose)


def restore(solver, path) -> None:
    """Caffe's Solver::Restore: ``.h5`` names an HDF5 state, anything else a binary SolverState."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        raise SnapshotError(f"{path}: no such solver state file")
    with files.open_input_file(path, "solver state") as handle:
        is_hdf5 = handle.read(8) == HDF5_MAGIC
    if path.endswith(".h5") or is_hdf5:
        _restore_hdf5(solver, path)
    else:
        _restore_binary(solver, path)


def _check_counters(solver, iteration: int, current_step: int, path: str) -> None:
    """``iter`` and ``current_step`` as a solver can continue from (Adam divides by 1 - beta^iter, the
    multistep policy indexes stepvalue with current_step)."""
    if iteration < 0:
        raise SnapshotError(f"{path}: field iter is {iteration}; an iteration count cannot be negative")
    if current_step < 0:
        raise SnapshotError(f"{path}: field current_step is {current_step}; it cannot be negative")
    steps = len(solver.param.stepvalue)
    if solver.param.lr_policy == "multistep" and current_step > steps:
        raise SnapshotError(f"{path}: field current_step is {current_step}, but the multistep policy has only "
                            f"{steps} stepvalue(s)")


def _check_history_count(solver, count: int, path: str) -> None:
    if count != len(solver.history):
        raise SnapshotError(f"{path}: Incorrect length of history blobs: the state has {count}, the "
                            f"{solver.param.type} solver has {len(solver.history)} (for "
                            f"{len(solver.net.learnable_params)} learnable parameters)")


def _restore_binary(solver, path: str) -> None:
    state = proto_io.read_binary(path, pb.SolverState)
    _check_history_count(solver, len(state.history), path)
    _check_counters(solver, state.iter, state.current_step, path)
    solver.iter = state.iter
    if state.HasField("learned_net"):
        if not isinstance(state.learned_net, str):
            # protobuf (upb) gives a proto2 string field whose bytes are not UTF-8 as bytes.
            raise SnapshotError(f"{path}: field learned_net ({len(state.learned_net)} bytes) is not UTF-8 text")
        _load_weights(solver.net, _resolve_learned_net(state.learned_net, path), path)
    solver.current_step = state.current_step
    logger.info("SGDSolver: restoring history")
    for i, proto in enumerate(state.history):
        _set_history(solver, i, proto_values(proto), proto_shape(proto), path)
    if state.HasField("netdef_state"):
        apply_netdef_state(solver, state.netdef_state, path)


def _restore_hdf5(solver, path: str) -> None:
    import h5py

    files.check_input_file(path, "solver state")
    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise SnapshotError(f"{path}: not a readable HDF5 solver state ({' '.join(str(exc).split())[:160]})") from None
    with handle:
        try:
            _restore_hdf5_fields(solver, handle, path)
        except (KeyError, TypeError, ValueError, OSError, IndexError) as exc:
            if isinstance(exc, SnapshotError):
                raise
            raise SnapshotError(f"{path}: not a valid HDF5 solver state ({type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:160]})") from None


def _h5_dataset(handle, name: str, path: str):
    import h5py

    if name not in handle or not isinstance(handle[name], h5py.Dataset):
        raise SnapshotError(f"{path}: field {name}: no such dataset")
    return handle[name]


def _h5_counter(handle, name: str, path: str) -> int:
    values = read_dataset(_h5_dataset(handle, name, path), path).reshape(-1)
    if values.size != 1 or not np.issubdtype(values.dtype, np.integer):
        raise SnapshotError(f"{path}: field {name} must be one integer, got {values.size} {values.dtype} value(s)")
    return int(values[0])


def _restore_hdf5_fields(solver, handle, path: str) -> None:
    history = handle["history"] if "history" in handle else {}
    _check_history_count(solver, len(history), path)
    iteration = _h5_counter(handle, "iter", path)
    current_step = _h5_counter(handle, "current_step", path) if "current_step" in handle else 0
    _check_counters(solver, iteration, current_step, path)
    solver.iter = iteration
    if "learned_net" in handle:
        _load_weights(solver.net, _resolve_learned_net(_h5_read_string(handle, "learned_net"), path), path)
    solver.current_step = current_step
    for i in range(len(history)):
        if str(i) not in history:
            raise SnapshotError(f"{path}: history dataset {i} is missing")
        values = read_dataset(_h5_dataset(history, str(i), path), path)
        _set_history(solver, i, values, np.shape(values), path)
    if "netdef_state" in handle:
        try:
            extra = pb.NetdefSolverState.FromString(read_dataset(_h5_dataset(handle, "netdef_state", path), path).tobytes())
        except DecodeError:
            raise SnapshotError(f"{path}: field netdef_state: not a serialized NetdefSolverState") from None
        apply_netdef_state(solver, extra, path)
