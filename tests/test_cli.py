"""The `netdef` command line end to end, in real subprocesses on files the tests create."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from netdef.data.convert import write_idx

NETDEF = [sys.executable, "-m", "netdef.cli"]

NET = """
name: "tiny"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 } data_param { source: "train_lmdb" batch_size: 16 backend: LMDB } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.00390625 } data_param { source: "test_lmdb" batch_size: 20 backend: LMDB } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

SOLVER = """
net: "net.prototxt"
test_iter: 2
test_interval: 20
base_lr: 0.1
momentum: 0.9
lr_policy: "fixed"
display: 10
max_iter: 40
snapshot: 20
snapshot_prefix: "snap/tiny"
random_seed: 3
"""


def netdef(*args, cwd, check=True, timeout=120):
    done = subprocess.run(NETDEF + [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"netdef {' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr}")
    return done


def two_blob_images(n, rng):
    """Class 0: a bright square top-left; class 1: bottom-right. Learnable in a few iterations."""
    labels = rng.integers(0, 2, n).astype(np.uint8)
    images = rng.integers(0, 40, (n, 6, 6)).astype(np.uint8)
    for i, label in enumerate(labels):
        if label:
            images[i, 3:, 3:] += 200
        else:
            images[i, :3, :3] += 200
    return images, labels


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    write_tiny_model(root, train_images=160)
    for split in ("train", "test"):
        netdef("convert-mnist", f"{split}-images.idx.gz", f"{split}-labels.idx.gz", f"{split}_lmdb", cwd=root)
    return root


def write_tiny_model(root, train_images: int) -> None:
    """The two-blob images as IDX files (train-*, test-*: 40), NET, SOLVER and the snapshot folder."""
    rng = np.random.default_rng(0)
    for split, n in (("train", train_images), ("test", 40)):
        images, labels = two_blob_images(n, rng)
        write_idx(root / f"{split}-images.idx.gz", images)
        write_idx(root / f"{split}-labels.idx.gz", labels)
    (root / "net.prototxt").write_text(NET)
    (root / "solver.prototxt").write_text(SOLVER)
    (root / "snap").mkdir()


def test_help_lists_every_verb():
    out = subprocess.run(NETDEF + ["--help"], capture_output=True, text=True, check=True).stdout
    for verb in ("train", "test", "time", "convert-mnist", "convert-imageset", "compute-image-mean",
                 "prepare-digits", "download-mnist", "upgrade", "draw", "plot", "parse-log"):
        assert verb in out
    train_help = subprocess.run(NETDEF + ["train", "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--solver", "--snapshot", "--weights", "--iterations", "--sigint_effect", "--sighup_effect", "--gpu",
                 "--tensorboard"):
        assert flag in train_help


def test_train_logs_caffe_lines_snapshots_and_learns(workdir):
    done = netdef("train", "--solver=solver.prototxt", cwd=workdir)
    log = done.stderr
    # glog prefix + Caffe's messages, as parse_log.py expects them.
    assert re.search(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] Iteration 10 \(.*iter/s.*\), loss = [\d.e+-]+$",
                     log, re.M)
    assert re.search(r"\] Iteration 10, lr = 0\.1$", log, re.M)
    assert re.search(r"\]     Test net output #0: accuracy = [\d.]+$", log, re.M)
    assert "Optimization Done." in log
    final = [float(x) for x in re.findall(r"Test net output #0: accuracy = ([\d.]+)", log)][-1]
    assert final >= 0.95
    assert (workdir / "snap" / "tiny_iter_40.caffemodel").exists()
    assert (workdir / "snap" / "tiny_iter_20.solverstate").exists()


def test_a_gpu_asked_for_where_there_is_none_runs_on_the_cpu_by_flag_and_by_field(workdir):
    """--gpu N and solver_mode: GPU behave alike where GPU N is not usable (no CuPy, no driver, no such
    device; GPU 99 is none of any machine's): one warning that names the flag or field and what to do."""
    by_flag = netdef("train", "solver.prototxt", "--iterations=2", "--gpu=99", cwd=workdir).stderr
    assert re.search(r"\] --gpu 99: no usable GPU, .+; running on the CPU \(leave out --gpu to say so\)$", by_flag,
                     re.M)
    (workdir / "gpu_solver.prototxt").write_text(SOLVER.replace("snap/tiny", "snap/gpu") +
                                                 "solver_mode: GPU\ndevice_id: 99\n")
    by_field = netdef("train", "gpu_solver.prototxt", "--iterations=2", cwd=workdir).stderr
    assert re.search(r"\] solver_mode: GPU \(device_id: 99\): no usable GPU, .+; training on the CPU \(set "
                     r"solver_mode: CPU to say so\)$", by_field, re.M)
    for log in (by_flag, by_field):
        assert "Optimization Done." in log and "Traceback" not in log and log.count("no usable GPU") == 1
    timing = netdef("time", "--model=net.prototxt", "--iterations=1", "--gpu=99", cwd=workdir).stderr
    assert "--gpu 99: no usable GPU" in timing and "Average Forward-Backward" in timing


def test_a_missing_db_names_every_folder_it_looked_in(workdir, tmp_path):
    """Relative to the working directory, then to the net's folder: both named."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "net.prototxt").write_text(NET.replace("train_lmdb", "absent_lmdb"))
    line = one_error_line(netdef("time", "--model=model/net.prototxt", "--iterations=1", cwd=tmp_path, check=False))
    assert "net.prototxt:3: layer 'd' (Data)" in line
    assert f"no such DB (looked for {tmp_path / 'absent_lmdb'} and {tmp_path / 'model' / 'absent_lmdb'})" in line
    assert "give --data_shape C,H,W" in line   # netdef time can go on without the data


def test_time_without_the_data_takes_data_shape(tmp_path):
    """As `netdef summary`: the data layers become Inputs of that shape, so a net whose LMDBs are not
    here is timed; the log says that their reading is not in the figures."""
    (tmp_path / "net.prototxt").write_text(NET)   # train_lmdb and test_lmdb are not there
    log = netdef("time", "--model=net.prototxt", "--iterations=2", "--data_shape=1,6,6", cwd=tmp_path).stderr
    assert "The data layers are Inputs of --data_shape 1,6,6 (zeros): their reading is not timed" in log
    assert re.search(r"\]\s+d\tforward: ", log) and re.search(r"\]\s+ip1\tbackward: ", log)
    assert "Average Forward-Backward: " in log
    bad = one_error_line(netdef("time", "--model=net.prototxt", "--data_shape=6,6", cwd=tmp_path, check=False))
    assert bad == "netdef: error: --data_shape: '6,6' must be C,H,W or N,C,H,W of positive numbers"


def test_time_of_a_deploy_net_says_it_timed_no_backward_and_its_lines_add_up(workdir, tmp_path):
    deploy = NET.split("layer {", 1)[0] + 'layer { name: "data" type: "Input" top: "data" ' \
        'input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 } } }\n' \
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }\n'
    (tmp_path / "deploy.prototxt").write_text(deploy)
    log = netdef("time", "--model=deploy.prototxt", "--iterations=3", "--json=profile.json", cwd=tmp_path).stderr
    assert "only the forward pass is timed" in log and "Performing Backward" not in log
    assert re.findall(r"\]\s+\w+\tbackward: (\S+) ms\.", log) == ["0", "0"]       # data, ip
    assert "Average Backward pass: 0 ms." in log
    per_iteration = [float(ms) for ms in re.findall(r"Iteration: \d forward-backward time: ([\d.e+-]+) ms\.", log)]
    average = float(re.search(r"Average Forward-Backward: ([\d.e+-]+) ms\.", log).group(1))
    assert len(per_iteration) == 3 and sum(per_iteration) / 3 == pytest.approx(average, rel=1e-3, abs=1e-3)
    simulated = netdef("simulate", "profile.json", "--workers=1,1024", cwd=tmp_path)
    assert "profile.json has no backward pass" in simulated.stderr and "not of training" in simulated.stderr


def test_resume_from_snapshot_continues_exactly(workdir):
    resumed = netdef("train", "solver.prototxt", "--snapshot=snap/tiny_iter_20.solverstate", cwd=workdir).stderr
    straight = netdef("train", "solver.prototxt", cwd=workdir).stderr
    pattern = r"Iteration (\d+) \(.*\), loss = ([\d.e+-]+)"
    after = {int(i): v for i, v in re.findall(pattern, resumed) if int(i) > 20}
    reference = {int(i): v for i, v in re.findall(pattern, straight) if int(i) > 20}
    assert after and after == reference
    assert "Iteration 10 " not in resumed


def test_finetune_weights_and_iterations_override(workdir):
    log = netdef("train", "solver.prototxt", "--weights=snap/tiny_iter_40.caffemodel", "--iterations=10",
                 cwd=workdir).stderr
    assert "Finetuning from snap/tiny_iter_40.caffemodel" in log
    first = float(re.findall(r"Test net output #0: accuracy = ([\d.]+)", log)[0])
    assert first >= 0.95  # already trained before its first update
    assert "Iteration 10, loss" in log and "Iteration 20" not in log


def test_test_verb_prints_means_as_caffe(workdir):
    netdef("train", "solver.prototxt", cwd=workdir)
    log = netdef("test", "--model=net.prototxt", "--weights=snap/tiny_iter_40.caffemodel", "--iterations=2",
                 cwd=workdir).stderr
    assert re.search(r"\] Batch 0, accuracy = [\d.]+$", log, re.M)
    accuracy = float(re.search(r"\] accuracy = ([\d.]+)$", log, re.M).group(1))
    assert accuracy >= 0.95
    assert re.search(r"\] loss = [\d.e+-]+ \(\* 1 = [\d.e+-]+ loss\)$", log, re.M)


def test_time_verb_prints_per_layer_and_averages(workdir):
    log = netdef("time", "--model=net.prototxt", "--iterations=3", cwd=workdir).stderr
    for layer in ("ip1", "relu", "ip2", "loss"):
        assert re.search(rf"\] +{layer}\tforward: [\d.e+-]+ ms\.$", log, re.M)
        assert re.search(rf"\] +{layer}\tbackward: [\d.e+-]+ ms\.$", log, re.M)
    assert "Average Forward-Backward:" in log and "*** Benchmark ends ***" in log


def test_time_verb_logs_the_initial_loss_of_its_first_forward(workdir):
    """Caffe's "Initial loss" is the loss of the first forward: with all-zero weights every one of the
    four classes scores 0, so the softmax loss is ln 4 whatever the data."""
    (workdir / "zero.prototxt").write_text("""
        layer { name: "d" type: "DummyData" top: "data" top: "label"
                dummy_data_param { shape { dim: 5 dim: 3 } shape { dim: 5 }
                                   data_filler { type: "gaussian" } data_filler { type: "constant" value: 2 } } }
        layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 4 } }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
    """)
    log = netdef("time", "--model=zero.prototxt", "--iterations=1", cwd=workdir).stderr
    initial = float(re.search(r"\] Initial loss: ([\d.e+-]+)$", log, re.M).group(1))
    assert initial == pytest.approx(np.log(4), rel=1e-5)


def test_time_verb_times_a_chain_trained_as_one_step_as_the_net_runs_it(workdir):
    """A BatchNorm chain runs as one step in training (layers/batchnorm_chain.py): netdef time runs and
    times it so, its time on BatchNorm forward and on the ReLU backward, the others' zero."""
    (workdir / "bn.prototxt").write_text("""
        name: "bn"
        layer { name: "data" type: "Input" top: "data" top: "target"
                input_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 dim: 2 } } }
        layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
                convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } } }
        layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
        layer { name: "scale" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
        layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
        layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip" inner_product_param { num_output: 2 } }
        layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
    """)
    log = netdef("time", "--model=bn.prototxt", "--iterations=2", cwd=workdir).stderr
    assert "layers run as one step: bn..relu" in log

    def ms(layer, direction):
        return float(re.search(rf"\] +{layer}\t{direction}: ([\d.e+-]+) ms\.$", log, re.M).group(1))

    assert ms("bn", "forward") > 0 and ms("scale", "forward") == 0 and ms("relu", "forward") == 0
    assert ms("relu", "backward") > 0 and ms("scale", "backward") == 0 and ms("bn", "backward") == 0


