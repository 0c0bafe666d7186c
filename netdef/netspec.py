"""Nets written in Python: pycaffe's ``NetSpec``, ``layers`` (``L``) and ``params`` (``P``).

    from netdef import layers as L, params as P
    n = netdef.NetSpec()
    n.data, n.label = L.Data(source="train_lmdb", backend=P.Data.LMDB, batch_size=64, ntop=2,
                             transform_param=dict(scale=1 / 256))
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"),
                            param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.relu1 = L.ReLU(n.pool1, in_place=True)
    n.loss = L.SoftmaxWithLoss(n.relu1, n.label)
    text = str(n.to_proto())                  # a NetParameter; str() is its prototxt

``L.<Type>(*bottoms, **fields)`` is one layer of that type. Each keyword is a field of
LayerParameter (``name``, ``param``, ``include``, ``loss_weight``, ``transform_param``, any
``*_param``...) or else a field of the type's own parameter message (``convolution_param`` for
Convolution and Deconvolution, ``recurrent_param`` for RNN and LSTM, ``<type>_param`` otherwise).
Values are numbers, strings, enum values or enum names, dicts for messages (nested as deep as the
message is), and lists for repeated fields (a single value for a repeated field is one element).
Three keywords are the spec's own: ``ntop`` (how many tops; 0 gives the layer itself, several a
tuple), ``in_place`` (the top is the first bottom's blob) and ``name`` (the layer's name).

Names: a top assigned to a NetSpec attribute is named after it; a layer is named after its first
top (or by ``name=``); anything left unnamed is ``<type><k>`` (``Convolution1``). ``to_proto()``
lists the layers in the order their tops were assigned, each after the layers it reads from.
"""
from __future__ import annotations

import collections

from .proto import netdef_pb2 as pb

# Types whose parameters live in a message that is not named after them.
_SHARED_PARAM_FIELDS = {"Deconvolution": "convolution_param", "RNN": "recurrent_param", "LSTM": "recurrent_param"}


def _type_param_fields() -> dict[str, str]:
    """{layer type: its parameter field}: ``ConvolutionParameter convolution_param`` gives Convolution."""
    fields = {}
    for field in pb.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name[:-len("Parameter")]
            fields.setdefault(type_name, field.name)
    fields.update(_SHARED_PARAM_FIELDS)
    return fields


_PARAM_FIELD_OF_TYPE = _type_param_fields()


class NetSpecError(ValueError):
    """A NetSpec that does not make a NetParameter (an unknown field, a value of the wrong kind)."""


# ============================================================================================ assigning values
def _scalar(field, value, where: str):
    if field.enum_type is not None and isinstance(value, str):
        try:
            return field.enum_type.values_by_name[value].number
        except KeyError:
            choices = ", ".join(v.name for v in field.enum_type.values)
            raise NetSpecError(f"{where}: {value!r} is not a value of {field.enum_type.name} ({choices})") from None
    return value


def fill_message(message, values: dict, where: str) -> None:
    """Set ``message``'s fields from ``values`` (nested dicts for messages, lists for repeated fields)."""
    for name, value in values.items():
        assign_field(message, name, value, where)


def assign_field(message, name: str, value, where: str) -> None:
    """Set one field of ``message`` (see the module docstring for the kinds of values)."""
    field = message.DESCRIPTOR.fields_by_name.get(name)
    if field is None:
        raise NetSpecError(f"{where}: {message.DESCRIPTOR.name} has no field {name!r}")
    inner = f"{where}.{name}"
    is_message = field.message_type is not None
    try:
        if field.is_repeated:
            items = list(value) if isinstance(value, (list, tuple)) else [value]
            target = getattr(message, name)
            for item in items:
                if is_message:
                    fill_message(target.add(), _as_dict(item, inner), inner)
                else:
                    target.append(_scalar(field, item, inner))
        elif is_message:
            fill_message(getattr(message, name), _as_dict(value, inner), inner)
        else:
            setattr(message, name, _scalar(field, value, inner))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, NetSpecError):
            raise
        raise NetSpecError(f"{inner}: {value!r} does not fit ({exc})") from None


