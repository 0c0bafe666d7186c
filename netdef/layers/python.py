"""The "Python" layer type: a user's layer class named in the prototxt, as in pycaffe.

    layer { type: "Python" python_param { module: "my_layers" layer: "MyLayer" param_str: "..." } }

imports ``my_layers`` (from ``sys.path``, plus the current working directory, which Caffe's embedded
interpreter also searches) and builds ``my_layers.MyLayer(layer_param)``. The class subclasses
``netdef.Layer`` and implements setup/reshape/forward/backward, so a pycaffe layer works after
replacing ``caffe`` by ``netdef``. Before ``setup`` the instance has ``param_str`` and ``phase``, and
``self.blobs.add_blob(*shape)`` adds a learnable blob, as in pycaffe.
"""
from __future__ import annotations

import importlib
import os
import sys

from ..blob import Blob
from .base import Layer, LayerError, register_layer


class BlobVec(list):
    """pycaffe's blob vector: a list of Blobs with ``add_blob(*shape)``."""

    def add_blob(self, *shape, dtype=None) -> Blob:
        blob = Blob(*shape, dtype=dtype)
        blob.data[...] = 0
        self.append(blob)
        return blob


def _import(module_name: str):
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path and "." not in sys.path:
        # Appended, not prepended: the working directory must not shadow installed packages.
        sys.path.append(cwd)
    return importlib.import_module(module_name)


@register_layer("Python")
class PythonLayer(Layer):
    """Factory for ``type: "Python"``: constructing it returns an instance of the user's class named
    by ``python_param.module`` and ``python_param.layer`` (a ``netdef.Layer`` subclass); the shapes
    and semantics of its bottoms and tops are the user's. ``share_in_parallel`` is accepted and has
    no effect (there is no multi-GPU training with shared Python layers here)."""

    def __new__(cls, layer_param=None):
        if layer_param is None:
            raise LayerError("a Python layer needs its LayerParameter (python_param.module and .layer)")
        name = layer_param.name
        param = layer_param.python_param
        where = f"layer {name!r} (Python)"
        if not param.module or not param.layer:
            raise LayerError(f"{where}: python_param.module and python_param.layer must both be set")
        try:
            module = _import(param.module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and param.module.split(".")[0] != exc.name.split(".")[0]:
                raise LayerError(f"{where}: module {param.module!r} failed to import: {exc}") from exc
            raise LayerError(f"{where}: cannot find python_param.module {param.module!r} on sys.path "
                             f"or in the working directory {os.getcwd()!r}") from exc
        except Exception as exc:
            raise LayerError(f"{where}: importing module {param.module!r} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        user_cls = getattr(module, param.layer, None)
        if user_cls is None:
            raise LayerError(f"{where}: module {param.module!r} ({getattr(module, '__file__', '?')}) "
                             f"has no class {param.layer!r}")
        if not (isinstance(user_cls, type) and issubclass(user_cls, Layer)):
            raise LayerError(f"{where}: {param.module}.{param.layer} is not a subclass of netdef.Layer "
                             f"(write `class {param.layer}(netdef.Layer)`)")
        if issubclass(user_cls, PythonLayer):
            raise LayerError(f"{where}: {param.module}.{param.layer} must subclass netdef.Layer, not the Python factory")
        instance = user_cls(layer_param)
        # The base constructor already read param_str and phase; pycaffe also offers add_blob.
        if not isinstance(instance.blobs, BlobVec):
            instance.blobs = BlobVec(instance.blobs)
        return instance
