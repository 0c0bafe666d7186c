"""The "Python" layer type: a user's layer class named in the prototxt, as in pycaffe.

    layer { type: "Python" python_param { module: "my_layers" layer: "MyLayer" param_str: "..." } }

imports ``my_layers`` and builds ``my_layers.MyLayer(layer_param)``. The class subclasses
``netdef.Layer`` and implements setup/reshape/forward/backward. Before ``setup`` the instance has
``param_str`` and ``phase``, and ``self.blobs.add_blob(*shape)`` adds a learnable blob, as in pycaffe.

A layer module written for pycaffe loads unchanged: while netdef imports it, ``import caffe`` (and
``caffe.io``, ``caffe.proto.caffe_pb2``) answers with netdef's API (netdef/pycaffe_alias/caffe),
unless a real Caffe is importable, which then wins. The alias's folder sits last on sys.path only
during that import, and its modules are taken out of sys.modules afterwards, so nothing else in the
process sees a ``caffe`` module that is not there; a layer module keeps the one it imported.

Trust model. Importing a module runs its code, so a model file from elsewhere must not choose what
runs. A Python layer's module comes only from Python's own import path (PYTHONPATH, installed
packages) and from folders the user names (``Net(python_path=...)``, ``NETDEF_PYTHON_PATH``,
``netdef --python_path``), never implicitly from the working directory or the running script's
folder, from the command line and from Python alike (``trusted_import``: Caffe's embedded interpreter
searched the working directory, which let ``netdef test`` on a downloaded model run a module lying
beside it). The standard library and ``__main__`` modules are refused before anything is imported. ``python_layers="deny"`` (``NETDEF_PYTHON_LAYERS=deny``, ``--python_layers=deny``) refuses
every Python layer before anything is imported. The log names the file each module was loaded from.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys

from ..blob import Blob
from .base import Layer, LayerError, register_layer
from .trusted_import import RefusedModuleError, import_layer_module

log = logging.getLogger("netdef")

#: "allow" (the default) or "deny": whether nets may import Python layers' modules.
PYTHON_LAYERS_ENV = "NETDEF_PYTHON_LAYERS"
#: Folders (os.pathsep-separated) searched for Python layers' modules before sys.path.
PYTHON_PATH_ENV = "NETDEF_PYTHON_PATH"
_CHOICES = ("allow", "deny")


@dataclasses.dataclass(frozen=True)
class PythonLayerPolicy:
    """Whether a net may import Python layers' modules, and the extra folders they may come from."""

    allow: bool = True
    folders: tuple[str, ...] = ()

    @classmethod
    def resolve(cls, python_layers: str | None = None, python_path=()) -> "PythonLayerPolicy":
        """``python_layers`` ("allow"/"deny") where given, else ``NETDEF_PYTHON_LAYERS``, else allow;
        the folders of ``NETDEF_PYTHON_PATH`` followed by ``python_path`` (one folder or several)."""
        choice = python_layers if python_layers is not None else os.environ.get(PYTHON_LAYERS_ENV, "") or "allow"
        if choice not in _CHOICES:
            source = "python_layers" if python_layers is not None else PYTHON_LAYERS_ENV
            raise ValueError(f"{source} must be 'allow' or 'deny', not {choice!r}")
        if isinstance(python_path, (str, os.PathLike)):
            python_path = [python_path]
        from_env = [f for f in os.environ.get(PYTHON_PATH_ENV, "").split(os.pathsep) if f]
        folders = tuple(os.path.abspath(os.fspath(f)) for f in [*from_env, *python_path])
        return cls(allow=choice == "allow", folders=folders)


class BlobVec(list):
    """pycaffe's blob vector: a list of Blobs with ``add_blob(*shape)``."""

    def add_blob(self, *shape, dtype=None) -> Blob:
        blob = Blob(*shape, dtype=dtype)
        blob.data[...] = 0
        self.append(blob)
        return blob


#: The folder whose only entry is netdef's ``caffe`` alias package (module docstring).
CAFFE_ALIAS_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pycaffe_alias")


