"""Label the memory a request allocates with its route, without OpenTelemetry.

In sample mode the agent labels each sampled allocation with the route of
the request that made it (docs/design/routes.md).  With OpenTelemetry's
Flask or FastAPI instrumentation nothing is needed: the span's
``http.route`` is the label.  Otherwise:

* ``route("/items/{id}")``: a context manager and a decorator (functions and
  coroutine functions) for any code;
* ``WSGIMiddleware(app)``: Flask's URL rule (``app.wsgi_app =
  WSGIMiddleware(app.wsgi_app)``), or ``route_of(environ)`` for any WSGI app;
* ``ASGIMiddleware(app)``: Starlette's and FastAPI's route path
  (``app.add_middleware(ASGIMiddleware)``), or ``route_of(scope)``.

Names are templates (``/users/<int:uid>``), never raw paths: the middlewares
never use the URL path, and a name given by hand that is a raw path fills
the cap (``MAX_ROUTES``) and folds every later route into ``<other>``.
The route is a ContextVar: asyncio tasks and threads started with a copied
context (``contextvars.copy_context().run``, ``asyncio.to_thread``,
Starlette's thread pool) keep it; a ``concurrent.futures`` pool's thread does
not copy the caller's context, so its work is ``<none>`` unless the task is
submitted as ``pool.submit(copy_context().run, fn, ...)``.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Callable, TypeVar

from heapwatch.runtime.routes import (
    MAX_ROUTES,
    ROUTE_NONE,
    ROUTE_OTHER,
    current_route,
    folded_routes,
    route_id,
    route_name,
)

__all__ = [
    "MAX_ROUTES",
    "ROUTE_NONE",
    "ROUTE_OTHER",
    "ASGIMiddleware",
    "WSGIMiddleware",
    "folded_routes",
    "route",
    "route_id",
    "route_name",
]

F = TypeVar("F", bound=Callable[..., Any])


def _enter(rid: int) -> int:
    """Sets the route; returns the one to set back on leaving.

    Set back rather than reset with a token (either is safe: the core reads
    the context without the variable's cache, docs/design/routes.md); a
    set is cheaper than the delete a reset to "never set" makes.
    """
    previous = current_route.get()
    current_route.set(rid)
    return previous


class route:  # lower case: used like a function, with route("/x"): and @route("/x")
    """The allocations made inside are labelled ``name``.

    A context manager (one ``with`` at a time per instance; nested routes
    restore the outer one) and a decorator, for functions and coroutine
    functions alike.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._rid = route_id(name)
        self._previous: list[int] = []

    def __enter__(self) -> route:
        self._previous.append(_enter(self._rid))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        current_route.set(self._previous.pop())

    def __call__(self, function: F) -> F:
        rid = self._rid
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def labelled_coroutine(*args: Any, **kwargs: Any) -> Any:
                previous = _enter(rid)
                try:
                    return await function(*args, **kwargs)
                finally:
                    current_route.set(previous)

            return labelled_coroutine  # type: ignore[return-value]

        @functools.wraps(function)
        def labelled(*args: Any, **kwargs: Any) -> Any:
            previous = _enter(rid)
            try:
                return function(*args, **kwargs)
            finally:
                current_route.set(previous)

        return labelled  # type: ignore[return-value]


def _rid_or_none(name: object) -> int:
    # A finder's odd answer is no reason to fail the host's request.
    if not isinstance(name, str) or not name:
        return ROUTE_NONE
    try:
        return route_id(name)
    except ValueError:
        return ROUTE_NONE


class WSGIMiddleware:
    """Labels each request with its route, the response body's iteration included.

    Args:
        app: the WSGI application (Flask's ``app.wsgi_app``, or the app).
        route_of: ``environ -> template or None``; by default the Flask (or
            werkzeug ``url_map``) rule that matches, and no route otherwise.
    """

    def __init__(self, app: Any, route_of: Callable[[dict[str, Any]], str | None] | None = None):
        self.app = app
        self.route_of = route_of if route_of is not None else _werkzeug_finder(app)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        rid = ROUTE_NONE
        if self.route_of is not None:
            try:
                rid = _rid_or_none(self.route_of(environ))
            except Exception:
                rid = ROUTE_NONE
        previous = _enter(rid)
        try:
            body = self.app(environ, start_response)
        finally:
            current_route.set(previous)
        return _LabelledBody(body, rid) if rid != ROUTE_NONE else body


class _LabelledBody:
    """The response iterable, each step and close() under the route."""

    def __init__(self, body: Iterable[bytes], rid: int) -> None:
        self._body = body
        self._iterator: Iterator[bytes] | None = None
        self._rid = rid

    def __iter__(self) -> _LabelledBody:
        return self

    def __next__(self) -> bytes:
        previous = _enter(self._rid)
        try:
            if self._iterator is None:
                self._iterator = iter(self._body)
            return next(self._iterator)
        finally:
            current_route.set(previous)

    def close(self) -> None:
        close = getattr(self._body, "close", None)
        if close is not None:
            previous = _enter(self._rid)
            try:
                close()
            finally:
                current_route.set(previous)

    def __getattr__(self, name: str) -> Any:
        # wsgi.file_wrapper's servers look for the wrapped file.
        return getattr(self._body, name)


def _werkzeug_finder(app: Any) -> Callable[[dict[str, Any]], str | None] | None:
    owner = getattr(app, "__self__", app)  # Flask's bound wsgi_app
    url_map = getattr(owner, "url_map", None)
    if url_map is None or not hasattr(url_map, "bind_to_environ"):
        return None
    config = getattr(owner, "config", None)
    server_name = config.get("SERVER_NAME") if isinstance(config, dict) else None

    def rule_of(environ: dict[str, Any]) -> str | None:
        try:
            rule, _ = url_map.bind_to_environ(environ, server_name=server_name).match(
                return_rule=True
            )
        except Exception:  # NotFound, MethodNotAllowed, a redirect: no route
            return None
        return getattr(rule, "rule", None)

    return rule_of


class ASGIMiddleware:
    """Labels each HTTP and websocket request with its route.

    Args:
        app: the ASGI application (given by ``app.add_middleware``).
        route_of: ``scope -> template or None``; by default the path of the
            Starlette/FastAPI route that matches (``scope["app"]``'s routes).
    """

    def __init__(self, app: Any, route_of: Callable[[dict[str, Any]], str | None] | None = None):
        self.app = app
        self.route_of = route_of if route_of is not None else _starlette_route

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            rid = _rid_or_none(self.route_of(scope))
        except Exception:
            rid = ROUTE_NONE
        previous = _enter(rid)
        try:
            await self.app(scope, receive, send)
        finally:
            current_route.set(previous)


def _starlette_route(scope: dict[str, Any]) -> str | None:
    app = scope.get("app")
    routes = getattr(getattr(app, "router", app), "routes", None)
    if not routes:
        return None
    # FastAPI 0.137 nests include_router()'s routes; this flattens them.
    flatten = getattr(sys.modules.get("fastapi.routing"), "iter_route_contexts", None)
    return _match(list(flatten(routes)) if flatten else routes, scope, "")


def _match(routes: Any, scope: dict[str, Any], prefix: str) -> str | None:
    """The template of the route Starlette's router would choose (full match)."""
    from starlette.routing import Match  # noqa: PLC0415 (only for Starlette apps)

    for candidate in routes:
        match, child = candidate.matches(scope)
        if match == Match.NONE:
            continue
        inner = getattr(candidate, "routes", None)
        path = getattr(candidate, "path", "")
        if inner and not hasattr(candidate, "endpoint"):
            found = _match(inner, {**scope, **child}, prefix + path)
            if found is not None:
                return found
            continue
        if match == Match.FULL:
            return prefix + path if isinstance(path, str) else None
    return None