def _as_dict(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise NetSpecError(f"{where}: a message is given as a dict, not {type(value).__name__} {value!r}")
    return value


# ============================================================================================ the graph
class Top:
    """One output of a layer (``fn``'s ``index``-th top): the value of ``L.<Type>(...)``."""

    def __init__(self, fn: "Function", index: int):
        self.fn = fn
        self.index = index

    def to_proto(self) -> pb.NetParameter:
        """A NetParameter of the layers this top needs."""
        return to_proto(self)


class Function:
    """One layer of the spec: its type, bottoms (Tops) and fields."""

    def __init__(self, type_name: str, inputs, params: dict):
        self.type_name = type_name
        self.inputs = tuple(inputs)
        for i, item in enumerate(self.inputs):
            if not isinstance(item, Top):
                raise NetSpecError(f"L.{type_name}: bottom #{i} is a {type(item).__name__}, not a layer's top")
        params = dict(params)
        self.ntop = int(params.pop("ntop", 1))
        self.in_place = bool(params.pop("in_place", False))
        self.name = params.pop("name", None)
        if self.in_place and not self.inputs:
            raise NetSpecError(f"L.{type_name}: in_place needs a bottom")
        self.params = params
        self.tops = tuple(Top(self, i) for i in range(self.ntop))

    @staticmethod
    def _label(top: Top, names: dict, autonames: collections.Counter) -> str:
        """The NetSpec attribute name of ``top``, or an automatic one (``<type><k>``)."""
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = f"{top.fn.type_name}{autonames[top.fn.type_name]}"
        return names[top]

    @classmethod
    def _blob_name(cls, top: Top, names: dict, autonames: collections.Counter) -> str:
        """The blob ``top`` is: an in-place layer's top is its bottom's blob, whatever it was assigned to."""
        while top.fn.in_place:
            top = top.fn.inputs[0]
        return cls._label(top, names, autonames)

    def _layer_name(self, names: dict, autonames: collections.Counter) -> str:
        if self.name is not None:
            return self.name
        if self.ntop:
            return self._label(self.tops[0], names, autonames)
        autonames[self.type_name] += 1
        return f"{self.type_name}{autonames[self.type_name]}"

    def _to_proto(self, built: dict, names: dict, autonames: collections.Counter) -> None:
        if self in built:
            return
        for top in self.inputs:
            top.fn._to_proto(built, names, autonames)
        layer = pb.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(self._blob_name(top, names, autonames) for top in self.inputs)
        # The layer's own name is taken first, so that an unnamed layer's tops number after it.
        layer.name = self._layer_name(names, autonames)
        layer.top.extend(self._blob_name(top, names, autonames) for top in self.tops)
        where = f"L.{self.type_name} {layer.name!r}"
        own_field = _PARAM_FIELD_OF_TYPE.get(self.type_name)
        for key, value in self.params.items():
            if key in pb.LayerParameter.DESCRIPTOR.fields_by_name:
                assign_field(layer, key, value, where)
            elif own_field is not None:
                assign_field(getattr(layer, own_field), key, value, f"{where} {own_field}")
            else:
                raise NetSpecError(f"{where}: {key!r} is not a LayerParameter field, and type {self.type_name!r} has "
                                   f"no parameter message of its own; name the message (e.g. python_param=dict(...))")
        built[self] = layer


def to_proto(*tops: Top) -> pb.NetParameter:
    """A NetParameter of the layers that ``tops`` need (unnamed tops get automatic names)."""
    built: dict = collections.OrderedDict()
    names: dict = {}
    autonames: collections.Counter = collections.Counter()
    for top in tops:
        top.fn._to_proto(built, names, autonames)
    net = pb.NetParameter()
    net.layer.extend(built.values())
    return net


class NetSpec:
    """Tops assigned as attributes, in order; ``to_proto()`` makes the NetParameter (module docstring)."""

    def __init__(self):
        super().__setattr__("tops", collections.OrderedDict())

    def __setattr__(self, name: str, value) -> None:
        if not isinstance(value, Top):
            raise NetSpecError(f"NetSpec.{name}: assign a layer's top (L.<Type>(...)), not {type(value).__name__}")
        self.tops[name] = value

    def __getattr__(self, name: str) -> Top:
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top {name!r}") from None

    __setitem__ = __setattr__

    def __getitem__(self, name: str) -> Top:
        return self.__getattr__(name)

    def __delattr__(self, name: str) -> None:
        del self.tops[name]

    def keys(self) -> list[str]:
        return list(self.tops)

    def to_proto(self) -> pb.NetParameter:
        names = {top: name for name, top in self.tops.items()}
        built: dict = collections.OrderedDict()
        autonames: collections.Counter = collections.Counter()
        for top in self.tops.values():
            top.fn._to_proto(built, names, autonames)
        net = pb.NetParameter()
        net.layer.extend(built.values())
        return net


class _Layers:
    """``L.<Type>(*bottoms, **fields)``: the top (ntop=1), the tops (ntop>1) or the layer (ntop=0)."""

    def __getattr__(self, type_name: str):
        if type_name.startswith("__"):
            raise AttributeError(type_name)

        def make(*bottoms, **fields):
            fn = Function(type_name, bottoms, fields)
            if fn.ntop == 0:
                return fn
            return fn.tops[0] if fn.ntop == 1 else fn.tops

        return make


class _EnumValues:
    """``P.Pooling.MAX``: the enum values of ``PoolingParameter``."""

    def __init__(self, message_name: str):
        self._message = getattr(pb, message_name)

    def __getattr__(self, value_name: str) -> int:
        if value_name.startswith("__"):
            raise AttributeError(value_name)
        for enum in self._message.DESCRIPTOR.enum_types:
            if value_name in enum.values_by_name:
                return enum.values_by_name[value_name].number
        raise AttributeError(f"{self._message.DESCRIPTOR.name} has no enum value {value_name!r}")


class _Params:
    def __getattr__(self, type_name: str) -> _EnumValues:
        if type_name.startswith("__"):
            raise AttributeError(type_name)
        message = f"{type_name}Parameter"
        if not hasattr(pb, message):
            raise AttributeError(f"no parameter message {message!r} for P.{type_name}")
        return _EnumValues(message)


layers = _Layers()
params = _Params()
