"""Net: a NetParameter built into layers and blobs, run forward and backward.

Building follows Caffe's Net::Init: filter layers by the net state (phase, level, stages), upgrade legacy
definitions, insert Split layers where a blob feeds several layers, resolve bottoms and tops in definition
order (a top named like one of the layer's bottoms works in place), share parameters by
``param { name }`` (``net_params.py``), assign loss weights and decide which layers and bottoms need
backward (``net_backward.py``).

During ``backward`` the net calls its backward hooks each time some parameters' gradients become final,
and around every layer its layer hooks (``net_hooks.py``).

Where no backward follows, ``forward_range`` runs a layer and the per-channel maps working in place on
its top after it (BatchNorm with global statistics, Scale, ReLU) as one pass (layers/fusion.py), with
the same bits; ``fuse_layers`` and ``forward_only`` below say when. On a GPU with ``cuda_graphs`` on,
``forward_range`` and ``backward_range`` replay stretches of layers from CUDA graphs (``net_graphs.py``)
and run the rest eagerly (``forward_eagerly``, ``backward_eagerly``). Which layers a net state includes
is ``net_state.py``'s business.
"""
from __future__ import annotations

import collections
import os
import numpy as np

from . import backend, net_backward, net_batches, net_graphs, net_memory, net_params, weights as _weights
from .blob import Blob
from .memory import BlobTooLargeError
from .layers import batchnorm_chain, fusion, relu_chain, sum_chain
from .layers.base import TEST, TRAIN, DataSource, LayerError, layer_class
from .layers.data import MemoryDataLayer
from .layers.python import PythonLayerPolicy
from .layers.scratch import Scratch
from .net_errors import NetError
from .net_hooks import GradientHook, NetHooks
from .net_loss import QueuedLoss
from .net_state import layer_included, parse_phase
from .proto import io as proto_io
from .proto import netdef_pb2 as pb
from .splits import insert_splits
from .upgrade import upgrade_net

BackwardHook = GradientHook


