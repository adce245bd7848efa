"""The agent's metrics: one catalogue, read by both exporters.

Names are fixed: the Grafana dashboard and the alert rules select on them.
``Metric.value`` reads a number out of the agent's ``Readings``; per-site
metrics have ``site_value`` instead and one series per ``Site`` (the top
sites, then ``<other>``); metrics with ``series`` have one series per value
of their labels, ``series_labels``.  A value of None means "no series"
(before the first successful cycle, or a figure this process cannot read).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, NamedTuple

from heapwatch.agent.interface import Readings, Route, Site

__all__ = [
    "CATALOGUE",
    "LABEL_FILE",
    "LABEL_LINE",
    "LABEL_ROUTE",
    "NATIVE_HEAP_STATES",
    "OTEL_ATTRIBUTE_FILE",
    "OTEL_ATTRIBUTE_LINE",
    "OTEL_ATTRIBUTE_ROUTE",
    "PRESSURE_KINDS",
    "Metric",
]

LABEL_FILE = "code_file_path"
LABEL_LINE = "code_line_number"
OTEL_ATTRIBUTE_FILE = "code.file.path"
OTEL_ATTRIBUTE_LINE = "code.line.number"
# The route a request's memory was allocated for: OpenTelemetry's http.route
# (a template, never a raw path), as Prometheus spells a label.
LABEL_ROUTE = "http_route"
OTEL_ATTRIBUTE_ROUTE = "http.route"
# heapwatch_native_heap_bytes{state=...}: the C allocator's heap, in use or
# free but retained.
NATIVE_HEAP_STATES = ("in_use", "retained")
# heapwatch_container_memory_pressure_seconds_total{kind=...}: PSI's two lines,
# some task stalled on memory, or all of them.
PRESSURE_KINDS = ("some", "full")

SeriesKey = tuple[object, ...]


class Metric(NamedTuple):
    otel_name: str
    otel_unit: str
    prometheus_name: str
    """The sample name, ``_total`` included for counters."""
    prometheus_unit: str
    kind: str
    """``gauge`` or ``counter``."""
    description: str
    value: Callable[[Readings], float | None] | None = None
    site_value: Callable[[Site], float | None] | None = None
    """One series per site; None leaves the site out (``<other>`` has no
    leak score)."""
    series: Callable[[Readings], Mapping[SeriesKey, float] | None] | None = None
    """Label values -> value, one series each (``series_labels`` names the
    labels: Prometheus's, and OpenTelemetry's attributes unless
    ``series_attributes`` names those)."""
    series_labels: tuple[str, ...] = ()
    series_attributes: tuple[str, ...] = ()


def _result(read: Callable[..., float | None]) -> Callable[[Readings], float | None]:
    def value(readings: Readings) -> float | None:
        return None if readings.result is None else read(readings.result)

    return value


def _native_heap(readings: Readings) -> Mapping[SeriesKey, float] | None:
    result = readings.result
    if result is None or result.native_in_use is None or result.native_retained is None:
        return None
    figures = (result.native_in_use, result.native_retained)
    return {(state,): figure for state, figure in zip(NATIVE_HEAP_STATES, figures)}


def _container(read: Callable[..., float | None]) -> Callable[[Readings], float | None]:
    def value(readings: Readings) -> float | None:
        result = readings.result
        if result is None or result.container is None:
            return None
        return read(result.container)

    return value


def _pressure(readings: Readings) -> Mapping[SeriesKey, float] | None:
    result = readings.result
    container = result.container if result is not None else None
    if container is None:
        return None
    figures = (container.pressure_some, container.pressure_full)
    return {(kind,): figure for kind, figure in zip(PRESSURE_KINDS, figures) if figure is not None}


def _previous_black_box(readings: Readings) -> Mapping[SeriesKey, float] | None:
    box = readings.previous_black_box
    if box is None:
        return None
    file, line = box.site if box.site is not None else ("", 0)
    name = box.path.rsplit("/", 1)[-1]
    return {(name, box.threshold, file, line): box.timestamp}


def _routes(
    read: Callable[[Route], float | None],
) -> Callable[[Readings], Mapping[SeriesKey, float] | None]:
    def series(readings: Readings) -> Mapping[SeriesKey, float] | None:
        result = readings.result
        if result is None:
            return None
        figures = ((route.name, read(route)) for route in result.routes)
        return {(name,): figure for name, figure in figures if figure is not None}

    return series


def _route_sites(readings: Readings) -> Mapping[SeriesKey, float] | None:
    result = readings.result
    if result is None:
        return None
    return {(site.route, site.file, site.line): site.size for site in result.route_sites}


def _routes_folded(readings: Readings) -> float | None:
    result = readings.result
    return None if result is None or not result.routes else result.routes_folded


CATALOGUE: tuple[Metric, ...] = (
    Metric(
        "heapwatch.traced",
        "By",
        "heapwatch_traced_bytes",
        "bytes",
        "gauge",
        "Live bytes allocated through the Python allocators, as traced "
        "(an estimate in sample mode).",
        value=_result(lambda r: r.traced),
    ),
    Metric(
        "heapwatch.traced.peak",
        "By",
        "heapwatch_traced_peak_bytes",
        "bytes",
        "gauge",
        "Peak of the traced bytes during the last interval.",
        value=_result(lambda r: r.peak),
    ),
    Metric(
        "heapwatch.traced.blocks",
        "{block}",
        "heapwatch_traced_blocks",
        "",
        "gauge",
        "Live memory blocks traced (an estimate in sample mode).",
        value=_result(lambda r: r.blocks),
    ),
    Metric(
        "heapwatch.lineno.size",
        "By",
        "heapwatch_lineno_size_bytes",
        "bytes",
        "gauge",
        "Live bytes allocated at each of the top allocation sites; the "
        'code_file_path="<other>" series sums the other sites, so a sum() '
        "equals heapwatch_traced_bytes.",
        site_value=lambda s: s.size,
    ),
    Metric(
        "heapwatch.lineno.blocks",
        "{block}",
        "heapwatch_lineno_blocks",
        "",
        "gauge",
        "Live memory blocks allocated at each of the top allocation sites.",
        site_value=lambda s: s.blocks,
    ),
    Metric(
        "heapwatch.lineno.growth",
        "By",
        "heapwatch_lineno_growth_bytes",
        "bytes",
        "gauge",
        "Change of each site's live bytes since the previous cycle (0 on the first).",
        site_value=lambda s: s.growth,
    ),
    Metric(
        "heapwatch.lineno.peak",
        "By",
        "heapwatch_lineno_peak_bytes",
        "bytes",
        "gauge",
        "Each site's live bytes at the moment the traced bytes reached the last interval's "
        "peak: the top sites by size, then by peak (a site that allocated and freed within "
        'the interval included); the code_file_path="<other>" series sums the other sites, '
        "so a sum() equals heapwatch_traced_peak_bytes.",
        site_value=lambda s: s.peak,
    ),
    Metric(
        "heapwatch.lineno.allocated",
        "By",
        "heapwatch_lineno_allocated_bytes_total",
        "bytes",
        "counter",
        "Bytes allocated at each exported site since tracing started, freed or not (an "
        "estimate in sample mode): rate() shows the allocation hot spots, the churn a live "
        "view never shows. The sites exported are the top ones by size, by peak, as leak "
        "suspects, and by bytes allocated in the interval (kept some cycles after they last "
        'ranked); the code_file_path="<other>" series holds the other sites and the totals '
        "the tracer folded past its cap.",
        site_value=lambda s: s.allocated,
    ),
    Metric(
        "heapwatch.lineno.leak_score",
        "1",
        "heapwatch_lineno_leak_score",
        "",
        "gauge",
        "How much each site's surviving memory looks like a leak, 0 to 1, over "
        "HEAPWATCH_LEAK_WINDOW: its growth against its noise (sampling variance, steps "
        "down) and spread over the window like a leak's. Sites scoring at least 0.5 get "
        "their series even outside the top sites by size; <other> has none.",
        site_value=lambda s: s.leak_score,
    ),
    Metric(
        "heapwatch.lineno.leak_rate",
        "By/s",
        "heapwatch_lineno_leak_rate_bytes_per_second",
        "bytes_per_second",
        "gauge",
        "How fast each site's memory grew over the span its leak score was found on "
        "(a least-squares slope; 0 when it did not grow).",
        site_value=lambda s: s.leak_rate,
    ),
    Metric(
        "heapwatch.route.size",
        "By",
        "heapwatch_route_size_bytes",
        "bytes",
        "gauge",
        "Live bytes allocated for each of the top routes (the http.route of the request "
        'being served when they were allocated, in sample mode): http_route="<none>" was '
        'allocated outside any request, http_route="<other>" sums the other routes, so a '
        "sum() equals heapwatch_traced_bytes. Absent until some allocation has a route.",
        series=_routes(lambda r: r.size),
        series_labels=(LABEL_ROUTE,),
        series_attributes=(OTEL_ATTRIBUTE_ROUTE,),
    ),
    Metric(
        "heapwatch.route.growth",
        "By",
        "heapwatch_route_growth_bytes",
        "bytes",
        "gauge",
        "Change of each route's live bytes since the previous cycle (0 on the first).",
        series=_routes(lambda r: r.growth),
        series_labels=(LABEL_ROUTE,),
        series_attributes=(OTEL_ATTRIBUTE_ROUTE,),
    ),
    Metric(
        "heapwatch.route.leak_score",
        "1",
        "heapwatch_route_leak_score",
        "",
        "gauge",
        "How much the surviving memory allocated for each route looks like a leak, 0 to 1: "
        "heapwatch_lineno_leak_score's score over the route's memory. Routes scoring at "
        'least 0.5 get their series even outside the top routes; http_route="<other>" has '
        "none.",
        series=_routes(lambda r: r.leak_score),
        series_labels=(LABEL_ROUTE,),
        series_attributes=(OTEL_ATTRIBUTE_ROUTE,),
    ),
    Metric(
        "heapwatch.route.leak_rate",
        "By/s",
        "heapwatch_route_leak_rate_bytes_per_second",
        "bytes_per_second",
        "gauge",
        "How fast each route's memory grew over the span its leak score was found on.",
        series=_routes(lambda r: r.leak_rate),
        series_labels=(LABEL_ROUTE,),
        series_attributes=(OTEL_ATTRIBUTE_ROUTE,),
    ),
    Metric(
        "heapwatch.route.lineno.size",
        "By",
        "heapwatch_route_lineno_size_bytes",
        "bytes",
        "gauge",
        "Live bytes allocated at each of the top 5 sites of each top route (by name: not "
        "<none> nor <other>), for that route: which request holds a line's memory.",
        series=_route_sites,
        series_labels=(LABEL_ROUTE, LABEL_FILE, LABEL_LINE),
        series_attributes=(OTEL_ATTRIBUTE_ROUTE, OTEL_ATTRIBUTE_FILE, OTEL_ATTRIBUTE_LINE),
    ),
    Metric(
        "heapwatch.routes.folded",
        "{route}",
        "heapwatch_routes_folded_total",
        "",
        "counter",
        "Route names refused because the registry of routes was full (their memory is "
        "<other>'s): a service whose route names are raw paths, not templates, shows here.",
        value=_routes_folded,
    ),
    Metric(
        "heapwatch.tracer.memory",
        "By",
        "heapwatch_tracer_memory_bytes",
        "bytes",
        "gauge",
        "Memory the tracer itself uses (trace tables, tracebacks).",
        value=_result(lambda r: r.tracer_memory),
    ),
    Metric(
        "heapwatch.process.resident",
        "By",
        "heapwatch_process_resident_bytes",
        "bytes",
        "gauge",
        "The process's resident set size (/proc/self/statm), read with the traced bytes.",
        value=_result(lambda r: r.resident),
    ),
    Metric(
        "heapwatch.untraced",
        "By",
        "heapwatch_untraced_bytes",
        "bytes",
        "gauge",
        "Resident bytes heapwatch cannot attribute: the resident set minus the traced bytes "
        "and the tracer's own (never below 0). Memory of C code, or heap the C allocator "
        "keeps: heapwatch_native_heap_bytes tells which.",
        value=_result(lambda r: r.untraced),
    ),
    Metric(
        "heapwatch.native_heap",
        "By",
        "heapwatch_native_heap_bytes",
        "bytes",
        "gauge",
        "The C allocator's heap (glibc's mallinfo2): state=\"in_use\" is handed out (Python's "
        'large blocks and C code\'s), state="retained" is free but kept by the allocator. '
        'Absent without glibc\'s malloc (heapwatch_info{native_heap="unavailable"}).',
        series=_native_heap,
        series_labels=("state",),
    ),
    Metric(
        "heapwatch.container.memory.limit",
        "By",
        "heapwatch_container_memory_limit_bytes",
        "bytes",
        "gauge",
        "The memory limit of the process's cgroup (v2 memory.max, v1 memory.limit_in_bytes; "
        "the smallest on its path): past it the kernel's OOM killer acts. Absent when there "
        "is no limit.",
        value=_container(lambda c: c.limit),
    ),
    Metric(
        "heapwatch.container.memory.high",
        "By",
        "heapwatch_container_memory_high_bytes",
        "bytes",
        "gauge",
        "cgroup v2's memory.high (the smallest on the path): past it the kernel throttles "
        "and reclaims. Absent when there is none, and on cgroup v1.",
        value=_container(lambda c: c.high),
    ),
    Metric(
        "heapwatch.container.memory.usage",
        "By",
        "heapwatch_container_memory_usage_bytes",
        "bytes",
        "gauge",
        "Memory charged to the process's cgroup (v2 memory.current, v1 memory.usage_in_bytes): "
        "every process of the container, and the page cache it caused.",
        value=_container(lambda c: c.usage),
    ),
    Metric(
        "heapwatch.container.memory.working_set",
        "By",
        "heapwatch_container_memory_working_set_bytes",
        "bytes",
        "gauge",
        "The cgroup's usage less its inactive file pages, as the kubelet computes it: what "
        "Kubernetes' eviction and kubectl top show, and what nears the limit before an OOM kill.",
        value=_container(lambda c: c.working_set),
    ),
    Metric(
        "heapwatch.container.oom_kills",
        "{kill}",
        "heapwatch_container_oom_kills_total",
        "",
        "counter",
        "Processes the kernel's OOM killer killed in the process's cgroup (v2 memory.events, "
        "v1 memory.oom_control): a worker killed while the container lives counts here.",
        value=_container(lambda c: c.oom_kills),
    ),
    Metric(
        "heapwatch.container.memory.pressure",
        "s",
        "heapwatch_container_memory_pressure_seconds_total",
        "seconds",
        "counter",
        'Time tasks of the cgroup stalled waiting for memory (PSI memory.pressure): kind="some" '
        'while at least one did, kind="full" while all did. Absent where the kernel has no PSI '
        "for the cgroup.",
        series=_pressure,
        series_labels=("kind",),
    ),
    Metric(
        "heapwatch.black_box.dumps",
        "{dump}",
        "heapwatch_black_box_dumps_total",
        "",
        "counter",
        "Black boxes this process wrote: dumps written into HEAPWATCH_DUMP_DIR as the "
        "container's working set crossed a threshold of HEAPWATCH_DUMP_AT.",
        value=lambda readings: readings.black_boxes,
    ),
    Metric(
        "heapwatch.black_box.previous",
        "s",
        "heapwatch_previous_black_box_timestamp_seconds",
        "seconds",
        "gauge",
        "Unix time of the black box an earlier process wrote into HEAPWATCH_DUMP_DIR before "
        "it died without exiting (an OOM kill), found at this process's start: dump names "
        "the file, threshold what was crossed, and the code labels its top allocation site.",
        series=_previous_black_box,
        series_labels=("dump", "threshold", LABEL_FILE, LABEL_LINE),
        series_attributes=(
            "heapwatch.dump",
            "heapwatch.threshold",
            OTEL_ATTRIBUTE_FILE,
            OTEL_ATTRIBUTE_LINE,
        ),
    ),
    Metric(
        "heapwatch.cycle.duration",
        "s",
        "heapwatch_cycle_duration_seconds",
        "seconds",
        "gauge",
        "How long the last cycle (snapshot, grouping, diff) took.",
        value=_result(lambda r: r.duration),
    ),
    Metric(
        "heapwatch.sample_interval",
        "By",
        "heapwatch_sample_interval_bytes",
        "bytes",
        "gauge",
        "Mean bytes between sampled allocations; 0 in exact mode, where every block is traced.",
        value=lambda readings: readings.sample_interval,
    ),
    Metric(
        "heapwatch.traces.dropped",
        "{trace}",
        "heapwatch_dropped_traces_total",
        "",
        "counter",
        "Allocations the tracer could not record (no memory for the trace); "
        "the traced figures miss them.",
        value=_result(lambda r: r.dropped),
    ),
    Metric(
        "heapwatch.cycles",
        "{cycle}",
        "heapwatch_cycles_total",
        "",
        "counter",
        "Cycles the agent ran, failed ones included.",
        value=lambda readings: readings.cycles,
    ),
    Metric(
        "heapwatch.cycle.errors",
        "{error}",
        "heapwatch_cycle_errors_total",
        "",
        "counter",
        "Cycles that failed (logged; retried at the next interval).",
        value=lambda readings: readings.errors,
    ),
    Metric(
        "",
        "",
        "heapwatch_last_cycle_timestamp_seconds",
        "seconds",
        "gauge",
        "Unix time of the last successful cycle; the other heapwatch series are as of this time.",
        value=_result(lambda r: r.timestamp),
    ),
)
