"""OpenTelemetry end to end: the real OTLP/HTTP exporter sends to a local receiver."""

from __future__ import annotations

import gzip
import http.server
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from support.agent_process import clean_env, fetch, free_ports, installed_python, running
from support.waiting import wait_for

LEAKY = """\
import sys, time

leak = []


def grow():
    leak.append(bytearray(100_000))  # LEAK


for _ in range(int(sys.argv[1])):
    grow()
    time.sleep(0.05)
print("exiting", time.time(), flush=True)
"""
LEAK_LINE = next(i for i, text in enumerate(LEAKY.splitlines(), 1) if "# LEAK" in text)


class Receiver:
    """An OTLP/HTTP metrics receiver on 127.0.0.1 that keeps what it decodes."""

    def __init__(self) -> None:
        self.requests: list[tuple[float, str, ExportMetricsServiceRequest]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append((time.time(), self.path, request))
                reply = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    try:
        yield receiver
    finally:
        receiver.close()


def attributes(items: Any) -> dict[str, Any]:
    out = {}
    for kv in items:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def heapwatch_metrics(request: ExportMetricsServiceRequest) -> dict[str, Any]:
    found = {}
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            if scope_metrics.scope.name == "heapwatch":
                for metric in scope_metrics.metrics:
                    found[metric.name] = metric
    return found


def leak_size(request: ExportMetricsServiceRequest) -> float:
    metric = heapwatch_metrics(request).get("heapwatch.lineno.size")
    if metric is None:
        return 0.0
    for point in metric.gauge.data_points:
        attrs = attributes(point.attributes)
        if attrs["code.file.path"].endswith("leaky.py") and attrs["code.line.number"] == LEAK_LINE:
            return point.as_int or point.as_double
    return 0.0


EXPECTED_UNITS = {
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
    "heapwatch.black_box.dumps": "{dump}",
}
# The container's, by the ContainerMemory field each reads: the service runs
# in the test's cgroup, so it publishes those this cgroup has.
CONTAINER_UNITS = {
    "limit": ("heapwatch.container.memory.limit", "By"),
    "high": ("heapwatch.container.memory.high", "By"),
    "usage": ("heapwatch.container.memory.usage", "By"),
    "working_set": ("heapwatch.container.memory.working_set", "By"),
    "oom_kills": ("heapwatch.container.oom_kills", "{kill}"),
    "pressure_some": ("heapwatch.container.memory.pressure", "s"),
}


def expected_units() -> dict[str, str]:
    from heapwatch.runtime.container import find_memory_cgroup, read_container_memory

    units = dict(EXPECTED_UNITS)
    cgroup = find_memory_cgroup()
    if cgroup is not None:
        memory = read_container_memory(cgroup)._asdict()
        units.update(
            name_unit for field, name_unit in CONTAINER_UNITS.items() if memory[field] is not None
        )
    return units


def otel_env(receiver: Receiver, **extra: str) -> dict[str, str]:
    return clean_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_METRIC_EXPORT_INTERVAL="300",
        OTEL_SERVICE_NAME="leaky-service",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
        HEAPWATCH_INTERVAL="0.2",
        # As without opentelemetry-distro (installed for the route tests):
        # no SDK configured by opentelemetry-instrument, so heapwatch builds
        # its own MeterProvider, which these tests are about.  (The distro's
        # configurator would set up gRPC exporters, not installed here.)
        OTEL_PYTHON_CONFIGURATOR="none",
        OTEL_PYTHON_DISTRO="none",
        **extra,
    )


def check_received(receiver: Receiver, pid: int) -> None:
    path, first = receiver.requests[0][1:]
    assert path == "/v1/metrics"
    resource = attributes(first.resource_metrics[0].resource.attributes)
    assert resource["service.name"] == "leaky-service"
    assert resource["deployment.environment"] == "test"
    assert resource["process.pid"] == pid
    metrics = heapwatch_metrics(receiver.requests[-1][2])
    assert {name: metric.unit for name, metric in metrics.items()} == expected_units()
    heap = {
        attributes(point.attributes)["state"]: point.as_int or point.as_double
        for point in metrics["heapwatch.native_heap"].gauge.data_points
    }
    assert set(heap) == {"in_use", "retained"} and heap["in_use"] > 0
    (resident,) = metrics["heapwatch.process.resident"].gauge.data_points
    assert (resident.as_int or resident.as_double) > 0
    sizes = [leak_size(request) for _, _, request in receiver.requests]
    assert max(sizes) > 1_000_000
    assert sizes[-1] > next(size for size in sizes if size)  # it grew


def test_otlp_exporter_sends_the_leak_to_a_receiver(receiver: Receiver, tmp_path: Path) -> None:
    # Given a script that does not import heapwatch, exporting over OTLP
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY)
    port = free_ports()
    env = otel_env(
        receiver, HEAPWATCH_ENABLED="1", HEAPWATCH_EXPORTERS="otlp", HEAPWATCH_PORT=str(port)
    )
    with running([installed_python(), str(script), "60"], env, cwd=tmp_path) as proc:
        wait_for(lambda: any(leak_size(r) for _, _, r in receiver.requests))
        # No /metrics port: HEAPWATCH_EXPORTERS has no prometheus
        assert fetch(f"http://127.0.0.1:{port}/metrics", timeout=1) is None
        assert proc.wait(timeout=60) == 0
        stdout, stderr = proc.output()  # type: ignore[attr-defined]
    # Then the receiver decoded heapwatch's metrics, attributes and resource
    check_received(receiver, proc.pid)
    # and the last export came at exit, after the script's last line ran
    exited_at = float(stdout.split()[1])
    assert receiver.requests[-1][0] >= exited_at
    assert "Traceback" not in stderr, stderr


def test_opentelemetry_instrument_switches_heapwatch_on(receiver: Receiver, tmp_path: Path) -> None:
    instrument = Path(sys.executable).parent / "opentelemetry-instrument"
    if not instrument.exists():
        pytest.skip("opentelemetry-instrument is not installed")
    installed_python()
    # Given a script run by opentelemetry-instrument, HEAPWATCH_ENABLED unset
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY)
    port = free_ports()
    env = otel_env(receiver, HEAPWATCH_PORT=str(port))
    with running(
        [str(instrument), installed_python(), str(script), "60"], env, cwd=tmp_path
    ) as proc:
        # Then the heapwatch instrumentor exports its metrics over OTLP
        wait_for(lambda: any(leak_size(r) for _, _, r in receiver.requests))
        assert fetch(f"http://127.0.0.1:{port}/metrics", timeout=1) is None
        assert proc.wait(timeout=60) == 0
        _, stderr = proc.output()  # type: ignore[attr-defined]
    check_received(receiver, proc.pid)
    assert "Traceback" not in stderr, stderr


def test_opentelemetry_instrument_respects_heapwatch_enabled_false(
    receiver: Receiver, tmp_path: Path
) -> None:
    instrument = Path(sys.executable).parent / "opentelemetry-instrument"
    if not instrument.exists():
        pytest.skip("opentelemetry-instrument is not installed")
    installed_python()
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY)
    env = otel_env(receiver, HEAPWATCH_ENABLED="false")
    with running([str(instrument), installed_python(), str(script), "10"], env) as proc:
        assert proc.wait(timeout=60) == 0
    assert receiver.requests == []
    assert os.environ.get("HEAPWATCH_ENABLED") is None
