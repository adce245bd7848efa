"""The Prometheus collector and the WSGI/ASGI apps, with injected readings and registries."""

from __future__ import annotations

import asyncio
import io
import logging
import sys
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families

from heapwatch import __version__
from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.agent.interface import BlackBox, CycleResult, Readings, Route, RouteSite, Site
from heapwatch.runtime.container import ContainerMemory
from heapwatch_exporters.prometheus import (
    HeapwatchCollector,
    PrometheusExporter,
    make_asgi_app,
    make_wsgi_app,
)
from support.agent_model import FakeClock, ModelSource, TickingTimer

RESULT = CycleResult(
    timestamp=1_700_000_123.5,
    duration=0.0125,
    traced=10_000,
    peak=12_000,
    blocks=40,
    tracer_memory=2048,
    dropped=2,
    sites=(
        Site("/srv/app.py", 42, 7000, 10, 500, peak=9000),
        Site("/srv/lib.py", 7, 2000, 20, -100, peak=2000),
        Site("<other>", 0, 1000, 10, 0, peak=1000),
    ),
    resident=50_000,
    untraced=37_952,
    native_in_use=30_000,
    native_retained=5_000,
    container=ContainerMemory(
        limit=200 << 20,
        high=180 << 20,
        usage=150 << 20,
        working_set=120 << 20,
        oom_kills=3,
        pressure_some=1.25,
        pressure_full=0.5,
    ),
)
PREVIOUS = BlackBox(
    "/dumps/heapwatch-20261128T120000.000000Z-1-2-blackbox.hwdump",
    1_700_000_000.25,
    1,
    "97%",
    194 << 20,
    200 << 20,
    ("/srv/app.py", 42),
    100 << 20,
)
READINGS = Readings(
    RESULT,
    cycles=12,
    errors=1,
    mode="sample",
    sample_interval=524288,
    native_heap="mallinfo2",
    black_boxes=2,
    previous_black_box=PREVIOUS,
)

# Fixed names: the Grafana dashboard and the alert rules use them.
FIXED_NAMES = {
    "heapwatch_info",
    "heapwatch_traced_bytes",
    "heapwatch_traced_peak_bytes",
    "heapwatch_traced_blocks",
    "heapwatch_lineno_size_bytes",
    "heapwatch_lineno_blocks",
    "heapwatch_lineno_growth_bytes",
    "heapwatch_lineno_peak_bytes",
    "heapwatch_lineno_allocated_bytes_total",
    "heapwatch_lineno_leak_score",
    "heapwatch_lineno_leak_rate_bytes_per_second",
    "heapwatch_tracer_memory_bytes",
    "heapwatch_cycle_duration_seconds",
    "heapwatch_sample_interval_bytes",
    "heapwatch_dropped_traces_total",
    "heapwatch_cycles_total",
    "heapwatch_cycle_errors_total",
    "heapwatch_last_cycle_timestamp_seconds",
    "heapwatch_process_resident_bytes",
    "heapwatch_untraced_bytes",
    "heapwatch_native_heap_bytes",
    "heapwatch_container_memory_limit_bytes",
    "heapwatch_container_memory_high_bytes",
    "heapwatch_container_memory_usage_bytes",
    "heapwatch_container_memory_working_set_bytes",
    "heapwatch_container_oom_kills_total",
    "heapwatch_container_memory_pressure_seconds_total",
    "heapwatch_black_box_dumps_total",
    "heapwatch_previous_black_box_timestamp_seconds",
}
# Published once some allocation was made for a route (issue 26).
ROUTE_NAMES = {
    "heapwatch_route_size_bytes",
    "heapwatch_route_growth_bytes",
    "heapwatch_route_leak_score",
    "heapwatch_route_leak_rate_bytes_per_second",
    "heapwatch_route_lineno_size_bytes",
    "heapwatch_routes_folded_total",
}


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def collect_registry(readings: Readings | None) -> CollectorRegistry:
    registry = CollectorRegistry()
    HeapwatchCollector(source=lambda: readings, registry=registry, python_version="3.11.7")
    return registry


