"""Shared fixtures: the suite's two tracemalloc implementations.

Helpers that test modules import live in the ``support`` package
(tests/support/): ``from conftest import`` is ambiguous beside tests/core/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest


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
