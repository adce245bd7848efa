"""The Prometheus exporter: a custom collector over the agent's last cycle.

``HeapwatchCollector`` is in the mould of prometheus-client's ``GCCollector``:
``collect()`` turns the agent's ``Readings`` into metric families and
``describe()`` lists them without reading anything, so registering costs
nothing.  Neither takes a snapshot: the agent's thread does, every interval.

The agent serves heapwatch's own registry (this collector and the
``process_*`` series of ``heapwatch_exporters.process_collector``) at ``/metrics`` on its endpoint;
``make_wsgi_app()`` and ``make_asgi_app()`` mount the same output in an
existing application, and ``HeapwatchCollector(registry=REGISTRY)`` adds the
heapwatch series to an application's own registry.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Callable

from prometheus_client import CollectorRegistry
from prometheus_client import make_asgi_app as _make_asgi_app
from prometheus_client import make_wsgi_app as _make_wsgi_app
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from heapwatch._version import __version__
from heapwatch.agent.config import AgentConfig
from heapwatch.agent.interface import Agent, AgentView, Readings, ReadingsSource, get_agent
from heapwatch_exporters._catalogue import CATALOGUE, LABEL_FILE, LABEL_LINE
from heapwatch_exporters._catalogue import Metric as CatalogueMetric
from heapwatch_exporters.process_collector import ProcessCollector

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "HeapwatchCollector",
    "PrometheusExporter",
    "make_asgi_app",
    "make_wsgi_app",
]

log = logging.getLogger("heapwatch.prometheus")


def _running_agent_readings() -> Readings | None:
    agent = get_agent()
    return agent.readings() if agent is not None else None


class HeapwatchCollector(Collector):
    """Collects heapwatch's metrics from the agent's last cycle.

    Args:
        source: returns the readings to publish, or None for none; by default
            those of the agent ``start_agent`` started.
        registry: registers the collector there when given.
        python_version: for ``heapwatch_info``; this interpreter's by default.
    """

    def __init__(
        self,
        source: ReadingsSource | None = None,
        registry: CollectorRegistry | None = None,
        python_version: str | None = None,
    ) -> None:
        self._source = source if source is not None else _running_agent_readings
        self._python_version = python_version or "{}.{}.{}".format(*sys.version_info[:3])
        if registry is not None:
            registry.register(self)

    def describe(self) -> Iterable[Metric]:
        families = [_family(metric) for metric in CATALOGUE]
        families.append(InfoMetricFamily("heapwatch", _INFO_HELP))
        return families

    def collect(self) -> Iterable[Metric]:
        try:
            readings = self._source()
        except Exception:
            # A scrape must not fail because of heapwatch.
            log.exception("heapwatch readings unavailable")
            return []
        if readings is None:
            return []
        return list(self._families(readings))

    def _families(self, readings: Readings) -> Iterator[Metric]:
        yield InfoMetricFamily(
            "heapwatch",
            _INFO_HELP,
            value={
                "version": __version__,
                "mode": readings.mode,
                "python_version": self._python_version,
                "native_heap": readings.native_heap,
            },
        )
        result = readings.result
        for metric in CATALOGUE:
            family = _family(metric)
            if metric.site_value is not None:
                if result is None:
                    continue
                for site in result.sites:
                    figure = metric.site_value(site)
                    if figure is not None:
                        family.add_metric([site.file, str(site.line)], figure)
            elif metric.series is not None:
                series = metric.series(readings)
                if series is None:
                    continue
                for key, figure in series.items():
                    family.add_metric([str(part) for part in key], figure)
            elif metric.value is not None:
                value = metric.value(readings)
                if value is None:
                    continue
                family.add_metric([], value)
            yield family


_INFO_HELP = (
    "heapwatch's version, tracing mode, Python version and where the C heap's split "
    'comes from (native_heap="mallinfo2" or "unavailable"); value 1.'
)


def _family(metric: CatalogueMetric) -> Any:
    if metric.site_value is not None:
        labels = [LABEL_FILE, LABEL_LINE]
    else:
        labels = list(metric.series_labels)
    if metric.kind == "counter":
        return CounterMetricFamily(
            metric.prometheus_name, metric.description, labels=labels, unit=metric.prometheus_unit
        )
    return GaugeMetricFamily(
        metric.prometheus_name, metric.description, labels=labels, unit=metric.prometheus_unit
    )


class PrometheusExporter:
    """Publishes the agent's readings to a registry served at ``/metrics``.

    Args:
        registry: where to register; by default heapwatch's own registry,
            which also gets the process's own series
            (``process_resident_memory_bytes``, ...).
    """

    name = "prometheus"

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._given_registry = registry
        self.registry: CollectorRegistry | None = None
        self._collector: HeapwatchCollector | None = None

    @classmethod
    def from_config(
        cls, config: AgentConfig, *, registry: CollectorRegistry | None = None
    ) -> PrometheusExporter:
        """The exporter the agent builds for ``HEAPWATCH_EXPORTERS=prometheus``
        (the entry point ``heapwatch.exporters: prometheus``)."""
        return cls(registry=registry)

    def start(self, agent: AgentView) -> None:
        if self.registry is None:
            registry = self._given_registry
            if registry is None:
                registry = CollectorRegistry()
                ProcessCollector(registry=registry)
            self._collector = HeapwatchCollector(source=agent.readings, registry=registry)
            self.registry = registry
            _registries[agent] = registry
        agent.router.add("/metrics", _make_wsgi_app(self.registry))

    def shutdown(self, timeout: float) -> None:
        # Leave an application's registry as it was, so that another agent
        # can register there later.
        if self._given_registry is not None and self._collector is not None:
            with contextlib.suppress(KeyError):
                self._given_registry.unregister(self._collector)
        self._collector = None

    def after_fork_in_child(self) -> None:
        """The collector reads the agent, which restarts in place, and the
        process collector reads /proc/self: nothing belongs to the parent."""


# The registry each agent publishes to, for make_wsgi_app()/make_asgi_app().
_registries: weakref.WeakKeyDictionary[AgentView, CollectorRegistry] = weakref.WeakKeyDictionary()


def registry_for(agent: AgentView) -> CollectorRegistry:
    """The registry ``agent`` publishes to; one with heapwatch's collector is
    made for an agent without the Prometheus exporter."""
    registry = _registries.get(agent)
    if registry is None:
        registry = CollectorRegistry()
        HeapwatchCollector(source=agent.readings, registry=registry)
        ProcessCollector(registry=registry)
        registry = _registries.setdefault(agent, registry)
    return registry


def _resolve(agent: Agent | None) -> CollectorRegistry | None:
    agent = agent if agent is not None else get_agent()
    return registry_for(agent) if agent is not None else None


_NOT_RUNNING = b"heapwatch agent not running\n"


def make_wsgi_app(agent: Agent | None = None) -> WSGIApplication:
    """A WSGI application serving heapwatch's metrics (OpenMetrics when the
    Accept header asks for it), to mount in an existing application.

    It serves ``agent``'s, or else the running agent's, registry; 503 when
    there is no agent.  Set ``HEAPWATCH_EXPORTERS=none`` to serve only there.
    """

    def heapwatch_metrics(
        environ: WSGIEnvironment, start_response: StartResponse
    ) -> Iterable[bytes]:
        registry = _resolve(agent)
        if registry is None:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [_NOT_RUNNING]
        app: WSGIApplication = _make_wsgi_app(registry)
        return app(environ, start_response)

    return heapwatch_metrics


def make_asgi_app(agent: Agent | None = None) -> Callable[..., Any]:
    """The ASGI counterpart of ``make_wsgi_app``."""

    async def heapwatch_metrics(scope: Any, receive: Any, send: Any) -> None:
        registry = _resolve(agent)
        if registry is None:
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [(b"content-type", b"text/plain")],
                }
            )
            await send({"type": "http.response.body", "body": _NOT_RUNNING})
            return
        app: Callable[..., Any] = _make_asgi_app(registry)
        await app(scope, receive, send)

    return heapwatch_metrics
