"""The memory page, ``/debug/heapwatch/`` in a browser: its files, its
login, and the live document it draws (``heapwatch.formats.view``).

The page is files of the package (``heapwatch/server/static/``: the HTML,
one script, one style sheet, a favicon and the vendored uPlot, see
``static/vendor/manifest.json``), served under ``/debug/heapwatch/static/``
behind the same token as every ``/debug/`` route, with a Content-Security-
Policy that lets it load and fetch from its own origin only.  The data comes
from ``/debug/heapwatch/view`` (``heapwatch.server.debug_routes``), which
builds it with ``live_view``; the HTML report (``heapwatch.server.report_html``)
inlines the same files around a document built from dumps.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import parse_qs

from heapwatch.agent.interface import CyclePoint, StackPoint, site_of
from heapwatch.formats.leaks import SUSPECT, rank_scores
from heapwatch.formats.view import (
    Baseline,
    SiteRow,
    SuspectRow,
    median_age,
    stacks_of_tracebacks,
    unfold_stacks,
    view_data,
)
from heapwatch.server import session

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from heapwatch import _core
    from heapwatch.agent.interface import AgentView, Routes
    from heapwatch.formats.dump import AgeClock

__all__ = [
    "BASELINE_MINUTES",
    "PAGE_CSP",
    "STATIC_FILES",
    "STATIC_PREFIX",
    "TOP_SITES",
    "TOP_SUSPECTS",
    "add_page_routes",
    "baselines_offered",
    "live_view",
    "page_response",
    "static_text",
]

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
STATIC_PREFIX = "/debug/heapwatch/static/"
TOP_SITES = 20
TOP_SUSPECTS = 10
BASELINE_MINUTES = (5, 15, 30)
"""The live page offers the agent's newest reading at least this old, and its oldest."""
_MAX_FORM_BYTES = 4096

# The files the page loads, and what they are; the report inlines the same.
STATIC_FILES = {
    "heapwatch.js": "text/javascript; charset=utf-8",
    "heapwatch.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
    "vendor/uplot-1.6.32/uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "vendor/uplot-1.6.32/uPlot.min.css": "text/css; charset=utf-8",
    "vendor/uplot-1.6.32/LICENSE": "text/plain; charset=utf-8",
    "vendor/manifest.json": "application/json",
}

PAGE_CSP = (
    "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
"""Scripts, styles, images and fetches from the agent's own origin only;
no inline script (the page has none), no plugin, no framing."""

_LOGIN_CSP = "default-src 'none'; img-src data:; form-action 'self'; frame-ancestors 'none'"

_HEADERS = [
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
]


def static_bytes(name: str) -> bytes:
    """One file of ``static/`` (a name of STATIC_FILES, or page.html/login.html)."""
    with open(os.path.join(STATIC_DIR, name), "rb") as file:
        return file.read()


def static_text(name: str) -> str:
    return static_bytes(name).decode("utf-8")


def _send(
    start_response: StartResponse,
    status: str,
    body: bytes,
    content_type: str,
    headers: Sequence[tuple[str, str]] = (),
    *,
    csp: str = PAGE_CSP,
) -> list[bytes]:
    start_response(
        status,
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Content-Security-Policy", csp),
            *_HEADERS,
            *headers,
        ],
    )
    return [body]


def page_response(start_response: StartResponse) -> list[bytes]:
    """The page itself (it fetches its data)."""
    return _send(
        start_response,
        "200 OK",
        static_bytes("page.html"),
        "text/html; charset=utf-8",
        [("Cache-Control", "no-store")],
    )


class _Static:
    """One static file: sent with its ETag, revalidated on every use (a
    newer heapwatch serves newer files under the same names)."""

    def __init__(self, name: str, content_type: str) -> None:
        self.name = name
        self.content_type = content_type

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _send(
                start_response,
                "405 Method Not Allowed",
                b"only GET\n",
                "text/plain",
                [("Allow", "GET")],
            )
        body = static_bytes(self.name)
        tag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        cache = [("Cache-Control", "private, no-cache"), ("ETag", tag)]
        if environ.get("HTTP_IF_NONE_MATCH", "") == tag:
            start_response(
                "304 Not Modified", [*cache, ("Content-Security-Policy", PAGE_CSP), *_HEADERS]
            )
            return []
        return _send(start_response, "200 OK", body, self.content_type, cache)


