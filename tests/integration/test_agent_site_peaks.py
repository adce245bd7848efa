"""Per-site peaks through the C core, the agent and both exporters, in this
process: what made the interval's peak, even when it is gone by the end."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("opentelemetry.sdk.metrics")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import heapwatch
from heapwatch.agent.agent import Agent
from support.waiting import wait_for

MIB = 1 << 20


pytestmark = pytest.mark.usefixtures("no_agent")


def hold_ten_mib() -> bytearray:
    return bytearray(10 * MIB)


def spike_fifty_mib() -> None:
    spike = bytearray(50 * MIB)
    del spike


B_LINE = hold_ten_mib.__code__.co_firstlineno + 1
A_LINE = spike_fifty_mib.__code__.co_firstlineno + 1


def scrape(agent: Agent) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of /metrics, over HTTP, by name."""
    url = agent.metrics_url
    assert url is not None
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def ours(series: list[tuple[dict[str, str], float]], line: int) -> float | None:
    for labels, value in series:
        if labels["code_file_path"] == __file__ and labels["code_line_number"] == str(line):
            return value
    return None


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_spike_freed_within_the_interval_shows_in_the_peaks_not_the_sizes(mode: str) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    # Given an agent whose cycles the test runs (its own interval is an hour)
    agent = heapwatch.start_agent(
        port=0,
        interval=3600,
        mode=mode,
        top=5,
        exporters=["prometheus", "otlp"],
        meter_provider=provider,
    )
    assert agent is not None
    wait_for(lambda: agent.readings().cycles >= 1)
    agent.run_cycle()
    # When site B holds 10 MiB and site A allocates 50 MiB and frees it
    held = hold_ten_mib()
    spike_fifty_mib()
    result = agent.run_cycle()
    # (a bytearray of n bytes is n + 1 bytes and its object; in sample mode a
    # block that size is always sampled, and weighs its size, give or take a
    # sampled small block of the same line)
    slack = 4096 if mode == "exact" else MIB

    def about(value: float | None, mib: int) -> bool:
        return value is not None and abs(value - mib * MIB) < slack

    # Then the agent's sites: sizes show B alone, peaks A at 50 MiB and B at 10 MiB
    sites = {(s.file, s.line): s for s in result.sites}
    assert about(sites[__file__, B_LINE].size, 10)
    assert about(sites[__file__, B_LINE].peak, 10)
    # (A's line may keep a small object a free list holds: 3.14+ keeps freed
    # ints there, and the int that sized the spike was made on that line)
    assert sites[__file__, A_LINE].size < slack
    assert about(sites[__file__, A_LINE].peak, 50)
    # and the peaks of the sites and <other> sum to the traced peak, exactly
    assert sum(s.peak for s in result.sites) == result.peak
    # Prometheus: a real scrape of /metrics
    found = scrape(agent)
    size_a = ours(found["heapwatch_lineno_size_bytes"], A_LINE)
    assert size_a is not None and size_a < slack
    assert about(ours(found["heapwatch_lineno_size_bytes"], B_LINE), 10)
    assert about(ours(found["heapwatch_lineno_peak_bytes"], A_LINE), 50)
    assert about(ours(found["heapwatch_lineno_peak_bytes"], B_LINE), 10)
    peaks = found["heapwatch_lineno_peak_bytes"]
    assert sum(v for _, v in peaks) == found["heapwatch_traced_peak_bytes"][0][1]
    # and the allocation counter: A allocated 50 MiB it no longer holds
    assert about(sites[__file__, A_LINE].allocated, 50)
    assert about(ours(found["heapwatch_lineno_allocated_bytes_total"], A_LINE), 50)
    assert about(ours(found["heapwatch_lineno_allocated_bytes_total"], B_LINE), 10)
    # OpenTelemetry: the application's reader
    otel_peaks: dict[tuple[Any, Any], float] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == "heapwatch.lineno.peak":
                    assert metric.unit == "By"
                    for point in metric.data.data_points:
                        attributes = dict(point.attributes or {})
                        key = (attributes["code.file.path"], attributes["code.line.number"])
                        otel_peaks[key] = point.value
    assert about(otel_peaks[__file__, A_LINE], 50)
    assert about(otel_peaks[__file__, B_LINE], 10)
    assert sum(otel_peaks.values()) == result.peak
    # A spike again adds to A's allocation counter; its size stays put
    spike_fifty_mib()
    again = {(s.file, s.line): s for s in agent.run_cycle().sites}
    assert about(again[__file__, A_LINE].allocated, 100)
    assert again[__file__, A_LINE].size < slack
    del held
    assert heapwatch.stop_agent() is True
    provider.shutdown()
