"""How cuDNN's plans are chosen and where they run (netdef/cudnn/plans.py), what the CPU can check:
the bookkeeping around the frontend, through stand-ins for it and for CuPy whose only values are
the workspace sizes and the times each candidate plan is given. The plans themselves run on a GPU
(tests/test_gpu_cudnn.py)."""
from __future__ import annotations

import gc
import shutil
import subprocess
import types
import weakref

import numpy as np
import pytest

from netdef.cudnn import plans, timing


class StandInCupy:
    """``empty`` gives NumPy bytes (every workspace made is noted, weakly, so a test can see which
    are still held; ``free`` bytes can be made before it runs out of memory); a device clock that the
    stand-in kernel that holds the stream and the frontend stand-in's launches advance, and events
    stamped with it."""

    uint8 = np.uint8

    class OutOfMemoryError(MemoryError):
        pass

    def __init__(self, free: int = 1 << 40):
        self.made: list[weakref.ref] = []
        self.free = free
        self.device_s = 0.0
        self.held_for: list[float] = []  # the seconds each hold of the stream lasted
        self.cached_blocks_released = 0
        stand_in = self

        class Event:
            def record(self, stream=None):
                self.at = stand_in.device_s

            def synchronize(self):
                pass

        def hold(grid, block, args):
            (nanoseconds,) = args
            stand_in.held_for.append(int(nanoseconds) / 1e9)
            stand_in.device_s += int(nanoseconds) / 1e9

        def release_cached_blocks():
            stand_in.cached_blocks_released += 1

        self.RawKernel = lambda source, name: hold
        self.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=release_cached_blocks)
        self.cuda = types.SimpleNamespace(
            Event=Event, get_current_stream=lambda: types.SimpleNamespace(ptr=0),
            get_elapsed_time=lambda start, stop: float(np.float32((stop.at - start.at) * 1e3)),
            memory=types.SimpleNamespace(OutOfMemoryError=self.OutOfMemoryError))

    def empty(self, nbytes, dtype):
        if nbytes > self.free:
            raise self.OutOfMemoryError(f"out of memory allocating {nbytes} bytes")
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
        self.modes = modes

    def deselect_workspace_greater_than(self, limit):
        pass

    def deselect_numeric_notes(self, notes):
        self.deselected_notes = notes

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

    def get_plan_name_at_index(self, index):
        return f"eng{index}"

    def _launch(self, index, workspace_bytes):
        needed, milliseconds = self.candidates[index]
        assert workspace_bytes >= needed, f"plan {index} launched with {workspace_bytes} of its {needed} bytes"
        self.launched_with.append((index, workspace_bytes))
        self.cupy.device_s += milliseconds / 1e3


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
        heur_mode=types.SimpleNamespace(A="A", B="B", FALLBACK="FALLBACK"),
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
    made.timer = timing.DeviceTimer(cupy, clock=lambda: 0.0)  # the host queues at once: one hold each
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


def test_a_workspace_that_cannot_grow_leaves_an_empty_one_and_counts_the_loss(device):
    device.device.workspace(300)
    device.cupy.free = 100
    with pytest.raises(StandInCupy.OutOfMemoryError):
        device.device.workspace(700)
    assert device.device.workspace(0).size == 0 and device.cupy.held() == [0]  # usable, and the 300 freed
    assert plans.workspace_generation() == 2  # a graph recorded with the 300 bytes is forgotten


def test_where_no_ranked_plan_runs_the_thorough_heuristics_are_asked_next(device):
    # Mode A's plans: one left out by the precision filter, one over the workspace limit as the frontend
    # says it, one that fails to build; mode B ranks one that runs.
    barred = RuntimeError("[cudnn_frontend] Error: Deselecting execution plan at position 0")
    too_big = RuntimeError("[cudnn_frontend] Error: Skipping plan since workspace violation. Requires 4294967296")
    first = StandInGraph(device.cupy, [barred, too_big, RuntimeError("CUDNN_STATUS_NOT_SUPPORTED")])
    device.graphs.append(first)
    chosen, second = _plan(device, "conv_fprop", [(64, 0.3)])  # the second graph, handed out after the first
    assert first.modes == ["A", "FALLBACK"] and second.modes == ["B", "FALLBACK"] and chosen.graph is second
    assert chosen.index == 0 and chosen.over_limit == (4294967296,)  # what the limit cut, from either


