"""Shared fixtures: external tools, and the suite's two tracemalloc implementations."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from types import ModuleType

import pytest


def require_tool(name: str) -> str:
    """Path of an external tool, or skip; with HEAPWATCH_REQUIRE_TOOLS=1 a
    missing tool fails the test instead (make ci sets it)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian: make ci-tools installs it)"
        if os.environ.get("HEAPWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(message + "; HEAPWATCH_REQUIRE_TOOLS=1 forbids skipping")
        pytest.skip(message)
    return path


def _stop(module: ModuleType) -> None:
    if module.is_tracing():
        module.stop()


@pytest.fixture(params=["stdlib", "heapwatch"])
def tm(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """The stdlib tracemalloc module, then heapwatch.tracemalloc: the same test
    runs against both, as markupsafe runs its suite against its two twins."""
    if request.param == "stdlib":
        import tracemalloc as module
    else:
        from heapwatch import tracemalloc as module  # type: ignore[no-redef]
    _stop(module)
    try:
        yield module
    finally:
        _stop(module)
