#!/usr/bin/env python3
"""Generate deploy/grafana/dashboard.json, the heapwatch Grafana dashboard.

    python deploy/grafana/generate.py            # rewrite dashboard.json
    python deploy/grafana/generate.py --check    # exit 1 if dashboard.json is stale

Built with grafana-foundation-sdk (pinned in requirements-deploy.txt to the
release that targets Grafana 11.6; it needs Python 3.11 or newer).  Edit this
file, never the JSON: tests/unit/test_deploy_grafana.py fails when the two
drift apart.

Every query filters on the dashboard variables with SELECTOR; the panels are
explained in deploy/README.md ("Grafana").  It reads the agent's suspect
threshold from heapwatch, so heapwatch must be installed (make install).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus as prometheus_builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.prometheus import PromQueryFormat, QueryEditorMode

from heapwatch.formats.leaks import SUSPECT as LEAK_SUSPECT

OUTPUT = Path(__file__).resolve().parent / "dashboard.json"

UID = "heapwatch"
DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Every query is limited to the chosen job and instances.
SELECTOR = 'job=~"$job", instance=~"$instance"'
# Allocation sites proper: the agent sums the sites outside its top
# HEAPWATCH_TOP into one series, code_file_path="<other>", which is no site.
SITES = SELECTOR + ', code_file_path!="<other>"'
SITE_LABELS = "job, code_file_path, code_line_number"
# A site of one process: the leak score is a process's own.
INSTANCE_SITE_LABELS = "job, instance, code_file_path, code_line_number"
SITE_LEGEND = "{{code_file_path}}:{{code_line_number}}"
TOP = 10
# Routes (issue 26): http_route is the request's route template; "<none>" is
# memory allocated outside any request, "<other>" the routes past the
# agent's HEAPWATCH_TOP_ROUTES.
ROUTE_LEGEND = "{{http_route}}"
# A container, as the container alerts of heapwatch-rules.yml name it: every
# process of one reports the same container figures, so one series per
# container.  host is the instance without its port (the machine, or the
# pod), added by with_host.
CONTAINER_LABELS = "job, service, namespace, pod, container, host"


def traced_memory_queries() -> dict[str, str]:
    return {
        "traced": f"heapwatch_traced_bytes{{{SELECTOR}}}",
        "peak": f"heapwatch_traced_peak_bytes{{{SELECTOR}}}",
        # The RSS of the processes heapwatch watches, not of anything else the
        # job scrapes.
        "RSS": (
            f"process_resident_memory_bytes{{{SELECTOR}}}"
            f" and on (job, instance) heapwatch_info{{{SELECTOR}}}"
        ),
    }


def untraced_memory_queries() -> dict[str, str]:
    return {
        "RSS": f"heapwatch_process_resident_bytes{{{SELECTOR}}}",
        "traced": f"heapwatch_traced_bytes{{{SELECTOR}}}",
        "untraced": f"heapwatch_untraced_bytes{{{SELECTOR}}}",
        "C heap {{state}}": f"heapwatch_native_heap_bytes{{{SELECTOR}}}",
    }


def indented(expr: str) -> str:
    return expr.replace("\n", "\n  ")


def with_host(expr: str) -> str:
    """``expr`` with a host label: its instance without the port."""
    return f'label_replace(\n  {indented(expr)},\n  "host", "$1", "instance", "(.*):[0-9]+"\n)'


def container_memory_query() -> str:
    """The working set, usage and limit of each container, one series each,
    told apart by a figure label.  One query, not three: where the cgroup has
    no limit its series is simply missing."""
    figures = {
        "working set": "heapwatch_container_memory_working_set_bytes",
        "usage": "heapwatch_container_memory_usage_bytes",
        "limit": "heapwatch_container_memory_limit_bytes",
    }
    each = "\nor ".join(
        f'label_replace({metric}{{{SELECTOR}}}, "figure", "{name}", "", "")'
        for name, metric in figures.items()
    )
    return f"max by ({CONTAINER_LABELS}, figure) (\n  {indented(with_host(each))}\n)"


def container_events_queries() -> dict[str, str]:
    """OOM kills and black boxes over the time range."""
    kills = with_host(f"increase(heapwatch_container_oom_kills_total{{{SELECTOR}}}[$__range])")
    return {
        # Every process of a container counts its kills: one count per container.
        "OOM kills": f"sum(max by ({CONTAINER_LABELS}) (\n  {indented(kills)}\n))",
        "black boxes written": (
            f"sum(increase(heapwatch_black_box_dumps_total{{{SELECTOR}}}[$__range]))"
        ),
        # None found is the usual case, and a count of nothing is no data.
        "black boxes found": (
            "count(count by (job, dump) (last_over_time("
            f"heapwatch_previous_black_box_timestamp_seconds{{{SELECTOR}}}[$__range]"
            "))) or vector(0)"
        ),
    }


def top_sites_query() -> str:
    return f"topk({TOP}, sum by ({SITE_LABELS}) (heapwatch_lineno_size_bytes{{{SITES}}}))"


def top_sites_over_time_query() -> str:
    # The ten largest at the end of the range, drawn over the whole range
    # (topk in a range query would pick a different ten at every step).
    size = f"sum by ({SITE_LABELS}) (heapwatch_lineno_size_bytes{{{SITES}}}"
    return f"{size})\nand on ({SITE_LABELS})\ntopk({TOP}, {size} @ end()))"


def fastest_growing_query() -> str:
    return (
        f"topk({TOP}, sum by ({SITE_LABELS}) "
        f"(deriv(heapwatch_lineno_size_bytes{{{SITES}}}[$__range])) > 0)"
    )


def leak_score_query() -> str:
    """The agent's leak suspects: the sites whose score is at least its own
    suspect threshold (it exports those beyond its top sites by size).  The
    sum by the site's labels drops the metric name, so that the score and
    the rate rows join on the labels alone."""
    score = f"heapwatch_lineno_leak_score{{{SITES}}} >= {LEAK_SUSPECT:g}"
    return f"max by ({INSTANCE_SITE_LABELS}) (\n  {score}\n)"


def leak_rate_query() -> str:
    """The leak rate (bytes per second) of the same sites."""
    rate = f"heapwatch_lineno_leak_rate_bytes_per_second{{{SITES}}}"
    score = f"heapwatch_lineno_leak_score{{{SITES}}} >= {LEAK_SUSPECT:g}"
    return (
        f"max by ({INSTANCE_SITE_LABELS}) (\n  {rate}\n  and on ({INSTANCE_SITE_LABELS}) {score}\n)"
    )


def leak_route_query() -> str:
    """The route whose requests hold the most of each suspect line (from the
    top lines of the top routes), with its bytes of it: no row where the
    service labels no request or the line is none of its top routes'."""
    route = f"heapwatch_route_lineno_size_bytes{{{SITES}}}"
    score = f"heapwatch_lineno_leak_score{{{SITES}}} >= {LEAK_SUSPECT:g}"
    most = f"topk by ({INSTANCE_SITE_LABELS}) (1, {route})"
    return (
        f"max by ({INSTANCE_SITE_LABELS}, http_route) (\n"
        f"  {most}\n  and on ({INSTANCE_SITE_LABELS}) {score}\n)"
    )