def test_errors_are_one_clear_line_and_exit_nonzero(workdir):
    (workdir / "bad.prototxt").write_text(NET.replace('bottom: "ip1" top: "ip2"', 'bottom: "nope" top: "ip2"'))
    done = netdef("time", "--model=bad.prototxt", cwd=workdir, check=False)
    assert done.returncode != 0
    assert "bad.prototxt:" in done.stderr and "unknown bottom blob 'nope'" in done.stderr
    assert "Traceback" not in done.stderr
    assert "--data_shape" not in done.stderr   # the data is there: the hint would mislead


def test_convert_imageset_and_compute_image_mean(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(1)
    lines = []
    for i in range(4):
        rgb = rng.integers(0, 256, (5, 7, 3)).astype(np.uint8)
        Image.fromarray(rgb).save(tmp_path / f"im{i}.png")
        lines.append(f"im{i}.png {i % 2}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    netdef("convert-imageset", "--resize_height=4", "--resize_width=6", f"{tmp_path}/", "list.txt", "imgs_lmdb",
           cwd=tmp_path)
    netdef("compute-image-mean", "imgs_lmdb", "mean.binaryproto", cwd=tmp_path)
    from netdef.data.datum import read_mean_file

    mean = read_mean_file(tmp_path / "mean.binaryproto")
    assert mean.reshape(-1, 3, 4, 6).shape[1:] == (3, 4, 6)
    assert 0 < float(mean.mean()) < 255


# ------------------------------------------------------------------------------ Python layer trust
PY_NET = """
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "scale" type: "Python" bottom: "x" top: "y" python_param { module: "beside_model" layer: "Twice" } }
"""

# Importing it leaves a file behind: the proof that a refused module's code never ran.
PY_MODULE = """
import pathlib
pathlib.Path("MODULE_RAN").write_text("imported")
import netdef


class Twice(netdef.Layer):
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = 2 * bottom[0].data
"""


@pytest.fixture
def model_with_python_layer(tmp_path):
    (tmp_path / "py.prototxt").write_text(PY_NET)
    (tmp_path / "beside_model.py").write_text(PY_MODULE)
    return tmp_path


def test_python_layer_module_is_not_imported_from_the_working_directory(model_with_python_layer):
    done = netdef("time", "--model=py.prototxt", "--iterations=1", cwd=model_with_python_layer, check=False)
    assert done.returncode == 1
    assert "layer 'scale' (Python): cannot find python_param.module 'beside_model'" in done.stderr
    assert "--python_path" in done.stderr and "Traceback" not in done.stderr
    assert not (model_with_python_layer / "MODULE_RAN").exists()


def test_python_path_flag_names_the_folder_and_the_log_names_the_file(model_with_python_layer):
    done = netdef("time", "--model=py.prototxt", "--iterations=1", "--python_path=.", cwd=model_with_python_layer)
    assert f"Python layer scale: beside_model.Twice from {model_with_python_layer / 'beside_model.py'}" in done.stderr
    assert (model_with_python_layer / "MODULE_RAN").exists()


@pytest.mark.parametrize("how", ["flag", "flag before the verb", "environment"])
def test_python_layers_deny_refuses_with_one_line(model_with_python_layer, how):
    args = ["time", "--model=py.prototxt", "--iterations=1", "--python_path=."]
    env = dict(os.environ)
    if how == "flag":
        args.append("--python_layers=deny")
    elif how == "flag before the verb":
        args.insert(0, "--python_layers=deny")
    else:
        env["NETDEF_PYTHON_LAYERS"] = "deny"
    done = subprocess.run(NETDEF + args, cwd=model_with_python_layer, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert re.search(r"py\.prototxt:3: layer 'scale' \(Python\): refused to import module 'beside_model': Python "
                     r"layers are denied", lines[0])
    assert not (model_with_python_layer / "MODULE_RAN").exists()


# ----------------------------------------------------------------------------- one line per failure
def one_error_line(done) -> str:
    """The single line a failed command prints (after any log lines), asserting there is no traceback."""
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("netdef: ")]
    assert len(errors) == 1, done.stderr
    return errors[0]


@pytest.mark.parametrize("args, message", [
    (["test", "--model=net.prototxt"], "netdef: error: test: Need model weights to score"),
    (["test", "--model=net.prototxt", "--weights=snap/tiny_iter_20.caffemodel", "--iterations=0"],
     "netdef: error: test: --iterations must be at least 1, got 0"),
    (["test", "--model=net.prototxt", "--weights=snap/tiny_iter_20.caffemodel", "--iterations=-5"],
     "netdef: error: test: --iterations must be at least 1, got -5"),
    (["time", "--model=net.prototxt", "--iterations=0"], "netdef: error: time: --iterations must be at least 1"),
    (["train", "solver.prototxt", "--iterations=0"], "netdef: error: train: --iterations must be at least 1"),
    (["train", "solver.prototxt", "--snapshot=a", "--weights=b"], "not both"),
    (["test", "--model=net.prototxt", "--weights=/dev/zero"],
     "netdef: error: weights file /dev/zero: is a character device, not a regular file"),
    (["time", "--model=/dev/zero"], "netdef: error: prototxt /dev/zero: is a character device, not a regular file"),
    (["train", "solver.prototxt", "--snapshot=/dev/zero"],
     "netdef: error: solver state /dev/zero: is a character device, not a regular file"),
])
def test_bad_command_lines_are_refused_with_one_line(workdir, args, message):
    if not (workdir / "snap" / "tiny_iter_20.caffemodel").exists():
        netdef("train", "solver.prototxt", cwd=workdir)
    assert message in one_error_line(netdef(*args, cwd=workdir, check=False))


def test_debug_shows_the_traceback(workdir):
    done = netdef("--debug", "time", "--model=/dev/zero", cwd=workdir, check=False)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "ProtoFileError" in done.stderr
    after_verb = netdef("time", "--model=/dev/zero", "--debug", cwd=workdir, check=False)
    assert "Traceback (most recent call last)" in after_verb.stderr


def test_truncated_lmdb_is_one_line_naming_it(workdir, tmp_path):
    import shutil

    db = tmp_path / "train_lmdb"
    shutil.copytree(workdir / "train_lmdb", db)
    data = db / "data.mdb"
    os.truncate(data, data.stat().st_size // 3)
    line = one_error_line(netdef("compute-image-mean", db, tmp_path / "mean.binaryproto", cwd=tmp_path, check=False))
    assert line.startswith(f"netdef: error: LMDB {db}: ") and "truncated?" in line


def test_a_bug_is_reported_as_an_internal_error_in_one_line(model_with_python_layer):
    (model_with_python_layer / "beside_model.py").write_text(PY_MODULE.replace("2 * bottom[0].data", "1 // 0"))
    line = one_error_line(netdef("time", "--model=py.prototxt", "--iterations=1", "--python_path=.",
                                 cwd=model_with_python_layer, check=False))
    assert line.startswith("netdef: internal error: ZeroDivisionError: integer division or modulo by zero")
    assert "--debug" in line


def test_prepare_digits_without_scikit_learn_names_the_extra(tmp_path):
    # sys.modules[name] = None is Python's documented way to make an import fail as if not installed.
    script = ("import sys; sys.modules['sklearn'] = None; from netdef.cli import main; "
              f"sys.exit(main(['prepare-digits', {str(tmp_path / 'digits')!r}]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert 'pip install "netdef-trainer[digits]"' in one_error_line(done)  # "netdef" on PyPI is another project


@pytest.mark.parametrize("debug", [False, True])
def test_under_mpi_a_failing_rank_prints_one_line(tmp_path, debug):
    from tests.comm.fixtures import mpi_available, run_netdef, write_case

    available, why_not = mpi_available()
    if not available:
        pytest.skip(why_not)
    solver = write_case(tmp_path, "fail", 4, 50, records=24, param_str="fail_rank=1 fail_iter=3 mode=raise")
    run = run_netdef(["train", str(solver)] + (["--debug"] if debug else []), 2, tmp_path, timeout=60)
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.startswith("netdef: error:")]
    assert len(lines) == 1 and lines[0].startswith("netdef: error: rank 1 of 2 failed: RuntimeError: deliberate "
                                                   "failure in layer 'scale'"), run.stderr
    assert lines[0].endswith("aborting all 2 ranks")
    assert ("Traceback (most recent call last)" in run.stderr) == debug