class _Login:
    """GET: the form; POST: the token for a session cookie, then the page."""

    def __init__(self, router: Routes) -> None:
        self.router = router

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        token = self.router.token
        if not token:
            return _send(
                start_response,
                "403 Forbidden",
                b"403 Forbidden\nthe /debug/ routes are off: set HEAPWATCH_TOKEN to turn them on\n",
                "text/plain; charset=utf-8",
            )
        if method == "GET":
            return self._form(start_response, "200 OK", "")
        if method != "POST":
            return _send(
                start_response,
                "405 Method Not Allowed",
                b"GET or POST\n",
                "text/plain",
                [("Allow", "GET, POST")],
            )
        given = _form_token(environ)
        if given is None or not hmac.compare_digest(given.encode(), token.encode()):
            return self._form(start_response, "401 Unauthorized", "That is not the token.")
        return _send(
            start_response,
            "303 See Other",
            b"",
            "text/plain",
            [
                ("Location", "/debug/heapwatch/"),
                session.cookie_header(token),
                ("Cache-Control", "no-store"),
            ],
        )

    @staticmethod
    def _form(start_response: StartResponse, status: str, message: str) -> list[bytes]:
        # The message is one of ours, never the client's input.
        shown = f'<p class="error" role="alert">{message}</p>' if message else ""
        html = static_text("login.html").replace("<!--message-->", shown)
        # Before the cookie nothing behind the token loads: the form is
        # plain HTML, its icon empty.
        return _send(
            start_response,
            status,
            html.encode(),
            "text/html; charset=utf-8",
            [("Cache-Control", "no-store")],
            csp=_LOGIN_CSP,
        )


def _form_token(environ: WSGIEnvironment) -> str | None:
    """The form's token, from a bounded url-encoded body; None when absent."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    if not 0 < length <= _MAX_FORM_BYTES:
        return None
    data = environ["wsgi.input"].read(length)
    try:
        fields = parse_qs(data.decode("ascii"), max_num_fields=4)
    except (UnicodeDecodeError, ValueError):
        return None
    values = fields.get("token", [])
    return values[0] if len(values) == 1 else None


def add_page_routes(router: Routes) -> None:
    """The page's files and its login; the page and its data are the
    ``/debug/`` routes' (``heapwatch.server.debug_routes``)."""
    for name, content_type in STATIC_FILES.items():
        router.add(STATIC_PREFIX + name, _Static(name, content_type), protected=True)
    router.add(session.LOGIN_PATH, _Login(router))


# ---- the live document ---------------------------------------------------------


class _Cycle(NamedTuple):
    growth: dict[tuple[str, int], int]
    peak_share: dict[tuple[str, int], float]
    scores: dict[tuple[str, int], float]


def _cycle_of(agent: AgentView | None) -> _Cycle:
    result = agent.readings().result if agent is not None else None
    if agent is None or result is None:
        return _Cycle({}, {}, {})
    peak = result.peak
    return _Cycle(
        {(s.file, s.line): s.growth for s in result.sites},
        {(s.file, s.line): s.peak / peak for s in result.sites if peak > 0},
        {(s.file, s.line): s.leak_score for s in result.sites if s.leak_score is not None},
    )


def baselines_offered(points: Sequence[StackPoint], at: float) -> list[Baseline]:
    """The agent's readings the page offers at ``at``, newest first: for
    each of ``BASELINE_MINUTES`` the newest at least that old, and the oldest."""
    chosen: list[StackPoint] = []
    for minutes in BASELINE_MINUTES:
        older = [p for p in points if at - p.timestamp >= minutes * 60]
        if older:
            chosen.append(older[-1])
    if points:
        chosen.append(points[0])
    unique = {p.timestamp: p for p in chosen}
    return [(when, unfold_stacks(unique[when].stacks)) for when in sorted(unique, reverse=True)]


def live_view(
    snap: _core.Snapshot, agent: AgentView | None, clock: AgeClock, at: float
) -> dict[str, Any]:
    """The page's document from a snapshot taken with its traces at ``at``
    and the agent's last cycles: stacks with their functions, the top
    sites with the cycle's growth, peak share and leak score and their age,
    the suspects and the timeline."""
    lines = snap.group("lineno", ages=True)
    cycle = _cycle_of(agent)
    sites: list[SiteRow] = []
    sizes: dict[tuple[str, int], int] = {}
    for frames, size, count, histogram in lines.ages():
        where = site_of(frames)
        sizes[where] = size
        if len(sites) < TOP_SITES:
            age = median_age(histogram)
            sites.append(
                SiteRow(
                    where[0],
                    where[1],
                    size,
                    count,
                    cycle.growth.get(where),
                    cycle.peak_share.get(where),
                    cycle.scores.get(where),
                    None if age is None else clock.min_seconds(age, at),
                )
            )
    suspects: list[SuspectRow] = []
    history: Sequence[CyclePoint] = ()
    baselines: list[Baseline] = []
    if agent is not None:
        baselines = baselines_offered(agent.stack_points(), at)
        for where, score in rank_scores(agent.leak_scores().items(), SUSPECT)[:TOP_SUSPECTS]:
            suspects.append(
                SuspectRow(where[0], where[1], score.score, score.rate, sizes.get(where, 0))
            )
        history = agent.history()
    notes = []
    if agent is not None:
        notes.append(
            f"growth, peak share and leak score are the agent's last cycle's; "
            f"it cycles every {agent.config.interval:g}s"
        )
    return view_data(
        kind="live",
        stacks=stacks_of_tracebacks(snap.tracebacks(names=True)),
        baselines=baselines,
        sites=sites,
        suspects=suspects,
        timeline=history,
        mode=snap.mode,
        sample_interval=snap.sample_interval,
        total=lines.total,
        peak=snap.peak,
        notes=notes,
        meta={"pid": os.getpid(), "timestamp": at},
    )
