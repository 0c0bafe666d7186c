"""Imports every built-in layer family so that their types are registered."""
from . import activation, data, datasets, dense, loss, lrn, normalization, pooling, python, recurrent, shape, vision  # noqa: F401
