"""The "Python" layer type: user modules written into tmp_path, found through the folders the user names
(NETDEF_PYTHON_PATH, Net(python_path=...)), never through the working directory; the deny policy."""
from __future__ import annotations

import itertools
import logging
import sys
import textwrap

import numpy as np
import pytest

from netdef.blob import Blob
from netdef.layers import python as python_module  # noqa: F401  (registers the type)
from netdef.net import Net, NetError
from netdef.layers.base import TEST, TRAIN, Layer, LayerError, layer_class
from tests.helpers import build, check_gradients, default_dtype, make_layer, parse_layer

USER_MODULE = '''
import numpy as np
from netdef.layers.base import Layer


class ScaleBy(Layer):
    """y = k * x with k from param_str; records what it saw at setup."""

    def setup(self, bottom, top):
        if len(bottom) != 1:
            raise Exception("one bottom")
        self.k = float(self.param_str)
        self.seen_phase = self.phase

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.k * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = self.k * top[0].diff


class AddBias(Layer):
    """y = x * w + b with learnable w (scalar) and b (per channel), pycaffe style blobs."""

    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs.add_blob(bottom[0].shape[1])
        self.blobs[0].data[...] = 1.5

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.blobs[0].data[0] + self.blobs[1].data[None, :]

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff
        self.blobs[0].diff[...] += (dy * bottom[0].data).sum()
        self.blobs[1].diff[...] += dy.sum(axis=0)
        if propagate_down[0]:
            bottom[0].diff[...] = dy * self.blobs[0].data[0]


class NotALayer(object):
    pass


not_a_class = 3
'''

_names = itertools.count()


@pytest.fixture
def clean_import_state(monkeypatch):
    """No trust settings from the caller's environment; sys.path restored after the test."""
    monkeypatch.delenv(python_module.PYTHON_LAYERS_ENV, raising=False)
    monkeypatch.delenv(python_module.PYTHON_PATH_ENV, raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])


@pytest.fixture
def user_module(tmp_path, monkeypatch, clean_import_state):
    """Writes the user module into tmp_path/user under a fresh name, named to netdef by
    NETDEF_PYTHON_PATH; sys.path and sys.modules are restored after."""
    folder = tmp_path / "user"
    folder.mkdir()
    monkeypatch.setenv(python_module.PYTHON_PATH_ENV, str(folder))
    name = f"netdef_user_layers_{next(_names)}"
    (folder / f"{name}.py").write_text(USER_MODULE)
    yield name
    sys.modules.pop(name, None)


def module_in_working_directory(tmp_path, monkeypatch) -> str:
    """A layer module lying in the working directory and nowhere else."""
    name = f"netdef_cwd_layers_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    return name


def python_layer(module, cls, param_str=""):
    return parse_layer(f'name: "py" type: "Python" python_param {{ module: "{module}" layer: "{cls}" '
                       f'param_str: "{param_str}" }}')


def test_builds_the_user_class(user_module):
    layer = make_layer(python_layer(user_module, "ScaleBy", "2.5"))
    assert type(layer).__name__ == "ScaleBy"
    assert type(layer).__module__ == user_module
    assert isinstance(layer, Layer)
    assert layer.param_str == "2.5"
    assert layer.type == "Python" and layer.name == "py"
    assert layer_class("Python") is python_module.PythonLayer


def test_forward_backward_and_param_str(user_module):
    param = python_layer(user_module, "ScaleBy", "-3")
    x = np.random.default_rng(0).standard_normal((2, 3))
    layer, bottom, top = build(param, [x], 1)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, -3 * x)
    check_gradients(param, [x])


IN_PLACE_AFTER_BATCHNORM = """
name: "chain" force_backward: true
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 3 dim: 4 dim: 5 } } }
layer { name: "t" type: "Input" top: "t" input_param { shape { dim: 3 dim: 4 dim: 5 } } }
layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" batch_norm_param { use_global_stats: false } }
layer { name: "py" type: "Python" bottom: "y" top: "%s" python_param { module: "%s" layer: "ScaleBy" param_str: "3" } }
layer { name: "loss" type: "EuclideanLoss" bottom: "%s" bottom: "t" top: "loss" }
"""


