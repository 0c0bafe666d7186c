"""cuDNN operation graphs, each planned once per operation and shape and kept for the process.

``plan(key, describe, arrays)`` returns the ``Plan`` for ``key`` (an operation and every shape, stride,
type and setting that decides how it runs), building it on first use: ``describe(graph, cudnn)``
declares the graph's tensors and operation and returns its operands in a fixed order; the frontend's
heuristics rank execution plans; those that break the precision setting or the workspace limit are
left out; the first that run, up to the benchmark limit, are each timed on ``arrays`` (the layer's
own arrays, in the operands' order; the device's time, not the host's: timing.py) and the fastest is
kept. Where none of
the ranked plans runs, the more thorough heuristics are asked (``HEURISTIC_MODES``). A key whose
graph cuDNN cannot run raises ``Unsupported``, naming each plan that failed, where and why (and is
remembered, so the layer's fallback is chosen at once the next time).

One handle and one workspace per device, bound to CuPy's current stream when a plan runs: layers
enqueue on the compute stream and the host never waits for cuDNN. The shared workspace is as large as
the largest chosen plan needs, not the largest candidate timed: each candidate is timed with a
workspace of its own, freed once timed (a candidate may want up to the limit, 1 GiB by default, and
keeping that for the process would be memory no layer uses). A workspace outgrown is freed at once;
``workspace_generation()`` counts the replacements, so that a CUDA graph recorded with an old one is
never launched again (net_graphs.py forgets it, as a replaced scratch buffer).
"""
from __future__ import annotations

import logging
import re

import numpy as np

from .. import backend
from . import benchmark_limit, workspace_limit
from .timing import DeviceTimer

log = logging.getLogger("netdef")

# Timed launches per candidate, after one untimed launch.
TIMED_RUNS = 3
# The heuristics asked, in turn, while none of the plans a graph was given runs: mode B is slower to
# answer and ranks more thoroughly; FALLBACK adds the engines that support the graph at all.
HEURISTIC_MODES = (("A", "FALLBACK"), ("B", "FALLBACK"))
# How the frontend (cuDNN 9.2 and later) refuses to build a plan that a filter left out, or whose
# workspace is over the limit given to ``deselect_workspace_greater_than``.
BARRED = "Deselecting execution plan"
WORKSPACE_VIOLATION = re.compile(r"workspace violation\. Requires (\d+)")
# cuDNN's and CUDA's words for an allocation that failed, in the frontend's errors.
_ALLOCATION_FAILED = re.compile(r"ALLOC|out of memory", re.IGNORECASE)
# Failures a refusal names in full (the rest are counted).
NAMED_FAILURES = 4


class Unsupported(RuntimeError):
    """cuDNN has no plan for this graph under the current settings; the message says why."""


class Plan:
    """One operation graph with its chosen execution plan, on the device it was built for.
    ``run(*arrays)`` launches it on the current stream with ``arrays`` bound to the operands, in the
    order ``describe`` returned them.

    The frontend's ``execute_plan_at_index`` re-checks the graph's plan filters on every call (a walk
    over every ranked plan, in Python: longer than the GPU took for most of ResNet-50's convolutions;
    benchmarks/README.md, "The first GPU figures"), so the chosen plan is pinned on its graph and run
    by ``execute`` with the operands' uids in a fixed order, the frontend's cached path (``pin``).
    Where that path fails on the frontend in use, the plan keeps the indexed call."""

    def __init__(self, graph, operands, index: int, workspace_bytes: int, device: "_Device",
                 over_limit: tuple = ()):
        self.graph = graph
        self.operands = operands
        self.index = index
        self.workspace_bytes = workspace_bytes
        self.device = device
        #: The workspace bytes of the candidates left out for wanting more than the limit (their
        #: speed unknown): where the limit may have cost this operation its fastest plan.
        self.over_limit = over_limit
        self._uids = None  # the operands' uids once the plan is pinned

    def pin(self, arrays) -> str | None:
        """Select this plan on its graph and run it once on ``arrays`` by the cached path; None when
        that worked (``run`` takes it from now on), else why not."""
        try:
            self.graph.select_plan(self.index)
            self.graph.build_plans()
            self._uids = tuple(operand.get_uid() for operand in self.operands)
            self.run(*arrays)
        except Exception as exc:  # noqa: BLE001 - any failure of the cached path leaves the indexed call
            self._uids = None
            return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return None

    def run(self, *arrays) -> None:
        workspace, handle = self.device.workspace(self.workspace_bytes), self.device.bound_handle()
        if self._uids is not None:
            self.graph.execute(tuple(a.data.ptr for a in arrays), workspace.data.ptr, handle=handle,
                               tensor_uids=self._uids)
        else:
            self.graph.execute_plan_at_index(_pointers(self.operands, arrays), workspace, index=self.index,
                                             handle=handle)


