"""The agent's HTTP routes: a small WSGI application that dispatches on the path.

``/metrics`` is one route; other components add theirs (``Router.add``), some
behind a bearer token.  Light on purpose (no ``http.server``): every agent has
a router, only one with routes serves it (``heapwatch.server.http``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["Router"]


class _Route(NamedTuple):
    app: WSGIApplication
    protected: bool


class Router:
    """A WSGI application that dispatches on the exact path.

    Routes marked ``protected`` need ``Authorization: Bearer <token>`` when the
    router has a token (401 with ``WWW-Authenticate`` otherwise; compared in
    constant time), or the session cookie a browser got for the token
    (``heapwatch.server.session``; a browser without one is sent to the login
    form when there is one); without a token they are refused (403), so that
    a debug endpoint is never open by accident.
    """

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self._routes: dict[str, _Route] = {}
        self._lock = threading.Lock()

    def add(self, path: str, app: WSGIApplication, *, protected: bool = False) -> None:
        """Serves ``app`` at ``path`` (it replaces a route already there)."""
        if not path.startswith("/"):
            raise ValueError(f"a route's path starts with '/', got {path!r}")
        with self._lock:
            self._routes[path] = _Route(app, protected)

    def remove(self, path: str) -> None:
        with self._lock:
            self._routes.pop(path, None)

    def paths(self) -> list[str]:
        with self._lock:
            return sorted(self._routes)

    def protected_paths(self) -> list[str]:
        with self._lock:
            return sorted(p for p, r in self._routes.items() if r.protected)

    def __bool__(self) -> bool:
        return bool(self._routes)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        with self._lock:
            route = self._routes.get(path)
            paths = sorted(p for p, r in self._routes.items() if not r.protected)
        if route is None:
            if path == "/":
                body = "heapwatch agent\n" + "".join(f"{p}\n" for p in paths)
                return _respond(start_response, "200 OK", body)
            return _respond(start_response, "404 Not Found", f"no route {path}\n")
        if route.protected:
            refusal = self._refusal(environ)
            if refusal is not None:
                status, headers, reason = refusal
                return _respond(start_response, status, f"{status}\n{reason}\n", headers)
        environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + path
        environ["PATH_INFO"] = ""
        return route.app(environ, start_response)

    def _refusal(self, environ: WSGIEnvironment) -> tuple[str, list[tuple[str, str]], str] | None:
        """None if the request may pass, else (status, headers, reason)."""
        if not self.token:
            return "403 Forbidden", [], "this route is off: set HEAPWATCH_TOKEN to turn it on"
        # Here: hmac loads OpenSSL (_hashlib), which an agent without a
        # token (or not serving) would load for nothing at start-up.
        import hmac  # noqa: PLC0415

        given = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, credentials = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode(), self.token.encode()
        ):
            return None
        from heapwatch.server import session  # noqa: PLC0415 (as hmac: when asked)

        if session.has_session(environ, self.token):
            return None
        with self._lock:
            login = session.LOGIN_PATH in self._routes
        if login and session.wants_page(environ):
            # A browser: to the form that trades the token for a cookie.
            return "303 See Other", [("Location", session.LOGIN_PATH)], "log in first"
        return (
            "401 Unauthorized",
            [("WWW-Authenticate", 'Bearer realm="heapwatch"')],
            "send Authorization: Bearer <HEAPWATCH_TOKEN>",
        )


def _respond(
    start_response: StartResponse,
    status: str,
    body: str,
    headers: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    data = body.encode()
    start_response(
        status,
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))]
        + (headers or []),
    )
    return [data]
