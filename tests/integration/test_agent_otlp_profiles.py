"""The otlp-profiles exporter against real loopback receivers: the request
decodes with opentelemetry-proto's own classes, the leak tops inuse_space
and the churn alloc_space, and a receiver that is down, slow, or answers 500
or 413 costs the service nothing."""

from __future__ import annotations

import gzip
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_agent_pyroscope import Receiver, cycles_complete

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig, ConfigError
from support.profiles_proto import profiles_service_pb2
from support.waiting import wait_for

pb = profiles_service_pb2()

hoard: list[bytearray] = []


def hoard_memory() -> None:
    for _ in range(100):
        hoard.append(bytearray(100_000))


def churn_memory() -> None:
    # Allocates far more than hoard_memory, and keeps none of it.
    for _ in range(3000):
        bytearray(100_000)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.hold.set()
        server.shutdown()
        server.server_close()


def start(monkeypatch: pytest.MonkeyPatch, endpoint: str, **settings: Any) -> Agent:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    config = AgentConfig(port=0, interval=3600, exporters=("otlp-profiles",), **settings)
    agent = Agent(config)
    assert agent.start()
    return agent


def top_function(request: Any, profile: Any) -> str:
    """The leaf function of the profile's largest sample."""
    dictionary = request.dictionary
    strings = dictionary.string_table
    sample = max(profile.samples, key=lambda s: s.values[0])
    stack = dictionary.stack_table[sample.stack_index]
    location = dictionary.location_table[stack.location_indices[0]]
    function = dictionary.function_table[location.lines[0].function_index]
    return str(strings[function.name_strindex])


def leaf_functions(request: Any, profile: Any) -> set[str]:
    dictionary = request.dictionary
    names = set()
    for sample in profile.samples:
        stack = dictionary.stack_table[sample.stack_index]
        location = dictionary.location_table[stack.location_indices[0]]
        function = dictionary.function_table[location.lines[0].function_index]
        names.add(dictionary.string_table[function.name_strindex])
    return names


@pytest.mark.parametrize(("mode", "compression"), [("sample", "none"), ("exact", "gzip")])
def test_each_cycle_pushes_inuse_and_alloc_space_with_the_metrics_resource(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, mode: str, compression: str
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "checkout")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20abc,x-tenant=a")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", compression)
    agent = start(monkeypatch, receiver.url + "/", mode=mode)
    try:
        hoard_memory()
        churn_memory()
        agent.run_cycle()
        wait_for(lambda: receiver.pushes, what="a push")
    finally:
        agent.stop()
        hoard.clear()
    path, headers, body = receiver.pushes[-1]
    assert path == "/v1development/profiles"
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["authorization"] == "Bearer abc" and headers["x-tenant"] == "a"
    if compression == "gzip":
        assert headers["content-encoding"] == "gzip"
        body = gzip.decompress(body)
    else:
        assert "content-encoding" not in headers
    request = pb.ExportProfilesServiceRequest.FromString(body)
    (resource_profiles,) = request.resource_profiles
    attributes = {a.key: a.value for a in resource_profiles.resource.attributes}
    assert attributes["service.name"].string_value == "checkout"
    assert attributes["deployment.environment"].string_value == "prod"
    assert attributes["process.pid"].int_value > 0
    (scope_profiles,) = resource_profiles.scope_profiles
    assert scope_profiles.scope.name == "heapwatch"
    strings = request.dictionary.string_table
    kinds = [
        (strings[p.sample_type.type_strindex], strings[p.sample_type.unit_strindex])
        for p in scope_profiles.profiles
    ]
    assert kinds == [("inuse_space", "bytes"), ("alloc_space", "bytes")]
    inuse, allocs = scope_profiles.profiles
    assert top_function(request, inuse) == "hoard_memory"
    assert top_function(request, allocs) == "churn_memory"
    assert "churn_memory" not in leaf_functions(request, inuse)
    for profile in (inuse, allocs):
        assert profile.time_unix_nano > 0 and len(profile.profile_id) == 16
        # The sampling period in sample mode; exact mode has none.
        assert profile.period == (agent.config.sample_interval if mode == "sample" else 0)


@pytest.mark.parametrize("status", [500, 413])
def test_a_refusing_receiver_costs_nothing_and_is_one_line(
    receiver: Receiver,
    status: int,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver.status = status
    caplog.set_level(logging.WARNING, logger="heapwatch")
    agent = start(monkeypatch, receiver.url)
    try:
        cycles_complete(agent, 3)
        # A retry after the back-off: the same failure, still one line.
        wait_for(lambda: len(receiver.pushes) >= 2, what="a retried push")
    finally:
        agent.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "heapwatch.otlp_profiles"]
    assert len(lines) == 1, lines
    assert f"HTTP {status}" in lines[0] and receiver.url in lines[0]
    if status == 413:
        assert "raise its limit" in lines[0]


def test_a_receiver_that_is_down_costs_nothing_and_is_one_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    caplog.set_level(logging.WARNING, logger="heapwatch")
    agent = start(monkeypatch, url)
    try:
        cycles_complete(agent, 3)
        (exporter,) = [e for e in agent.exporters if e.name == "otlp-profiles"]
        wait_for(lambda: getattr(exporter, "failed", 0) >= 2, what="a retried push")
        cycles_complete(agent, 2)
    finally:
        agent.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "heapwatch.otlp_profiles"]
    assert len(lines) == 1, lines
    assert "refused" in lines[0].lower()


def test_a_slow_receiver_never_holds_a_cycle(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver.hold.clear()
    agent = start(monkeypatch, receiver.url)
    try:
        agent.run_cycle()
        assert receiver.arrived.wait(30)
        cycles_complete(agent, 5)
        receiver.hold.set()
        agent.run_cycle()
        wait_for(lambda: len(receiver.pushes) >= 2, what="the next push")
    finally:
        receiver.hold.set()
        agent.stop()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "collector:4318", "http:// or https://"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon", "seconds, above 0"),
        ("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", "zstd", "gzip or none"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization", "key=value pairs"),
    ],
)
def test_a_bad_variable_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    from heapwatch_exporters.otlp_profiles import OtlpProfilesExporter

    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable) as raised:
        OtlpProfilesExporter(AgentConfig(exporters=("otlp-profiles",)))
    assert message in str(raised.value)


def test_the_profiles_endpoint_wins_and_is_used_as_given() -> None:
    from heapwatch_exporters.otlp_profiles import DEFAULT_ENDPOINT, otlp_settings

    both = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
        "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT": "https://b/p",
    }
    assert otlp_settings(both).endpoint == "https://b/p"
    general = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318/"}
    assert otlp_settings(general).endpoint == "http://a:4318/v1development/profiles"
    assert otlp_settings({}).endpoint == DEFAULT_ENDPOINT