def memory_by_route_query() -> str:
    return f"sum by (job, http_route) (heapwatch_route_size_bytes{{{SELECTOR}}})"


def peak_sites_query() -> str:
    """Each site's share of every interval's peak, for the TOP sites with the
    largest share of any peak in the range (a site that allocated and freed
    within one interval shows only there: it would miss a top at end())."""
    peak = f"sum by ({SITE_LABELS}) (heapwatch_lineno_peak_bytes{{{SITES}}}"
    largest = (
        f"sum by ({SITE_LABELS}) "
        f"(max_over_time(heapwatch_lineno_peak_bytes{{{SITES}}}[$__range] @ end()))"
    )
    return f"{peak})\nand on ({SITE_LABELS})\ntopk({TOP}, {largest})"


def query(expr: str, legend: str, ref_id: str) -> prometheus_builders.Dataquery:
    return (
        prometheus_builders.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref_id)
        .datasource(DATASOURCE)
        .editor_mode(QueryEditorMode.CODE)
        .range()
    )


def instant(expr: str, legend: str, ref_id: str = "A") -> prometheus_builders.Dataquery:
    return query(expr, legend, ref_id).instant()


def legend_table(calcs: list[str]) -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(calcs)
    )


def tooltip_all() -> common_builders.VizTooltipOptions:
    return (
        common_builders.VizTooltipOptions()
        .mode(common.TooltipDisplayMode.MULTI)
        .sort(common.SortOrder.DESCENDING)
    )