def _pointers(operands, arrays) -> dict:
    """The frontend's variant pack: each operand's device address."""
    return {operand: array.data.ptr for operand, array in zip(operands, arrays)}


class _Device:
    """A device's cuDNN handle and the workspace all of its chosen plans share (grown as they need,
    freed by ``release_workspace``). ``cudnn`` and ``cupy``: the modules (a test gives stand-ins)."""

    def __init__(self, cudnn, cupy):
        self.cudnn = cudnn
        self.cupy = cupy
        self.handle = cudnn.create_handle()
        self._workspace = cupy.empty(0, dtype=cupy.uint8)
        self.timer = DeviceTimer(cupy)
        #: How many times the shared workspace was let go (``workspace_generation``).
        self.generation = 0

    def bound_handle(self):
        self.cudnn.set_stream(self.handle, self.cupy.cuda.get_current_stream().ptr)
        return self.handle

    def workspace(self, nbytes: int):
        """The shared workspace, grown to ``nbytes`` where smaller. The outgrown one is let go first,
        so that its memory can serve the larger one's allocation (the plans run on the compute stream,
        where CuPy's pool reuses a block in the stream's order); where the larger one does not fit,
        the error is raised with an empty workspace in place."""
        if self._workspace.size < nbytes:
            self.release_workspace()
            self._workspace = self.cupy.empty(nbytes, dtype=self.cupy.uint8)
        return self._workspace

    def release_workspace(self) -> None:
        """Free the shared workspace; the next plan to run makes a new one."""
        self._workspace = self.cupy.empty(0, dtype=self.cupy.uint8)
        self.generation += 1

    def candidate_workspace(self, nbytes: int):
        """A workspace for timing one candidate plan, freed when the caller lets go of it."""
        return self.cupy.empty(nbytes, dtype=self.cupy.uint8)


_devices: dict[int, _Device] = {}
_plans: dict = {}


def _current_device_id() -> int:
    import cupy

    return cupy.cuda.Device().id


def _device(device_id: int) -> _Device:
    found = _devices.get(device_id)
    if found is None:
        import cudnn
        import cupy

        found = _devices[device_id] = _Device(cudnn, cupy)
    return found


def shared_workspace_bytes() -> int:
    """The bytes of every device's shared workspace (as large as the largest plan chosen there needs)."""
    return sum(int(device.workspace(0).size) for device in _devices.values())


def release_workspaces() -> None:
    """Free every device's shared workspace, as a process that has finished with its nets may (the
    plans stay; the next to run grows a new one). A CUDA graph recorded before is forgotten."""
    for device in _devices.values():
        device.release_workspace()


def workspace_generation() -> int:
    """How many times a device's shared workspace has been let go in this process: a CUDA graph
    recorded before the last time would run its plans in freed memory."""
    return sum(device.generation for device in _devices.values())


