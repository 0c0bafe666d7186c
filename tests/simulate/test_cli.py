"""``netdef time --json`` and ``netdef simulate`` through the command line (in process)."""
import json

import pytest

from netdef.cli import main

NET = """
name: "tiny"
layer { name: "d" type: "DummyData" top: "data" top: "label" dummy_data_param {
        shape { dim: 8 dim: 1 dim: 6 dim: 6 } shape { dim: 8 }
        data_filler { type: "constant" value: 0.5 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 64 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    root = tmp_path_factory.mktemp("simulate")
    (root / "net.prototxt").write_text(NET)
    assert main(["time", f"--model={root / 'net.prototxt'}", "--iterations=2", f"--json={root / 'times.json'}"]) == 0
    return root / "times.json"


def test_time_writes_per_layer_times_and_parameter_sizes(profile):
    doc = json.loads(profile.read_text())
    names = [layer["name"] for layer in doc["layers"]]
    assert names == ["d", "ip1", "relu", "ip2", "loss"]
    assert all(layer["forward_ms"] >= 0 and layer["backward_ms"] >= 0 for layer in doc["layers"])
    # ip1: 64 x 36 weights and 64 biases; ip2: 2 x 64 and 2; float32.
    assert [p["bytes"] for p in doc["params"]] == [64 * 36 * 4, 64 * 4, 2 * 64 * 4, 2 * 4]
    assert doc["layers"][1]["uses"] == doc["layers"][1]["final"] == [0, 1]
    assert doc["batch"] == 8


def test_simulate_prints_a_table_and_json(profile, capsys):
    assert main(["simulate", str(profile), "--workers=1,2,16", "--bandwidth=1gbit", "--latency=20us"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 16]
    assert float(rows[0][4]) == 1.0 and float(rows[2][4]) < 1.0
    assert main(["simulate", str(profile), "--workers=4", "--exchange=gossip", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["exchange"] == "gossip" and doc["predictions"][0]["workers"] == 4


@pytest.mark.parametrize("content, message", [
    ("{", "not JSON"),
    ('{"layers": [{"forward_ms": -1, "backward_ms": 0}], "params": []}', "layers[0].forward_ms must be a number"),
    ('{"layers": [{"forward_ms": 1, "backward_ms": 0, "uses": [3]}], "params": []}', "layers[0].uses must list"),
])
def test_a_bad_profile_is_one_line_naming_the_field(tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and message in err[0]


def test_a_bad_network_option_names_it(profile, capsys):
    assert main(["simulate", str(profile), "--bandwidth=fast"]) == 1
    assert "--bandwidth: cannot read 'fast'" in capsys.readouterr().err


def test_simulate_takes_the_fixed_per_iteration_costs(profile, capsys):
    def predicted(*flags):
        assert main(["simulate", str(profile), "--workers=2", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    default = predicted()
    assert default["progress"] == "thread" and default["poll_s"] == pytest.approx(0.002) and default["sync_s"] == 0
    assert predicted("--poll_ms=1")["poll_s"] == pytest.approx(0.001)
    measured = predicted("--polled_ms=6.5")
    assert measured["polled_s"] == pytest.approx(0.0065) and default["polled_s"] == 0
    assert measured["predictions"][0]["iteration_s"] >= default["predictions"][0]["iteration_s"]
    deferred = predicted("--progress=deferred")
    synced = predicted("--progress=deferred", "--sync_ms=5")
    assert synced["progress"] == "deferred" and synced["sync_s"] == pytest.approx(0.005)
    # The wait for the slowest adds 5 ms, less what of the exchange moves meanwhile (it is blocked time).
    added = synced["predictions"][0]["iteration_s"] - deferred["predictions"][0]["iteration_s"]
    assert 0.004 < added <= 0.005 + 1e-12
    assert main(["simulate", str(profile), "--sync_ms=-1"]) == 1
    assert "--sync_ms must be >= 0" in capsys.readouterr().err
    assert main(["simulate", str(profile), "--polled_ms=-1"]) == 1
    assert "--polled_ms must be >= 0" in capsys.readouterr().err