def lines(panel: timeseries.Panel) -> timeseries.Panel:
    """The look every time series panel shares."""
    return (
        panel.line_width(1)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
        .legend(legend_table(["lastNotNull", "max"]))
        .tooltip(tooltip_all())
    )


def last_value() -> common_builders.ReduceDataOptions:
    return common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)


def thresholds(*steps: tuple[float, str]) -> dashboard_builders.ThresholdsConfig:
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(models.ThresholdsMode.ABSOLUTE)
        .steps([models.Threshold(value=value, color=color) for value, color in steps])
    )


def stat_panels() -> list[stat.Panel]:
    mode = (
        stat.Panel()
        .title("Mode")
        .description(
            "Tracing mode of each agent: exact traces every allocation, sample "
            "traces allocations a Poisson process picks by bytes."
        )
        .datasource(DATASOURCE)
        .with_target(
            instant(
                f"heapwatch_info{{{SELECTOR}}}",
                "{{mode}} · heapwatch {{version}} · Python {{python_version}}",
            )
        )
        .text_mode(common.BigValueTextMode.NAME)
        .color_mode(common.BigValueColorMode.NONE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .reduce_options(last_value())
        .height(4)
        .span(6)
    )
    sample_interval = (
        stat.Panel()
        .title("Sample interval")
        .description(
            "Mean distance in bytes between sampled allocations in sample mode "
            "(HEAPWATCH_SAMPLE_INTERVAL); 0 means exact mode."
        )
        .datasource(DATASOURCE)
        .with_target(instant(f"heapwatch_sample_interval_bytes{{{SELECTOR}}}", "{{instance}}"))
        .unit("bytes")
        .mappings(
            [models.ValueMap(options={"0": models.ValueMappingResult(text="exact", index=0)})]
        )
        .color_mode(common.BigValueColorMode.NONE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .reduce_options(last_value())
        .height(4)
        .span(6)
    )
    last_cycle = (
        stat.Panel()
        .title("Since last cycle")
        .description(
            "Time since each agent last refreshed its figures; it should stay "
            "near HEAPWATCH_INTERVAL."
        )
        .datasource(DATASOURCE)
        .with_target(
            instant(
                f"time() - heapwatch_last_cycle_timestamp_seconds{{{SELECTOR}}}",
                "{{instance}}",
            )
        )
        .unit("s")
        # Grafana reads the first step as the base (-Infinity) whatever its
        # value; the schema wants a number there, not null.
        .thresholds(thresholds((0, "green"), (60, "orange"), (300, "red")))
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .reduce_options(last_value())
        .height(4)
        .span(6)
    )
    traced = (
        stat.Panel()
        .title("Traced now")
        .description("Memory traced by heapwatch, summed over the chosen instances.")
        .datasource(DATASOURCE)
        .with_target(instant(f"sum(heapwatch_traced_bytes{{{SELECTOR}}})", "traced"))
        .unit("bytes")
        .color_mode(common.BigValueColorMode.NONE)
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(last_value())
        .height(4)
        .span(6)
    )
    return [mode, sample_interval, last_cycle, traced]


def memory_panel(title: str, description: str, queries: dict[str, str]) -> timeseries.Panel:
    panel = (
        lines(timeseries.Panel())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit("bytes")
        .min(0)
        .height(9)
        .span(24)
    )
    for ref_id, (name, expr) in zip("ABCD", queries.items()):
        panel = panel.with_target(query(expr, f"{name} {{{{instance}}}}", ref_id))
    return panel


def traced_memory_panel() -> timeseries.Panel:
    return memory_panel(
        "Traced memory, peak and RSS",
        "Memory traced by heapwatch, its peak during each agent interval, and "
        "the resident set size of the process. RSS above traced is memory "
        "Python did not allocate through the traced allocators (C "
        "extensions, fragmentation, the tracer itself).",
        traced_memory_queries(),
    )


def untraced_memory_panel() -> timeseries.Panel:
    return memory_panel(
        "Memory heapwatch can't see",
        "Where RSS goes besides what heapwatch traces. untraced is RSS minus "
        "the traced bytes and the tracer's own: memory no Python allocation "
        "explains. glibc's heap tells native memory in use (a C library's "
        "blocks, and Python's own large blocks) from memory freed but "
        "retained by the allocator. untraced climbing with C heap in_use while "
        "traced stays flat: native code is leaking or holding memory. "
        "untraced climbing with C heap retained: the allocator keeps freed "
        "memory (fragmentation, many arenas): try MALLOC_ARENA_MAX=2, not a "
        "code change. untraced climbing with neither: memory mapped outside "
        "malloc (a library's own mmap, thread stacks).",
        untraced_memory_queries(),
    )


def container_memory_panel() -> timeseries.Panel:
    return (
        lines(timeseries.Panel())
        .title("Container memory against its limit")
        .description(
            "The memory of each container (or a host's service cgroup), as the "
            "kernel counts it: usage, the working set (usage less the inactive "
            "page cache, what the kubelet and kubectl top show) and the limit, "
            "where there is one. The kernel's OOM killer acts when the working "
            "set reaches the limit; HeapwatchNearMemoryLimit fires above 90% of "
            "it, and heapwatch writes its black boxes at HEAPWATCH_DUMP_AT (90% "
            "and 97% by default). The processes of a container report the same "
            "figures: one line each per container."
        )
        .datasource(DATASOURCE)
        .with_target(query(container_memory_query(), "{{figure}} {{host}}", "A"))
        .fill_opacity(0)
        .unit("bytes")
        .min(0)
        .height(9)
        .span(16)
    )


def container_events_panel() -> stat.Panel:
    panel = (
        stat.Panel()
        .title("OOM kills and black boxes")
        .description(
            "Over the time range: processes the kernel's OOM killer killed in "
            "containers that lived on (a container killed as a whole starts "
            "again with a new count); black boxes the processes wrote as the "
            "working set crossed HEAPWATCH_DUMP_AT; and black boxes of killed "
            "processes that their successors found (HeapwatchPreviousBlackBox: "
            "the alert names the dump and its top site)."
        )
        .datasource(DATASOURCE)
        .decimals(0)
        .thresholds(thresholds((0, "green"), (1, "red")))
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(last_value())
        .height(9)
        .span(8)
    )
    for ref_id, (name, expr) in zip("ABC", container_events_queries().items()):
        panel = panel.with_target(instant(expr, name, ref_id))
    return panel


def top_sites_panel() -> bargauge.Panel:
    return (
        bargauge.Panel()
        .title(f"Top {TOP} sites by size")
        .description(
            "Allocation sites (file:line) holding the most traced memory now, "
            "summed over the chosen instances."
        )
        .datasource(DATASOURCE)
        .with_target(instant(top_sites_query(), SITE_LEGEND))
        .unit("bytes")
        .min(0)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .orientation(common.VizOrientation.HORIZONTAL)
        .name_placement(common.BarGaugeNamePlacement.TOP)
        .reduce_options(last_value())
        .height(10)
        .span(12)
    )


def fastest_growing_panel() -> bargauge.Panel:
    return (
        bargauge.Panel()
        .title("Fastest-growing sites")
        .description(
            "Growth rate of each site over the selected time range (the "
            "least-squares slope of its size, deriv), largest first. Sites that "
            "shrank are left out."
        )
        .datasource(DATASOURCE)
        .with_target(instant(fastest_growing_query(), SITE_LEGEND))
        .unit("binBps")
        .min(0)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .orientation(common.VizOrientation.HORIZONTAL)
        .name_placement(common.BarGaugeNamePlacement.TOP)
        .reduce_options(last_value())
        .height(10)
        .span(12)
    )


def leak_suspects_panel() -> table.Panel:
    return (
        table.Panel()
        .title("Leak suspects")
        .description(
            "Sites whose leak score, computed by the agent over its "
            "HEAPWATCH_LEAK_WINDOW (30 minutes by default), is at least "
            f"{LEAK_SUSPECT:g}, with the rate they leak at (bytes per second, over "
            "the span that scored). The score is 0 to 1: memory that survives and "
            "grows steadily, far above its noise (a cache filling then "
            "stopping, a batch, churn stay low). The HeapwatchLeakSuspect alert "
            "fires on the same score (deploy/README.md). The route is the one "
            "whose requests hold the most of the line, with its bytes of it (where "
            "the service labels its requests, and the line is among the top lines of "
            "the agent's top routes). As of the end of the time range. "
            "Take a dump of the instance to see the tracebacks."
        )
        .datasource(DATASOURCE)
        .with_target(instant(leak_score_query(), SITE_LEGEND, "A").format(PromQueryFormat.TABLE))
        .with_target(instant(leak_rate_query(), SITE_LEGEND, "B").format(PromQueryFormat.TABLE))
        .with_target(instant(leak_route_query(), SITE_LEGEND, "C").format(PromQueryFormat.TABLE))
        .with_transformation(models.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            models.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True},
                    "indexByName": {
                        "job": 0,
                        "instance": 1,
                        "code_file_path": 2,
                        "code_line_number": 3,
                        "Value #A": 4,
                        "Value #B": 5,
                        "http_route": 6,
                        "Value #C": 7,
                    },
                    "renameByName": {
                        "code_file_path": "file",
                        "code_line_number": "line",
                        "Value #A": "score",
                        # No unit per column: the schema this dashboard is
                        # checked against refuses field overrides' values.
                        "Value #B": "rate (B/s)",
                        "http_route": "route",
                        "Value #C": "route's bytes",
                    },
                },
            )
        )
        .sort_by([common_builders.TableSortByFieldState().display_name("score").desc(True)])
        .filterable(True)
        .height(9)
        .span(24)
    )


