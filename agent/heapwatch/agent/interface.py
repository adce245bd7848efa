"""The agent's one door for the layers above it.

The server, the exporters, the CLI and the public face (``heapwatch/__init__``)
import the agent from here, and its settings from ``heapwatch.agent.config``,
never from its other modules: ``tests/check_layers.py`` fails on any other
import of the agent from above.  The OpenTelemetry SDK keeps its metrics
exporters' code in ``_internal/`` behind ``sdk/metrics/export/__init__.py``,
whose ``__all__`` is all its users see; this module is that ``__all__``.

* What the agent publishes and what its components implement (defined in
  ``heapwatch.agent.contract``): ``Site``, ``CycleResult``, ``CyclePoint``, ``Readings``,
  ``StackPoint``, ``BlackBox``, ``ReadingsSource``, ``site_of`` and the ``<other>`` site's
  name; the ``Component``, ``AgentView``, ``Routes`` and ``Server``
  protocols.  A component gets the agent as an ``AgentView`` (its
  ``start(agent)``) and uses nothing else of it.
* The process's agent (``heapwatch.agent.agent``): ``Agent``,
  ``start_agent``, ``get_agent`` and ``stop_agent``, for whatever starts
  one or reads the running one (``heapwatch.start_agent``,
  ``opentelemetry-instrument``, ``make_wsgi_app()``).  Importing this module
  imports the agent: its users run beside one.

The agent imports neither this module nor its components: it finds them by
name (``heapwatch.agent.plugins``), as the OpenTelemetry SDK loads the
exporters named in ``OTEL_METRICS_EXPORTER``.
"""

from __future__ import annotations

from heapwatch.agent.agent import Agent, get_agent, start_agent, stop_agent
from heapwatch.agent.contract import (
    OTHER_FILE,
    OTHER_LINE,
    AgentView,
    BlackBox,
    Component,
    CyclePoint,
    CycleResult,
    Readings,
    ReadingsSource,
    Routes,
    Server,
    Site,
    StackPoint,
    site_of,
)

__all__ = [
    "OTHER_FILE",
    "OTHER_LINE",
    "Agent",
    "AgentView",
    "BlackBox",
    "Component",
    "CyclePoint",
    "CycleResult",
    "Readings",
    "ReadingsSource",
    "Routes",
    "Server",
    "Site",
    "StackPoint",
    "get_agent",
    "site_of",
    "start_agent",
    "stop_agent",
]
