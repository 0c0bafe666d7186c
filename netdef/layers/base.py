"""The layer contract and the type registry.

Every layer, built-in or a user's, implements four methods against the current array module:

- ``setup(bottom, top)``: read parameters from ``self.layer_param`` once, create ``self.blobs``.
- ``reshape(bottom, top)``: derive top shapes from bottom shapes (called again when inputs change).
- ``forward(bottom, top)``: compute tops.
- ``backward(top, propagate_down, bottom)``: write ``bottom[i].diff`` for each ``i`` with
  ``propagate_down[i]`` and *add* parameter gradients into ``self.blobs[j].diff`` where
  ``self.param_propagate_down[j]`` (adding is what makes shared parameters and ``iter_size`` work).

Parameter defaults live in the schema (``netdef.proto``), never in layer code. pycaffe Python layers
(``class L(caffe.Layer)`` with the same four methods) work unchanged as ``class L(netdef.Layer)``.
"""
from __future__ import annotations

import math

import numpy as np

from .. import memory
from ..blob import Blob
from ..proto import netdef_pb2 as pb
from ..registry import Registry

TRAIN = pb.TRAIN
TEST = pb.TEST


class LayerError(Exception):
    """A problem with one layer's definition or inputs; the message names the layer.

    ``detail`` is the message without the layer's name, for callers (the Net) that add their own
    prefix with the file position."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail if detail is not None else message


def register_layer(type_name: str):
    """Class decorator: ``@register_layer("MyType")`` makes ``type: "MyType"`` build that class."""

    def decorate(cls):
        LAYER_TYPES.add(type_name, cls)
        cls.type_name = type_name
        return cls

    return decorate


def layer_class(type_name: str) -> type:
    """The class registered for ``type_name``; a KeyError (``registry.UnknownNameError``) that
    suggests the nearest known types (or lists them all when none is near) otherwise."""
    return LAYER_TYPES.get(type_name)


def registered_types() -> list[str]:
    return LAYER_TYPES.names()


def _load_builtin_layers() -> None:
    # The one place the built-in layers are imported, which runs their @register_layer decorators;
    # the registry calls it on its first lookup, so importing netdef.layers.base has no side effects.
    from . import _builtin  # noqa: F401


#: Layer type names (``type: "ReLU"``) -> layer classes.
LAYER_TYPES: Registry[type] = Registry("layer type", load=_load_builtin_layers)


class Layer:
    """Base class of every layer. Subclasses override the four methods and optionally the
    class attributes that describe blob counts and loss behaviour."""

    type_name = "Layer"
    #: Blob-count contract, checked before setup (None: no constraint).
    exact_num_bottom: int | None = None
    min_bottom: int | None = None
    max_bottom: int | None = None
    exact_num_top: int | None = None
    min_top: int | None = None
    max_top: int | None = None
    #: A loss layer's first top gets loss_weight 1 unless the prototxt says otherwise.
    is_loss = False
    #: Whether the net may create missing tops automatically (Caffe's AutoTopBlobs).
    auto_top_blobs = False
    #: A factory that imports a user's module (the Python layer): the net passes it its
    #: PythonLayerPolicy as a second argument, so that a definition never runs code the user refused.
    runs_user_code = False

    _scratch = None  # see scratch
    #: Folder of the net definition, set by the Net; see resolve_path.
    base_dir: str | None = None

    def __init__(self, layer_param: pb.LayerParameter | None = None):
        self.layer_param = layer_param if layer_param is not None else pb.LayerParameter()
        self.blobs: list[Blob] = []
        self.param_propagate_down: list[bool] = []
        self.phase = self.layer_param.phase if self.layer_param.HasField("phase") else TRAIN
        self.param_str = self.layer_param.python_param.param_str

    # ------------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        return self.layer_param.name

    @property
    def type(self) -> str:
        return self.layer_param.type or self.type_name

    # ------------------------------------------------------------------ the contract
    @property
    def scratch(self):
        """Temporaries for use inside one call (layers/scratch.py): shared by the layers of a net
        (``share_scratch``), the layer's own otherwise."""
        if self._scratch is None:
            from .scratch import Scratch

            self._scratch = Scratch()
        return self._scratch

    def share_scratch(self, scratch) -> None:
        """Use ``scratch`` (the net's, shared with its other layers) for temporaries."""
        self._scratch = scratch

    def setup(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Read parameters and create learnable blobs. Default: nothing to set up."""

    def reshape(self, bottom: list[Blob], top: list[Blob]) -> None:
        raise NotImplementedError(f"layer {self.name!r} ({self.type}) does not implement reshape")

    def forward(self, bottom: list[Blob], top: list[Blob]) -> None:
        raise NotImplementedError(f"layer {self.name!r} ({self.type}) does not implement forward")

    def backward(self, top: list[Blob], propagate_down: list[bool], bottom: list[Blob]) -> None:
        """Default: no gradient (layers that cannot back-propagate, e.g. data layers)."""

    # ------------------------------------------------------------------ CUDA graphs (net_graphs.py)
    def replayable(self) -> bool:
        """Whether this layer's passes on a GPU may be recorded once into a CUDA graph and replayed
        instead of run: for the same shapes, every forward and backward launches the same device work
        on CuPy's current stream, reads no device value on the host, draws no random numbers, changes
        no host state that a later pass depends on, and writes its results into the blobs' arrays
        (in place, or into arrays it keeps or makes anew; a replay puts back the ones the recording
        left). False by default: a layer type says True once its GPU passes are known to keep this
        (a user's layer runs as written)."""
        return False

    # ------------------------------------------------------------------ fusion (layers/fusion.py)
    def channel_map(self, bottom: list[Blob], top: list[Blob]):
        """What ``forward`` computes, when it is a per-channel element-wise map of its one bottom
        that backward needs nothing of: a ``fusion.ChannelMap`` with the values forward would use
        now (called after ``reshape``); None (the default) when it is not one. A net runs the maps
        of layers working in place one after another as one pass, which must give forward's bits."""
        return None

    def forward_mapped(self, bottom: list[Blob], top: list[Blob], channel_map) -> bool:
        """Run ``forward`` with ``channel_map`` (a ``fusion.ChannelMap``) applied to top[0]'s values
        as well, and return True; False (the default, nothing computed) when this layer cannot. The
        net asks when the layers after this one only map its top in place and no one can read the
        values in between (net.py); it then runs none of them. In the TEST phase no backward follows;
        in training (relu_chain.py) this layer's ``backward`` follows, so this must leave what
        backward needs, as ``forward`` does."""
        return False

    def resolve_path(self, path: str) -> str:
        """A file named in this layer's parameters: as given when it exists (relative to the working
        directory, as Caffe), else relative to the folder of the net definition (``self.base_dir``),
        so a model folder runs from anywhere. Unchanged when neither exists (the caller reports it)."""
        import os

        # lexists: a link that leads nowhere (a loop) is the file meant; opening it will say what is wrong.
        if os.path.isabs(path) or os.path.lexists(path) or not self.base_dir:
            return path
        beside = os.path.join(self.base_dir, path)
        return beside if os.path.lexists(beside) else path

    @staticmethod
    def is_missing(path: str) -> bool:
        """Whether nothing is at ``path`` (as ``resolve_path`` gave it), for a "no such file" error
        naming ``places_tried``. A link that leads nowhere counts as there, and so does a name no file
        can have (a NUL byte): opening them says what is wrong with them."""
        import os

        return "\0" not in path and not os.path.lexists(path)

    def places_tried(self, path: str) -> str:
        """Where ``resolve_path`` looked for ``path``, for an error: the working directory's and,
        where the net's folder is another, that folder's."""
        import os

        places = [os.path.abspath(path)]
        if not os.path.isabs(path) and self.base_dir:
            beside = os.path.abspath(os.path.join(self.base_dir, path))
            if beside not in places:
                places.append(beside)
        return " and ".join(places)

    def allow_force_backward(self, bottom_index: int) -> bool:
        """Whether ``force_backward`` may ask for this bottom's gradient (False for labels)."""
        return True

    # ------------------------------------------------------------------ framework side
    def check_blob_counts(self, bottom: list[Blob], top: list[Blob]) -> None:
        def check(kind, n, exact, lo, hi):
            if exact is not None and n != exact:
                raise LayerError(f"layer {self.name!r} ({self.type}) takes {exact} {kind} blob(s), got {n}")
            if lo is not None and n < lo:
                raise LayerError(f"layer {self.name!r} ({self.type}) takes at least {lo} {kind} blob(s), got {n}")
            if hi is not None and n > hi:
                raise LayerError(f"layer {self.name!r} ({self.type}) takes at most {hi} {kind} blob(s), got {n}")

        check("bottom", len(bottom), self.exact_num_bottom, self.min_bottom, self.max_bottom)
        check("top", len(top), self.exact_num_top, self.min_top, self.max_top)

    def setup_layer(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Caffe's Layer::SetUp: check counts, set up, then shape the tops."""
        self.check_blob_counts(bottom, top)
        self.setup(bottom, top)
        if len(self.param_propagate_down) != len(self.blobs):
            self.param_propagate_down = [True] * len(self.blobs)
        self.reshape(bottom, top)

    def error(self, message: str) -> LayerError:
        """An exception whose message names this layer; ``raise self.error("...")``."""
        return LayerError(f"layer {self.name!r} ({self.type}): {message}", detail=message)

    def check_temporary_fits(self, shape, dtype, what: str) -> None:
        """Raise this layer's error when a temporary of ``shape`` (sized by the definition, not only by
        the blobs: LRN's ``local_size``) could not be allocated: from ``reshape``, before ``forward``
        makes it (netdef/memory.py says why before)."""
        nbytes = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
        try:
            memory.check_fits(nbytes, f"{what} of shape {tuple(int(d) for d in shape)}")
        except memory.BlobTooLargeError as exc:
            raise self.error(str(exc)) from None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class DataSource(Layer):
    """A layer that brings records into the net from outside it (a database, files, arrays). Beyond
    the four methods it has three abilities the solver uses, each with a default that means "not
    able"; a subclass overrides the ones it has (``Net.data_sources()`` lists a net's sources):

    - ``set_shard(rank, num_ranks) -> bool``: read only this rank's share of the records from the
      next batch on; True when the layer shards, False (the default) when every rank gets the same
      batches (data parallelism warns about that once).
    - ``data_state() -> bytes | None`` / ``restore_data_state(bytes)``: where the next batch starts,
      so that a resumed run reads what an uninterrupted one would; None (the default) when there is
      nothing to save.
    - ``close()``: release threads and open files (the solver calls it when training ends).

    A user's Python layer gets them by subclassing ``netdef.DataSource`` instead of ``netdef.Layer``.
    """

    def set_shard(self, rank: int, num_ranks: int) -> bool:
        return False

    def data_state(self) -> bytes | None:
        return None

    def restore_data_state(self, state: bytes) -> None:
        raise self.error("restore_data_state: this data source saves no state, so it has none to restore")

    def close(self) -> None:
        """Default: nothing to release."""