def memory_by_route_panel() -> timeseries.Panel:
    return (
        lines(timeseries.Panel())
        .title("Memory by route")
        .description(
            "Traced memory by the route of the request it was allocated for "
            "(http.route, from OpenTelemetry or heapwatch's middleware; sample "
            'mode), summed over the chosen instances: "<none>" was allocated '
            'outside any request, "<other>" sums the routes past the agent\'s '
            "HEAPWATCH_TOP_ROUTES. Empty when the service labels no request."
        )
        .datasource(DATASOURCE)
        .with_target(query(memory_by_route_query(), ROUTE_LEGEND, "A"))
        .unit("bytes")
        .min(0)
        .height(9)
        .span(24)
    )


def peak_sites_panel() -> timeseries.Panel:
    return (
        lines(timeseries.Panel())
        .title("What made the peak")
        .description(
            "For each agent interval, the bytes each site held at the moment "
            "traced memory reached that interval's peak, stacked: the stack's "
            "height is the peak of the sites shown (the peak itself is on "
            f"Traced memory, peak and RSS). The {TOP} sites with the largest "
            "share of any peak in the time range. A site that allocates and "
            "frees within one interval shows here and nowhere else."
        )
        .datasource(DATASOURCE)
        .with_target(query(peak_sites_query(), SITE_LEGEND, "A"))
        .stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
        .unit("bytes")
        .min(0)
        .height(9)
        .span(24)
    )


