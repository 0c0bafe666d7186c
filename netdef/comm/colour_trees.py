"""Where each rank sits in the multicolour allreduce's trees (``multicolor.py``, and over NCCL
``nccl_trees.py``): k colours, colour c's tree rooted at rank ``c * size // k``, a rank's position in
it ``(rank - root) % size``, the positions a binary heap (position p's parent is ``(p - 1) // 2``).
"""
from __future__ import annotations

DEFAULT_MAX_COLOURS = 4


def default_colours(size: int) -> int:
    """k for ``size`` ranks when the user did not choose (why: ``multicolor.py``'s docstring)."""
    return max(1, min(size, DEFAULT_MAX_COLOURS))


def colour_count(size: int, requested: int) -> int:
    """The k a run uses: ``requested`` (0: the default), at most one tree per rank."""
    return default_colours(size) if requested <= 0 else min(int(requested), size)


def colour_roots(size: int, colours: int) -> list[int]:
    """The root of each colour's tree, spread evenly over the ranks (distinct while colours <= size)."""
    return [c * size // colours for c in range(colours)]


def tree_parents(size: int, root: int) -> list[int]:
    """The parent of every rank in the binary tree rooted at ``root`` (-1 for the root)."""
    parents = []
    for rank in range(size):
        position = (rank - root) % size
        parents.append(-1 if position == 0 else (root + (position - 1) // 2) % size)
    return parents


class TreeLinks:
    """One rank's place in one colour's tree: its ``parent`` (-1 at the root) and its ``children`` in
    the order their partial sums are added."""

    __slots__ = ("parent", "children")

    def __init__(self, size: int, root: int, rank: int):
        parents = tree_parents(size, root)
        self.parent = parents[rank]
        self.children = sorted((r for r in range(size) if parents[r] == rank), key=lambda r: (r - root) % size)


def describe_trees(size: int, colours: int) -> str:
    """The trees of ``colours`` colours over ``size`` ranks, for the log ("2 colours, binary trees rooted
    at ranks 0, 2")."""
    roots = ", ".join(str(r) for r in colour_roots(size, colours))
    if colours == 1:
        return f"1 colour, a binary tree rooted at rank {roots}"
    return f"{colours} colours, binary trees rooted at ranks {roots}"


def heap_depth(position: int) -> int:
    """How many links separate heap position ``position`` from the root (0 at the root)."""
    return (position + 1).bit_length() - 1
