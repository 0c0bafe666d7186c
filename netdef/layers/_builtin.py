"""Imports every built-in layer family so that their types are registered."""
from . import (activation, convolution, data, datasets, dense, loss, lrn, normalization, pooling, python,  # noqa: F401
               recurrent, shape)
