"""The "Python" layer type: user modules written into tmp_path, found through the working directory."""
from __future__ import annotations

import itertools
import sys
import textwrap

import numpy as np
import pytest

from netdef.blob import Blob
from netdef.layers import python as python_module  # noqa: F401  (registers the type)
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
def user_module(tmp_path, monkeypatch):
    """Writes the user module into tmp_path under a fresh name and makes tmp_path the working
    directory (the only place it can be found); sys.path and sys.modules are restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    name = f"netdef_user_layers_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    yield name
    sys.modules.pop(name, None)


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


def test_user_module_text_is_importable_as_a_package_module(tmp_path, monkeypatch):
    """A dotted module path works too (sys.path entry for the package's parent)."""
    pkg = tmp_path / "netdef_user_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        layer = make_layer(python_layer("netdef_user_pkg.layers", "ScaleBy", "1"))
        assert type(layer).__name__ == "ScaleBy"
    finally:
        for name in ("netdef_user_pkg", "netdef_user_pkg.layers"):
            sys.modules.pop(name, None)
