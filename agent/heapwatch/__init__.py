"""heapwatch: an always-on memory monitor for Python services.

``heapwatch.tracemalloc`` is a drop-in for the stdlib module, backed by
heapwatch's own allocator hooks.  The agent (``start_agent``) publishes what it
sees to Prometheus and OpenTelemetry.
"""

# No ``from __future__ import annotations`` here: Python 3.6 does not know it,
# and must get _check_interpreter's ImportError rather than a SyntaxError.
from heapwatch._interpreter import check as _check_interpreter

_check_interpreter()

from heapwatch._errors import HeapwatchError  # noqa: E402
from heapwatch._version import __version__  # noqa: E402

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any

    from heapwatch.agent.config import AgentConfig, ConfigError
    from heapwatch.agent.interface import (
        Agent,
        CycleResult,
        Site,
        get_agent,
        start_agent,
        stop_agent,
    )

__all__ = [
    "Agent",
    "AgentConfig",
    "ConfigError",
    "CycleResult",
    "HeapwatchError",
    "Site",
    "__version__",
    "get_agent",
    "start_agent",
    "stop_agent",
]

# Imported on first use, so that ``import heapwatch`` (and the auto-start
# hook when it is off) stays light; from the agent's front door, as every
# layer above the agent imports it.
_LAZY = {
    "Agent": "heapwatch.agent.interface",
    "CycleResult": "heapwatch.agent.interface",
    "Site": "heapwatch.agent.interface",
    "get_agent": "heapwatch.agent.interface",
    "start_agent": "heapwatch.agent.interface",
    "stop_agent": "heapwatch.agent.interface",
    "AgentConfig": "heapwatch.agent.config",
    "ConfigError": "heapwatch.agent.config",
}


def __getattr__(name: str) -> "Any":
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'heapwatch' has no attribute {name!r}")
    import importlib  # noqa: PLC0415 (imported on first use)

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> "list[str]":
    return sorted(set(globals()) | set(__all__))
