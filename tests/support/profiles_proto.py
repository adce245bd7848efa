"""opentelemetry-proto's profiles classes, or a skip of the calling module.

heapwatch writes proto v1.10.0's profiles (opentelemetry-proto 1.45.0 on): an
older release numbers the sample's fields otherwise, and 1.45.0 needs Python
3.10 (requirements-dev.txt)."""

from __future__ import annotations

import importlib.metadata
from types import ModuleType

import pytest

__all__ = ["profiles_service_pb2"]


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())


def profiles_service_pb2() -> ModuleType:
    """The request's module; skips the calling test module when the installed
    opentelemetry-proto cannot decode what heapwatch writes."""
    try:
        release = importlib.metadata.version("opentelemetry-proto")
    except importlib.metadata.PackageNotFoundError:
        release = "0"
    if _version_tuple(release) < (1, 45):
        pytest.skip(
            "decoding needs opentelemetry-proto 1.45.0 or newer (proto v1.10.0), "
            "which needs Python 3.10",
            allow_module_level=True,
        )
    return pytest.importorskip(
        "opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2"
    )