def data_type(cudnn, dtype):
    """The frontend's name of a NumPy/CuPy float type."""
    types = {np.dtype(np.float32): cudnn.data_type.FLOAT, np.dtype(np.float64): cudnn.data_type.DOUBLE,
             np.dtype(np.float16): cudnn.data_type.HALF}
    try:
        return types[np.dtype(dtype)]
    except KeyError:
        raise Unsupported(f"cuDNN runs float16/32/64 arrays, not {np.dtype(dtype)}") from None


def plan(key: tuple, describe, arrays) -> Plan:
    """The plan for ``key``, built and timed on ``arrays`` the first time (see the module docstring).
    The device and the settings that decide which plans qualify and how many are timed (precision,
    workspace limit, benchmark limit) are part of the key."""
    key = key + (backend.precision(), workspace_limit(), benchmark_limit(), _current_device_id())
    found = _plans.get(key)
    if found is None:
        try:
            found = _build(key, describe, arrays)
        except Unsupported as exc:
            found = exc
        _plans[key] = found
    if isinstance(found, Unsupported):
        raise found
    return found


def _build(key, describe, arrays) -> Plan:
    device = _device(key[-1])
    tried, over_limit = [], []
    for modes in HEURISTIC_MODES:
        try:
            graph, operands = _ranked_graph(describe, arrays, device, modes)
        except Exception as exc:  # noqa: BLE001 - the frontend raises several types; all mean: no plan
            tried.append(f"heuristics {'+'.join(modes)}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            continue
        trial = _time_candidates(graph, operands, arrays, device)
        over_limit += trial.over_limit
        if trial.timed:
            break
        tried.append(f"heuristics {'+'.join(modes)}: {trial.why_none_ran(graph.get_execution_plan_count())}")
    else:
        raise Unsupported(f"{key[0]}: no cuDNN plan ran within the workspace limit ({workspace_limit()} bytes) "
                          f"and precision {backend.precision()}: {'; '.join(tried)}")
    _, index, workspace_bytes = min(trial.timed)
    chosen = Plan(graph, operands, index, workspace_bytes, device, tuple(over_limit))
    why_not_pinned = chosen.pin(arrays)
    if why_not_pinned is not None:
        _log_unpinned_once(why_not_pinned)
    return chosen


def _ranked_graph(describe, arrays, device, modes) -> tuple:
    """(graph, operands): the operation ``describe`` declares, with the plans the heuristics ``modes``
    rank for it, those that break the precision setting or the workspace limit left out."""
    cudnn = device.cudnn
    dtype = arrays[0].dtype
    compute = cudnn.data_type.DOUBLE if dtype == np.float64 else cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=data_type(cudnn, dtype), intermediate_data_type=compute,
                          compute_data_type=compute, handle=device.handle)
    operands = describe(graph, cudnn)
    graph.validate()
    graph.build_operation_graph()
    heuristics = {"A": cudnn.heur_mode.A, "B": cudnn.heur_mode.B, "FALLBACK": cudnn.heur_mode.FALLBACK}
    graph.create_execution_plans([heuristics[mode] for mode in modes])
    graph.deselect_workspace_greater_than(workspace_limit())
    if dtype == np.float32:
        # No engine that converts float32 inputs to float16 or bfloat16 (DOWN_CONVERT_INPUTS, which
        # PyTorch leaves out too); in Caffe's strict float32 none that rounds them to TensorFloat-32
        # for the tensor cores either.
        notes = [cudnn.numerical_note.DOWN_CONVERT_INPUTS]
        if backend.precision() == "float32":
            notes.append(cudnn.numerical_note.TENSOR_CORE)
        graph.deselect_numeric_notes(notes)
    graph.check_support()
    return graph, operands


_unpinned_logged = False


def _log_unpinned_once(why: str) -> None:
    global _unpinned_logged
    if not _unpinned_logged:
        _unpinned_logged = True
        log.warning("cuDNN plans run by the frontend's indexed call, slow in Python (its cached path "
                    "failed: %s)", why)


