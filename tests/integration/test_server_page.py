"""The memory page's routes over real HTTP: the login that trades the token
for a cookie, the page and its files, its data, and the listing kept."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from test_server_debug_routes import AUTH, TOKEN, get, leak, url_of

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.server.page import PAGE_CSP, STATIC_FILES
from support.waiting import wait_for

HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


@pytest.fixture
def agent() -> Iterator[Agent]:
    options: dict[str, Any] = {"port": 0, "interval": 0.2, "mode": "exact", "token": TOKEN}
    started = Agent(AgentConfig().replace(**options))
    assert started.start()
    threading.Event().wait(0.05)
    yield started
    started.stop()


def post(url: str, fields: Mapping[str, str]) -> tuple[int, Any, bytes]:
    import urllib.request

    data = urllib.parse.urlencode(fields).encode()

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, data=data, method="POST")
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read()


def test_a_browser_without_the_cookie_is_sent_to_the_form(agent: Agent) -> None:
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    request = urllib.request.Request(url_of(agent, "/debug/heapwatch/"), headers=HTML)
    try:
        urllib.request.build_opener(NoRedirect).open(request, timeout=30)
        raise AssertionError("no redirect")
    except urllib.error.HTTPError as error:
        with error:
            assert error.code == 303
            assert error.headers["Location"] == "/debug/heapwatch/login"
    # A client that is not a browser still gets the bearer challenge.
    assert get(url_of(agent, "/debug/heapwatch/"))[0] == 401
    status, headers, body = get(url_of(agent, "/debug/heapwatch/login"), HTML)
    assert status == 200
    assert b'method="post"' in body and b'type="password"' in body
    assert "default-src 'none'" in headers["Content-Security-Policy"]


def test_the_token_buys_a_strict_cookie_that_is_not_the_token(agent: Agent) -> None:
    login = url_of(agent, "/debug/heapwatch/login")
    status, _, body = post(login, {"token": "wrong-token-0123456789"})
    assert status == 401 and b"That is not the token." in body
    status, headers, _ = post(login, {"token": TOKEN})
    assert status == 303 and headers["Location"] == "/debug/heapwatch/"
    cookie = headers["Set-Cookie"]
    attributes = [part.strip() for part in cookie.split(";")]
    assert {"HttpOnly", "SameSite=Strict", "Path=/debug/"} <= set(attributes), cookie
    assert TOKEN not in cookie
    jar = {"Cookie": attributes[0]}
    # The cookie opens every /debug/ route, the page included...
    status, headers, body = get(url_of(agent, "/debug/heapwatch/"), {**HTML, **jar})
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert headers["Content-Security-Policy"] == PAGE_CSP
    assert b"<script>" not in body  # no inline script: the CSP would refuse it
    assert get(url_of(agent, "/debug/heapwatch/top"), jar)[0] == 200
    # ...and a forged or stale one opens nothing.
    forged = {"Cookie": attributes[0][:-4] + "0000"}
    assert get(url_of(agent, "/debug/heapwatch/top"), forged)[0] == 401
    assert (
        get(url_of(agent, "/debug/heapwatch/top"), {"Cookie": "heapwatch_session=" + TOKEN})[0]
        == 401
    )


def test_the_listing_stays_for_machines(agent: Agent) -> None:
    status, headers, body = get(url_of(agent, "/debug/heapwatch/?format=json"), {**HTML, **AUTH})
    assert status == 200 and headers["Content-Type"] == "application/json"
    routes = json.loads(body)["routes"]
    assert "/debug/heapwatch/view" in routes and "/debug/heapwatch/top" in routes
    status, headers, body = get(url_of(agent, "/debug/heapwatch/"), AUTH)
    assert headers["Content-Type"].startswith("text/plain") and b"routes:" in body


def test_static_files_have_their_types_and_revalidate(agent: Agent) -> None:
    for name, content_type in STATIC_FILES.items():
        url = url_of(agent, "/debug/heapwatch/static/" + name)
        assert get(url)[0] == 401, name
        status, headers, body = get(url, AUTH)
        assert (status, headers["Content-Type"]) == (200, content_type), name
        assert headers["X-Content-Type-Options"] == "nosniff"
        tag = headers["ETag"]
        assert get(url, {**AUTH, "If-None-Match": tag})[0] == 304
        assert body


def test_the_view_holds_the_stacks_sites_and_timeline(agent: Agent) -> None:
    leak(20)
    deadline = threading.Event()
    for _ in range(100):
        if len(agent.history()) >= 2:
            break
        deadline.wait(0.1)
    status, headers, body = get(url_of(agent, "/debug/heapwatch/view"), AUTH)
    assert status == 200 and headers["Content-Type"] == "application/json"
    data = json.loads(body)
    assert data["kind"] == "live" and data["mode"] == "exact"
    assert len(data["timeline"]) >= 2
    assert all(len(row) == 5 for row in data["timeline"])
    leaking = [s for s in data["sites"] if s["file"].endswith("test_server_debug_routes.py")]
    assert leaking and leaking[0]["size"] >= 20 * 50_000
    names = {frame[2] for frame in data["frames"]}
    assert "leak" in names
    assert get(url_of(agent, "/debug/heapwatch/view?x=1"), AUTH)[0] == 400


def leak_stacks(data: dict[str, Any], stacks: list[Any]) -> int:
    """Bytes of the stacks whose most recent frame is leak()'s line."""
    frames = data["frames"]
    return sum(
        size
        for ids, size, _count in stacks
        if frames[ids[-1]][0].endswith("test_server_debug_routes.py")
        and frames[ids[-1]][2] == "leak"
    )


