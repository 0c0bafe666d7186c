"""The error of a net definition that cannot be built."""
from __future__ import annotations


class NetError(ValueError):
    """A net definition that cannot be built; the message names the file, line, layer and blob.

    ``layer_type``: the type of the layer whose set-up failed (``"Data"`` when its DB is missing),
    None when the fault is not one layer's set-up."""

    def __init__(self, message: str, *, layer_type: str | None = None):
        super().__init__(message)
        self.layer_type = layer_type