class _Trial:
    """What timing a graph's ranked plans found: (milliseconds, index, workspace bytes) of each timed,
    how many the filters left out, the workspace bytes of those over the limit, and (index, the plan's
    name, "build" or "run", the error) of each that failed otherwise."""

    def __init__(self):
        self.timed: list[tuple[float, int, int]] = []
        self.barred = 0
        self.over_limit: list[int] = []
        self.failures: list[tuple[int, str, str, str]] = []

    def why_none_ran(self, ranked: int) -> str:
        named = ", ".join(f"#{index} {name} ({stage}): {error[:300]}"
                          for index, name, stage, error in self.failures[:NAMED_FAILURES])
        more = len(self.failures) - NAMED_FAILURES
        return (f"{ranked} ranked, {self.barred} left out by the precision filter, {len(self.over_limit)} over the "
                f"workspace limit, {len(self.failures)} failed" + (f": {named}" if named else "")
                + (f" and {more} more" if more > 0 else ""))


def _time_candidates(graph, operands, arrays, device) -> _Trial:
    """Each ranked plan in turn built and timed, until ``benchmark_limit()`` have been; a plan cuDNN could
    not allocate for is tried again once CuPy's pool has given its cached blocks back (planning runs in
    the eager passes, before any CUDA graph is recorded)."""
    pack = _pointers(operands, arrays)
    trial = _Trial()
    for index in range(graph.get_execution_plan_count()):
        if len(trial.timed) == benchmark_limit():
            break
        for last_try in (False, True):
            stage = "build"
            try:
                graph.build_plan_at_index(index)
                workspace_bytes = graph.get_workspace_size_plan_at_index(index)
                if workspace_bytes > workspace_limit():  # a frontend that leaves the limit to its caller
                    trial.over_limit.append(workspace_bytes)
                    break
                stage = "run"
                trial.timed.append((_time_candidate(graph, pack, index, workspace_bytes, device), index,
                                    workspace_bytes))
                break
            except Exception as exc:  # noqa: BLE001 - a plan that does not build or run is not a candidate
                error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                if not last_try and _out_of_memory(exc):
                    device.cupy.get_default_memory_pool().free_all_blocks()
                    continue
                _note_refusal(trial, graph, index, stage, error)
                break
    return trial


def _out_of_memory(exc: Exception) -> bool:
    """Whether the error says an allocation failed: cuDNN's (ALLOC_FAILED), CUDA's or CuPy's (out of
    memory)."""
    return _ALLOCATION_FAILED.search(str(exc)) is not None


def _note_refusal(trial: _Trial, graph, index: int, stage: str, error: str) -> None:
    over = WORKSPACE_VIOLATION.search(error)
    if BARRED in error:
        trial.barred += 1
    elif over is not None:
        trial.over_limit.append(int(over.group(1)))
    else:
        trial.failures.append((index, _plan_name(graph, index), stage, error))


def _plan_name(graph, index: int) -> str:
    """The frontend's name of plan ``index`` (its engine and knobs), for the log."""
    try:
        return str(graph.get_plan_name_at_index(index))
    except Exception:  # noqa: BLE001 - a name is only for the log; no name is no reason to fail
        return "(unnamed)"


def _time_candidate(graph, pack, index: int, workspace_bytes: int, device) -> float:
    """Device milliseconds per launch of plan ``index`` (``timing.DeviceTimer``), with a workspace of its
    own, freed on return."""
    workspace = device.candidate_workspace(workspace_bytes)
    handle = device.bound_handle()
    graph.execute_plan_at_index(pack, workspace, index=index, handle=handle)  # untimed: first-launch costs
    return device.timer.milliseconds(
        lambda: graph.execute_plan_at_index(pack, workspace, index=index, handle=handle), TIMED_RUNS)


def limited_by_workspace() -> list[tuple[str, int]]:
    """(operation, the most workspace bytes a candidate left out wanted) of every plan built so far
    in this process whose candidates included some the workspace limit left out."""
    return [(key[0], max(found.over_limit)) for key, found in _plans.items()
            if isinstance(found, Plan) and found.over_limit]