def top_sites_over_time_panel() -> timeseries.Panel:
    return (
        lines(timeseries.Panel())
        .title(f"Top {TOP} sites over time")
        .description(
            f"Size of the {TOP} largest sites at the end of the range, over the "
            "whole range: a leak is a line that keeps climbing."
        )
        .datasource(DATASOURCE)
        .with_target(query(top_sites_over_time_query(), SITE_LEGEND, "A"))
        .unit("bytes")
        .min(0)
        .height(9)
        .span(24)
    )


def tracer_memory_panel() -> timeseries.Panel:
    return (
        lines(timeseries.Panel())
        .title("Tracer memory")
        .description(
            "What heapwatch costs in memory: its own trace tables and "
            "tracebacks, outside the traced figures."
        )
        .datasource(DATASOURCE)
        .with_target(query(f"heapwatch_tracer_memory_bytes{{{SELECTOR}}}", "{{instance}}", "A"))
        .unit("bytes")
        .min(0)
        .height(8)
        .span(8)
    )


def cycle_time_panel() -> timeseries.Panel:
    return (
        lines(timeseries.Panel())
        .title("Cycle time")
        .description(
            "What heapwatch costs in time: how long each agent cycle (snapshot, "
            "grouping by line, export) took."
        )
        .datasource(DATASOURCE)
        .with_target(query(f"heapwatch_cycle_duration_seconds{{{SELECTOR}}}", "{{instance}}", "A"))
        .unit("s")
        .min(0)
        .height(8)
        .span(8)
    )


