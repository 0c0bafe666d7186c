"""benchmarks/gpu_train.py: its CPU path (the check of the script) on a small zoo net."""
import sys

import pytest

from netdef import backend
from tests.benchmarks import benchmark_module

pytest.importorskip("torch", reason="gpu_train.py compares against PyTorch: pip install -e '.[bench]'")


@pytest.fixture(scope="module")
def gpu_train():
    with benchmark_module("gpu_train") as module:
        yield module


def test_cpu_run_prints_a_row_with_both_frameworks(gpu_train, monkeypatch, capsys, tmp_path):
    # CIFAR-10 quick is not one of the benchmark's nets; the same code runs it in seconds.
    monkeypatch.setitem(gpu_train.NETS, "cifar10_quick", ("CIFAR-10 quick", 8))
    cupy_before = "cupy" in sys.modules
    rows = gpu_train.main(["--device", "cpu", "--nets", "cifar10_quick", "--precision", "float32", "--warmup", "1",
                           "--iters", "1", "--rounds", "2", "--json", str(tmp_path / "figures.json")])
    out = capsys.readouterr().out
    assert len(rows) == 1 and "error" not in rows[0], rows
    row = rows[0]
    assert row["batch"] == 8 and row["netdef_img_s"] > 0 and row["torch_img_s"] > 0
    assert row["ratio"] == pytest.approx(row["netdef_img_s"] / row["torch_img_s"])
    assert len(row["netdef_ms"]) == len(row["torch_ms"]) == 2
    assert sum(row["conv_algorithms"].values()) == 3  # CIFAR-10 quick's three convolutions
    line = next(line for line in out.splitlines() if line.startswith("CIFAR-10 quick"))
    assert f"{row['netdef_img_s']:.1f}" in line and f"{row['torch_img_s']:.1f}" in line
    assert "--nets cifar10_quick" in out
    assert (tmp_path / "figures.json").read_text().count('"torch_img_s"') == 1
    assert cupy_before or "cupy" not in sys.modules  # the CPU path never imports it
    assert backend.device() == "cpu"


def test_a_failing_net_prints_its_error_and_the_others_run(gpu_train, monkeypatch, capsys):
    monkeypatch.setitem(gpu_train.NETS, "cifar10_quick", ("CIFAR-10 quick", 4))
    monkeypatch.setitem(gpu_train.NETS, "no_such_model", ("Missing", 4))
    rows = gpu_train.main(["--device", "cpu", "--nets", "no_such_model,cifar10_quick", "--precision", "float32",
                           "--warmup", "0", "--iters", "1", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "error" in rows[0] and "ratio" not in rows[0]
    assert rows[1]["netdef_img_s"] > 0 and rows[1]["torch_img_s"] > 0
    assert any(line.startswith("Missing") and "error:" in line for line in out.splitlines())


def test_time_budget_stops_starting_nets(gpu_train, monkeypatch, capsys):
    monkeypatch.setitem(gpu_train.NETS, "cifar10_quick", ("CIFAR-10 quick", 2))
    rows = gpu_train.main(["--device", "cpu", "--nets", "cifar10_quick", "--precision", "float32,tf32",
                           "--warmup", "0", "--iters", "1", "--rounds", "1", "--time-budget", "0"])
    assert [row["precision"] for row in rows] == ["float32"]
    assert "not run: cifar10_quick tf32" in capsys.readouterr().out


def test_batch_scale_keeps_at_least_one_image(gpu_train):
    assert gpu_train.scaled_batch(256, 0.02) == 5
    assert gpu_train.scaled_batch(64, 0.001) == 1


def test_every_benchmark_net_has_one_train_input_with_its_deploy_shape(gpu_train):
    for key in gpu_train.NETS:
        param = gpu_train.train_net_param(key, 2)
        inputs = [layer for layer in param.layer if layer.type == "Input"]
        assert len(inputs) == 1, key
        assert list(inputs[0].top) == ["data", "label"]
        assert list(inputs[0].input_param.shape[0].dim) == [2, *gpu_train.image_shape(key)]
        assert not any(layer.type in ("Data", "Accuracy") for layer in param.layer), key
