"""External tools the integration tests run (promtool, prometheus, go, gunicorn...).

A plain module rather than conftest.py: tests/core/ has a conftest.py too, and
``from conftest import ...`` gets whichever of the two pytest imported last.
"""

from __future__ import annotations

import os
import shutil

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