def test_every_fixed_name_is_published_with_its_value() -> None:
    values = samples(collect_registry(READINGS))
    assert {name for name, _ in values} == FIXED_NAMES
    assert values["heapwatch_traced_bytes", ()] == 10_000
    assert values["heapwatch_traced_peak_bytes", ()] == 12_000
    assert values["heapwatch_traced_blocks", ()] == 40
    assert values["heapwatch_tracer_memory_bytes", ()] == 2048
    assert values["heapwatch_cycle_duration_seconds", ()] == 0.0125
    assert values["heapwatch_sample_interval_bytes", ()] == 524288
    assert values["heapwatch_dropped_traces_total", ()] == 2
    assert values["heapwatch_cycles_total", ()] == 12
    assert values["heapwatch_cycle_errors_total", ()] == 1
    assert values["heapwatch_last_cycle_timestamp_seconds", ()] == 1_700_000_123.5
    assert values["heapwatch_process_resident_bytes", ()] == 50_000
    assert values["heapwatch_untraced_bytes", ()] == 37_952
    assert values["heapwatch_native_heap_bytes", (("state", "in_use"),)] == 30_000
    assert values["heapwatch_native_heap_bytes", (("state", "retained"),)] == 5_000
    assert values["heapwatch_container_memory_limit_bytes", ()] == 200 << 20
    assert values["heapwatch_container_memory_high_bytes", ()] == 180 << 20
    assert values["heapwatch_container_memory_usage_bytes", ()] == 150 << 20
    assert values["heapwatch_container_memory_working_set_bytes", ()] == 120 << 20
    assert values["heapwatch_container_oom_kills_total", ()] == 3
    pressure = "heapwatch_container_memory_pressure_seconds_total"
    assert values[pressure, (("kind", "some"),)] == 1.25
    assert values[pressure, (("kind", "full"),)] == 0.5
    assert values["heapwatch_black_box_dumps_total", ()] == 2
    previous = (
        ("code_file_path", "/srv/app.py"),
        ("code_line_number", "42"),
        ("dump", "heapwatch-20261128T120000.000000Z-1-2-blackbox.hwdump"),
        ("threshold", "97%"),
    )
    assert values["heapwatch_previous_black_box_timestamp_seconds", previous] == 1_700_000_000.25
    info = (
        ("mode", "sample"),
        ("native_heap", "mallinfo2"),
        ("python_version", "3.11.7"),
        ("version", __version__),
    )
    assert values["heapwatch_info", info] == 1


def test_without_mallinfo2_the_heap_split_is_absent_and_info_says_so() -> None:
    # given a process whose C library cannot split its heap
    result = RESULT._replace(native_in_use=None, native_retained=None)
    readings = READINGS._replace(result=result, native_heap="unavailable")
    # when scraped
    values = samples(collect_registry(readings))
    # then resident and untraced are there, the split is not, and info says why
    names = {name for name, _ in values}
    assert "heapwatch_native_heap_bytes" not in names
    assert values["heapwatch_untraced_bytes", ()] == 37_952
    info = [dict(labels) for name, labels in values if name == "heapwatch_info"]
    assert info[0]["native_heap"] == "unavailable"


def test_without_a_limit_or_a_cgroup_the_container_series_are_absent() -> None:
    # given a process in a cgroup with no limit and no PSI
    unlimited = RESULT.container._replace(
        limit=None, high=None, pressure_some=None, pressure_full=None
    )  # type: ignore[union-attr]
    values = samples(
        collect_registry(READINGS._replace(result=RESULT._replace(container=unlimited)))
    )
    names = {name for name, _ in values}
    # then the limit and pressure are absent, the usage is there
    assert "heapwatch_container_memory_limit_bytes" not in names
    assert "heapwatch_container_memory_pressure_seconds_total" not in names
    assert values["heapwatch_container_memory_working_set_bytes", ()] == 120 << 20
    # and outside any memory cgroup, none of the container's series
    readings = READINGS._replace(result=RESULT._replace(container=None), previous_black_box=None)
    names = {name for name, _ in samples(collect_registry(readings))}
    assert not {name for name in names if "container" in name or "previous" in name}


