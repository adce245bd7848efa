"""The host's stderr gets one clear line per distinct problem, never a
traceback for an expected condition: idle or half-sent HTTP requests, an
endpoint reachable beyond loopback."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _deploy_support import free_port, get_text, source_pythonpath, stop_process

from heapwatch.server import http as _server
from heapwatch.server.http import Server
from heapwatch.server.router import Router
from support.agent_process import free_ports, run_script
from support.waiting import wait_for


@pytest.fixture
def quick_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_server._Handler, "timeout", 0.3)
    # a fresh rate limit for each test
    monkeypatch.setattr(_server, "problems", _server.ProblemLog(_server.log))


@pytest.fixture
def server(quick_timeout: None) -> Iterator[Server]:
    router = Router()
    router.add("/metrics", lambda environ, start: [b""])
    served = Server(router, "127.0.0.1", 0)
    assert served.start()
    yield served
    served.stop()


def test_idle_and_half_sent_requests_give_one_line_and_no_traceback(
    server: Server, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, "heapwatch")
    assert server.address is not None
    # Given clients that connect and say nothing, or half a request line
    clients = [socket.create_connection(server.address) for _ in range(3)]
    clients[1].sendall(b"GET /metr")
    clients[2].sendall(b"GET /metrics HTTP/1.0\r\n")
    try:
        # When the server's timeout passes for each of them
        for client in clients:
            client.settimeout(10)
            assert client.recv(1) == b""  # closed by the server
        time.sleep(0.1)
    finally:
        for client in clients:
            client.close()
    # Then one warning says so, naming the client, and nothing goes to stderr
    shown = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in shown] == [
        "heapwatch HTTP: a client at 127.0.0.1 sent no complete request within 0.3s; "
        "its connection was closed"
    ]
    assert shown[0].exc_info is None
    out, err = capfd.readouterr()
    assert err == ""
    assert "Traceback" not in out


def test_loopback_is_served_without_a_word(
    quick_timeout: None, caplog: pytest.LogCaptureFixture
) -> None:
    router = Router(token="t" * 32)
    router.add("/debug/x", lambda environ, start: [b""], protected=True)
    served = Server(router, "127.0.0.1", 0)
    caplog.set_level(logging.WARNING, "heapwatch")
    assert served.start()
    served.stop()
    assert caplog.records == []


# Tests bind 127.0.0.1 only: beyond loopback is checked on the bound
# address the server would report.
@pytest.mark.parametrize("bound", ["0.0.0.0", "::", "10.1.2.3", "fe80::1%eth0"])
def test_an_endpoint_beyond_loopback_warns(bound: str, caplog: pytest.LogCaptureFixture) -> None:
    router = Router()
    router.add("/metrics", lambda environ, start: [b""])
    caplog.set_level(logging.WARNING, "heapwatch")
    _server._warn_if_exposed(bound, "http://host:9438", router)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "/metrics on http://host:9438, beyond loopback" in record.getMessage()
    assert "HEAPWATCH_HOST=127.0.0.1" in record.getMessage()


def test_debug_routes_beyond_loopback_warn_louder(caplog: pytest.LogCaptureFixture) -> None:
    router = Router(token="t" * 32)
    router.add("/metrics", lambda environ, start: [b""])
    router.add("/debug/heapwatch/top", lambda environ, start: [b""], protected=True)
    caplog.set_level(logging.WARNING, "heapwatch")
    _server._warn_if_exposed("0.0.0.0", "http://0.0.0.0:9438", router)
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert "/debug/" in record.getMessage() and "token travels in clear" in record.getMessage()


@pytest.mark.parametrize("bound", ["127.0.0.1", "127.0.0.53", "::1"])
def test_loopback_addresses_do_not_warn(bound: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "heapwatch")
    _server._warn_if_exposed(bound, "http://x", Router(token="t" * 32))
    assert caplog.records == []


OTLP_TO_NOWHERE = textwrap.dedent(
    """\
    import time

    import heapwatch

    heapwatch.start_agent(exporters="otlp", interval=0.1)
    time.sleep(1.5)  # exports fail every 0.2 s; then the exit's last one
    """
)


def test_an_unreachable_collector_is_a_line_per_problem_not_tracebacks(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    # Given a service exporting to a collector that is not there
    done = run_script(
        OTLP_TO_NOWHERE,
        cwd=tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_ports()}",
        OTEL_METRIC_EXPORT_INTERVAL="200",
        OTEL_METRIC_EXPORT_TIMEOUT="1000",
    )
    # Then it exits as usual, having said each distinct thing once, on one line
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert lines, "the failure is said"
    assert all(line.startswith("heapwatch") for line in lines), lines
    shapes = [re.sub(r"[\d.]+", "N", line) for line in lines]
    assert len(shapes) == len(set(shapes)), lines


GUNICORN_APP = """
def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\\n"]
"""


def test_gunicorns_own_signal_is_said_once_by_name(tmp_path: Path) -> None:
    # Given gunicorn started as users start it, whose master takes SIGUSR2
    # after the agent has (and whose workers re-arm as they start)
    pytest.importorskip("gunicorn")
    (tmp_path / "wsgi_app.py").write_text(GUNICORN_APP)
    env = dict(os.environ)
    source_pythonpath(env, str(tmp_path))
    port = free_port()
    env.update(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_PORT=str(free_ports(8)),
        HEAPWATCH_DUMP_DIR=str(tmp_path / "dumps"),
        XDG_RUNTIME_DIR=str(tmp_path),
    )
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-w",
                "3",
                "-b",
                f"127.0.0.1:{port}",
                "wsgi_app:application",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    try:
        wait_for(lambda: log.read_text().count("Booting worker") == 3, what=log.read_text)
        wait_for(lambda: get_text(f"http://127.0.0.1:{port}/") == "ok\n")
        time.sleep(1.0)  # the workers' agents have started
    finally:
        stop_process(proc, timeout=30)
    # Then the line is there once, naming the handler, not its address
    said = [line for line in log.read_text().splitlines() if "does not handle SIGUSR2" in line]
    assert said == [
        "heapwatch does not handle SIGUSR2: the application handles it already "
        "(gunicorn.arbiter.Arbiter.signal); choose a free signal with "
        "HEAPWATCH_DUMP_SIGNAL, or none"
    ], log.read_text()
