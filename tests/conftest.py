"""Fixtures shared across the test modules."""
from __future__ import annotations

import pytest

from tests.helpers import gpu_settings


@pytest.fixture
def on_gpu():
    """New blobs on GPU 0 for the test (``helpers.gpu_settings``); the GPU modules skip without one
    (``helpers.skip_without_gpu``, ``skip_without_cudnn``)."""
    with gpu_settings():
        yield
