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
"""
from __future__ import annotations

from typing import Callable

LayerHook = Callable[[int], None]
GradientHook = Callable[[int, list], None]


class NetHooks:
    """The hooks registered on one net, each kind as a list (empty when none)."""

    def __init__(self):
        self._handles: list[tuple] = []  # (before_forward, after_forward, before_backward, after_backward)
        self.before_forward: list[LayerHook] = []
        self.after_forward: list[LayerHook] = []
        self.before_backward: list[LayerHook] = []
        self.after_backward: list[LayerHook] = []
        self.gradients_final: list[GradientHook] = []

    def any(self) -> bool:
        """Whether any hook of any kind is registered."""
        return bool(self._handles or self.gradients_final)

    def add_layer_hooks(self, before_forward=None, after_forward=None, before_backward=None,
                        after_backward=None) -> tuple:
        """Register up to four layer hooks at once; returns the handle that removes them."""
        handle = (before_forward, after_forward, before_backward, after_backward)
        self._handles.append(handle)
        self._sort()
        return handle

    def remove_layer_hooks(self, handle: tuple) -> None:
        self._handles.remove(handle)
        self._sort()

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