def test_a_user_layer_writing_into_its_in_place_top_leaves_earlier_outputs_alone(tmp_path, user_module):
    # BatchNorm keeps its output for backward; the user's in-place layer writes into its top's array
    # (top[0].data[...] = ...), which the net gives it fresh, so the kept output is not overwritten.
    rng = np.random.default_rng(3)
    x, t = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 4, 5))
    grads = []
    for top in ("y", "z"):  # in place, then out of place
        path = tmp_path / f"{top}.prototxt"
        path.write_text(IN_PLACE_AFTER_BATCHNORM % (top, user_module, top))
        net = Net(str(path), TRAIN)
        net.blobs["x"].data[...] = x
        net.blobs["t"].data[...] = t
        net.forward()
        net.backward()
        grads.append(net.blobs["x"].diff.copy())
    assert np.abs(grads[1]).max() > 1e-3
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("phase", [TRAIN, TEST])
def test_phase_is_visible_in_setup(user_module, phase):
    layer, _, _ = build(parse_layer(str(python_layer(user_module, "ScaleBy", "1")), phase), [np.zeros(2)], 1)
    assert layer.seen_phase == phase


def test_learnable_blobs(user_module):
    param = python_layer(user_module, "AddBias")
    x = np.random.default_rng(1).standard_normal((3, 4))
    layer, bottom, top = build(param, [x], 1)
    assert [b.shape for b in layer.blobs] == [(1,), (4,)]
    assert float(layer.blobs[0].data[0]) == 1.5
    layer.blobs[1].data[...] = [1, 2, 3, 4]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, 1.5 * x + np.array([1, 2, 3, 4]))
    check_gradients(param, [x], params=[np.array([0.7]), np.array([0.1, -0.2, 0.3, 0.4])])


def test_blob_dtype_follows_default(user_module):
    with default_dtype(np.float32):
        layer = make_layer(python_layer(user_module, "AddBias"))
        bottom, top = [Blob((2, 3), dtype=np.float32)], [Blob(dtype=np.float32)]
        layer.setup_layer(bottom, top)
    assert all(b.dtype == np.float32 for b in layer.blobs)


def test_missing_module(user_module):
    with pytest.raises(LayerError, match=r"'py'.*cannot find.*no_such_module_xyz"):
        make_layer(python_layer("no_such_module_xyz", "ScaleBy"))


def test_missing_class(user_module):
    with pytest.raises(LayerError, match=r"'py'.*has no class 'Nope'"):
        make_layer(python_layer(user_module, "Nope"))


@pytest.mark.parametrize("cls", ["NotALayer", "not_a_class"])
def test_not_a_layer(user_module, cls):
    with pytest.raises(LayerError, match=r"'py'.*not a subclass of netdef.Layer"):
        make_layer(python_layer(user_module, cls))


def test_broken_module_reports_its_error(tmp_path, user_module):
    tmp_path = tmp_path / "user"
    (tmp_path / "netdef_broken_user_mod.py").write_text("import no_such_dependency_abc\n")
    try:
        with pytest.raises(LayerError, match=r"failed to import.*no_such_dependency_abc"):
            make_layer(python_layer("netdef_broken_user_mod", "X"))
        (tmp_path / "netdef_raising_user_mod.py").write_text("raise RuntimeError('boom')\n")
        with pytest.raises(LayerError, match=r"RuntimeError: boom"):
            make_layer(python_layer("netdef_raising_user_mod", "X"))
    finally:
        sys.modules.pop("netdef_broken_user_mod", None)
        sys.modules.pop("netdef_raising_user_mod", None)


def test_module_and_layer_required():
    with pytest.raises(LayerError, match="must both be set"):
        make_layer(parse_layer('name: "py" type: "Python" python_param { module: "x" }'))


def test_user_module_text_is_importable_as_a_package_module(tmp_path, monkeypatch, clean_import_state):
    """A dotted module path works too (the package's parent is the named folder)."""
    pkg = tmp_path / "netdef_user_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.setenv(python_module.PYTHON_PATH_ENV, str(tmp_path))
    try:
        layer = make_layer(python_layer("netdef_user_pkg.layers", "ScaleBy", "1"))
        assert type(layer).__name__ == "ScaleBy"
    finally:
        for name in ("netdef_user_pkg", "netdef_user_pkg.layers"):
            sys.modules.pop(name, None)


# ------------------------------------------------------------------------------------ trust model
def net_with_python_layer(module: str) -> str:
    return ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\n'
            f'layer {{ name: "py" type: "Python" bottom: "x" top: "y" python_param {{ module: "{module}" '
            'layer: "ScaleBy" param_str: "2" } }\n')


def test_working_directory_is_not_searched(tmp_path, monkeypatch, clean_import_state):
    name = module_in_working_directory(tmp_path, monkeypatch)
    with pytest.raises(LayerError, match=rf"cannot find python_param.module '{name}'.*working directory and the "
                                         r"running script's folder are not searched.*--python_path"):
        make_layer(python_layer(name, "ScaleBy", "1"))
    assert name not in sys.modules


