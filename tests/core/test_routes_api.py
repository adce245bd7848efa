"""heapwatch.routes through the real core in sample mode: route() as context
manager and decorator, what threads, asyncio tasks and concurrent.futures
pools inherit, and the WSGI/ASGI middlewares called as servers call them."""

from __future__ import annotations

import asyncio
import contextvars
import math
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import pytest

from heapwatch.routes import ASGIMiddleware, WSGIMiddleware, route, route_name
from heapwatch.runtime.routes import ROUTE_NONE, current_route

SIZE = 32 * 1024
BLOCK = sys.getsizeof(bytes(SIZE))
N = 200
INTERVAL = 8 * 1024


@pytest.fixture
def labelled(core: ModuleType) -> Iterator[ModuleType]:
    core.start(1, "sample", INTERVAL)
    core.set_route_var(current_route)
    try:
        yield core
    finally:
        core.set_route_var(None)


def _alloc(keep: list[bytes], n: int = N) -> None:
    for _ in range(n):
        keep.append(bytes(SIZE))  # the site


SITE = _alloc.__code__.co_firstlineno + 2


def _by_route(core: ModuleType) -> dict[str, int]:
    snap = core.take_snapshot()
    sums: dict[str, int] = {}
    for rid, row in zip(snap.routes(), snap.tracebacks(names=True)):
        filename, lineno, _ = row[1][0]
        if filename == __file__ and lineno == SITE:
            name = route_name(rid)
            sums[name] = sums.get(name, 0) + row[3]
    return sums


def _close(got: int, blocks: int) -> bool:
    """Within six standard deviations of the sampled estimate."""
    p = 1 - math.exp(-BLOCK / INTERVAL)
    return abs(got - blocks * BLOCK) <= 6 * math.sqrt(blocks * (1 - p) / p) * BLOCK


def test_route_as_context_manager_and_decorator(labelled: ModuleType) -> None:
    keep: list[bytes] = []
    with route("/test/with"):
        _alloc(keep)
        with route("/test/inner"):
            _alloc(keep)
        _alloc(keep)  # the outer route again

    @route("/test/decorated")
    def handler() -> None:
        _alloc(keep)

    handler()
    _alloc(keep)  # outside: no route
    found = _by_route(labelled)
    assert _close(found["/test/with"], 2 * N), found
    assert _close(found["/test/inner"], N), found
    assert _close(found["/test/decorated"], N), found
    assert _close(found["<none>"], N), found
    assert current_route.get() == ROUTE_NONE


def test_coroutines_keep_their_route_across_awaits(labelled: ModuleType) -> None:
    keep: list[bytes] = []

    @route("/test/async-a")
    async def a() -> None:
        for _ in range(N):
            keep.append(bytes(SIZE))
            await asyncio.sleep(0)

    async def b() -> None:
        with route("/test/async-b"):
            for _ in range(N):
                keep.append(bytes(SIZE))
                await asyncio.sleep(0)

    async def both() -> None:
        await asyncio.gather(a(), b())

    asyncio.run(both())
    snap = labelled.take_snapshot()
    sums: dict[str, int] = {}
    for rid, row in zip(snap.routes(), snap.tracebacks(names=True)):
        if row[1][0][0] == __file__:
            sums[route_name(rid)] = sums.get(route_name(rid), 0) + row[3]
    assert _close(sums["/test/async-a"], N), sums
    assert _close(sums["/test/async-b"], N), sums


def test_a_thread_pool_keeps_the_route_only_with_a_copied_context(
    labelled: ModuleType,
) -> None:
    keep: list[bytes] = []
    with ThreadPoolExecutor(2) as pool, route("/test/pool"):
        # concurrent.futures runs the task in the worker's own context...
        pool.submit(_alloc, keep).result()
        # ...unless the request hands its context over.
        pool.submit(contextvars.copy_context().run, _alloc, keep).result()
    found = _by_route(labelled)
    assert _close(found["<none>"], N), found
    assert _close(found["/test/pool"], N), found


def _framework(name: str) -> None:
    """Installed by requirements-dev.txt from Python 3.10 (it says why)."""
    if sys.version_info < (3, 10):
        pytest.skip(f"{name} is not installed for the tests on Python 3.9")
    pytest.importorskip(name)


def _wsgi_app(keep: list[bytes]) -> Any:
    from flask import Flask

    app = Flask(__name__)

    @app.route("/items/<int:item>")
    def items(item: int) -> str:
        _alloc(keep)
        return "ok"

    return app


def test_the_wsgi_middleware_takes_flask_s_rule_never_the_path(labelled: ModuleType) -> None:
    _framework("flask")
    keep: list[bytes] = []
    app = _wsgi_app(keep)
    app.wsgi_app = WSGIMiddleware(app.wsgi_app)  # type: ignore[method-assign]
    client = app.test_client()
    assert client.get("/items/7").data == b"ok"
    assert client.get("/items/8").data == b"ok"
    assert client.get("/nowhere").status_code == 404
    found = _by_route(labelled)
    assert set(found) == {"/items/<int:item>"}, found
    assert _close(found["/items/<int:item>"], 2 * N), found


def test_the_wsgi_body_is_labelled_as_it_is_iterated(labelled: ModuleType) -> None:
    keep: list[bytes] = []

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        _alloc(keep)  # a generator: runs as the server iterates
        yield b"done"

    wrapped = WSGIMiddleware(app, route_of=lambda environ: "/test/stream")
    body = wrapped({"PATH_INFO": "/x"}, lambda *a: None)
    assert list(body) == [b"done"]
    body.close()
    assert current_route.get() == ROUTE_NONE
    assert set(_by_route(labelled)) == {"/test/stream"}


def test_the_asgi_middleware_takes_the_starlette_route(labelled: ModuleType) -> None:
    _framework("fastapi")
    from fastapi import FastAPI

    keep: list[bytes] = []
    app = FastAPI()

    @app.get("/things/{thing}")
    async def things(thing: int) -> str:
        _alloc(keep)
        return "ok"

    app.add_middleware(ASGIMiddleware)
    assert asyncio.run(_asgi_get(app, "/things/3")) == 200
    assert asyncio.run(_asgi_get(app, "/nowhere")) == 404
    found = _by_route(labelled)
    assert set(found) == {"/things/{thing}"}, found
    assert _close(found["/things/{thing}"], N), found


async def _asgi_get(app: Any, path: str) -> int:
    """One GET as an ASGI server makes it; the response's status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"])
