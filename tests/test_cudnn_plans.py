"""How cuDNN's plans are chosen and where they run (netdef/cudnn/plans.py), what the CPU can check:
the bookkeeping around the frontend, through stand-ins for it and for CuPy whose only values are
the workspace sizes and the times each candidate plan is given. The plans themselves run on a GPU
(tests/test_gpu_cudnn.py)."""
from __future__ import annotations

import gc
import types
import weakref

import numpy as np
import pytest

from netdef.cudnn import plans


class StandInCupy:
    """``empty`` gives NumPy bytes (every workspace made is noted, weakly, so a test can see which
    are still held); events time nothing: ``get_elapsed_time`` answers the time the frontend stand-in
    set for the plan last launched."""

    uint8 = np.uint8

    def __init__(self):
        self.made: list[weakref.ref] = []
        self.elapsed_ms = 0.0
        stand_in = self

        class Event:
            def record(self, stream=None):
                pass

            def synchronize(self):
                pass

        self.cuda = types.SimpleNamespace(
            Event=Event, get_current_stream=lambda: types.SimpleNamespace(ptr=0),
            get_elapsed_time=lambda start, stop: stand_in.elapsed_ms * plans.TIMED_RUNS)

    def empty(self, nbytes, dtype):
        array = np.empty(nbytes, dtype=dtype).view(DeviceArray)
        self.made.append(weakref.ref(array))
        return array

    def held(self) -> list[int]:
        """The sizes of the workspaces still referred to by anyone."""
        gc.collect()
        return sorted(ref().size for ref in self.made if ref() is not None)


class StandInGraph:
    """A frontend graph whose ranked plans are ``candidates``: (workspace bytes, ms per launch), or
    an exception a plan raises when built. Each launch checks that its workspace is large enough."""

    def __init__(self, cupy: StandInCupy, candidates):
        self.cupy = cupy
        self.candidates = candidates
        self.launched_with: list[tuple[int, int]] = []  # (plan index, workspace bytes given)
        self.selected = None

    # what _build asks of every graph
    def validate(self):
        pass

    def build_operation_graph(self):
        pass

    def create_execution_plans(self, modes):
        pass

    def deselect_workspace_greater_than(self, limit):
        pass

    def deselect_numeric_notes(self, notes):
        pass

    def check_support(self):
        pass

    def get_execution_plan_count(self):
        return len(self.candidates)

    def build_plan_at_index(self, index):
        if isinstance(self.candidates[index], Exception):
            raise self.candidates[index]

    def get_workspace_size_plan_at_index(self, index):
        return self.candidates[index][0]

    def execute_plan_at_index(self, pack, workspace, index, handle):
        self._launch(index, workspace.size)

    # the cached path of a pinned plan
    def select_plan(self, index):
        self.selected = index

    def build_plans(self):
        pass

    def execute(self, pointers, workspace_pointer, handle, tensor_uids):
        workspace = next(ref() for ref in reversed(self.cupy.made) if ref() is not None
                         and ref().ctypes.data == workspace_pointer)
        self._launch(self.selected, workspace.size)

    def _launch(self, index, workspace_bytes):
        needed, milliseconds = self.candidates[index]
        assert workspace_bytes >= needed, f"plan {index} launched with {workspace_bytes} of its {needed} bytes"
        self.launched_with.append((index, workspace_bytes))
        self.cupy.elapsed_ms = milliseconds


class StandInOperand:
    def __init__(self, uid):
        self.uid = uid

    def get_uid(self):
        return self.uid


def stand_in_frontend(graphs: list):
    """A ``cudnn`` module whose ``pygraph`` hands out ``graphs`` in turn."""
    return types.SimpleNamespace(
        create_handle=lambda: "handle", set_stream=lambda handle, stream: None,
        pygraph=lambda **settings: graphs.pop(0),
        data_type=types.SimpleNamespace(FLOAT="float", DOUBLE="double", HALF="half"),
        heur_mode=types.SimpleNamespace(A="A", FALLBACK="FALLBACK"),
        numerical_note=types.SimpleNamespace(TENSOR_CORE="tc", DOWN_CONVERT_INPUTS="down"))


class DeviceArray(np.ndarray):
    """A NumPy array with CuPy's ``.data.ptr``, for the operands a plan is bound to."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


@pytest.fixture
def device(monkeypatch):
    """A stand-in device 0 for plans to build on, and no plans from other tests."""
    cupy = StandInCupy()
    graphs: list = []
    made = plans._Device(stand_in_frontend(graphs), cupy)
    monkeypatch.setattr(plans, "_devices", {0: made})
    monkeypatch.setattr(plans, "_plans", {})
    monkeypatch.setattr(plans, "_current_device_id", lambda: 0)
    return types.SimpleNamespace(cupy=cupy, graphs=graphs, device=made)


def _plan(device, key: str, candidates) -> tuple[plans.Plan, StandInGraph]:
    graph = StandInGraph(device.cupy, candidates)
    device.graphs.append(graph)
    arrays = tuple(np.zeros(4, np.float32).view(DeviceArray) for _ in range(3))
    chosen = plans.plan((key,), lambda g, cudnn: [StandInOperand(i) for i in range(3)], arrays)
    return chosen, graph


def test_the_shared_workspace_is_the_chosen_plans_not_the_largest_candidates(device):
    # The fastest plan wants 300 bytes; slower ones wanted up to 9000, timed each in a workspace of
    # its own that is freed once timed.
    chosen, graph = _plan(device, "conv_fprop", [(9000, 2.0), (300, 0.5), (5000, 1.0), RuntimeError("no")])
    assert chosen.index == 1 and chosen.workspace_bytes == 300
    assert device.cupy.held() == [300]  # no candidate's workspace is kept
    assert graph.selected == 1 and graph.launched_with[-1] == (1, 300)  # pinned, then run in the shared one


def test_an_outgrown_workspace_is_freed_and_counted_and_a_smaller_plan_runs_in_the_larger_one(device):
    assert plans.workspace_generation() == 0
    first, _ = _plan(device, "conv_fprop", [(300, 1.0)])
    assert plans.workspace_generation() == 1  # from the empty one made with the device
    _plan(device, "conv_dgrad", [(700, 1.0), (100, 3.0)])
    assert plans.workspace_generation() == 2 and device.cupy.held() == [700]  # the 300 bytes are freed
    _plan(device, "conv_wgrad", [(200, 1.0)])
    assert plans.workspace_generation() == 2 and device.cupy.held() == [700]  # fits: nothing replaced
    first.run(*(np.zeros(4, np.float32).view(DeviceArray) for _ in range(3)))
    assert device.cupy.held() == [700] and plans.shared_workspace_bytes() == 700
    plans.release_workspaces()  # the plans stay; the next to run makes a workspace of its size
    assert device.cupy.held() == [0] and plans.workspace_generation() == 3
    first.run(*(np.zeros(4, np.float32).view(DeviceArray) for _ in range(3)))
    assert device.cupy.held() == [300] and plans.workspace_generation() == 4


def test_no_plan_that_builds_names_the_reasons_and_is_remembered(device):
    candidates = [RuntimeError("not supported"), (1 << 40, 1.0)]
    with pytest.raises(plans.Unsupported, match="none of the 2 ranked plans.*not supported.*workspace"):
        _plan(device, "conv_fprop", candidates)
    with pytest.raises(plans.Unsupported):  # from the record: no graph is asked for again
        plans.plan(("conv_fprop",), None, ())
    assert device.cupy.held() == [0]