def test_the_view_offers_the_agents_baselines(agent: Agent) -> None:
    # The agent's first cycle took one, before this leak
    wait_for(agent.stack_points, what="a baseline")
    leak(20)
    wait_for(lambda: len(agent.history()) >= 3, what="cycles")
    status, _headers, body = get(url_of(agent, "/debug/heapwatch/view"), AUTH)
    assert status == 200
    data = json.loads(body)
    (point,) = agent.stack_points()  # the next one is minutes away
    (offered,) = data["baselines"]
    assert offered["at"] == point.timestamp < data["meta"]["timestamp"]
    grown = leak_stacks(data, data["stacks"]) - leak_stacks(data, offered["stacks"])
    assert grown >= 20 * 50_000


@pytest.fixture
def slow_agent() -> Iterator[Agent]:
    """An agent that cycles only when told to (its thread's first cycle aside)."""
    options: dict[str, Any] = {"port": 0, "interval": 3600.0, "mode": "exact", "token": TOKEN}
    started = Agent(AgentConfig().replace(**options))
    assert started.start()
    wait_for(lambda: started.readings().cycles >= 1, what="the first cycle")
    yield started
    started.stop()


def test_the_view_is_built_once_per_cycle(slow_agent: Agent) -> None:
    view = url_of(slow_agent, "/debug/heapwatch/view")
    first = get(view, AUTH)[2]
    leak(20)
    # The same cycle: the same document, the leak not in it
    assert get(view, AUTH)[2] == first
    slow_agent.run_cycle()
    fresh, old = json.loads(get(view, AUTH)[2]), json.loads(first)
    assert fresh["meta"]["timestamp"] > old["meta"]["timestamp"]
    assert leak_stacks(fresh, fresh["stacks"]) - leak_stacks(old, old["stacks"]) >= 20 * 50_000


def test_the_baselines_are_not_the_services_memory(
    slow_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    import inspect

    from heapwatch import _core
    from heapwatch.agent import agent as agent_module
    from heapwatch.formats import view

    # Every cycle folds the stacks (nframe 1: a trace's frame is where it was allocated)
    monkeypatch.setattr(agent_module, "STACK_POINT_SECONDS", 0.0)
    for _ in range(3):
        slow_agent.run_cycle()
    assert len(slow_agent.stack_points()) >= 4
    code, first = inspect.getsourcelines(view.fold_stacks)
    ours = range(first, first + len(code))
    traced = [
        frames[0]
        for _domain, frames, _nframe, _size, _count in _core.take_snapshot(traces=True).tracebacks()
        if frames[0][0] == view.__file__ and frames[0][1] in ours
    ]
    assert traced == []
