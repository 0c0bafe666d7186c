"""A net's hooks: what others run around its layers, without the net knowing who they are.

- Layer hooks, ``fn(layer_index)``: before and after each layer's forward and backward (tracing, the
  timings of a distributed iteration, an exchange's progress between layers, the updates that the
  next forward of a layer waits for). A chain of layers run as one step gets every layer's "before"
  hooks before it runs and every "after" hook after it.
- Gradient hooks, ``fn(layer_index, param_ids)``: during backward, each time the gradients of some
  learnable parameters become final (a parameter shared by several layers is final after the last
  of them in backward order, i.e. its first user in definition order); the distributed solver
  starts exchanging those gradients right then.

Hooks of one kind run in the order they were registered.

A hook registered ``at_run_edges`` may also be called at the edges of a stretch of layers replayed
from a CUDA graph (``net_graphs.py``), as it is around a chain: every layer's "before" hooks before
the stretch, its "after" and gradient hooks after it, in the pass's order. The distributed solver's
hooks are such (they hand gradients over, wait for updates, move the exchange along); a hook that
must see each layer run (the timings of ``netdef time`` and of a timeline) is not, and keeps the net
eager. Those who register hooks may also say where stretches must end (``split_runs_at``), so that
what they do between layers still happens part way through a pass: the exchange cuts backward
where its buckets close, so that a bucket leaves while the layers below it still run.
"""
from __future__ import annotations

from typing import Callable

LayerHook = Callable[[int], None]
GradientHook = Callable[[int, list], None]


class NetHooks:
    """The hooks registered on one net, each kind as a list (empty when none)."""

    def __init__(self):
        self._handles: list[tuple] = []  # (before_forward, after_forward, before_backward, after_backward)
        self._each_layer: list = []  # the handles and gradient hooks not called at run edges
        self.before_forward: list[LayerHook] = []
        self.after_forward: list[LayerHook] = []
        self.before_backward: list[LayerHook] = []
        self.after_backward: list[LayerHook] = []
        self.gradients_final: list[GradientHook] = []
        self.run_boundaries: frozenset[int] = frozenset()

    def any(self) -> bool:
        """Whether any hook of any kind is registered."""
        return bool(self._handles or self.gradients_final)

    def need_every_layer(self) -> bool:
        """Whether some registered hook must be called around each layer (not at run edges)."""
        return bool(self._each_layer)

    def add_layer_hooks(self, before_forward=None, after_forward=None, before_backward=None,
                        after_backward=None, at_run_edges: bool = False) -> tuple:
        """Register up to four layer hooks at once; returns the handle that removes them."""
        handle = (before_forward, after_forward, before_backward, after_backward)
        self._handles.append(handle)
        if not at_run_edges:
            self._each_layer.append(handle)
        self._sort()
        return handle

    def remove_layer_hooks(self, handle: tuple) -> None:
        self._handles.remove(handle)
        if handle in self._each_layer:
            self._each_layer.remove(handle)
        self._sort()

    def add_gradient_hook(self, hook: GradientHook, at_run_edges: bool = False) -> None:
        self.gradients_final.append(hook)
        if not at_run_edges:
            self._each_layer.append(hook)

    def remove_gradient_hook(self, hook: GradientHook) -> None:
        self.gradients_final.remove(hook)
        if hook in self._each_layer:
            self._each_layer.remove(hook)

    def split_runs_at(self, boundaries) -> None:
        """Layer indices b such that no stretch replayed as one CUDA graph holds both layer b - 1 and
        layer b (the hooks between them then run between two launches)."""
        self.run_boundaries = frozenset(int(b) for b in boundaries)

    def _sort(self) -> None:
        # New lists, not edited ones: a pass that is calling the old ones goes on with them.
        self.before_forward, self.after_forward, self.before_backward, self.after_backward = (
            [handle[position] for handle in self._handles if handle[position] is not None] for position in range(4))

    @staticmethod
    def call(hooks: list[LayerHook], first: int, last: int) -> None:
        """Each of ``hooks`` for each layer first..last (a chain's layers, all before or after it runs)."""
        for hook in hooks:
            for li in range(first, last + 1):
                hook(li)

    def before_backward_of(self, high: int, low: int) -> None:
        """The "before" hooks of layers high..low, in backward order, before they run as one."""
        for li in range(high, low - 1, -1):
            for before in self.before_backward:
                before(li)

    def after_backward_of(self, li: int, final: list) -> None:
        """What follows layer ``li``'s backward: its "after" hooks, then the gradient hooks of the
        parameters whose gradients are now ``final``."""
        for after in self.after_backward:
            after(li)
        if final:
            for hook in self.gradients_final:
                hook(li, final)
