"""One registry type for every plug-in family: the names a prototxt, a flag or a user's code uses, each
mapped to the class (or function) that implements it.

The families and where each keeps its registry (each name declared once):

- layer types: ``layers/base.py`` (``@register_layer("ReLU")``; the built-ins loaded by ``layers/_builtin.py``)
- update rules (a solver's ``type``): ``solver/updates.py`` (``@register_update_rule("Adam")``)
- pycaffe's solver classes (``SGDSolver``...): ``solver/solver.py``
- exchange rules: ``comm/exchange.py`` (``@register_exchange("fp16")``; the built-ins loaded by ``comm/_builtin.py``)
- progress drivers: ``comm/progress.py``
- ONNX converters: ``export/onnx/registry.py``

A family whose entries live in other modules gives ``load``: a function that imports them, called once,
on the first question asked of the registry (so importing a family's module has no side effects)::

    LAYER_TYPES = Registry("layer type", load=_load_builtin_layers)

    @LAYER_TYPES.register("ReLU")
    class ReLULayer(Layer): ...

    LAYER_TYPES.get("ReLU")       # ReLULayer
    LAYER_TYPES.get("Relu")       # UnknownNameError: unknown layer type 'Relu' (did you mean 'ReLU' or ...?)
"""
from __future__ import annotations

import difflib
from typing import Callable, Generic, Mapping, TypeVar

Entry = TypeVar("Entry")


class UnknownNameError(KeyError):
    """A name nobody registered. ``kind``, ``name``, ``known`` (every registered name, sorted) and
    ``near`` (the known names close to it, nearest first) let a family word its own message."""

    def __init__(self, kind: str, name: str, known: list[str], near: list[str]):
        if near:
            hint = "did you mean " + " or ".join(repr(n) for n in near) + "?"
        else:
            hint = f"known {kind.split()[-1]}s: {', '.join(known)}"
        super().__init__(f"unknown {kind} {name!r} ({hint})")
        self.kind, self.name, self.known, self.near = kind, name, known, near

    def __str__(self) -> str:  # the message itself, not KeyError's repr of it
        return self.args[0]


class DuplicateNameError(ValueError):
    """A name registered a second time, for something else."""


class Registry(Generic[Entry]):
    """Names of one ``kind`` mapped to their entries (classes or functions). ``kind`` is a singular
    noun whose last word takes an "s" in the list of known names ("layer type", "exchange rule").

    ``entries``: names and entries to start with (a family whose table is one literal).
    ``load``: imports the modules whose decorators register the family's built-in entries."""

    def __init__(self, kind: str, entries: Mapping[str, Entry] | None = None,
                 load: Callable[[], None] | None = None):
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._load = load
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    def add(self, name: str, entry: Entry) -> Entry:
        """Register ``entry`` under ``name``. Registering the same entry again is allowed, and so is
        one of the same qualified name (its module executed again, as a script run as ``__main__``
        that is also imported); anything else under a taken name is a DuplicateNameError."""
        existing = self._entries.get(name)
        if existing is not None and existing is not entry and existing.__qualname__ != entry.__qualname__:
            raise DuplicateNameError(f"{self.kind} {name!r} is already registered to "
                                     f"{existing.__module__}.{existing.__qualname__}")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[Entry], Entry]:
        """Decorator form of ``add``: ``@registry.register("name")``."""
        return lambda entry: self.add(name, entry)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a plug-in withdrawn, a test's temporary entry); unknown names are ignored."""
        self._entries.pop(name, None)

    def get(self, name: str) -> Entry:
        """The entry of ``name``; an UnknownNameError that suggests near names (or lists them all)."""
        self._load_once()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names(), self.near(name)) from None

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load_once()
        return sorted(self._entries)

    def near(self, name: str) -> list[str]:
        """Up to three registered names close to ``name`` ignoring case, nearest first (a typo's
        suggestions)."""
        self._load_once()
        by_lower = {known.lower(): known for known in self._entries}
        return [by_lower[n] for n in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)]

    def __contains__(self, name: str) -> bool:
        self._load_once()
        return name in self._entries

    def __repr__(self) -> str:
        return f"<Registry of {self.kind}s: {', '.join(sorted(self._entries))}>"

    def _load_once(self) -> None:
        load, self._load = self._load, None  # cleared first: the modules it imports register, never ask
        if load is not None:
            try:
                load()
            except BaseException:
                self._load = load
                raise