def test_sites_are_labelled_by_file_and_line_and_sum_to_the_total() -> None:
    values = samples(collect_registry(READINGS))
    app = (("code_file_path", "/srv/app.py"), ("code_line_number", "42"))
    other = (("code_file_path", "<other>"), ("code_line_number", "0"))
    assert values["heapwatch_lineno_size_bytes", app] == 7000
    assert values["heapwatch_lineno_blocks", app] == 10
    assert values["heapwatch_lineno_growth_bytes", app] == 500
    assert values["heapwatch_lineno_size_bytes", other] == 1000
    sizes = [v for (name, _), v in values.items() if name == "heapwatch_lineno_size_bytes"]
    assert sum(sizes) == values["heapwatch_traced_bytes", ()]


ROUTES = (
    Route("/items/{id}", 6000, 8, 400, 0.75, 12.5),
    Route("<none>", 3000, 20, -50, 0.0, 0.0),
    Route("<other>", 1000, 12, 150, None, None),
)
ROUTE_SITES = (
    RouteSite("/items/{id}", "/srv/app.py", 42, 5000, 6),
    RouteSite("/items/{id}", "/srv/lib.py", 7, 1000, 2),
)


def test_routes_are_labelled_by_http_route_and_sum_to_the_total() -> None:
    # Given a cycle whose memory was allocated for routes
    result = RESULT._replace(routes=ROUTES, route_sites=ROUTE_SITES, routes_folded=4)
    values = samples(collect_registry(READINGS._replace(result=result)))
    assert {name for name, _ in values} == FIXED_NAMES | ROUTE_NAMES
    items, other = (("http_route", "/items/{id}"),), (("http_route", "<other>"),)
    # Then each route has its size, growth and score, <other> no score
    assert values["heapwatch_route_size_bytes", items] == 6000
    assert values["heapwatch_route_growth_bytes", items] == 400
    assert values["heapwatch_route_leak_score", items] == 0.75
    assert values["heapwatch_route_leak_rate_bytes_per_second", items] == 12.5
    assert values["heapwatch_route_size_bytes", other] == 1000
    assert ("heapwatch_route_leak_score", other) not in values
    sizes = [v for (name, _), v in values.items() if name == "heapwatch_route_size_bytes"]
    assert sum(sizes) == values["heapwatch_traced_bytes", ()]
    # and each route's top lines, by route, file and line
    line = (*items, ("code_file_path", "/srv/app.py"), ("code_line_number", "42"))
    assert values["heapwatch_route_lineno_size_bytes", tuple(sorted(line))] == 5000
    assert values["heapwatch_routes_folded_total", ()] == 4
    # and a cycle without routes has none of these series
    names = {name for name, _ in samples(collect_registry(READINGS))}
    assert not {name for name in names if "route" in name}


def test_before_the_first_cycle_only_the_counters_and_info_are_published() -> None:
    readings = Readings(None, cycles=0, errors=0, mode="exact", sample_interval=0)
    names = {name for name, _ in samples(collect_registry(readings))}
    assert names == {
        "heapwatch_info",
        "heapwatch_sample_interval_bytes",
        "heapwatch_cycles_total",
        "heapwatch_cycle_errors_total",
        "heapwatch_black_box_dumps_total",
    }


def test_no_agent_publishes_nothing() -> None:
    assert samples(collect_registry(None)) == {}


