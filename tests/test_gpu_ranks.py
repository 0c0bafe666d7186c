"""Two MPI ranks on one GPU (``mpiexec -n 2 netdef train ... --gpu all``): how the GPU machines,
which have one device each, test the distributed solver on GPUs. Each rank takes the machine's GPU
in turn (netdef/devices.py), the log names the sharing, and 2 ranks at batch B end with the weights
of one GPU process at batch 2B over the same records (to float32 rounding: the sums run in another
order), the gradients going through pinned host buffers (netdef/comm/gradient_staging.py). Skips without a GPU or without MPI, saying which."""
from __future__ import annotations

import collections
import json
import re
import time

import numpy as np
import pytest

from tests.comm.fixtures import mpi_available, run_netdef, write_case
from tests.comm.test_mpi import BATCH, ITERATIONS, RECORDS, relative_error, weights
from tests.helpers import gpu_missing

MISSING = gpu_missing()
MPI_OK, MPI_WHY_NOT = mpi_available()
pytestmark = [pytest.mark.skipif(MISSING is not None, reason=f"no GPU: {MISSING}"),
              pytest.mark.skipif(not MPI_OK, reason=MPI_WHY_NOT)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One GPU process at batch 2B: its folder and final weights."""
    folder = tmp_path_factory.mktemp("one_gpu")
    single = write_case(folder, "single", 2 * BATCH, ITERATIONS, records=RECORDS)
    run = run_netdef(["train", str(single), "--gpu", "0"], 0, folder, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    return weights(single.with_name("single_net.prototxt"), folder / f"single_iter_{ITERATIONS}.caffemodel")


def assert_trained_as(expected, net_path, model_path):
    """The weights of ``model_path`` (for ``net_path``) equal ``expected``'s to float32 rounding."""
    got = weights(net_path, model_path)
    for name, blobs in expected.items():
        for a, b in zip(got[name], blobs):
            assert relative_error(np.asarray(a), np.asarray(b)) < 1e-5, name


def skip_where_nccl_refuses_sharing(run) -> None:
    """Skip, saying so, where ``run`` ended because this machine's NCCL refuses two ranks on one GPU."""
    if run.returncode != 0 and re.search(r"Duplicate GPU|ncclInvalidUsage|invalid usage|which NCCL [\d.]+ refuses",
                                         run.stderr):
        pytest.skip("this machine's NCCL refuses two ranks on one GPU: " + run.stderr.strip().splitlines()[-1][:300])


# The staged path's exchange (gradient_staging.py) under the schedules and overlap settings.
FLAGS = [pytest.param([], id="priority"), pytest.param(["--schedule", "fifo"], id="fifo"),
         pytest.param(["--overlap", "off", "--schedule", "fifo"], id="fifo-no-overlap")]


@pytest.mark.parametrize("flags", FLAGS)
def test_two_ranks_share_the_gpu_and_train_as_one_process_at_twice_the_batch(tmp_path, one_process, flags):
    pair = write_case(tmp_path, "pair", BATCH, ITERATIONS, records=RECORDS)
    two = run_netdef(["train", str(pair), "--gpu", "all"] + flags, 2, tmp_path, timeout=180)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 0 -> GPU 0 on " in two.stderr and "(shared with rank(s) 1)" in two.stderr, two.stderr[-3000:]
    assert_trained_as(one_process, pair.with_name("pair_net.prototxt"), tmp_path / f"pair_iter_{ITERATIONS}.caffemodel")


def test_the_log_says_how_the_gradients_travel(tmp_path):
    pair = write_case(tmp_path, "route", BATCH, 2, records=RECORDS)
    two = run_netdef(["train", str(pair), "--gpu", "all", "--exchange_via", "auto"], 2, tmp_path, timeout=180,
                     env={"NCCL_MULTI_RANK_GPU_ENABLE": None})
    assert two.returncode == 0, two.stderr[-3000:]
    assert "Gradients on the GPU are summed through pinned host buffers and MPI (ranks share a GPU" in two.stderr
    refused = run_netdef(["train", str(pair), "--gpu", "all", "--exchange_via", "nccl"], 2, tmp_path, timeout=180,
                         env={"NCCL_MULTI_RANK_GPU_ENABLE": None})
    assert refused.returncode != 0 and "exchange_via is nccl, but ranks share a GPU" in refused.stderr


# NCCL's paths (netdef/comm/nccl.py, nccl_sum.py): the priority schedule's chunks, the drivers' buckets
# without overlap, and the fifo schedule's one group per layer, as the log describes each.
NCCL_FLAGS = [pytest.param([], "allreduce on a communication stream of its own", id="priority"),
              pytest.param(["--chunk_bytes", "4096", "--credit_bytes", "8192"],
                           "allreduce on a communication stream of its own", id="priority-small-chunks"),
              pytest.param(["--schedule", "fifo", "--overlap", "off"], "allreduce on a communication stream of its own",
                           id="fifo-no-overlap"),
              pytest.param(["--schedule", "fifo"], "allreduce over NCCL", id="fifo")]


@pytest.mark.parametrize("flags, described", NCCL_FLAGS)
def test_nccl_on_one_gpu_where_nccl_allows_two_ranks(tmp_path, one_process, flags, described):
    """NCCL 2.30 and later let two ranks share a GPU (experimentally, NCCL_MULTI_RANK_GPU_ENABLE=1,
    channels limited by NCCL_MAX_CTAS): the NCCL exchange then runs here too. An older NCCL refuses,
    and the test says so rather than pass."""
    pair = write_case(tmp_path, "pair", BATCH, ITERATIONS, records=RECORDS)
    two = run_netdef(["train", str(pair), "--gpu", "all", "--exchange_via", "nccl"] + flags, 2, tmp_path, timeout=180,
                     env={"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_MAX_CTAS": "4"})
    skip_where_nccl_refuses_sharing(two)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "summed through NCCL" in two.stderr and described in two.stderr, two.stderr[-3000:]
    assert_trained_as(one_process, pair.with_name("pair_net.prototxt"), tmp_path / f"pair_iter_{ITERATIONS}.caffemodel")


def assert_nccl_trains_as_the_host(tmp_path, flags, described) -> None:
    """The rule of ``flags`` over NCCL trains two ranks as through the host (``exchange_via: mpi``), and
    the log says ``described``; skips where this machine's NCCL refuses two ranks on one GPU."""
    staged = write_case(tmp_path, "staged", BATCH, ITERATIONS, records=RECORDS)
    via_host = run_netdef(["train", str(staged), "--gpu", "all", "--exchange_via", "mpi"] + flags, 2, tmp_path,
                          timeout=180)
    assert via_host.returncode == 0, via_host.stderr[-3000:]
    nccl = write_case(tmp_path, "nccl", BATCH, ITERATIONS, records=RECORDS)
    two = run_netdef(["train", str(nccl), "--gpu", "all", "--exchange_via", "nccl"] + flags, 2, tmp_path,
                     timeout=180, env={"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_MAX_CTAS": "4"})
    skip_where_nccl_refuses_sharing(two)
    assert two.returncode == 0, two.stderr[-3000:]
    assert described in two.stderr, two.stderr[-3000:]
    a = weights(staged.with_name("staged_net.prototxt"), tmp_path / f"staged_iter_{ITERATIONS}.caffemodel")
    b = weights(nccl.with_name("nccl_net.prototxt"), tmp_path / f"nccl_iter_{ITERATIONS}.caffemodel")
    for name in a:
        for x, y in zip(a[name], b[name]):
            assert relative_error(np.asarray(y), np.asarray(x)) < 1e-5, name


def test_hybrid_sums_over_nccl_inside_its_group(tmp_path):
    """hybrid with one group of both ranks over NCCL: its allreduce inside the group is NCCL's, and it
    trains as the same rule through the host does."""
    assert_nccl_trains_as_the_host(tmp_path, ["--exchange", "hybrid", "--group_size", "2", "--tau", "2",
                                              "--chunk_bytes", "4096", "--credit_bytes", "8192"],
                                   "allreduce on a communication stream of its own")


@pytest.mark.parametrize("rule", ["multicolor", "fp16"])
def test_the_trees_sum_over_nccls_point_to_point_calls_as_through_the_host(tmp_path, rule):
    """multicolor and fp16 over NCCL (netdef/comm/nccl_trees.py: every level of the trees queued on the
    communication stream, fp16's scales and casts as device kernels) train as the same rule through the
    host: the same additions in the same order, the same float16 messages."""
    assert_nccl_trains_as_the_host(tmp_path, ["--exchange", rule, "--colors", "2", "--chunk_bytes", "4096",
                                              "--credit_bytes", "8192"],
                                   "point-to-point calls on a communication stream of its own")


def test_a_two_rank_gpu_snapshot_resumes_exactly(tmp_path):
    full = write_case(tmp_path, "full", BATCH, 5, records=25, snapshot=2)
    full_run = run_netdef(["train", str(full), "--gpu", "all"], 2, tmp_path, timeout=180)
    assert full_run.returncode == 0, full_run.stderr[-3000:]
    state = tmp_path / "full_iter_2.solverstate"
    resumed = write_case(tmp_path, "resumed", BATCH, 5, records=25)
    resumed_run = run_netdef(["train", str(resumed), "--gpu", "all", "--snapshot", str(state)], 2, tmp_path,
                             timeout=180)
    assert resumed_run.returncode == 0, resumed_run.stderr[-3000:]
    assert "written by" not in resumed_run.stderr  # every rank found its own state
    a = weights(tmp_path / "full_net.prototxt", tmp_path / "full_iter_5.caffemodel")
    b = weights(tmp_path / "resumed_net.prototxt", tmp_path / "resumed_iter_5.caffemodel")
    for name in a:
        for x, y in zip(a[name], b[name]):
            np.testing.assert_array_equal(y, x, err_msg=name)  # the same device, the same order: the same bits


def test_a_raising_rank_ends_a_gpu_job_promptly(tmp_path):
    solver = write_case(tmp_path, "fail", BATCH, 50, records=RECORDS, param_str="fail_rank=1 fail_iter=3 mode=raise")
    start = time.monotonic()
    run = run_netdef(["train", str(solver), "--gpu", "all"], 2, tmp_path, timeout=120)
    assert run.returncode != 0
    assert time.monotonic() - start < 90  # two CUDA start-ups included
    assert "rank 1 of 2 failed: RuntimeError" in run.stderr, run.stderr[-3000:]
    assert not (tmp_path / "fail_iter_50.caffemodel").exists()


# Each rule on the GPU against the same rule on the CPU: the synchronous ones to float32 rounding,
# fp16 within its wire's rounding; the asynchronous ones (whose mixing depends on timing) train.
RULES = [pytest.param(["--exchange", "multicolor"], 1e-5, id="multicolor"),
         pytest.param(["--exchange", "fp16"], 1e-2, id="fp16"),
         pytest.param(["--exchange", "hybrid", "--group_size", "2", "--tau", "2"], 1e-5, id="hybrid"),
         pytest.param(["--exchange", "easgd", "--tau", "2"], None, id="easgd"),
         pytest.param(["--exchange", "gossip", "--gossip_probability", "0.5"], None, id="gossip")]


@pytest.mark.parametrize("flags, tolerance", RULES)
def test_every_rule_trains_two_ranks_on_the_gpu(tmp_path, flags, tolerance):
    chunked = ["--chunk_bytes", "4096", "--credit_bytes", "8192"]  # no link measurement
    cpu = write_case(tmp_path, "cpu", BATCH, ITERATIONS, records=RECORDS)
    on_cpu = run_netdef(["train", str(cpu)] + flags + chunked, 2, tmp_path, timeout=180)
    assert on_cpu.returncode == 0, on_cpu.stderr[-3000:]
    gpu = write_case(tmp_path, "gpu", BATCH, ITERATIONS, records=RECORDS)
    on_gpu = run_netdef(["train", str(gpu), "--gpu", "all"] + flags + chunked, 2, tmp_path, timeout=180)
    assert on_gpu.returncode == 0, on_gpu.stderr[-3000:]
    a = weights(cpu.with_name("cpu_net.prototxt"), tmp_path / f"cpu_iter_{ITERATIONS}.caffemodel")
    b = weights(gpu.with_name("gpu_net.prototxt"), tmp_path / f"gpu_iter_{ITERATIONS}.caffemodel")
    for name in a:
        for x, y in zip(a[name], b[name]):
            assert np.isfinite(y).all(), name
            if tolerance is not None:
                assert relative_error(np.asarray(y), np.asarray(x)) < tolerance, name


def test_the_timeline_shows_the_devices_streams(tmp_path):
    """--timeline on a GPU: each layer's kernels on the compute stream, and the staged copies on the
    exchange's stream, as spans of their own lanes on the host's time axis."""
    pair = write_case(tmp_path, "trace", BATCH, 3, records=RECORDS)
    run = run_netdef(["train", str(pair), "--gpu", "all", "--timeline", "trace.json"], 2, tmp_path, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    on_device = [e for e in spans if lanes[(e["pid"], e["tid"])] == "device compute"]
    copies = [e for e in spans if lanes[(e["pid"], e["tid"])] == "device exchange"]
    assert {"ip1 forward", "ip3 backward"} <= {e["name"] for e in on_device}
    assert any(e["name"].endswith("to the host") for e in copies) and any(e["name"].endswith(" back") for e in copies)
    # A kernel runs after the host has queued it: the k-th device span of a layer on a rank starts
    # after the k-th host span of that name on that rank (each iteration has one of each).
    def starts(lane):
        found = collections.defaultdict(list)
        for e in spans:
            if lanes[(e["pid"], e["tid"])] == lane:
                found[(e["pid"], e["name"])].append(e["ts"])
        return {key: sorted(times) for key, times in found.items()}

    host, device = starts("compute"), starts("device compute")
    paired = [(key, queued, ran) for key, ran_at in device.items() if key in host
              for queued, ran in zip(host[key], ran_at)]
    assert paired and all(len(device[key]) == len(host[key]) for key, _, _ in paired)
    assert all(ran >= queued - 50 for _, queued, ran in paired), [p for p in paired if p[2] < p[1] - 50][:5]


@pytest.mark.parametrize("flags", [pytest.param([], id="staged-priority"),
                                   pytest.param(["--schedule", "fifo"], id="staged-fifo")])
def test_two_ranks_replay_their_passes_from_cuda_graphs_between_the_exchanges_hooks(tmp_path, flags):
    """--cuda_graphs in a distributed run: the train net's stretches replay from CUDA graphs, the
    exchange's and the updates' hooks run at their edges (net_hooks.py), and 2 ranks at batch B still
    end with the weights of one process at 2B trained eagerly. 7 iterations: recorded at the 4th."""
    iterations = 7
    single = write_case(tmp_path, "single", 2 * BATCH, iterations, records=RECORDS)
    one = run_netdef(["train", str(single), "--gpu", "0"], 0, tmp_path, timeout=180)
    assert one.returncode == 0, one.stderr[-3000:]
    expected = weights(single.with_name("single_net.prototxt"), tmp_path / f"single_iter_{iterations}.caffemodel")
    pair = write_case(tmp_path, "pair", BATCH, iterations, records=RECORDS)
    two = run_netdef(["train", str(pair), "--gpu", "all", "--cuda_graphs"] + flags, 2, tmp_path, timeout=180)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "recorded as CUDA graphs (backward)" in two.stderr, two.stderr[-3000:]
    assert "without a CUDA graph" not in two.stderr, two.stderr[-3000:]
    assert_trained_as(expected, pair.with_name("pair_net.prototxt"), tmp_path / f"pair_iter_{iterations}.caffemodel")
