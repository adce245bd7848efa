"""heapwatch's public agent API: names, laziness."""

from __future__ import annotations

import os
import subprocess
import sys

import heapwatch

AGENT_NAMES = {
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
}


def test_the_agent_api_is_public() -> None:
    assert set(heapwatch.__all__) >= AGENT_NAMES
    for name in AGENT_NAMES:
        assert getattr(heapwatch, name) is not None
    assert set(dir(heapwatch)) >= AGENT_NAMES
    from heapwatch.agent import agent, config, interface

    assert heapwatch.start_agent is agent.start_agent
    assert heapwatch.AgentConfig is config.AgentConfig
    assert heapwatch.Site is interface.Site
    assert issubclass(heapwatch.ConfigError, heapwatch.HeapwatchError)


def test_unknown_attributes_raise_attribute_error() -> None:
    try:
        heapwatch.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as error:
        assert "no_such_thing" in str(error)
    else:
        raise AssertionError("no AttributeError")


def test_import_heapwatch_stays_light() -> None:
    # Given a fresh interpreter, importing heapwatch loads no agent, core or exporter
    code = (
        "import sys, heapwatch\n"
        "print(sorted(m for m in sys.modules if m.startswith(('heapwatch', 'prometheus', "
        "'opentelemetry'))))\n"
        "print('threading' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    modules, threading = done.stdout.splitlines()
    for heavy in ("heapwatch.agent.agent", "heapwatch._core", "prometheus_client", "opentelemetry"):
        assert heavy not in modules
    assert threading == "False"


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HEAPWATCH_")}
    done = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))\n"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    return set(done.stdout.split())


def test_an_agent_that_serves_nothing_starts_light() -> None:
    # Every process started with HEAPWATCH_ENABLED pays for what the agent
    # imports, a service's short-lived children included.
    # Given a fresh interpreter whose agent has no exporter and no token
    modules = _modules_after(
        "import heapwatch\n"
        "agent = heapwatch.start_agent(exporters='none')\n"
        "assert agent is not None and agent.running\n"
    )
    # Then it imports neither the routes, the formats, the drop-in nor what
    # they need, beyond what the modules an agent needs import on this Python
    # (logging imports dataclasses on 3.14+, through traceback's colours)
    needed = _modules_after("import logging, threading, typing")
    heavy = {
        "heapwatch.server.debug_routes",
        "heapwatch.formats.dump",
        "heapwatch.formats.pprof",
        "heapwatch.tracemalloc",
        "dataclasses",
        "hmac",
        "json",
        "socket",
        "urllib.parse",
    }
    assert modules & heavy - needed == set()
    assert "heapwatch.server.debug_routes" not in needed
