"""A net's per-layer compute profile: what ``netdef time --json`` writes and ``netdef simulate`` reads.

The file is JSON (``FORMAT``)::

    {"format": "netdef-time-1", "model": "...", "phase": "TRAIN", "batch": 64, "iterations": 20,
     "layers": [{"name": "conv1", "type": "Convolution", "forward_ms": 3.1, "backward_ms": 6.0,
                 "uses": [0, 1], "final": [0, 1]}, ...],
     "params": [{"name": "conv1_w", "shape": [20, 1, 5, 5], "bytes": 2000}, ...]}

``layers`` are in forward (definition) order; ``uses`` are the indices into ``params`` of the
learnable parameters the layer uses, ``final`` those whose gradient is final once the layer has run
backward (what the net's backward hooks hand to the exchange after it). A profile for a GPU can be
written by hand in the same format, or a CPU profile rescaled (``scaled``).
"""
from __future__ import annotations

import dataclasses
import json

FORMAT = "netdef-time-1"


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class LayerTimes:
    name: str
    type: str
    forward_s: float
    backward_s: float
    uses: tuple[int, ...]
    final: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    name: str
    shape: tuple[int, ...]
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Profile:
    layers: tuple[LayerTimes, ...]
    params: tuple[ParamInfo, ...]
    model: str = ""
    batch: int = 0

    @property
    def forward_s(self) -> float:
        return sum(layer.forward_s for layer in self.layers)

    @property
    def backward_s(self) -> float:
        return sum(layer.backward_s for layer in self.layers)

    @property
    def gradient_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    def scaled(self, factor: float) -> "Profile":
        """Every layer's times multiplied by ``factor`` (a faster or slower device, same shape)."""
        if not factor > 0:
            raise ProfileError(f"compute scale must be positive, got {factor}")
        layers = tuple(dataclasses.replace(layer, forward_s=layer.forward_s * factor,
                                           backward_s=layer.backward_s * factor) for layer in self.layers)
        return dataclasses.replace(self, layers=layers)

    def to_dict(self, **extra) -> dict:
        return {"format": FORMAT, "model": self.model, "batch": self.batch, **extra,
                "layers": [{"name": layer.name, "type": layer.type, "forward_ms": layer.forward_s * 1e3,
                            "backward_ms": layer.backward_s * 1e3, "uses": list(layer.uses),
                            "final": list(layer.final)} for layer in self.layers],
                "params": [{"name": p.name, "shape": list(p.shape), "bytes": p.nbytes} for p in self.params]}


def profile_of(net, forward_ms, backward_ms, model: str = "") -> Profile:
    """The profile of a built Net from per-layer mean times (ms, by layer index)."""
    names: dict[int, str] = {}
    for li, layer in enumerate(net.layers):
        for j, pid in enumerate(net.layer_learnable_ids(li)):
            names.setdefault(pid, f"{layer.name}[{j}]")
    params = tuple(ParamInfo(blob.name or names.get(i, f"param{i}"), tuple(int(d) for d in blob.shape),
                             int(blob.count) * blob.data.dtype.itemsize)
                   for i, blob in enumerate(net.learnable_params))
    layers = tuple(LayerTimes(layer.name, layer.layer_param.type, forward_ms[li] / 1e3, backward_ms[li] / 1e3,
                              tuple(net.layer_learnable_ids(li)), tuple(net.gradients_final_at(li)))
                   for li, layer in enumerate(net.layers))
    first_tops = [blob for blob in net.blobs.values() if len(blob.shape)]
    batch = int(first_tops[0].shape[0]) if first_tops else 0
    return Profile(layers, params, model, batch)


def write_profile(profile: Profile, path: str, **extra) -> None:
    with open(path, "w") as f:
        json.dump(profile.to_dict(**extra), f, indent=1)
        f.write("\n")


def load_profile(path: str) -> Profile:
    """Read and check a profile file (see the module docstring)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ProfileError(f"profile {path}: {reason}") from None
    if not isinstance(doc, dict):
        raise ProfileError(f"{path}: expected a JSON object with 'layers' and 'params'")
    if doc.get("format", FORMAT) != FORMAT:
        raise ProfileError(f"{path}: format {doc.get('format')!r} is not {FORMAT!r}")
    params = tuple(_param(path, i, p) for i, p in enumerate(_list(path, doc, "params")))
    layers = tuple(_layer(path, i, entry, len(params)) for i, entry in enumerate(_list(path, doc, "layers")))
    if not layers:
        raise ProfileError(f"{path}: 'layers' is empty")
    return Profile(layers, params, str(doc.get("model", "")), int(_number(path, "batch", doc.get("batch", 0))))


def _list(path: str, doc: dict, key: str) -> list:
    value = doc.get(key)
    if not isinstance(value, list):
        raise ProfileError(f"{path}: '{key}' must be a list")
    return value


def _number(path: str, where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ProfileError(f"{path}: {where} must be a number >= 0, got {value!r}")
    return float(value)


def _param(path: str, index: int, entry) -> ParamInfo:
    where = f"params[{index}]"
    if not isinstance(entry, dict):
        raise ProfileError(f"{path}: {where} must be an object")
    nbytes = _number(path, f"{where}.bytes", entry.get("bytes"))
    return ParamInfo(str(entry.get("name", f"param{index}")), tuple(int(d) for d in entry.get("shape", ())),
                     int(nbytes))


def _layer(path: str, index: int, entry, n_params: int) -> LayerTimes:
    where = f"layers[{index}]"
    if not isinstance(entry, dict):
        raise ProfileError(f"{path}: {where} must be an object")
    ids = {}
    for key in ("uses", "final"):
        value = entry.get(key, [])
        if not isinstance(value, list) or not all(isinstance(i, int) and 0 <= i < n_params for i in value):
            raise ProfileError(f"{path}: {where}.{key} must list indices into 'params' (0..{n_params - 1})")
        ids[key] = tuple(value)
    return LayerTimes(str(entry.get("name", f"layer{index}")), str(entry.get("type", "")),
                      _number(path, f"{where}.forward_ms", entry.get("forward_ms")) / 1e3,
                      _number(path, f"{where}.backward_ms", entry.get("backward_ms")) / 1e3,
                      ids["uses"], ids["final"])
