"""The agent's /debug/ routes over real HTTP, against the C tracer in this process."""

from __future__ import annotations

import json
import os
import socket
import threading
import tracemalloc as stdlib_tm
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Callable

import pytest

from heapwatch import _core
from heapwatch import tracemalloc as hw_tm
from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.cli import main
from heapwatch.formats.dump import read_dump
from heapwatch.formats.pprof import decode_profile
from heapwatch.runtime.source import CoreSource
from heapwatch.server.dumps import DumpService, iter_traces
from heapwatch.server.served_dumps import ServedDumpService
from support.agent_model import ModelSource

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROUTES = (
    "/debug/heapwatch/snapshot",
    "/debug/heapwatch/top",
    "/debug/heapwatch/diff",
    "/debug/heapwatch/leaks",
    "/debug/pprof/heap",
    "/debug/pprof/allocs",
)
HERE = os.path.abspath(__file__)
LEAK_LINE = next(
    i for i, line in enumerate(Path(HERE).read_text().splitlines(), 1) if line.endswith("  # LEAK")
)

leaked: list[bytearray] = []


def leak(count: int) -> None:
    for _ in range(count):
        leaked.append(bytearray(50_000))  # LEAK


Response = tuple[int, Mapping[str, str], bytes]


def get(url: str, headers: Mapping[str, str] | None = None, method: str = "GET") -> Response:
    request = urllib.request.Request(url, headers=dict(headers or {}), method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        with error:  # its body is a temporary file: 3.14 warns if it is left open
            return error.code, error.headers, error.read()


@pytest.fixture
def start_agent() -> Iterator[Callable[..., Agent]]:
    agents: list[Agent] = []

    def start(**settings: Any) -> Agent:
        options: dict[str, Any] = {
            "port": 0,
            "interval": 3600,
            "mode": "exact",
            "token": TOKEN,
            "exporters": ("prometheus",),
        }
        options.update(settings)
        agent = Agent(AgentConfig().replace(**options))
        assert agent.start()
        agents.append(agent)
        # the first cycle, the baseline of /diff, runs as the thread starts
        for _ in range(400):
            if agent.readings().cycles:
                break
            threading.Event().wait(0.025)
        return agent

    yield start
    for agent in agents:
        agent.stop()
    leaked.clear()


def url_of(agent: Agent, path: str) -> str:
    base = agent.serve()
    assert base is not None
    return base + path


def service_of(agent: Agent) -> DumpService:
    (service,) = [e for e in agent.exporters if isinstance(e, DumpService)]
    return service


def test_every_debug_route_needs_the_token_and_metrics_does_not(
    start_agent: Callable[..., Agent],
) -> None:
    agent = start_agent()
    for path in ROUTES:
        status, headers, body = get(url_of(agent, path))
        assert status == 401, path
        assert headers["WWW-Authenticate"] == 'Bearer realm="heapwatch"'
        assert b"Authorization: Bearer" in body
        assert (
            get(url_of(agent, path), {"Authorization": "Bearer wrong-token-0123456789"})[0] == 401
        )
        assert get(url_of(agent, path), {"Authorization": f"Basic {TOKEN}"})[0] == 401
        assert get(url_of(agent, path), AUTH)[0] == 200, path
    status, _, body = get(url_of(agent, "/metrics"))
    assert status == 200
    assert b"heapwatch_traced_bytes" in body
    assert get(url_of(agent, "/metrics"), AUTH)[0] == 200
    # the index lists /metrics and the form a browser trades the token at only
    assert get(url_of(agent, "/"))[2] == b"heapwatch agent\n/debug/heapwatch/login\n/metrics\n"


def test_without_a_token_debug_routes_are_forbidden(start_agent: Callable[..., Agent]) -> None:
    agent = start_agent(token=None)
    for path in ROUTES:
        status, _, body = get(url_of(agent, path), AUTH)
        assert status == 403
        assert b"set HEAPWATCH_TOKEN" in body
    assert get(url_of(agent, "/metrics"))[0] == 200


def test_with_a_token_and_no_exporter_only_debug_is_served(
    start_agent: Callable[..., Agent],
) -> None:
    agent = start_agent(exporters=())
    assert get(url_of(agent, "/debug/heapwatch/top"), AUTH)[0] == 200
    assert get(url_of(agent, "/metrics"))[0] == 404


def test_top_shows_the_leaking_line_as_text_or_json(start_agent: Callable[..., Agent]) -> None:
    agent = start_agent()
    leak(40)
    status, headers, body = get(url_of(agent, "/debug/heapwatch/top?limit=3"), AUTH)
    assert status == 200
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert headers["Cache-Control"] == "no-store"
    lines = body.decode().splitlines()
    assert lines[0] == "Top 3 lines"
    assert lines[1].startswith(f"#1: {HERE}:{LEAK_LINE}: ")
    assert lines[2] == "    leaked.append(bytearray(50_000))  # LEAK"
    assert lines[-1].startswith("Total allocated size: ")

    for query, headers_sent in (("?format=json", {}), ("", {"Accept": "application/json"})):
        status, headers, body = get(
            url_of(agent, "/debug/heapwatch/top" + query), {**AUTH, **headers_sent}
        )
        assert headers["Content-Type"] == "application/json"
        data = json.loads(body)
        first = data["stats"][0]
        assert (first["filename"], first["lineno"]) == (HERE, LEAK_LINE)
        assert first["size"] >= 40 * 50_000
        assert first["count"] >= 40
        assert data["meta"]["pid"] == os.getpid()
        assert data["total"]["size"] >= first["size"]

    status, _, body = get(
        url_of(agent, "/debug/heapwatch/top?key_type=filename&cumulative=1&limit=1"), AUTH
    )
    lines = body.decode().splitlines()
    assert lines[0] == "Top 1 files (cumulative)"
    assert lines[1].startswith(f"#1: {HERE}: ")


def test_top_by_traceback_shows_the_callers(start_agent: Callable[..., Agent]) -> None:
    agent = start_agent(nframe=3)
    leak(40)
    _, _, body = get(url_of(agent, "/debug/heapwatch/top?key_type=traceback&limit=1"), AUTH)
    lines = body.decode().splitlines()
    assert lines[1].startswith(f"#1: {HERE}:{LEAK_LINE}: ")
    assert lines[3].startswith(f"    from {HERE}:")  # the test that called leak()


TOP, DIFF = "/debug/heapwatch/top", "/debug/heapwatch/diff"
SNAPSHOT, PPROF = "/debug/heapwatch/snapshot", "/debug/pprof/heap"
ALLOCS = "/debug/pprof/allocs"
BAD_PARAMETERS = [
    (TOP, "key_type=module", "key_type='module' is invalid: key_type is one of lineno, filename"),
    (TOP, "limit=-1", "limit='-1' is invalid: limit is an integer from 0 to 10000"),
    (TOP, "limit=ten", "limit='ten' is invalid"),
    (TOP, "limit=10001", "limit='10001' is invalid"),
    (TOP, "limit=" + "9" * 5000, "limit='" + "9" * 40 + "...' is invalid"),
    (TOP, "cumulative=yes", "cumulative='yes' is invalid: cumulative is 0 or 1"),
    (TOP, "cumulative=true", "cumulative='true' is invalid: cumulative is 0 or 1"),
    (DIFF, "cumulative=false", "cumulative='false' is invalid: cumulative is 0 or 1"),
    (TOP, "key_type=traceback&cumulative=1", "cumulative=1 is invalid with key_type=traceback"),
    (TOP, "format=xml", "format='xml' is invalid: format is text or json"),
    (TOP, "limit=1&limit=2", "parameter 'limit' is given 2 times"),
    (DIFF, "path=/etc/passwd", "unknown parameter 'path': this route takes key_type, limit"),
    (SNAPSHOT, "file=x", "unknown parameter 'file': this route takes no parameters"),
    (PPROF, "seconds=30", "unknown parameter 'seconds': this route takes gc, debug"),
    (PPROF, "debug=1", "debug='1' is not served: Go's text formats"),
    (ALLOCS, "debug=2", "debug='2' is not served"),
    (PPROF, "gc=2", "gc='2' is invalid: gc is 0 or 1"),
    (PPROF, "gc=true", "gc='true' is invalid: gc is 0 or 1"),
]


@pytest.mark.parametrize(("path", "query", "named"), BAD_PARAMETERS)
def test_a_bad_parameter_is_a_400_naming_it(
    start_agent: Callable[..., Agent], path: str, query: str, named: str
) -> None:
    agent = start_agent()
    status, _, body = get(url_of(agent, f"{path}?{query}"), AUTH)
    assert status == 400
    assert named in body.decode()


class FailingSource:
    def snapshot(self, traces: bool) -> _core.Snapshot:
        raise ValueError("boom")


def test_an_unexpected_failure_is_a_500_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    config = AgentConfig(port=0, interval=3600, token=TOKEN, exporters=())
    agent = Agent(
        config, source=ModelSource(), exporters=[ServedDumpService(config, source=FailingSource())]
    )
    assert agent.start()
    try:
        for path in ROUTES[:2]:
            status, _, body = get(url_of(agent, path), AUTH)
            assert status == 500
            assert b"see the service's log" in body
        # the lock was released: the next request fails the same way, not with 429
        assert get(url_of(agent, ROUTES[0]), AUTH)[0] == 500
    finally:
        agent.stop()
    assert "heapwatch /debug/heapwatch/snapshot failed" in caplog.text
    assert "boom" in caplog.text


def test_only_get_is_allowed(start_agent: Callable[..., Agent]) -> None:
    agent = start_agent()
    status, headers, _ = get(url_of(agent, "/debug/heapwatch/top"), AUTH, method="POST")
    assert (status, headers["Allow"]) == (405, "GET")


def test_diff_shows_what_grew_since_the_last_cycle(start_agent: Callable[..., Agent]) -> None:
    agent = start_agent()
    last = agent.last_snapshot()
    assert last is not None
    leak(40)
    status, _, body = get(url_of(agent, "/debug/heapwatch/diff?format=json&limit=2"), AUTH)
    assert status == 200
    data = json.loads(body)
    first = data["stats"][0]
    assert (first["filename"], first["lineno"]) == (HERE, LEAK_LINE)
    assert first["size_diff"] >= 40 * 50_000
    assert first["count_diff"] >= 40
    assert data["meta"]["since"] == last[1]
    assert data["total"]["size_diff"] >= first["size_diff"] - 100_000
    status, _, body = get(url_of(agent, "/debug/heapwatch/diff?limit=1"), AUTH)
    lines = body.decode().splitlines()
    assert lines[0].startswith("# since the agent's last cycle, ")
    assert lines[1] == "Top 1 differences (lines)"
    assert lines[2].startswith(f"#1: {HERE}:{LEAK_LINE}: ")
    assert "(+" in lines[2]


def test_snapshot_round_trips_through_the_dump_format_and_the_stdlib(
    start_agent: Callable[..., Agent], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a service with a leak, traced with 2 frames
    agent = start_agent(nframe=2)
    leak(40)
    # When its snapshot is fetched
    status, headers, body = get(url_of(agent, "/debug/heapwatch/snapshot"), AUTH)
    assert status == 200
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Content-Disposition"].startswith('attachment; filename="heapwatch-')
    path = tmp_path / "live.hwdump"
    path.write_bytes(body)
    # Then it reads back with its header and the leak
    dump = read_dump(path)
    header = dump.header
    assert (header.pid, header.mode, header.sample_interval) == (os.getpid(), "exact", 0)
    assert header.traceback_limit == 2
    assert header.extra["hostname"] == socket.gethostname()
    assert header.extra["trigger"] == "http"
    loaded = hw_tm.Snapshot.load(path)
    by_line = {
        (str(s.traceback[0].filename), s.traceback[0].lineno): s
        for s in loaded.statistics("lineno")
    }
    assert by_line[HERE, LEAK_LINE].size >= 40 * 50_000
    # and the stdlib's tracemalloc loads its conversion with the same statistics
    out = tmp_path / "live.pickle"
    assert main(["convert", str(path), "--to", "tracemalloc", "-o", str(out)]) == 0
    stdlib = stdlib_tm.Snapshot.load(str(out))
    assert [str(s) for s in stdlib.statistics("traceback")] == [
        str(s) for s in loaded.statistics("traceback")
    ]
    # and heapwatch top reads it
    assert main(["top", str(path), "--limit", "1"]) == 0
    assert f"#1: {HERE}:{LEAK_LINE}: " in capsys.readouterr().out


def test_pprof_profile_of_live_memory(start_agent: Callable[..., Agent]) -> None:
    agent = start_agent(mode="sample", sample_interval=4096)
    leak(40)
    status, headers, body = get(url_of(agent, "/debug/pprof/heap?gc=1"), AUTH)
    assert status == 200
    assert headers["Content-Type"] == "application/octet-stream"
    profile = decode_profile(body)
    strings = profile["string_table"]
    assert [(strings[t["type"]], strings[t["unit"]]) for t in profile["sample_type"]] == [
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]
    assert strings[profile["default_sample_type"]] == "inuse_space"
    assert (strings[profile["period_type"]["type"]], profile["period"]) == ("space", 4096)
    functions = {f["id"]: strings[f["name"]] for f in profile["function"]}
    lines = {
        loc["id"]: (functions[loc["line"][0]["function_id"]], loc["line"][0]["line"])
        for loc in profile["location"]
    }
    leaking = [
        s["value"][3]
        for s in profile["sample"]
        if lines[s["location_id"][0]] == ("leak", LEAK_LINE)
    ]
    assert sum(leaking) > 40 * 50_000 // 2  # an estimate


def test_allocs_is_the_same_profile_with_alloc_space_first(
    start_agent: Callable[..., Agent],
) -> None:
    agent = start_agent()
    status, headers, body = get(url_of(agent, ALLOCS), AUTH)
    assert status == 200
    assert 'filename="allocs.pb.gz"' in headers["Content-Disposition"]
    profile = decode_profile(body)
    strings = profile["string_table"]
    assert strings[profile["default_sample_type"]] == "alloc_space"
    assert len(profile["sample_type"]) == 4


GO_DEFAULT_SCRAPES = [
    "/debug/pprof/profile",
    "/debug/pprof/goroutine",
    "/debug/pprof/block",
    "/debug/pprof/mutex",
    "/debug/pprof/profile?seconds=14",
]


@pytest.mark.parametrize("path", GO_DEFAULT_SCRAPES)
def test_other_go_profiles_are_a_404_that_waits_for_nothing(
    start_agent: Callable[..., Agent], path: str
) -> None:
    # Alloy scrapes these by default; Go's /profile would run a CPU profile
    # for 30 s.  Given a dump in flight (the dump lock held)
    agent = start_agent()
    with service_of(agent).dump_lock:
        # When Alloy asks for a profile heapwatch does not have
        status, _, body = get(url_of(agent, path), AUTH)
    # Then it is told at once that there is none, not to come back later
    assert status == 404, body


class HeldSource:
    """The core, but the first snapshot waits until released: a dump in flight."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def snapshot(self, traces: bool) -> _core.Snapshot:
        self.entered.set()
        assert self.release.wait(30)
        return CoreSource().snapshot(traces)


def test_one_dump_at_a_time_a_second_gets_429(start_agent: Callable[..., Agent]) -> None:
    agent = start_agent()
    service = service_of(agent)
    # Given a dump being built (the test holds the dump lock)
    with service.dump_lock:
        # When any debug route is asked for
        for path in ROUTES:
            status, headers, body = get(url_of(agent, path), AUTH)
            # Then it is refused with a time to come back
            assert status == 429, path
            assert int(headers["Retry-After"]) >= 1
            assert b"one at a time" in body
        # a bad parameter is still a 400, not a 429
        assert get(url_of(agent, "/debug/heapwatch/top?limit=x"), AUTH)[0] == 400
    assert get(url_of(agent, "/debug/heapwatch/top"), AUTH)[0] == 200


def test_a_snapshot_in_flight_refuses_a_concurrent_one(tmp_path: Path) -> None:
    config = AgentConfig(port=0, interval=3600, mode="exact", token=TOKEN)
    held = HeldSource()
    service = ServedDumpService(config, source=held)
    agent = Agent(config, exporters=[service])
    assert agent.start()
    try:
        agent.router.add("/metrics", lambda e, s: [])  # stands for /metrics
        url = url_of(agent, "/debug/heapwatch/snapshot")
        first: list[Response] = []
        thread = threading.Thread(target=lambda: first.append(get(url, AUTH)))
        thread.start()
        assert held.entered.wait(30)
        status, headers, _ = get(url_of(agent, "/debug/pprof/heap"), AUTH)
        assert (status, "Retry-After" in headers) == (429, True)
        held.release.set()
        thread.join(60)
        assert first[0][0] == 200
        path = tmp_path / "d.hwdump"
        path.write_bytes(first[0][2])
        assert read_dump(path).header.pid == os.getpid()
    finally:
        held.release.set()
        agent.stop()


def test_diff_before_the_first_cycle_and_top_without_tracing_are_503() -> None:
    config = AgentConfig(port=0, interval=3600, token=TOKEN, exporters=())
    source = ModelSource()
    source.hang = threading.Event()  # the first cycle never ends
    agent = Agent(config, source=source, exporters=[ServedDumpService(config)])
    assert agent.start()
    try:
        status, headers, body = get(url_of(agent, "/debug/heapwatch/diff"), AUTH)
        assert (status, headers["Retry-After"]) == (503, "3600")
        assert b"no agent cycle yet" in body
        # the model traces nothing: the core is not tracing
        assert not _core.is_tracing()
        status, _, body = get(url_of(agent, "/debug/heapwatch/top"), AUTH)
        assert status == 503
        assert b"cannot take a snapshot" in body
    finally:
        source.hang.set()
        agent.stop()


def test_dump_traces_are_streamed_in_batches_of_tracebacks() -> None:
    # Given the core tracing many blocks from many lines
    _core.start(1, "exact")
    try:
        blocks = [bytearray(10 + i % 50) for i in range(3000)]
        snap = _core.take_snapshot(traces=True)
        # When the traces are read a small batch at a time
        batched = list(iter_traces(snap, batch=100))
        # Then they are the same traces, with their ages, as all at once
        assert sorted(batched) == sorted(((*t[:4],), t[4]) for t in snap.traces(ages=True))
        assert len(batched) == snap.ntraces
        del blocks
    finally:
        _core.stop()


def test_leaks_answers_the_agents_suspects_and_refuses_bad_parameters(
    start_agent: Callable[..., Agent],
) -> None:
    agent = start_agent(leak_window="10m")
    # With no suspect yet: none, over the agent's window
    status, headers, body = get(url_of(agent, "/debug/heapwatch/leaks?format=json"), AUTH)
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    data = json.loads(body)
    assert (data["kind"], data["suspects"], data["window"]) == ("leaks", [], 600.0)
    status, _, body = get(url_of(agent, "/debug/heapwatch/leaks"), AUTH)
    assert status == 200
    assert b"Leak suspects (score >= 0.50 over a 600s window): 0\n" in body
    for query, named in (
        ("limit=x", b"limit='x' is invalid: limit is an integer from 0 to 10000"),
        ("format=xml", b"format='xml' is invalid: format is text or json"),
        ("key_type=lineno", b"unknown parameter 'key_type': this route takes limit, format"),
    ):
        status, _, body = get(url_of(agent, "/debug/heapwatch/leaks?" + query), AUTH)
        assert (status, named in body) == (400, True), (query, body)
