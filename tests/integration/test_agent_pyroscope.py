"""The pyroscope exporter against real loopback receivers: what it pushes
(read back with ``go tool pprof``), and that a receiver that is down, slow,
or answers 500 or 413 costs the service nothing."""

from __future__ import annotations

import base64
import http.server
import logging
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_pprof_go import go, run_pprof, top_rows

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig, ConfigError
from support.waiting import wait_for

__all__ = ["go"]  # the fixture, shared with test_pprof_go

hoard: list[bytearray] = []


def hoard_memory() -> None:
    for _ in range(100):
        hoard.append(bytearray(100_000))


class Receiver(http.server.ThreadingHTTPServer):
    """Pyroscope's /ingest on 127.0.0.1: records each push and answers
    ``status``; while ``hold`` is clear it keeps the request waiting."""

    daemon_threads = True

    def __init__(self, status: int = 200) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.status = status
        self.hold = threading.Event()
        self.hold.set()
        self.pushes: list[tuple[str, dict[str, str], bytes]] = []
        self.arrived = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.server.pushes.append((self.path, headers, body))
        self.server.arrived.set()
        self.server.hold.wait(60)
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


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


def start(url: str, **settings: Any) -> Agent:
    config = AgentConfig(
        port=0, interval=3600, exporters=("pyroscope",), pyroscope_url=url, **settings
    )
    agent = Agent(config)
    assert agent.start()
    return agent


def cycles_complete(agent: Agent, n: int) -> None:
    """n cycles run to their end (a cycle that waited for the receiver
    would not: the join fails instead of hanging the test)."""
    worker = threading.Thread(target=lambda: [agent.run_cycle() for _ in range(n)])
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "a cycle waited for the receiver"


def test_each_cycle_pushes_go_pprof_with_the_service_and_its_labels(
    go: tuple[str, dict[str, str], Path],
    receiver: Receiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "checkout")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod")
    agent = start(
        receiver.url,
        pyroscope_user="123456",
        pyroscope_password="glc_secret",
        pyroscope_tenant_id="team-a",
    )
    try:
        hoard_memory()
        agent.run_cycle()
        wait_for(lambda: receiver.pushes, what="a push")
    finally:
        agent.stop()
        hoard.clear()
    path, headers, body = receiver.pushes[-1]
    url = urllib.parse.urlsplit(path)
    assert url.path == "/ingest"
    query = dict(urllib.parse.parse_qsl(url.query))
    assert query["format"] == "pprof"
    assert query["name"].startswith("checkout{")
    assert "deployment_environment=prod" in query["name"]
    assert int(query["from"]) <= int(query["until"])
    assert headers["authorization"] == "Basic " + base64.b64encode(b"123456:glc_secret").decode()
    assert headers["x-scope-orgid"] == "team-a"
    profile = tmp_path / "pushed.pb.gz"
    profile.write_bytes(body)
    raw = run_pprof(go, "-raw", str(profile))
    assert "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes" in raw
    rows = top_rows(run_pprof(go, "-top", "-sample_index=inuse_space", str(profile)))
    assert rows[0][2] == "hoard_memory"


@pytest.mark.parametrize("status", [500, 413])
def test_a_refusing_receiver_costs_nothing_and_is_one_line(
    receiver: Receiver, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.status = status
    caplog.set_level(logging.WARNING, logger="heapwatch")
    agent = start(receiver.url)
    try:
        cycles_complete(agent, 3)
        wait_for(lambda: receiver.pushes, what="a push")
    finally:
        agent.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "heapwatch.pyroscope"]
    assert len(lines) == 1, lines
    assert f"HTTP {status}" in lines[0] and receiver.url in lines[0]
    if status == 413:
        assert "raise its limit" in lines[0]


def test_a_receiver_that_is_down_costs_nothing_and_is_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    caplog.set_level(logging.WARNING, logger="heapwatch")
    agent = start(url)
    try:
        cycles_complete(agent, 3)
        wait_for(
            lambda: [r for r in caplog.records if r.name == "heapwatch.pyroscope"],
            what="the failure's line",
        )
        cycles_complete(agent, 2)
    finally:
        agent.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "heapwatch.pyroscope"]
    assert len(lines) == 1, lines
    assert "Connection refused" in lines[0] or "refused" in lines[0].lower()


def test_a_slow_receiver_never_holds_a_cycle(receiver: Receiver) -> None:
    # Given a receiver that keeps the first push waiting
    receiver.hold.clear()
    agent = start(receiver.url)
    try:
        agent.run_cycle()
        assert receiver.arrived.wait(30)
        # When cycles run while that push waits
        cycles_complete(agent, 5)
        # Then they all ran; and once the receiver answers, pushes go on
        receiver.hold.set()
        agent.run_cycle()
        wait_for(lambda: len(receiver.pushes) >= 2, what="the next push")
    finally:
        receiver.hold.set()
        agent.stop()


def test_without_a_url_the_exporter_says_what_it_needs() -> None:
    from heapwatch_exporters.pyroscope import PyroscopeExporter

    with pytest.raises(ConfigError, match="HEAPWATCH_PYROSCOPE_URL"):
        PyroscopeExporter(AgentConfig(exporters=("pyroscope",)))


@pytest.mark.parametrize(
    "value", ["pyroscope:4040", "ftp://host", "http://", "http://u:p@host", "http://h:port"]
)
def test_a_bad_url_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ConfigError, match=f"pyroscope_url={value!r} is invalid"):
        AgentConfig().replace(pyroscope_url=value)
