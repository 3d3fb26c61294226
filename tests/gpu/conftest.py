"""Fixtures for device tests: the fake GPU (runs everywhere) and the CUDA skip (needs a GPU)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import fake_device


@pytest.fixture
def fake_gpu() -> Iterator[type[fake_device.FakeGPUProvider]]:
    """The fake device registered as "FakeGPUExecutionProvider" for the test, then removed."""
    fake_device.install()
    try:
        yield fake_device.FakeGPUProvider
    finally:
        fake_device.uninstall()
