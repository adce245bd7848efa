"""The agent's HTTP endpoint: routes, the bearer token, the port rule, stopping."""

from __future__ import annotations

import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.runtime.threads import own_threads
from heapwatch.server.http import Server
from heapwatch.server.router import Router
from support.agent_model import ModelSource
from support.agent_process import free_ports


def hello(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello " + environ["SCRIPT_NAME"].encode()]


def get(url: str, token: str | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        with error:  # its body is a temporary file: 3.14 warns if it is left open
            return error.code, error.read().decode(), dict(error.headers)


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Server] = []

    def start(router: Router, port: int = 0, port_range: int = 1) -> Server:
        server = Server(router, "127.0.0.1", port, port_range)
        assert server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_routes_dispatch_on_the_exact_path(serve: Any) -> None:
    router = Router()
    router.add("/metrics", hello)
    server = serve(router)
    assert get(f"{server.url}/metrics")[:2] == (200, "hello /metrics")
    assert get(f"{server.url}/metrics/extra")[0] == 404
    status, body, _ = get(f"{server.url}/")
    assert (status, body) == (200, "heapwatch agent\n/metrics\n")
    # a route added while serving is served at once
    router.add("/debug/heapwatch/top", hello, protected=True)
    assert get(f"{server.url}/debug/heapwatch/top")[0] == 403
    with pytest.raises(ValueError, match="starts with '/'"):
        router.add("metrics", hello)


def test_protected_routes_need_the_bearer_token(serve: Any) -> None:
    router = Router(token="s3cret")
    router.add("/debug/pprof/heap", hello, protected=True)
    router.add("/metrics", hello)
    server = serve(router)
    url = f"{server.url}/debug/pprof/heap"
    status, _, headers = get(url)
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert get(url, token="wrong")[0] == 401
    assert get(url, token="s3cret")[:2] == (200, "hello /debug/pprof/heap")
    assert get(f"{server.url}/metrics")[0] == 200
    # protected routes are not listed on the index
    assert "/debug" not in get(f"{server.url}/")[1]


def test_the_first_free_port_of_the_range_is_taken(serve: Any) -> None:
    base = free_ports(3)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base))
        busy.listen()
        first = serve(Router(), base, 3)
        second = serve(Router(), base, 3)
        assert first.address == ("127.0.0.1", base + 1)
        assert second.address == ("127.0.0.1", base + 2)


def test_a_full_range_is_a_warning_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    base = free_ports(2)
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", base))
        a.listen()
        b.bind(("127.0.0.1", base + 1))
        b.listen()
        with caplog.at_level(logging.WARNING, logger="heapwatch.server"):
            assert Server(Router(), "127.0.0.1", base, 2).start() is False
    message = caplog.records[0].getMessage()
    assert f"ports {base} to {base + 1}" in message
    assert "HEAPWATCH_PORT_RANGE" in message


def test_port_zero_takes_any_free_port(serve: Any) -> None:
    server = serve(Router(), 0, 5)
    assert server.address[1] > 0


def test_stop_is_prompt_idempotent_and_frees_the_port() -> None:
    server = Server(Router(), "127.0.0.1", 0)
    assert server.start()
    port = server.address[1]
    (thread,) = [t for t in own_threads() if t.name == "heapwatch-http"]
    assert thread.daemon
    started = time.monotonic()
    assert server.stop(timeout=5)
    assert time.monotonic() - started < 1.0
    assert server.stop() is True
    assert not thread.is_alive()
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


def test_ipv6_loopback_is_served_when_available(serve: Any) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    router = Router()
    router.add("/metrics", hello)
    server = Server(router, "::1", 0)
    assert server.start()
    try:
        assert server.url.startswith("http://[::1]:")
        assert get(f"{server.url}/metrics")[0] == 200
    finally:
        server.stop()


def test_the_agent_serves_metrics_and_stops_serving() -> None:
    source = ModelSource()
    source.allocate("app.py", 1, 100)
    agent = Agent(AgentConfig(port=0, interval=3600), source=source)
    assert agent.start()
    try:
        url = agent.metrics_url
        assert url is not None and url.endswith("/metrics")
        for _ in range(100):
            status, body, _ = get(url)
            if "heapwatch_traced_bytes 100.0" in body:
                break
            time.sleep(0.05)
        assert status == 200
        assert "heapwatch_traced_bytes 100.0" in body
    finally:
        assert agent.stop()
    assert agent.metrics_url is None
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_routes_added_after_start_are_served_on_request() -> None:
    # Given an agent with no exporter, hence no endpoint
    agent = Agent(AgentConfig(port=0, interval=3600, exporters=()), source=ModelSource())
    assert agent.start()
    try:
        assert agent.address is None
        # When a component adds a route and asks for the endpoint
        agent.router.add("/debug/heapwatch/top", hello)
        url = agent.serve()
        # Then it is served
        assert url is not None
        assert get(f"{url}/debug/heapwatch/top")[:2] == (200, "hello /debug/heapwatch/top")
        assert agent.metrics_url is None
        assert agent.serve() == url
    finally:
        agent.stop()