def _is_caffe_alias(module) -> bool:
    path = getattr(module, "__file__", None) or ""  # a namespace or built-in module has no file
    return path.startswith(CAFFE_ALIAS_FOLDER + os.sep)


@contextlib.contextmanager
def _caffe_answers_with_netdef():
    """``import caffe`` finds netdef's alias while the block runs, unless something earlier on
    sys.path (an installed Caffe) provides ``caffe``; afterwards sys.path and sys.modules hold no
    trace of the alias. Appended last, the folder cannot shadow any other module."""
    sys.path.append(CAFFE_ALIAS_FOLDER)
    try:
        yield
    finally:
        # The last occurrence: the one appended above.
        del sys.path[len(sys.path) - 1 - sys.path[::-1].index(CAFFE_ALIAS_FOLDER)]
        for name in [n for n in sys.modules if n == "caffe" or n.startswith("caffe.")]:
            if _is_caffe_alias(sys.modules[name]):
                del sys.modules[name]


@register_layer("Python")
class PythonLayer(Layer):
    """Factory for ``type: "Python"``: constructing it returns an instance of the user's class named
    by ``python_param.module`` and ``python_param.layer`` (a ``netdef.Layer`` subclass); the shapes
    and semantics of its bottoms and tops are the user's. ``share_in_parallel`` is accepted and has
    no effect (there is no multi-GPU training with shared Python layers here).

    ``policy`` (a PythonLayerPolicy; default: from the environment) says whether the module may be
    imported at all and which folders besides sys.path hold it."""

    runs_user_code = True

    def __new__(cls, layer_param=None, policy: PythonLayerPolicy | None = None):
        if layer_param is None:
            raise LayerError("a Python layer needs its LayerParameter (python_param.module and .layer)")
        if policy is None:
            policy = PythonLayerPolicy.resolve()
        name = layer_param.name
        param = layer_param.python_param
        where = f"layer {name!r} (Python)"

        def error(detail: str) -> LayerError:
            return LayerError(f"{where}: {detail}", detail=detail)

        if not param.module or not param.layer:
            raise error("python_param.module and python_param.layer must both be set")
        if not policy.allow:
            raise error(f"refused to import module {param.module!r}: Python layers are denied "
                        f"(--python_layers=deny or {PYTHON_LAYERS_ENV}=deny)")
        try:
            with _caffe_answers_with_netdef():
                module = import_layer_module(param.module, policy.folders)
        except RefusedModuleError as exc:
            raise error(str(exc)) from None
        except ModuleNotFoundError as exc:
            if exc.name is not None and param.module.split(".")[0] != exc.name.split(".")[0]:
                raise error(f"module {param.module!r} failed to import: {exc}") from exc
            searched = f"the folders {list(policy.folders)} and sys.path" if policy.folders else "sys.path"
            raise error(f"cannot find python_param.module {param.module!r} in {searched}; the working "
                        f"directory and the running script's folder are not searched: name the module's "
                        f"folder with --python_path DIR, {PYTHON_PATH_ENV} or Net(python_path=...)") from exc
        except Exception as exc:
            raise error(f"importing module {param.module!r} failed: {type(exc).__name__}: {exc}") from exc
        origin = getattr(module, "__file__", None) or "a module without a file"
        user_cls = getattr(module, param.layer, None)
        if user_cls is None:
            raise error(f"module {param.module!r} ({origin}) has no class {param.layer!r}")
        if not (isinstance(user_cls, type) and issubclass(user_cls, Layer)):
            raise error(f"{param.module}.{param.layer} is not a subclass of netdef.Layer "
                        f"(write `class {param.layer}(netdef.Layer)`; `caffe.Layer` is netdef.Layer only "
                        f"where no Caffe is installed, since an installed Caffe's `import caffe` wins)")
        if issubclass(user_cls, PythonLayer):
            raise error(f"{param.module}.{param.layer} must subclass netdef.Layer, not the Python factory")
        log.info("Python layer %s: %s.%s from %s", name, param.module, param.layer, origin)
        instance = user_cls(layer_param)
        # The base constructor already read param_str and phase; pycaffe also offers add_blob.
        if not isinstance(instance.blobs, BlobVec):
            instance.blobs = BlobVec(instance.blobs)
        return instance