def agent_health_panel() -> timeseries.Panel:
    rates = {
        "cycles": "heapwatch_cycles_total",
        "cycle errors": "heapwatch_cycle_errors_total",
        "dropped traces": "heapwatch_dropped_traces_total",
    }
    panel = (
        lines(timeseries.Panel())
        .title("Agent cycles, errors and dropped traces")
        .description(
            "Per-second rates: cycles should be 1/HEAPWATCH_INTERVAL; errors and "
            "dropped traces should be 0."
        )
        .datasource(DATASOURCE)
        .unit("ops")
        .min(0)
        .height(8)
        .span(8)
    )
    for ref_id, (name, metric) in zip("ABC", rates.items()):
        expr = f"rate({metric}{{{SELECTOR}}}[$__rate_interval])"
        panel = panel.with_target(query(expr, f"{name} {{{{instance}}}}", ref_id))
    return panel


def variables() -> list[dashboard_builders.DatasourceVariable | dashboard_builders.QueryVariable]:
    datasource = (
        dashboard_builders.DatasourceVariable("datasource").label("Data source").type("prometheus")
    )
    job = (
        dashboard_builders.QueryVariable("job")
        .label("Job")
        .datasource(DATASOURCE)
        .query("label_values(heapwatch_info, job)")
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
    )
    instance = (
        dashboard_builders.QueryVariable("instance")
        .label("Instance")
        .datasource(DATASOURCE)
        .query('label_values(heapwatch_info{job=~"$job"}, instance)')
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.NATURAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".+")
    )
    return [datasource, job, instance]


def build() -> dashboard_builders.Dashboard:
    builder = (
        dashboard_builders.Dashboard("heapwatch")
        .uid(UID)
        .description(
            "Python heap of services running the heapwatch agent: traced memory, "
            "the memory it cannot attribute, the container's memory against its "
            "limit, top and growing allocation sites, "
            "leak suspects, memory by route, what made each peak, and the tracer's cost."
        )
        .tags(["heapwatch", "python", "memory"])
        .editable()
        .timezone(common.TimeZoneBrowser)
        .time("now-6h", "now")
        .refresh("30s")
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .variables(list(variables()))
    )
    panels: list[stat.Panel | timeseries.Panel | bargauge.Panel | table.Panel] = [
        *stat_panels(),
        traced_memory_panel(),
        untraced_memory_panel(),
        container_memory_panel(),
        container_events_panel(),
        top_sites_panel(),
        fastest_growing_panel(),
        leak_suspects_panel(),
        memory_by_route_panel(),
        peak_sites_panel(),
        top_sites_over_time_panel(),
        tracer_memory_panel(),
        cycle_time_panel(),
        agent_health_panel(),
    ]
    for number, panel in enumerate(panels, start=1):
        builder = builder.with_panel(panel.id(number))
    return builder


def render() -> str:
    """The dashboard as the JSON committed in deploy/grafana/dashboard.json."""
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed JSON is stale"
    )
    parser.add_argument("--output", type=Path, default=OUTPUT, help="default: %(default)s")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