def test_no_plan_that_runs_names_each_failure_where_and_why_and_is_remembered(device):
    barred = RuntimeError("Deselecting execution plan")
    candidates = [barred, RuntimeError("CUDNN_STATUS_NOT_SUPPORTED_SHAPE"), (1 << 40, 1.0), (10, 1.0)]
    device.graphs.append(StandInGraph(device.cupy, candidates))
    device.cupy.free = 5  # plan 3's workspace never fits, even with the pool's cached blocks given back
    with pytest.raises(plans.Unsupported) as refused:
        _plan(device, "conv_fprop", candidates)
    message = str(refused.value)
    assert message.startswith("conv_fprop: no cuDNN plan ran within the workspace limit")
    for modes in ("A+FALLBACK", "B+FALLBACK"):
        assert (f"heuristics {modes}: 4 ranked, 1 left out by the precision filter, 1 over the workspace limit, "
                f"2 failed: #1 eng1 (build): RuntimeError: CUDNN_STATUS_NOT_SUPPORTED_SHAPE, #3 eng3 (run): "
                f"OutOfMemoryError: out of memory allocating 10 bytes") in message
    assert device.cupy.cached_blocks_released == 2  # once for plan 3, per graph
    with pytest.raises(plans.Unsupported):  # from the record: no graph is asked for again
        plans.plan(("conv_fprop",), None, ())
    assert device.cupy.held() == [0]


@pytest.mark.parametrize("precision, dtype, left_out", [("float32", np.float32, ["down", "tc"]),
                                                        ("tf32", np.float32, ["down"]),
                                                        ("float32", np.float64, None)])
def test_float32_plans_never_narrow_their_inputs_and_strict_float32_takes_no_tensor_cores(
        device, precision, dtype, left_out, monkeypatch):
    from netdef import backend

    monkeypatch.setattr(backend, "_state", {**backend._state, "precision": precision})
    graph = StandInGraph(device.cupy, [(0, 1.0)])
    device.graphs.append(graph)
    arrays = tuple(np.zeros(4, dtype).view(DeviceArray) for _ in range(3))
    plans.plan(("conv_fprop",), lambda g, cudnn: [StandInOperand(i) for i in range(3)], arrays)
    assert getattr(graph, "deselected_notes", None) == left_out


def test_the_fastest_on_the_device_is_chosen_and_each_timing_queues_behind_a_hold_of_the_stream(device):
    chosen, graph = _plan(device, "conv_fprop", [(0, 0.9), (0, 0.2), (0, 0.5)])
    assert chosen.index == 1
    assert device.cupy.held_for == [timing.FIRST_WAIT_S] * 3  # one hold per candidate, long enough here


def test_the_benchmark_limit_caps_the_candidates_timed_and_is_part_of_the_key(device, monkeypatch):
    from netdef import cudnn

    monkeypatch.setattr(cudnn, "_settings", {**cudnn._settings})
    cudnn.set_benchmark_limit(2)
    chosen, graph = _plan(device, "conv_fprop", [(0, 0.9), (0, 0.5), (0, 0.2)])
    assert chosen.index == 1 and len(device.cupy.held_for) == 2  # the third, fastest, never timed
    cudnn.set_benchmark_limit(3)
    chosen, graph = _plan(device, "conv_fprop", [(0, 0.9), (0, 0.5), (0, 0.2)])  # planned anew
    assert chosen.index == 2
    with pytest.raises(ValueError, match="at least 1"):
        cudnn.set_benchmark_limit(0)


def test_a_hold_the_host_outlasts_is_doubled_and_the_timing_taken_again():
    cupy = StandInCupy()
    host = {"s": 0.0}

    def launch():  # the host takes 1.5 ms to queue each run of 0.1 ms
        host["s"] += 1.5e-3
        cupy.device_s += 1e-4

    timer = timing.DeviceTimer(cupy, clock=lambda: host["s"])
    assert timer.milliseconds(launch, runs=3) == pytest.approx(0.1, rel=1e-3)
    # 4.5 ms of queueing outlasted the first hold of 2 ms; the second, of 9 ms, held the stream throughout.
    assert cupy.held_for == pytest.approx([timing.FIRST_WAIT_S, 2 * 4.5e-3])
    assert timer.wait_s == pytest.approx(2 * 4.5e-3)  # and the next candidates start from it


def test_the_kernel_that_holds_the_stream_compiles(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the kernel cannot be compile-checked here")
    source = tmp_path / "hold.cu"
    source.write_text(timing.WAIT_SOURCE)
    result = subprocess.run([nvcc, "--ptx", "-arch=sm_80", "-o", str(tmp_path / "hold.ptx"), str(source)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert f".entry {timing.WAIT_KERNEL}(" in (tmp_path / "hold.ptx").read_text()
