"""Start-up agreement: every rank of a distributed run checks that the others train the same thing.

Ranks whose solver files differ enter different collectives (a rank with max_iter 100 stops while its
peer with 300 waits for it forever; test_interval 20 against 50 tests at different iterations) or
train to nonsense without a sound (base_lr 0.01 against 1). So before the first collective of the
training, the ranks compare, in groups of named facts:

- ``solver``: every SolverParameter field, defaults included, except those that are a rank's own
  business: ``device_id`` (which GPU this rank drives), ``weights`` (rank 0's fine-tuning weights are
  broadcast to all) and the net fields ``net``, ``train_net``, ``test_net``, ``*_net_param`` (a net
  file may lie at another path on every node: the built nets are compared instead). The
  ``netdef_distributed`` field is compared in ``distributed``, after the command line's overrides.
- ``net``: each net's ``force_backward`` and, for each layer, every field of its LayerParameter that is
  set (and every value of the sub-messages that are set, defaults included), so that ranks differing
  only in a value (an ``lr_mult``, a ``loss_weight``, a transform's ``scale``, a ReLU's slope, a
  ``batch_size``) are refused, not left to train different models; and the shape of every parameter
  blob. Left out, as a rank's own: the files a layer reads or writes on its node (every ``source``,
  ``mean_file``, ``root_folder``, ``file_name``: each rank may read its own shard, from its own paths),
  the data layers' ``prefetch`` depth, and the values stored in the definition (``blobs``: parameters
  are broadcast from rank 0).
- ``distributed``: the exchange options (``ExchangeOptions``, each declared in ``options.py``) as
  given; chunk and credit sizes of 0 mean "measured", and the measurement itself is rank 0's,
  broadcast (``scheduler.choose_sizes``). The timeline path only matters on rank 0, but whether there
  is one decides a collective: only that is compared.
- ``version``: netdef's version.

Cost: one ``allgather`` of a 16-byte digest per group. Only when digests differ does a second
allgather carry the facts of the groups that differ, so that every rank can name the first field in
which some rank differs from rank 0. Every rank then raises the same ``RanksDisagreeError`` at the
same point: no rank is left waiting for another, and no abort is needed.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
from google.protobuf import text_format

from ..proto import netdef_pb2 as pb
from . import options as options_module

_SOLVER_FIELDS_OF_ONE_RANK = frozenset({
    "device_id", "weights", "net", "train_net", "test_net", "net_param", "train_net_param", "test_net_param",
    "netdef_distributed",
})

#: LayerParameter fields (at any depth) that may differ per rank: paths on a node, prefetch depth,
#: stored values (see the module docstring).
_LAYER_FIELDS_OF_ONE_RANK = frozenset({"source", "mean_file", "root_folder", "file_name", "prefetch", "blobs"})

Facts = dict[str, dict[str, str]]  # group -> {field name: value as text}, in a fixed order


class RanksDisagreeError(RuntimeError):
    """The ranks of a distributed run differ in something that must be equal. Raised on every rank at the
    same point, with the same message."""


def _text(value) -> str:
    if isinstance(value, float):
        return str(np.float32(value))  # the fields are float32: 0.01, not 0.009999999776482582
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _field_text(field, value) -> str:
    if field.type == field.TYPE_MESSAGE:
        return text_format.MessageToString(value, as_one_line=True) or "{}"
    if field.enum_type is not None:
        return field.enum_type.values_by_number[value].name
    return _text(value)


def solver_facts(param: pb.SolverParameter) -> dict[str, str]:
    """The SolverParameter fields every rank must share, by name (see the module docstring)."""
    facts = {}
    for field in param.DESCRIPTOR.fields:
        if field.name in _SOLVER_FIELDS_OF_ONE_RANK:
            continue
        value = getattr(param, field.name)
        if field.is_repeated:
            facts[field.name] = "[" + ", ".join(_field_text(field, v) for v in value) + "]"
        else:
            facts[field.name] = _field_text(field, value)
    return facts


def net_facts(label: str, net) -> dict[str, str]:
    """A net's ``force_backward``, its layers' fields and its parameter shapes, keyed by ``label``,
    layer and field path (``train net layer 'relu1' relu_param.negative_slope``)."""
    facts = {f"{label} force_backward": _text(bool(net.force_backward))}
    for layer in net.layers:
        key = f"{label} layer {layer.name!r}"
        _message_facts(layer.layer_param, key + " ", facts)
        for j, blob in enumerate(layer.blobs):
            facts[f"{key} parameter {j} shape"] = str(tuple(int(d) for d in blob.shape))
    return facts


def _message_facts(message, prefix: str, facts: dict[str, str]) -> None:
    """Every field of ``message`` that is not a rank's own, by path: scalars (defaults included) and
    the sub-messages that are set, recursively."""
    for field in message.DESCRIPTOR.fields:
        if field.name in _LAYER_FIELDS_OF_ONE_RANK:
            continue
        value = getattr(message, field.name)
        if field.type != field.TYPE_MESSAGE:
            facts[prefix + field.name] = ("[" + ", ".join(_field_text(field, v) for v in value) + "]"
                                          if field.is_repeated else _field_text(field, value))
        elif field.is_repeated:
            for index, item in enumerate(value):
                _message_facts(item, f"{prefix}{field.name}[{index}].", facts)
        elif message.HasField(field.name):
            _message_facts(value, f"{prefix}{field.name}.", facts)


def distributed_facts(options) -> dict[str, str]:
    """The exchange options every rank must share, as declared in ``options.py``."""
    return {name: _text(value) for name, value in options_module.agreed(options).items()}


def startup_facts(param: pb.SolverParameter, nets, options, version: str) -> Facts:
    """Every group of facts for the start-up check. ``nets``: (label, Net) pairs, train net first."""
    net = {}
    for label, one in nets:
        net.update(net_facts(label, one))
    return {"solver": solver_facts(param), "net": net, "distributed": distributed_facts(options),
            "netdef": {"version": version}}


def _digest(facts: dict[str, str]) -> bytes:
    return hashlib.sha256(json.dumps(list(facts.items())).encode("utf-8")).digest()[:16]


def first_difference(group: str, by_rank: list[dict[str, str]]) -> str:
    """The message naming the first field (in rank 0's order, then the others') where a rank differs
    from rank 0."""
    names = list(by_rank[0])
    for facts in by_rank[1:]:
        names += [name for name in facts if name not in by_rank[0] and name not in names]
    absent = "nothing"
    for name in names:
        reference = by_rank[0].get(name, absent)
        others = [(rank, facts.get(name, absent)) for rank, facts in enumerate(by_rank) if rank
                  and facts.get(name, absent) != reference]
        if others:
            rank, value = others[0]
            more = f" (and {len(others) - 1} more rank(s) differ from rank 0)" if len(others) > 1 else ""
            return f"ranks disagree on {group} {name}: rank 0 has {reference}, rank {rank} has {value}{more}"
    return f"ranks disagree on {group}"  # digests differ but the facts read alike: cannot happen


def agree(comm, facts: Facts) -> None:
    """Raise RanksDisagreeError on every rank when some rank's ``facts`` differ from rank 0's (a
    collective call: every rank must make it, with the same groups)."""
    if comm.size == 1:
        return
    groups = list(facts)
    gathered = comm.allgather_bytes(b"".join(_digest(facts[g]) for g in groups))
    differing = [k for k, _ in enumerate(groups) if len({d[16 * k:16 * (k + 1)] for d in gathered}) > 1]
    if not differing:
        return
    # Every rank saw the same digests, so every rank makes this second call, for the same group.
    group = groups[differing[0]]
    details = comm.allgather_bytes(json.dumps(list(facts[group].items())).encode("utf-8"))
    raise RanksDisagreeError(first_difference(group, [dict(json.loads(d.decode("utf-8"))) for d in details]))
