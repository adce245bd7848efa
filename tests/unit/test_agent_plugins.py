"""The agent finds its components by name (heapwatch.agent.plugins)."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from typing import Any

import pytest

from heapwatch.agent import plugins
from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig


def installed(group: str) -> dict[str, str]:
    if sys.version_info >= (3, 10):
        found: Any = entry_points(group=group)
    else:
        found = entry_points().get(group, ())
    return {ep.name: ep.value for ep in found}


def test_own_components_are_the_installed_entry_points() -> None:
    # The table the agent reads at start-up says what the metadata says.
    assert installed(plugins.COMPONENTS_GROUP) == plugins.OWN_COMPONENTS


def test_exporters_are_entry_points() -> None:
    assert set(installed(plugins.EXPORTERS_GROUP)) >= {"prometheus", "otlp"}
    from heapwatch_exporters.prometheus import PrometheusExporter

    exporter = plugins.exporter("prometheus")(AgentConfig(), registry=None)
    assert isinstance(exporter, PrometheusExporter)


def test_an_unknown_exporter_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match="no heapwatch exporter named 'nope'"):
        plugins.exporter("nope")


def test_the_agent_builds_named_exporters_then_the_dump_service() -> None:
    from heapwatch.server.served_dumps import ServedDumpService
    from heapwatch_exporters.prometheus import PrometheusExporter

    registry: Any = object()
    agent = Agent(
        AgentConfig(exporters=("prometheus",)),
        exporter_settings={"prometheus": {"registry": registry}},
    )
    prometheus, dumps = agent.exporters
    assert isinstance(prometheus, PrometheusExporter)
    assert prometheus._given_registry is registry
    assert isinstance(dumps, ServedDumpService)


def test_the_agent_imports_no_component_by_itself() -> None:
    # The agent layer names the components, never imports them (tools/check_layers.py
    # checks the imports; here, the names resolve to the layer above).
    for value in plugins.OWN_COMPONENTS.values():
        assert value.startswith("heapwatch.server.")
