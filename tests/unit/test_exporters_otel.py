"""The OpenTelemetry exporter, against the SDK's in-memory reader and a recording exporter."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.runtime.container import ContainerMemory, MemoryCgroup
from heapwatch.runtime.procmem import ProcessMemory
from heapwatch.runtime.threads import own_threads
from heapwatch_exporters import otel
from heapwatch_exporters.otel import OtelExporter, configured_meter_provider
from support.agent_model import FakeClock, ModelSource, TickingTimer

INSTRUMENTS = {
    "heapwatch.traced": "By",
    "heapwatch.traced.peak": "By",
    "heapwatch.traced.blocks": "{block}",
    "heapwatch.lineno.size": "By",
    "heapwatch.lineno.blocks": "{block}",
    "heapwatch.lineno.growth": "By",
    "heapwatch.lineno.peak": "By",
    "heapwatch.lineno.allocated": "By",
    "heapwatch.lineno.leak_score": "1",
    "heapwatch.lineno.leak_rate": "By/s",
    "heapwatch.tracer.memory": "By",
    "heapwatch.cycle.duration": "s",
    "heapwatch.sample_interval": "By",
    "heapwatch.traces.dropped": "{trace}",
    "heapwatch.cycles": "{cycle}",
    "heapwatch.cycle.errors": "{error}",
    "heapwatch.process.resident": "By",
    "heapwatch.untraced": "By",
    "heapwatch.native_heap": "By",
    "heapwatch.container.memory.limit": "By",
    "heapwatch.container.memory.high": "By",
    "heapwatch.container.memory.usage": "By",
    "heapwatch.container.memory.working_set": "By",
    "heapwatch.container.oom_kills": "{kill}",
    "heapwatch.container.memory.pressure": "s",
    "heapwatch.black_box.dumps": "{dump}",
}
CGROUP = MemoryCgroup(2, "/sys/fs/cgroup", ("/sys/fs/cgroup",), "/sys/fs/cgroup/memory.pressure")
CONTAINER = ContainerMemory(300 << 20, 250 << 20, 200 << 20, 150 << 20, 1, 2.5, 0.5)


def model_agent(exporter: OtelExporter) -> tuple[Agent, ModelSource]:
    source = ModelSource()
    source.allocate("/srv/app.py", 42, 7000, 7)
    source.allocate("/srv/lib.py", 7, 1000, 1)
    agent = Agent(
        AgentConfig(exporters=(), top=1),
        source=source,
        exporters=[exporter],
        clock=FakeClock(),
        timer=TickingTimer(0.01),
        memory=lambda: ProcessMemory(
            resident=100_000, native_in_use=60_000, native_retained=20_000
        ),
        cgroup=lambda: CGROUP,
        container=lambda cgroup: CONTAINER,
    )
    return agent, source


def points(data: Any) -> dict[str, list[tuple[dict[str, Any], float, str]]]:
    found: dict[str, list[tuple[dict[str, Any], float, str]]] = {}
    if data is None:
        return found
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            if scope_metrics.scope.name == "opentelemetry-sdk":
                # The SDK's own otel.sdk.* metrics: always on in opentelemetry-sdk
                # 1.41 (what Python 3.9 installs), behind
                # OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED in 1.45.
                continue
            assert scope_metrics.scope.name == "heapwatch"
            for metric in scope_metrics.metrics:
                found[metric.name] = [
                    (dict(p.attributes or {}), p.value, metric.unit)
                    for p in metric.data.data_points
                ]
    return found


def test_instruments_on_the_given_provider_read_the_last_cycle() -> None:
    # Given an application's provider
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    agent, _ = model_agent(OtelExporter(meter_provider=provider))
    agent.start()
    try:
        agent.run_cycle()
        # When the application's reader collects
        found = points(reader.get_metrics_data())
    finally:
        agent.stop()
    # Then every instrument is there with its unit and the sites carry code.* attributes
    assert {name: pts[0][2] for name, pts in found.items()} == INSTRUMENTS
    assert found["heapwatch.traced"][0][1] == 8000
    sizes = {
        (a["code.file.path"], a["code.line.number"]): v
        for a, v, _ in found["heapwatch.lineno.size"]
    }
    # (lib.py, outside the top 1 by size, has a series for its share of the peak)
    assert sizes == {("/srv/app.py", 42): 7000, ("/srv/lib.py", 7): 1000, ("<other>", 0): 0}
    assert sum(sizes.values()) == found["heapwatch.traced"][0][1]
    assert found["heapwatch.sample_interval"][0][1] == 512 * 1024
    # and the memory heapwatch cannot attribute: resident - traced - the tracer's own
    assert found["heapwatch.process.resident"][0][1] == 100_000
    assert found["heapwatch.untraced"][0][1] == 100_000 - 8000 - 4096
    heap = {a["state"]: v for a, v, _ in found["heapwatch.native_heap"]}
    assert heap == {"in_use": 60_000, "retained": 20_000}
    # and the container's memory, read once a cycle from the process's cgroup
    assert found["heapwatch.container.memory.limit"][0][1] == 300 << 20
    assert found["heapwatch.container.memory.working_set"][0][1] == 150 << 20
    assert found["heapwatch.container.oom_kills"][0][1] == 1
    pressure = {a["kind"]: v for a, v, _ in found["heapwatch.container.memory.pressure"]}
    assert pressure == {"some": 2.5, "full": 0.5}
    provider.shutdown()


def test_a_stopped_agent_publishes_nothing_and_a_new_one_takes_over() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    first, _ = model_agent(OtelExporter(meter_provider=provider))
    first.start()
    first.run_cycle()
    first.stop()
    assert "heapwatch.traced" not in points(reader.get_metrics_data())
    # The instruments are made once per provider: the second agent feeds them.
    second, source = model_agent(OtelExporter(meter_provider=provider))
    source.allocate("/srv/new.py", 1, 100)
    second.start()
    try:
        second.run_cycle()
        assert points(reader.get_metrics_data())["heapwatch.traced"][0][1] == 8100
    finally:
        second.stop()
        provider.shutdown()


def test_the_applications_global_provider_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(otel.metrics, "get_meter_provider", lambda: provider)
    assert configured_meter_provider() is provider
    exporter = OtelExporter()
    agent, _ = model_agent(exporter)
    agent.start()
    try:
        assert exporter.meter_provider is provider
        agent.run_cycle()
        assert "heapwatch.traced" in points(reader.get_metrics_data())
    finally:
        agent.stop()
        provider.shutdown()


def test_no_global_provider_is_detected() -> None:
    # The test process never sets one: the API's proxy stands in.
    assert configured_meter_provider() is None


class RecordingExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []
        self.exported = threading.Event()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.batches.append(metrics_data)
        self.exported.set()
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def resource_of(batch: MetricsData) -> dict[str, Any]:
    return dict(batch.resource_metrics[0].resource.attributes)


def test_without_a_provider_one_is_built_from_otel_variables() -> None:
    # Given no application provider and the standard variables
    env = {
        "OTEL_METRIC_EXPORT_INTERVAL": "50",
        "OTEL_SERVICE_NAME": "checkout",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }
    recording = RecordingExporter()
    exporter = OtelExporter(environ=env, otlp_exporter=recording)
    agent, source = model_agent(exporter)
    old = dict(os.environ)
    os.environ.update(env)  # Resource.create reads the process environment
    try:
        agent.start()
        # Then heapwatch's own thread exports at the OTEL interval
        assert recording.exported.wait(10)
        assert [t for t in own_threads() if t.name == "heapwatch-otlp"]
        source.allocate("/srv/late.py", 9, 50)
    finally:
        agent.stop()
        os.environ.clear()
        os.environ.update(old)
    assert not [t for t in own_threads() if t.name == "heapwatch-otlp"]
    resource = resource_of(recording.batches[0])
    assert resource["service.name"] == "checkout"
    assert resource["deployment.environment"] == "test"
    assert resource["process.pid"] == os.getpid()
    # and the export at shutdown carries the last cycle
    last = points(recording.batches[-1])
    assert last["heapwatch.traced"][0][1] == 8050


def test_bad_otel_values_warn_and_fall_back(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "OTEL_METRIC_EXPORT_INTERVAL": "often",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon",
    }
    with caplog.at_level(logging.WARNING):
        assert otel._parse_ms(env, "OTEL_METRIC_EXPORT_INTERVAL", 60000.0) == 60000.0
        assert otel._protocol(env) == "http/protobuf"
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "OTEL_METRIC_EXPORT_INTERVAL='often'" in messages
    assert "a positive number of milliseconds" in messages
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='carrier-pigeon'" in messages
    assert "http/protobuf or grpc" in messages


def test_the_sdk_disabled_switch_is_respected(caplog: pytest.LogCaptureFixture) -> None:
    exporter = OtelExporter(
        environ={"OTEL_SDK_DISABLED": "true"}, otlp_exporter=RecordingExporter()
    )
    agent, _ = model_agent(exporter)
    with caplog.at_level(logging.INFO, logger="heapwatch.otel"):
        agent.start()
    try:
        assert exporter.meter_provider is None
        assert "OTEL_SDK_DISABLED" in caplog.text
    finally:
        agent.stop()


def test_after_fork_the_own_provider_is_dropped_without_exporting() -> None:
    parent_exports = RecordingExporter()
    exporter = OtelExporter(
        environ={"OTEL_METRIC_EXPORT_INTERVAL": "3600000"}, otlp_exporter=parent_exports
    )
    agent, _ = model_agent(exporter)
    agent.start()
    assert exporter._own is not None
    parent_thread = exporter._own[1]
    try:
        parent_provider = exporter.meter_provider
        # When the child drops what it inherited
        exporter.after_fork_in_child()
        # Then nothing is exported on the parent's behalf
        assert exporter.meter_provider is None
        assert parent_exports.batches == []
        # and start() in the child builds a provider of its own
        child_exports = RecordingExporter()
        exporter._otlp_exporter = child_exports
        exporter.start(agent)
        assert exporter.meter_provider is not None
        assert exporter.meter_provider is not parent_provider
    finally:
        agent.stop()
        parent_thread.stop(5.0)  # in a real child that thread does not exist
    assert len(child_exports.batches) == 1  # the final export, with the last cycle
    assert points(child_exports.batches[0])["heapwatch.traced"][0][1] == 8000


def test_routes_carry_the_http_route_attribute() -> None:
    # Given readings whose cycle saw memory allocated for routes
    from heapwatch.agent.interface import CycleResult, Readings, Route, RouteSite

    result = CycleResult(
        1.0, 0.01, 9000, 9000, 10, 0, 0, (), routes_folded=2,
        routes=(
            Route("/items/{id}", 6000, 4, 100, 0.5, 3.0),
            Route("<none>", 3000, 6, 0, 0.0, 0.0),
            Route("<other>", 0, 0, 0, None, None),
        ),
        route_sites=(RouteSite("/items/{id}", "/srv/app.py", 42, 6000, 4),),
    )  # fmt: skip
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel._instruments_for(provider).source = lambda: Readings(result, 1, 0, "sample", 512)
    # When the application's reader collects
    found = points(reader.get_metrics_data())
    provider.shutdown()
    # Then each route is a point with http.route, as Prometheus's http_route
    sizes = {a["http.route"]: v for a, v, _ in found["heapwatch.route.size"]}
    assert sizes == {"/items/{id}": 6000, "<none>": 3000, "<other>": 0}
    scores = {a["http.route"]: v for a, v, _ in found["heapwatch.route.leak_score"]}
    assert scores == {"/items/{id}": 0.5, "<none>": 0.0}
    [(attributes, size, unit)] = found["heapwatch.route.lineno.size"]
    assert attributes == {
        "http.route": "/items/{id}",
        "code.file.path": "/srv/app.py",
        "code.line.number": 42,
    }
    assert (size, unit) == (6000, "By")
    assert found["heapwatch.routes.folded"][0][1] == 2