def test_net_python_path_argument_names_a_folder(tmp_path, monkeypatch, clean_import_state, caplog):
    name = module_in_working_directory(tmp_path, monkeypatch)
    try:
        with caplog.at_level(logging.INFO, logger="netdef"):
            net = Net(net_with_python_layer(name), "TEST", python_path=str(tmp_path))
        assert type(net.layers[1]).__name__ == "ScaleBy"
        assert f"Python layer py: {name}.ScaleBy from {tmp_path / (name + '.py')}" in caplog.text
    finally:
        sys.modules.pop(name, None)


def test_deny_by_net_argument_refuses_before_importing(tmp_path, monkeypatch, clean_import_state):
    name = module_in_working_directory(tmp_path, monkeypatch)
    (tmp_path / f"{name}.py").write_text("raise SystemExit('this module must never run')\n")
    with pytest.raises(NetError, match=rf"layer 'py' \(Python\): refused to import module '{name}': Python "
                                       r"layers are denied"):
        Net(net_with_python_layer(name), "TEST", python_layers="deny", python_path=str(tmp_path))
    assert name not in sys.modules


def test_deny_by_environment(user_module, monkeypatch):
    monkeypatch.setenv(python_module.PYTHON_LAYERS_ENV, "deny")
    with pytest.raises(LayerError, match="Python layers are denied"):
        make_layer(python_layer(user_module, "ScaleBy", "1"))
    assert user_module not in sys.modules
    # The argument of Net is the caller's explicit choice and wins over the environment.
    net = Net(net_with_python_layer(user_module), "TEST", python_layers="allow")
    assert type(net.layers[1]).__name__ == "ScaleBy"


def test_unknown_policy_value_is_refused(monkeypatch, clean_import_state):
    monkeypatch.setenv(python_module.PYTHON_LAYERS_ENV, "sometimes")
    with pytest.raises(ValueError, match="NETDEF_PYTHON_LAYERS must be 'allow' or 'deny', not 'sometimes'"):
        Net(net_with_python_layer("x"), "TEST")


# ============================================================================ `import caffe` in a layer module
PYCAFFE_LOSS_MODULE = '''
import caffe
import caffe.io
import numpy as np
from caffe.proto import caffe_pb2


class HalfSquaredDistance(caffe.Layer):
    """pycaffe's Python loss layer shape: sum((a - b)^2) / num / 2, as written for Caffe."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise Exception("Need two inputs to compute distance.")
        self.was_train = self.phase == caffe.TRAIN
        self.pb_train = caffe_pb2.TRAIN
        self.has_io = caffe.io.Transformer is not None

    def reshape(self, bottom, top):
        self.diff = np.zeros_like(bottom[0].data, dtype=np.float32)
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data
        top[0].data[...] = np.sum(self.diff ** 2) / bottom[0].num / 2.

    def backward(self, top, propagate_down, bottom):
        for i in range(2):
            if propagate_down[i]:
                sign = 1 if i == 0 else -1
                bottom[i].diff[...] = sign * self.diff / bottom[i].num
'''

LOSS_NET = '''
force_backward: true
layer { name: "a" type: "Input" top: "a" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "b" type: "Input" top: "b" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "loss" type: "Python" bottom: "a" bottom: "b" top: "loss" loss_weight: 1
        python_param { module: "MODULE" layer: "HalfSquaredDistance" } }
'''


@pytest.fixture
def no_installed_caffe():
    import importlib.util

    if importlib.util.find_spec("caffe") is not None:
        pytest.skip("a real Caffe is importable here; it wins over netdef's alias (tested with a stand-in below)")


def test_a_pycaffe_layer_module_that_imports_caffe_loads_unchanged(tmp_path, clean_import_state, no_installed_caffe):
    name = f"netdef_pycaffe_loss_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(PYCAFFE_LOSS_MODULE)
    path_before = list(sys.path)
    try:
        net = Net(LOSS_NET.replace("MODULE", name), "TRAIN", python_path=str(tmp_path))
        layer = net.layers[-1]
        assert isinstance(layer, Layer) and layer.was_train and layer.pb_train == TRAIN and layer.has_io
        a = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
        b = np.array([[1, 0, 3], [4, 5, 2]], np.float32)
        # (2^2 + 4^2) / 2 rows / 2 = 5
        assert net.forward(a=a, b=b)["loss"] == pytest.approx(5.0)
        diffs = net.backward()
        np.testing.assert_allclose(diffs["a"], (a - b) / 2)
        np.testing.assert_allclose(diffs["b"], -(a - b) / 2)
        # The module kept netdef's answer to `import caffe`; the rest of the process never sees one.
        assert sys.modules[name].caffe.Layer is Layer
        assert not any(n == "caffe" or n.startswith("caffe.") for n in sys.modules)
        assert python_module.CAFFE_ALIAS_FOLDER not in sys.path and sys.path == [str(tmp_path)] + path_before
        with pytest.raises(ModuleNotFoundError):
            import caffe  # noqa: F401
    finally:
        sys.modules.pop(name, None)


