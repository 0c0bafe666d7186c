"""Layer families; see base.py for the contract every layer implements."""
from .base import TRAIN, TEST, Layer, LayerError, layer_class, register_layer, registered_types

__all__ = ["TRAIN", "TEST", "Layer", "LayerError", "layer_class", "register_layer", "registered_types"]
