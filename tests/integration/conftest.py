"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import heapwatch
from heapwatch import _core


@pytest.fixture
def no_agent() -> Iterator[None]:
    """No agent and no tracing before the test, and none left after it (the
    tests of an agent in this process)."""
    heapwatch.stop_agent()
    _core.stop()
    yield
    heapwatch.stop_agent()
    _core.stop()
