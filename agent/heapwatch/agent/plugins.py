"""Finding the agent's components by name, never by importing them here.

Exporters are plug-ins of the entry-point group ``heapwatch.exporters``
(``HEAPWATCH_EXPORTERS=prometheus,otlp`` names them), as the OpenTelemetry
SDK loads the names in ``OTEL_METRICS_EXPORTER`` from
``opentelemetry_metrics_exporter``: any distribution may register one, and
the agent imports none of them by itself.  An exporter's factory is called
as ``factory(config, **settings)`` with the settings given for its name
(``start_agent(registry=...)`` is Prometheus's, ``meter_provider=``
OpenTelemetry's).

heapwatch's own components in the layers above the agent (the HTTP router and
server, the dump service) are entry points too, of ``heapwatch.components``.
Those are resolved from ``OWN_COMPONENTS``, the same "module:attribute"
names written in code, because reading the installed entry points imports
``importlib.metadata`` (and the email package: tens of milliseconds) on the
start-up path of every agent, including one that serves nothing;
tests/unit/test_agent_plugins.py keeps the table equal to the installed entry points.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["COMPONENTS_GROUP", "EXPORTERS_GROUP", "OWN_COMPONENTS", "component", "exporter"]

EXPORTERS_GROUP = "heapwatch.exporters"
COMPONENTS_GROUP = "heapwatch.components"

OWN_COMPONENTS = {
    "router": "heapwatch.server.router:Router",
    "server": "heapwatch.server.http:Server",
    "dumps": "heapwatch.server.served_dumps:ServedDumpService",
}


def _resolve(value: str) -> Any:
    module_name, _, attribute = value.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def component(name: str) -> Any:
    """heapwatch's own component ``name`` (a key of ``OWN_COMPONENTS``)."""
    return _resolve(OWN_COMPONENTS[name])


def exporter(name: str) -> Any:
    """The factory registered as ``name`` in ``heapwatch.exporters``.

    Raises LookupError when no installed distribution registers it, and
    ImportError when its module (or what it needs) cannot be imported.
    """
    # Imported on first use: only an agent with exporters pays for it.
    from importlib.metadata import entry_points  # noqa: PLC0415

    if sys.version_info >= (3, 10):
        found = list(entry_points(group=EXPORTERS_GROUP, name=name))
    else:  # 3.9: a dict of every group
        found = [ep for ep in entry_points().get(EXPORTERS_GROUP, ()) if ep.name == name]
    if not found:
        raise LookupError(f"no heapwatch exporter named {name!r} is installed")
    return found[0].load()
