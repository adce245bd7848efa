"""The browser's way past the ``/debug/`` token: a cookie traded for it.

A browser cannot send ``Authorization: Bearer``, and a token in a URL ends
up in logs and history.  ``/debug/heapwatch/login`` takes the token from a
form (POST body) and answers with a cookie that is not the token: an HMAC of
it, so a cookie read off a disk or a proxy's log does not give the token
for other clients, and every cookie dies with the token.  It is ``HttpOnly``
(no script reads it), ``SameSite=Strict`` (no other site's page sends it)
and scoped to ``/debug/`` (no other route of the service gets it).
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

__all__ = [
    "COOKIE_NAME",
    "COOKIE_PATH",
    "LOGIN_PATH",
    "SESSION_SECONDS",
    "cookie_header",
    "has_session",
    "wants_page",
]

LOGIN_PATH = "/debug/heapwatch/login"
COOKIE_NAME = "heapwatch_session"
COOKIE_PATH = "/debug/"
SESSION_SECONDS = 8 * 3600
"""How long a browser keeps the cookie: a working day."""

_CONTEXT = b"heapwatch /debug/ session v1"


def _value(token: str) -> str:
    return hmac.new(token.encode(), _CONTEXT, hashlib.sha256).hexdigest()


def cookie_header(token: str) -> tuple[str, str]:
    """The ``Set-Cookie`` header of a session for ``token``."""
    return (
        "Set-Cookie",
        f"{COOKIE_NAME}={_value(token)}; Path={COOKIE_PATH}; Max-Age={SESSION_SECONDS}; "
        "HttpOnly; SameSite=Strict",
    )


def has_session(environ: WSGIEnvironment, token: str) -> bool:
    """Whether the request carries the session cookie of ``token`` (compared
    in constant time)."""
    header = environ.get("HTTP_COOKIE", "")
    if COOKIE_NAME not in header:
        return False
    try:
        jar: SimpleCookie = SimpleCookie(header)
    except CookieError:
        return False
    morsel = jar.get(COOKIE_NAME)
    return morsel is not None and hmac.compare_digest(morsel.value.encode(), _value(token).encode())


def wants_page(environ: WSGIEnvironment) -> bool:
    """Whether a GET comes from a browser navigating (it accepts HTML)."""
    return environ.get("REQUEST_METHOD", "GET") == "GET" and "text/html" in environ.get(
        "HTTP_ACCEPT", ""
    )
