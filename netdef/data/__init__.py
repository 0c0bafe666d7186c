"""Data sources, transforms and converters."""