def test_a_failing_source_fails_no_scrape(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> Readings:
        raise RuntimeError("broken")

    registry = CollectorRegistry()
    HeapwatchCollector(source=broken, registry=registry)
    with caplog.at_level(logging.ERROR, logger="heapwatch.prometheus"):
        assert generate_latest(registry) == b""
    assert "readings unavailable" in caplog.records[0].getMessage()


def test_registering_reads_nothing() -> None:
    calls = []

    def source() -> Readings:
        calls.append(1)
        return READINGS

    registry = CollectorRegistry()
    HeapwatchCollector(source=source, registry=registry)
    assert calls == []
    generate_latest(registry)
    assert calls == [1]


def test_describe_lists_every_family_without_samples() -> None:
    collector = HeapwatchCollector(source=lambda: READINGS)
    described = list(collector.describe())
    assert all(not family.samples for family in described)
    names = {family.name for family in described}
    # families carry counters without their _total suffix
    every = FIXED_NAMES | ROUTE_NAMES
    assert names == {name.removesuffix("_total").removesuffix("_info") for name in every} | {
        "heapwatch"
    } - {"heapwatch_info"}


def test_openmetrics_output_parses_with_units() -> None:
    text = generate_openmetrics(collect_registry(READINGS)).decode()
    assert text.endswith("# EOF\n")
    assert "# UNIT heapwatch_traced_bytes bytes" in text
    assert "# UNIT heapwatch_cycle_duration_seconds seconds" in text
    families = {family.name: family for family in parse_om(text)}
    assert families["heapwatch_cycles"].type == "counter"
    assert families["heapwatch"].type == "info"


def wsgi_get(app: Any, accept: str = "") -> tuple[str, dict[str, str], bytes]:
    environ: dict[str, Any] = {"PATH_INFO": "/metrics", "wsgi.errors": io.StringIO()}
    if accept:
        environ["HTTP_ACCEPT"] = accept
    setup_testing_defaults(environ)
    response: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        response["status"], response["headers"] = status, dict(headers)

    body = b"".join(app(environ, start_response))
    return response["status"], response["headers"], body


def model_agent() -> Agent:
    source = ModelSource()
    source.allocate("app.py", 3, 4096)
    agent = Agent(
        AgentConfig(exporters=()),
        source=source,
        exporters=[],
        clock=FakeClock(),
        timer=TickingTimer(0.1),
    )
    agent.run_cycle()
    return agent


def test_the_wsgi_app_serves_an_agent_and_negotiates_openmetrics() -> None:
    app = make_wsgi_app(model_agent())
    status, headers, body = wsgi_get(app)
    assert status == "200 OK"
    assert headers["Content-Type"].startswith("text/plain")
    assert (
        b'heapwatch_lineno_size_bytes{code_file_path="app.py",code_line_number="3"} 4096.0' in body
    )
    assert b"process_" in body or not sys.platform.startswith("linux")
    status, headers, body = wsgi_get(app, accept="application/openmetrics-text; version=1.0.0")
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def test_the_wsgi_app_without_an_agent_answers_503() -> None:
    status, _, body = wsgi_get(make_wsgi_app())
    assert status.startswith("503")
    assert b"not running" in body


def asgi_get(app: Any) -> tuple[int, bytes]:
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/metrics",
        "query_string": b"",
        "headers": [],
    }
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return status, body


def test_the_asgi_app_serves_an_agent() -> None:
    status, body = asgi_get(make_asgi_app(model_agent()))
    assert status == 200
    assert b"heapwatch_traced_bytes 4096.0" in body
    assert asgi_get(make_asgi_app())[0] == 503


def test_the_exporter_publishes_to_a_given_registry_and_leaves_it_clean() -> None:
    registry = CollectorRegistry()
    agent = model_agent()
    exporter = PrometheusExporter(registry=registry)
    exporter.start(agent)
    assert agent.router.paths() == ["/metrics"]
    assert ("heapwatch_traced_bytes", ()) in samples(registry)
    # its own registry has no process collector: the application's has one already
    assert not any(name.startswith("process_") for name, _ in samples(registry))
    exporter.shutdown(1.0)
    assert samples(registry) == {}
    # and a new agent can register there again
    PrometheusExporter(registry=registry).start(model_agent())


def test_heapwatchs_own_registry_has_the_process_collector() -> None:
    agent = model_agent()
    exporter = PrometheusExporter()
    exporter.start(agent)
    assert exporter.registry is not None
    names = {name for name, _ in samples(exporter.registry)}
    if sys.platform.startswith("linux"):
        assert "process_resident_memory_bytes" in names
    assert "heapwatch_traced_bytes" in names