class Net:
    """A built network. pycaffe-compatible surface::

        net = netdef.Net("deploy.prototxt", netdef.TEST, weights="model.caffemodel")
        net = netdef.Net("deploy.prototxt", "model.caffemodel", netdef.TEST)   # pycaffe's order
        out = net.forward(data=batch)          # {output blob name: array}
        net.backward()                         # parameter gradients in net.params[name][i].diff

    ``model`` is a prototxt path, prototxt text or a NetParameter.

    ``python_layers`` ("allow" or "deny"; default: ``NETDEF_PYTHON_LAYERS``, else allow) says whether
    Python layers may import their modules; ``python_path`` (a folder or several) adds folders to
    search for those modules, after ``NETDEF_PYTHON_PATH``'s. The working directory is never searched.

    ``keep_blob_diffs`` (True, as Caffe): every blob keeps its gradient after backward, for a user to
    read. False: a blob's gradient is dropped as soon as the backward pass has no further use for it
    (after the layer it feeds has run backward), as PyTorch frees them; learnable parameters' and
    the inputs' gradients are always kept. ``netdef train`` trains with False, since no one can read
    them there and a deep net's peak memory falls by its activations' gradients (benchmarks/README.md,
    "The figures behind the other layers' choices").
    """

    keep_blob_diffs = True

    #: ``fuse_layers`` (True): a layer followed by layers that only map its top in place per channel
    #: (a convolution, then BatchNorm with global statistics, Scale, ReLU; an Eltwise sum, then ReLU)
    #: runs as one pass (layers/fusion.py), with the same bits, when no layer of the chain needs
    #: backward (or the net is ``forward_only``): only the chain's last value could be read anyway.
    #: ``forward_only`` (False): the net is only run forward (``netdef test``, ``Classifier``): every
    #: chain may run fused, and ``backward`` refuses, since fused layers keep nothing for it.
    fuse_layers = True
    forward_only = False

    def __init__(self, model, phase=None, weights=None, *, stages=(), level: int = 0, base_dir=None,
                 python_layers: str | None = None, python_path=(), read_from=None, **legacy):
        # read_from: the prototxt file a NetParameter ``model`` was made from, layer for layer (--data_shape
        # replaces its data layers, netdef/without_data.py): errors name that file's lines, and relative
        # paths inside layers are tried beside it.
        # pycaffe also accepts Net(model, weights_path, phase).
        if isinstance(phase, (str, os.PathLike)) and str(phase).upper() not in ("TRAIN", "TEST"):
            weights, phase = phase, weights
        if "param" in legacy:
            model = legacy.pop("param")
        if legacy:
            raise TypeError(f"unexpected arguments: {', '.join(legacy)}")
        self.python_policy = PythonLayerPolicy.resolve(python_layers, python_path)
        param, text, self.source = proto_io.read_net_param(model)
        as_written = param
        if read_from is not None:
            as_written, text, self.source = proto_io.read_net_param(read_from)
        defined_in = read_from if read_from is not None else model
        # Relative file names inside layers (data sources, mean files) are tried in the working
        # directory first, as Caffe does, then in this folder: the definition's own by default.
        if (base_dir is None and not isinstance(defined_in, pb.NetParameter)
                and not proto_io.looks_like_text_message(str(defined_in))):
            base_dir = os.path.dirname(os.path.abspath(str(defined_in)))
        self.base_dir = base_dir
        copy = pb.NetParameter()
        copy.CopyFrom(param)  # never mutate the caller's
        param = copy
        self._layer_lines = proto_io.top_level_block_lines(text) if text else []
        if as_written.input:  # upgrade_net makes the input: fields a leading Input layer: theirs is its line
            self._layer_lines[:0] = proto_io.top_level_block_lines(text, ("input",))[:1]
        try:
            upgrade_net(param, self.source)
        except ValueError as exc:
            raise NetError(str(exc)) from None
        state = pb.NetState()
        state.CopyFrom(param.state)
        state.phase = parse_phase(phase if phase is not None else (param.state.phase if param.HasField("state") else None))
        if stages:
            del state.stage[:]
            state.stage.extend(stages)
        if level:
            state.level = level
        self.phase = state.phase
        self.state = state
        self.name = param.name
        self.force_backward = param.force_backward
        self.param_def = param
        self._hooks = NetHooks()
        self._graphs: net_graphs.PassGraphs | None = None  # see cuda_graphs
        self._build(param)
        if weights is not None:
            self.copy_from(weights)

    # ====================================================================================== building
    def _where(self, layer_index_in_file: int | None) -> str:
        if layer_index_in_file is not None and layer_index_in_file < len(self._layer_lines):
            return f"{self.source}:{self._layer_lines[layer_index_in_file]}"
        return self.source

    def _build(self, param: pb.NetParameter) -> None:
        # Keep the index each layer had in the file, to put line numbers into errors.
        defined = []
        for file_index, layer in enumerate(param.layer):
            if layer_included(layer, self.state):
                defined.append((file_index, layer))
        filtered = [layer for _, layer in defined]
        origins = [i for i, _ in defined]
        for file_index, layer in defined:
            self._check_top_names(layer, self._where(file_index))
        try:
            with_splits, origin_of = insert_splits(filtered)
        except ValueError as exc:
            raise NetError(f"{self.source}: {exc}") from None
        file_index_of = [origins[o] if o is not None else None for o in origin_of]

        self.layers = []
        self._layer_names: list[str] = []
        self.blobs: "collections.OrderedDict[str, Blob]" = collections.OrderedDict()
        self.bottom_names: dict[str, list[str]] = {}
        self.top_names: dict[str, list[str]] = {}
        self._bottom_vecs: list[list[Blob]] = []
        self._top_vecs: list[list[Blob]] = []
        self._loss_weights: list[list[float]] = []
        # Per layer, the in-place tops that get an array of their own before each forward: a user's
        # (Python) layer may write into its top's array (pycaffe's ``top[0].data[...] = ...``), and
        # netdef's layers keep references to their outputs for backward on the rule that a later
        # layer replaces a blob's array instead of writing into it (layers/reused.py).
        self._own_array_tops: list[list[Blob]] = []
        self._producer: dict[str, int] = {}
        self._scratch = Scratch()  # the layers' temporaries, one call at a time (layers/scratch.py)
        available: dict[str, Blob] = {}
        unconsumed: set[str] = set()  # produced and not yet read: the net's outputs at the end
        self._input_names: list[str] = []

        for li, layer_param in enumerate(with_splits):
            where = self._where(file_index_of[li])
            layer_param.phase = self.phase
            cls = self._layer_class(layer_param, where)
            bottoms = self._resolve_bottoms(layer_param, where, available, unconsumed)
            tops = self._create_tops(li, layer_param, where, available, unconsumed)
            layer = self._instantiate(cls, layer_param, where)
            layer.share_scratch(self._scratch)
            if cls.auto_top_blobs:
                self._add_automatic_tops(cls, layer_param, tops, available, unconsumed)
            self._set_up(layer, layer_param, bottoms, tops, where)
            if layer_param.type == "Input":
                self._input_names.extend(layer_param.top)
            self.layers.append(layer)
            self._layer_names.append(layer_param.name)
            self.bottom_names[layer_param.name] = list(layer_param.bottom)
            self.top_names[layer_param.name] = list(layer_param.top)
            self._bottom_vecs.append(bottoms)
            self._top_vecs.append(tops)
            self._own_array_tops.append([t for t in tops if cls.runs_user_code and any(t is b for b in bottoms)])
            self._loss_weights.append(self._layer_loss_weights(layer, layer_param, where))
        # Caffe keeps the unread blobs in a std::set, so its (and pycaffe's) outputs are sorted by name.
        self._output_names = sorted(unconsumed)
        self._setup_params(with_splits, file_index_of)
        self._decide_backward()
        try:
            net_memory.check_net_fits(self.source, self._blobs_to_hold(), self.phase == TRAIN)
        except BlobTooLargeError as exc:
            raise NetError(str(exc)) from None
        self._compute_hook_points()
        self._chains = fusion.plan_chains(self.layers, self._bottom_vecs, self._top_vecs, self._loss_weights)
        # The tops whose values add to the loss, per layer: forward sums them, backward seeds their diffs.
        self._weighted_tops = [[(blob, weight) for blob, weight in zip(tops, weights) if weight]
                               for tops, weights in zip(self._top_vecs, self._loss_weights)]
        # Chains trained as one step (layers/batchnorm_chain.py, sum_chain.py, relu_chain.py): by
        # first layer, and by member.
        plan_args = (self.layers, self._bottom_vecs, self._top_vecs, self._loss_weights)
        self._training_chains = {**batchnorm_chain.plan(*plan_args), **sum_chain.plan(*plan_args),
                                 **relu_chain.plan(*plan_args)}
        self._training_chain_of = {li: c for c in self._training_chains.values() for li in c.members}

    def _blobs_to_hold(self):
        """(name, blob, whether it gets a gradient) for every top and parameter: what the net will hold
        once it has run (``net_memory``); only a TRAIN net's backward makes gradients."""
        training = self.phase == TRAIN
        for li, layer in enumerate(self.layers):
            for name, top in zip(self.top_names[layer.name], self._top_vecs[li]):
                yield name, top, training and self.layer_need_backward[li]
            for j, blob in enumerate(layer.blobs):
                yield blob.name, blob, training and layer.param_propagate_down[j]

    @staticmethod
    def _check_top_names(layer_param, where: str) -> None:
        """One layer cannot produce the same blob twice (split insertion and in-place rules assume it)."""
        seen = set()
        for top_name in layer_param.top:
            if top_name in seen:
                raise NetError(f"{where}: layer {layer_param.name!r} ({layer_param.type}) names top blob "
                               f"{top_name!r} twice; each top of a layer needs its own name")
            seen.add(top_name)

    @staticmethod
    def _layer_class(layer_param, where: str) -> type:
        name = layer_param.name
        if not layer_param.type:
            raise NetError(f"{where}: layer {name!r} has no type")
        try:
            cls = layer_class(layer_param.type)
        except KeyError as exc:
            raise NetError(f"{where}: layer {name!r}: {exc.args[0]}") from None
        if len(layer_param.propagate_down) not in (0, len(layer_param.bottom)):
            raise NetError(f"{where}: layer {name!r} has {len(layer_param.propagate_down)} propagate_down "
                           f"values for {len(layer_param.bottom)} bottoms")
        return cls

    @staticmethod
    def _resolve_bottoms(layer_param, where: str, available: dict, unconsumed: set) -> list[Blob]:
        bottoms = []
        for bi, bottom_name in enumerate(layer_param.bottom):
            if bottom_name not in available:
                raise NetError(f"{where}: layer {layer_param.name!r} ({layer_param.type}): unknown bottom blob "
                               f"{bottom_name!r} (bottom {bi}); no earlier layer produces it")
            bottoms.append(available[bottom_name])
            unconsumed.discard(bottom_name)
        return bottoms

    def _new_blob(self, name: str, producer: int, available: dict, unconsumed: set) -> Blob:
        blob = Blob(name=name)
        self.blobs[name] = blob
        available[name] = blob
        unconsumed.add(name)
        self._producer[name] = producer
        return blob

    def _create_tops(self, li: int, layer_param, where: str, available: dict, unconsumed: set) -> list[Blob]:
        tops = []
        for ti, top_name in enumerate(layer_param.top):
            if ti < len(layer_param.bottom) and layer_param.bottom[ti] == top_name:
                tops.append(available[top_name])  # in place, as Caffe: same name at the same index
                unconsumed.add(top_name)
                continue
            if top_name in self.blobs:
                raise NetError(f"{where}: layer {layer_param.name!r} ({layer_param.type}): top blob {top_name!r} is "
                               f"already produced by layer {self._layer_names[self._producer[top_name]]!r} "
                               f"(a layer works in place only when top i has the name of bottom i)")
            tops.append(self._new_blob(top_name, li, available, unconsumed))
        return tops

    def _add_automatic_tops(self, cls, layer_param, tops: list, available: dict, unconsumed: set) -> None:
        """Caffe's AutoTopBlobs: a layer that needs more tops than the definition names gets them."""
        wanted = max(cls.exact_num_top or 0, cls.min_top or 0)
        while len(tops) < wanted:
            auto_name = f"{layer_param.name}_auto_top_{len(tops)}"
            tops.append(self._new_blob(auto_name, len(self.layers), available, unconsumed))
            layer_param.top.append(auto_name)

    def _instantiate(self, cls, layer_param, where: str):
        try:
            layer = cls(layer_param, self.python_policy) if cls.runs_user_code else cls(layer_param)
        except (LayerError, ValueError, ImportError, AttributeError, TypeError) as exc:
            detail = exc.detail if isinstance(exc, LayerError) else str(exc)
            raise NetError(f"{where}: layer {layer_param.name!r} ({layer_param.type}): {detail}") from None
        layer.base_dir = self.base_dir
        if layer_param.blobs:
            # Blobs stored in the definition (Caffe nets can carry them) preset the parameters.
            layer.blobs = [_weights.blob_from_proto(b, name=f"{layer_param.name}[{j}]")
                           for j, b in enumerate(layer_param.blobs)]
        return layer

    @staticmethod
    def _set_up(layer, layer_param, bottoms: list[Blob], tops: list[Blob], where: str) -> None:
        shapes = ", ".join(f"{n} {tuple(b.shape)}" for n, b in zip(layer_param.bottom, bottoms))
        for name, blob in zip(layer_param.bottom, bottoms):
            if blob.count == 0:
                # Layers divide by a bottom's item count or batch size; an empty blob is always a mistake
                # in the definition (an input or data shape with a zero dimension).
                raise NetError(f"{where}: layer {layer_param.name!r} ({layer_param.type}): bottom blob {name!r} "
                               f"is empty (shape {tuple(blob.shape)}); every dimension must be at least 1")
        bottom_shapes = {id(blob): blob.shape for blob in bottoms}
        try:
            layer.setup_layer(bottoms, tops)
            for top in tops:  # allocated later (lazily), but sized now: refused here, naming the layer
                top.check_fits()
        except (LayerError, ValueError, IndexError, KeyError, NotImplementedError, TypeError, ZeroDivisionError,
                OSError, MemoryError) as exc:
            detail = exc.detail if isinstance(exc, LayerError) else str(exc)
            raise NetError(f"{where}: layer {layer_param.name!r} ({layer_param.type}) with bottoms [{shapes}]: "
                           f"{detail}", layer_type=layer_param.type) from None
        for name, top in zip(layer_param.top, tops):
            # An in-place top is its bottom's blob: a layer that reshapes it would read its input in the
            # new shape (a Pooling over its own input broke the NumPy kernels with a ValueError).
            if id(top) in bottom_shapes and top.shape != bottom_shapes[id(top)]:
                raise NetError(f"{where}: layer {layer_param.name!r} ({layer_param.type}): top {name!r} is computed "
                               f"in place over the bottom of that name, but of shape {top.shape}, not "
                               f"{bottom_shapes[id(top)]}; in place needs the same shape: give the top its own name")

    def _layer_loss_weights(self, layer, layer_param, where) -> list[float]:
        n = len(layer_param.top)
        if layer_param.loss_weight:
            if len(layer_param.loss_weight) != n:
                raise NetError(f"{where}: layer {layer_param.name!r} has {len(layer_param.loss_weight)} loss_weight "
                               f"values for {n} tops")
            return list(layer_param.loss_weight)
        weights = [0.0] * n
        if layer.is_loss and n:
            weights[0] = 1.0
        return weights

    def _setup_params(self, layer_params, file_index_of) -> None:
        """Parameter sharing by ``param { name }`` and the lr/decay multipliers of every parameter
        (net_params.py)."""
        try:
            shared = net_params.share_params(self.layers, layer_params, lambda li: self._where(file_index_of[li]))
        except net_params.ParamSharingError as exc:
            raise NetError(str(exc)) from None
        self.params = shared.params
        self.learnable_params = shared.learnable_params
        self.params_lr = shared.params_lr
        self.params_weight_decay = shared.params_weight_decay
        self._learnable_id_of = shared.learnable_id_of  # per layer, per blob -> learnable index

    def _decide_backward(self) -> None:
        """Which layers run backward and which of their bottoms get a gradient (Caffe's rules)."""
        self.layer_need_backward, self.bottom_need_backward = net_backward.decide_backward(
            self.layers, self._loss_weights, self.force_backward)

    def _compute_hook_points(self) -> None:
        """For each layer, the learnable parameters whose gradient is final once it has run backward."""
        self._final_at, self.learnable_param_ids_with_grad = net_backward.final_gradients(
            self.layers, self._learnable_id_of, self.layer_need_backward)
        # Tops whose gradient nothing reads once the layer has run backward (see keep_blob_diffs): a
        # layer's own tops, except those it works in place on, whose diff becomes the bottom's.
        inputs = [self.blobs[name] for name in self._input_names]
        self._diff_consumed_at: list[list[Blob]] = [
            [t for t in tops if not any(t is b for b in bottoms) and not any(t is i for i in inputs)]
            for bottoms, tops in zip(self._bottom_vecs, self._top_vecs)]

    # ====================================================================================== pycaffe API
    @property
    def inputs(self) -> list[str]:
        return list(self._input_names)

    @property
    def outputs(self) -> list[str]:
        return list(self._output_names)

    @property
    def layer_dict(self):
        return collections.OrderedDict(zip(self._layer_names, self.layers))

    @property
    def blob_loss_weights(self) -> dict[str, float]:
        out = collections.OrderedDict((name, 0.0) for name in self.blobs)
        for li, layer in enumerate(self.layers):
            for top_name, w in zip(layer.layer_param.top, self._loss_weights[li]):
                out[top_name] = w
        return out

    def data_sources(self) -> list:
        """The layers that bring records in from outside the net (``DataSource``), in definition order."""
        return [layer for layer in self.layers if isinstance(layer, DataSource)]

    def layer_learnable_ids(self, layer_index: int) -> list[int]:
        """The learnable parameters (indices into ``learnable_params``) that layer ``layer_index``
        uses, shared ones included."""
        return list(self._learnable_id_of[layer_index])

    def gradients_final_at(self, layer_index: int) -> list[int]:
        """The learnable parameters whose gradient is final once layer ``layer_index`` has run
        backward (what the backward hooks hand over after it; a shared parameter after the
        lowest layer that uses it)."""
        return list(self._final_at[layer_index])

    def layer_index(self, name: str) -> int:
        try:
            return self._layer_names.index(name)
        except ValueError:
            raise KeyError(f"net {self.name!r} has no layer {name!r}") from None

    def _range(self, start, end, default_start, default_end):
        s = self.layer_index(start) if isinstance(start, str) else (default_start if start is None else start)
        e = self.layer_index(end) if isinstance(end, str) else (default_end if end is None else end)
        return s, e

    # ====================================================================================== forward
    def forward_range(self, start: int = 0, end: int | None = None) -> float:
        """Run layers start..end inclusive; return the weighted loss they produced."""
        return self.forward_queued(start, end).value()

    def forward_queued(self, start: int = 0, end: int | None = None) -> QueuedLoss:
        """``forward_range`` without waiting for its loss: read it (``value``) once more work is queued
        (``net_loss.py``)."""
        end = len(self.layers) - 1 if end is None else end
        if self._graphs is not None and self._graphs.apply():
            return self._graphs.forward(start, end)
        return self.forward_eagerly(start, end)

    def forward_eagerly(self, start: int, end: int, call_hooks: bool = True) -> QueuedLoss:
        """``forward_queued`` layer by layer, without CUDA graphs; without its layer hooks where the
        caller calls them (at the edges of a stretch replayed as one graph)."""
        loss = QueuedLoss()
        li = start
        hooks = self._hooks if call_hooks else NetHooks()
        while li <= end:
            last, training_chain = self._step_end(li, end)
            if hooks.before_forward:
                hooks.call(hooks.before_forward, li, last)
            if training_chain is not None:
                ran_as_one = self._forward_training_chain(training_chain)
            else:
                ran_as_one = last > li and self._forward_fused(li, last)
            if not ran_as_one:
                for lj in range(li, last + 1):
                    self._forward_layer(lj)
            if hooks.after_forward:
                hooks.call(hooks.after_forward, li, last)
            for lj in range(li, last + 1):
                for blob, weight in self._weighted_tops[lj]:
                    loss.add(weight, blob.data.sum())
            li = last + 1
        return loss

    def forward_steps(self, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
        """The (first, last) layer ranges ``forward_range(start, end)`` runs, each as one step: a
        fused chain (layers/fusion.py) or a single layer."""
        end = len(self.layers) - 1 if end is None else end
        steps, li = [], start
        while li <= end:
            steps.append((li, self._step_end(li, end)[0]))
            li = steps[-1][1] + 1
        return steps

    def _step_end(self, li: int, end: int) -> tuple[int, object]:
        """(the last layer of the step that starts at ``li`` and ends by ``end``, the chain trained as
        one step that step is, or None): a fused forward chain, a BatchNorm, sum or rectified-product chain
        (layers/batchnorm_chain.py, sum_chain.py, relu_chain.py), or layer ``li`` alone."""
        last = self._fused_chain_end(li, end)
        if last != li:
            return last, None
        chain = self._training_chains.get(li)
        if (not self.fuse_layers or chain is None or chain.last > end
                or (any(self.layer_need_backward[li:chain.last + 1]) and not self.layer_need_backward[li])):
            return li, None  # the first needs no backward but a later member does (Scale's parameters)
        return chain.last, chain

    def _fused_chain_end(self, li: int, end: int) -> int:
        """The last layer of the fused chain that starts at ``li`` and ends by ``end``; ``li`` when none."""
        last = self._chains.get(li)
        if not self.fuse_layers or last is None or last > end:
            return li
        if not self.forward_only and any(self.layer_need_backward[li:last + 1]):
            return li
        return last

    def _forward_training_chain(self, chain) -> bool:
        """Run a chain trained as one step; False (nothing computed) where its kernels do not take
        the arrays."""
        try:
            for li in chain.members:
                self.layers[li].reshape(self._bottom_vecs[li], self._top_vecs[li])
            return chain.forward(self._bottom_vecs[chain.first], self._top_vecs[chain.last])
        except BlobTooLargeError as exc:
            raise self.layers[chain.first].error(str(exc)) from None

    def _forget_training_chain(self, li: int) -> None:
        """Layer ``li`` runs forward other than as its chain trained as one step (if it has one): the
        chain's state goes, and backward runs layer by layer."""
        chain = self._training_chain_of.get(li)
        if chain is not None:
            chain.forget()

    def _forward_layer(self, li: int) -> None:
        layer, bottom, top = self.layers[li], self._bottom_vecs[li], self._top_vecs[li]
        self._forget_training_chain(li)
        try:
            layer.reshape(bottom, top)
            for blob in self._own_array_tops[li]:
                blob.data = blob.data.copy()
            layer.forward(bottom, top)
        except BlobTooLargeError as exc:  # netdef's refusal of a blob or scratch array: say whose
            raise layer.error(str(exc)) from None

    def _forward_fused(self, first: int, last: int) -> bool:
        """Run the chain first..last as its first layer's forward with the others' maps applied;
        False (nothing computed) when the maps do not compose or the first layer cannot."""
        members = range(first, last + 1)
        layer = self.layers[first]
        for li in members:
            self._forget_training_chain(li)
        try:
            for li in members:
                self.layers[li].reshape(self._bottom_vecs[li], self._top_vecs[li])
            channel_map = fusion.compose_all(self.layers[li].channel_map(self._bottom_vecs[li], self._top_vecs[li])
                                             for li in members[1:])
            return channel_map is not None and layer.forward_mapped(self._bottom_vecs[first], self._top_vecs[first],
                                                                    channel_map)
        except BlobTooLargeError as exc:
            raise layer.error(str(exc)) from None

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """pycaffe's forward: set input blobs from ``kwargs``, run, return {output name: data}."""
        for name, value in kwargs.items():
            if name not in self.blobs:
                raise KeyError(f"net {self.name!r} has no blob {name!r} to set (inputs: {self.inputs})")
            blob = self.blobs[name]
            value = backend.to_device(np.asarray(value) if not hasattr(value, "__cuda_array_interface__") else value,
                                      like=blob.data)
            if tuple(value.shape) != blob.shape:
                blob.reshape(value.shape)
            blob.data = value
        s, e = self._range(start, end, 0, len(self.layers) - 1)
        self.loss = self.forward_range(s, e)
        names = set(self.outputs) | set(blobs or ())
        return collections.OrderedDict((n, self.blobs[n].data) for n in self.blobs if n in names)

    def forward_all(self, blobs=None, **kwargs):
        """pycaffe's forward_all: run the inputs in ``kwargs`` (arrays of any length, batched by the
        net's batch size, the last batch padded) and return {output name: all its rows}."""
        return net_batches.forward_all(self, blobs, kwargs)

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        """pycaffe's forward_backward_all: forward_all and backward over the same batches (top diffs
        from ``kwargs`` too); returns ({output: rows}, {input diff: rows})."""
        return net_batches.forward_backward_all(self, blobs, diffs, kwargs)

    def set_input_arrays(self, data, labels) -> None:
        """pycaffe's set_input_arrays: the arrays the first layer, a MemoryData layer, serves from."""
        if not self.layers or not isinstance(self.layers[0], MemoryDataLayer):
            first = f"{self.layers[0].type} layer {self.layers[0].name!r}" if self.layers else "no layer"
            raise NetError(f"set_input_arrays may only be called if the first layer is a MemoryData layer "
                           f"(net {self.name!r} starts with {first})")
        self.layers[0].set_input_arrays(data, labels)

    # ================================================================= pycaffe's underscore names
    # pycaffe builds its Python names on these (and user code reaches for them): blobs are numbered
    # in definition order, an in-place top keeping its bottom's number, as Caffe's blob ids.
    @property
    def _blob_names(self) -> list[str]:
        return list(self.blobs)

    @property
    def _blobs(self) -> list[Blob]:
        return list(self.blobs.values())

    @property
    def _blob_loss_weights(self) -> list[float]:
        return list(self.blob_loss_weights.values())

    def _blob_ids(self, names) -> list[int]:
        number = {name: i for i, name in enumerate(self.blobs)}
        return [number[name] for name in names]

    @property
    def _inputs(self) -> list[int]:
        """The input blobs' numbers (``inputs`` are their names)."""
        return self._blob_ids(self._input_names)

    @property
    def _outputs(self) -> list[int]:
        """The output blobs' numbers, in the order of ``outputs`` (by name, as Caffe's)."""
        return self._blob_ids(self._output_names)

    def _bottom_ids(self, layer_index: int) -> list[int]:
        return self._blob_ids(self.layers[layer_index].layer_param.bottom)

    def _top_ids(self, layer_index: int) -> list[int]:
        return self._blob_ids(self.layers[layer_index].layer_param.top)

    def _forward(self, start: int, end: int) -> float:
        """Caffe's ForwardFromTo: layers start..end inclusive; the loss they produced."""
        self.loss = self.forward_range(start, end)
        return self.loss

    def _backward(self, start: int, end: int) -> None:
        """Caffe's BackwardFromTo: layers start down to end inclusive, the loss tops seeded with
        their loss weights."""
        self._fill_loss_diffs(0, len(self.layers) - 1)
        self.backward_range(start, end)

    def _batch(self, blobs: dict):
        """pycaffe's batcher: {name: rows} in the net's batch size, the last batch padded with zeros."""
        yield from net_batches.batches(self, blobs)

    # ====================================================================================== CUDA graphs
    @property
    def cuda_graphs(self) -> "net_graphs.PassGraphs | None":
        """On a GPU, stretches of layers run as CUDA graphs, recorded once and replayed (the host
        launches one graph instead of every kernel of those layers; the same bits): the net's
        ``net_graphs.PassGraphs`` while on (set True), None while off (the default). Where graphs do
        not apply (the CPU, a net with hooks) the net runs eagerly and the log says why, once."""
        return self._graphs

    @cuda_graphs.setter
    def cuda_graphs(self, enabled) -> None:
        # True, False, or the PassGraphs of this net to use (tests give one recording through a stand-in).
        if isinstance(enabled, net_graphs.PassGraphs):
            self._graphs = enabled
        elif not enabled:
            self._graphs = None
        elif self._graphs is None:
            self._graphs = net_graphs.PassGraphs(self)

    def has_hooks(self) -> bool:
        """Whether any layer or gradient hook is registered on this net."""
        return self._hooks.any()

    @property
    def hooks(self) -> NetHooks:
        """What is registered to run around this net's layers (``net_hooks.py``)."""
        return self._hooks

    # ====================================================================================== backward
    def register_backward_hook(self, hook: BackwardHook, at_run_edges: bool = False) -> None:
        """Call ``hook(layer_index, param_ids)`` during backward each time the gradients of the
        learnable parameters ``param_ids`` (indices into ``learnable_params``) become final;
        ``at_run_edges``: it may be called after a stretch of layers replayed as one CUDA graph."""
        self._hooks.add_gradient_hook(hook, at_run_edges)

    def remove_backward_hook(self, hook: BackwardHook) -> None:
        self._hooks.remove_gradient_hook(hook)

    def register_layer_hooks(self, before_forward=None, after_forward=None, before_backward=None,
                             after_backward=None, at_run_edges: bool = False) -> tuple:
        """Call ``fn(layer_index)`` around every layer's forward and backward (tracing, progress polls).
        ``after_backward`` runs before that layer's gradient hooks; ``at_run_edges``: they may be called
        at the edges of a stretch replayed as one CUDA graph (``net_hooks.py``). Returns a handle."""
        return self._hooks.add_layer_hooks(before_forward, after_forward, before_backward, after_backward,
                                           at_run_edges)

    def remove_layer_hooks(self, handle: tuple) -> None:
        self._hooks.remove_layer_hooks(handle)

    def _fill_loss_diffs(self, start: int, end: int) -> None:
        for li in range(start, end + 1):
            for blob, weight in self._weighted_tops[li]:
                blob.diff = blob.data * 0 + weight

    def backward_range(self, start: int | None = None, end: int = 0) -> None:
        """Run backward from layer ``start`` down to layer ``end`` (inclusive)."""
        if self.forward_only:
            raise NetError(f"net {self.name!r} is forward_only (as netdef test and Classifier run nets): its "
                           f"forward fuses layers and keeps nothing for backward; set forward_only = False")
        start = len(self.layers) - 1 if start is None else start
        if self._graphs is not None and self._graphs.apply():
            self._graphs.backward(start, end)
        else:
            self.backward_eagerly(start, end)

    def backward_steps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The (highest, lowest) layer ranges ``backward_range(start, end)`` runs, each as one step: a
        chain that ran forward as one step, or a single layer. Raises NetError where the range cuts
        such a chain."""
        steps, li = [], start
        while li >= end:
            chain = self._training_chain_of.get(li)
            if chain is not None and chain.ran_fused and self.layer_need_backward[li]:
                if li != chain.last or chain.first < end:
                    names = self._layer_names
                    raise NetError(f"backward from layer {names[start]!r} to layer {names[end]!r} cuts the chain "
                                   f"{names[chain.first]!r}..{names[chain.last]!r}, which ran forward as one step; "
                                   f"set net.fuse_layers = False to run its layers one by one")
                steps.append((li, chain.first))
            else:
                steps.append((li, li))
            li = steps[-1][1] - 1
        return steps

    def backward_eagerly(self, start: int, end: int, call_hooks: bool = True) -> None:
        """``backward_range`` step by step, without CUDA graphs; without its hooks where the caller
        calls them (at the edges of a stretch replayed as one graph)."""
        for high, low in self.backward_steps(start, end):
            members = range(high, low - 1, -1)
            if call_hooks:
                self._hooks.before_backward_of(high, low)
            try:
                if high != low:  # a chain trained as one step
                    self._training_chain_of[high].backward(self._top_vecs[high], self._bottom_vecs[low],
                                                           self.bottom_need_backward[low])
                elif self.layer_need_backward[high]:
                    self.layers[high].backward(self._top_vecs[high], self.bottom_need_backward[high],
                                               self._bottom_vecs[high])
            except BlobTooLargeError as exc:
                raise self.layers[low].error(str(exc)) from None
            for lj in members:
                # The gradients no one reads any more go; then the hooks (a hook reads parameters' gradients).
                if not self.keep_blob_diffs:
                    for blob in self._diff_consumed_at[lj]:
                        blob.release_diff()
                if call_hooks:
                    self._hooks.after_backward_of(lj, self._final_at[lj])

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """pycaffe's backward: set top diffs from ``kwargs`` (else loss weights), run, return
        {input name: diff}. Parameter gradients are *added* to ``.diff`` (call
        ``clear_param_diffs`` between iterations, as the solver does)."""
        s, e = self._range(start, end, len(self.layers) - 1, 0)
        self._fill_loss_diffs(0, len(self.layers) - 1)
        for name, value in kwargs.items():
            self.blobs[name].diff = value
        self.backward_range(s, e)
        names = set(self.inputs) | set(diffs or ())
        return collections.OrderedDict((n, self.blobs[n].diff) for n in self.blobs if n in names)

    def forward_backward(self) -> float:
        """One training pass: forward, loss diffs, backward; returns the loss (read once backward is
        queued: ``net_loss.py``)."""
        loss = self.forward_queued(0, len(self.layers) - 1)
        self._fill_loss_diffs(0, len(self.layers) - 1)
        self.backward_range()
        self.loss = loss.value()
        return self.loss

    def clear_param_diffs(self, deferred: bool = False) -> None:
        """Zero every learnable parameter's gradient; ``deferred``: lazily (``Blob.defer_zero_diff``,
        what the solver does: nothing reads the gradients but through ``diff``), else at once."""
        for blob in self.learnable_params:
            if deferred:
                blob.defer_zero_diff()
            else:
                blob.zero_diff()

    def reshape(self) -> None:
        """Propagate new input shapes through every layer."""
        for layer, bottom, top in zip(self.layers, self._bottom_vecs, self._top_vecs):
            layer.reshape(bottom, top)

    # ====================================================================================== weights
    def copy_from(self, path) -> None:
        """Load a ``.caffemodel`` (V2 or legacy V1, or Caffe's HDF5 ``.caffemodel.h5``), by layer name."""
        _weights.copy_from(self, path)

    def share_with(self, other: "Net") -> None:
        """Make this net use ``other``'s parameter blobs for layers of the same name (Caffe's ShareTrainedLayersWith)."""
        _weights.share_with(self, other)

    def to_proto(self, write_diff: bool = False) -> pb.NetParameter:
        return _weights.to_proto(self, write_diff)

    def save(self, path, write_diff: bool = False) -> None:
        """Write the parameters as a V2 ``.caffemodel`` that Caffe reads (atomically)."""
        _weights.save(self, path, write_diff)

    def save_hdf5(self, path, write_diff: bool = False) -> None:
        """Write the parameters in Caffe's HDF5 format (``.caffemodel.h5``)."""
        _weights.save_hdf5(self, path, write_diff)

    def load_hdf5(self, path) -> None:
        """Load parameters from Caffe's HDF5 format by layer name (Caffe's CopyTrainedLayersFromHDF5)."""
        _weights.copy_from_hdf5(self, path)

    def __repr__(self) -> str:
        return f"<Net {self.name!r} phase={'TRAIN' if self.phase == TRAIN else 'TEST'} layers={len(self.layers)}>"
