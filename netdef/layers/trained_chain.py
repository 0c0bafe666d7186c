"""What a chain of layers trained as one step is to the net (net.py runs it; batchnorm_chain.py,
sum_chain.py and relu_chain.py are the kinds).

A chain is layers ``first``..``last`` of a net whose values in between no one can read: the net runs
their forward as one ``forward`` call and, where that ran, their backward as one ``backward`` call,
calling every member's hooks around it. The state ``forward`` keeps for ``backward`` is the chain's;
when the net runs the members one by one instead (a forward range that starts inside the chain,
fusing switched off, arrays the kernels do not take) it calls ``forget``, and backward then goes
layer by layer as well.
"""
from __future__ import annotations

from .activation import ReLULayer
from .reused import ReusedArrays


class TrainedChain:
    """The protocol and the shared bookkeeping; subclasses compute ``forward`` and ``backward``."""

    def __init__(self, first: int, last: int):
        self.first, self.last = first, last
        self._outputs = ReusedArrays()
        self._saved = None  # what forward keeps for backward; None: the members ran one by one

    @property
    def members(self) -> range:
        return range(self.first, self.last + 1)

    @property
    def ran_fused(self) -> bool:
        """Whether the last forward of these layers ran as this chain (so backward must too)."""
        return self._saved is not None

    def forget(self) -> None:
        self._saved = None

    def forward(self, bottom, top) -> bool:
        """The first layer's ``bottom`` blobs to the last layer's ``top`` blobs (the members reshaped
        already); False, with nothing computed, where the kernels do not take the arrays."""
        raise NotImplementedError

    def backward(self, top, bottom, propagate_down) -> None:
        """The gradients of the last layer's ``top`` to the first layer's ``bottom`` (those
        ``propagate_down`` asks for) and to the members' parameters, as the layers would leave them."""
        raise NotImplementedError


def only(blobs, blob) -> bool:
    """Whether ``blobs`` is ``blob`` alone."""
    return len(blobs) == 1 and blobs[0] is blob


def rectifies_in_place(layer, bottom, top, loss_weights, blob) -> bool:
    """Whether ``layer`` is a ReLU with slope >= 0 (its gradient's sign is then its output's) working in
    place on ``blob`` alone, with no loss weight: how the sum and rectified-product chains end."""
    return (isinstance(layer, ReLULayer) and layer.negative_slope >= 0 and only(bottom, blob) and only(top, blob)
            and not any(loss_weights))