def test_an_installed_caffe_wins_over_netdefs_alias(tmp_path, clean_import_state):
    """A real Caffe stands earlier on sys.path: the layer module gets it, and its caffe.Layer is not
    netdef's, so the layer is refused with a line that says why."""
    installed = tmp_path / "site"
    (installed / "caffe").mkdir(parents=True)
    (installed / "caffe" / "__init__.py").write_text("class Layer:\n    pass\nTRAIN = 0\n")
    layers = tmp_path / "layers"
    layers.mkdir()
    name = f"netdef_pycaffe_loss_{next(_names)}"
    (layers / f"{name}.py").write_text("import caffe\n\n\nclass HalfSquaredDistance(caffe.Layer):\n    pass\n")
    sys.path.insert(0, str(installed))
    try:
        with pytest.raises(NetError, match=r"not a subclass of netdef.Layer .*an installed Caffe's `import caffe` "
                                           r"wins"):
            Net(LOSS_NET.replace("MODULE", name), "TRAIN", python_path=str(layers))
        assert sys.modules[name].caffe.__file__ == str(installed / "caffe" / "__init__.py")
        assert sys.modules["caffe"] is sys.modules[name].caffe  # the installed one stays, as any import
    finally:
        for module in [n for n in sys.modules if n in (name, "caffe") or n.startswith("caffe.")]:
            del sys.modules[module]


# ------------------------------------------------ one trust rule for every entry point (issue 32, classes 4, 5)
# A module that leaves a mark in the working directory when it runs: the mark proves it was imported.
MARKING_MODULE = USER_MODULE + '\nopen("IMPORTED", "w").close()\n'
SCRIPT = """
import netdef
try:
    netdef.Net(open("model.prototxt").read(), "TEST")
except netdef.net.NetError as exc:
    print(exc)
"""


@pytest.mark.parametrize("how", ["script beside the module", "python -c in the module's folder"])
def test_python_entry_points_search_neither_working_directory_nor_script_folder(tmp_path, how):
    """Python itself puts these folders first on sys.path (a script's folder, or "" for -c): a model
    must not reach a module lying there through ``netdef.Net`` any more than through the command line."""
    import subprocess

    (tmp_path / "marking_layers.py").write_text(MARKING_MODULE)
    (tmp_path / "model.prototxt").write_text(net_with_python_layer("marking_layers"))
    (tmp_path / "run.py").write_text(SCRIPT)
    command = ["run.py"] if how.startswith("script") else ["-c", SCRIPT]
    done = subprocess.run([sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cannot find python_param.module 'marking_layers' in sys.path; the working directory and the " \
           "running script's folder are not searched" in done.stdout
    assert not (tmp_path / "IMPORTED").exists()


def test_a_named_folder_is_searched_even_when_it_is_the_working_directory(tmp_path, monkeypatch,
                                                                          clean_import_state):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "netdef_cwd_named_layers.py").write_text(MARKING_MODULE)
    try:
        net = Net(net_with_python_layer("netdef_cwd_named_layers"), "TEST", python_path=".")
        assert type(net.layers[1]).__name__ == "ScaleBy"
        assert (tmp_path / "IMPORTED").exists()
    finally:
        sys.modules.pop("netdef_cwd_named_layers", None)


@pytest.mark.parametrize("module, why", [
    ("venv.__main__", "it is part of Python's standard library"),
    ("antigravity", "it is part of Python's standard library"),
    ("http.server", "it is part of Python's standard library"),
    ("netdef_program_pkg.__main__", "a __main__ module is a program that runs when imported, not a layer"),
])
def test_modules_that_hold_no_layer_are_refused_before_importing(tmp_path, monkeypatch, clean_import_state,
                                                                  module, why):
    package = tmp_path / "netdef_program_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text('open("IMPORTED", "w").close()\n')
    monkeypatch.chdir(tmp_path)
    already = set(sys.modules)
    with pytest.raises(NetError, match=rf"layer 'py' \(Python\): refused to import module '{module}': {why}"):
        Net(net_with_python_layer(module), "TEST", python_path=str(tmp_path))
    assert set(sys.modules) - already == set()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["netdef_program_pkg"]
