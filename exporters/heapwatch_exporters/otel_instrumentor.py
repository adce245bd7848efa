"""``opentelemetry-instrument`` support: the ``heapwatch`` instrumentor.

Declared as the ``opentelemetry_instrumentor`` entry point ``heapwatch``, so
``opentelemetry-instrument python app.py`` switches heapwatch on along with
the other instrumentations (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=heapwatch``
leaves it off, and so does ``HEAPWATCH_ENABLED=false``).  Its metrics go
through the MeterProvider the instrumentation was given or the application's
global one, else one built from ``OTEL_*``.  The agent takes its settings from
``HEAPWATCH_*``; without ``HEAPWATCH_EXPORTERS`` it exports to OpenTelemetry
only and opens no port.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from heapwatch.agent.config import AgentConfig
from heapwatch.agent.interface import Agent, get_agent, start_agent, stop_agent
from heapwatch.runtime import route_labels
from heapwatch_exporters.otel import OtelExporter

__all__ = ["HeapwatchInstrumentor"]

log = logging.getLogger("heapwatch.otel")


class HeapwatchInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Starts the heapwatch agent with OpenTelemetry export, or adds
    OpenTelemetry export to the agent already running (auto-started)."""

    _started: Agent | None = None
    _added: tuple[Agent, OtelExporter] | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        meter_provider = kwargs.get("meter_provider")
        agent = get_agent()
        if agent is not None:
            # Auto-started before OpenTelemetry was set up: the spans' routes
            # label allocations from now on, not from the agent's next cycle.
            route_labels.poll()
            if not any(exporter.name == "otlp" for exporter in agent.exporters):
                exporter = OtelExporter(meter_provider=meter_provider)
                if agent.add_exporter(exporter):
                    self._added = (agent, exporter)
            return
        config = AgentConfig.from_env()
        if not config.enabled:
            log.info("HEAPWATCH_ENABLED is false: the heapwatch instrumentor does nothing")
            return
        if os.environ.get("HEAPWATCH_EXPORTERS", "").strip():
            exporters = tuple(dict.fromkeys((*config.exporters, "otlp")))
        else:
            exporters = ("otlp",)
        self._started = start_agent(
            config.replace(exporters=exporters), meter_provider=meter_provider
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        if self._started is not None:
            self._started = None
            stop_agent()
        if self._added is not None:
            agent, exporter = self._added
            self._added = None
            agent.remove_exporter(exporter)
