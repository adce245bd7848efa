"""The agent's ``/debug/`` routes: dumps, top statistics, differences, pprof.

The routes are a face of the dump service (``heapwatch.server.dumps``): they
depend on it, it never on them; ``heapwatch.server.served_dumps`` puts the two
together.

Every route is protected (``Router.add(..., protected=True)``): with
``HEAPWATCH_TOKEN`` set it needs ``Authorization: Bearer <token>`` (401
otherwise), without one it answers 403.  Each request that builds something
takes the service's dump lock without waiting: a second one answers 429 with
``Retry-After``.  Parameters are checked strictly (400 naming the parameter
and what it accepts); none of them names a file.

``GET /debug/heapwatch/``           what is here: the routes, the black box, and the
                                    one an earlier process left (text, or JSON); to a
                                    browser (Accept: text/html), the memory page
``GET /debug/heapwatch/view``       the memory page's data (``heapwatch.server.page``),
                                    built once per cycle of the agent
``GET /debug/heapwatch/snapshot``   every live trace, in heapwatch's dump format
``GET /debug/heapwatch/top``        top statistics ("Pretty top" text, or JSON);
                                    ``min_age=30m``: only live memory that old
``GET /debug/heapwatch/diff``       top differences since the agent's last cycle
``GET /debug/heapwatch/leaks``      the agent's leak suspects, their memory and its ages
``GET /debug/pprof/heap``           live memory and allocation totals as a gzip pprof
                                   profile (Go's four sample types, inuse_space first)
``GET /debug/pprof/allocs``         the same profile, alloc_space by default
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, TypeVar, cast
from urllib.parse import parse_qs

from heapwatch.agent.config import parse_age
from heapwatch.agent.interface import site_of
from heapwatch.formats.dump import write_dump
from heapwatch.formats.leak_report import (
    AgesRow,
    LeakReport,
    format_leaks_text,
    leaks_to_json,
    suspect_of,
)
from heapwatch.formats.leaks import SUSPECT, rank_scores
from heapwatch.formats.pprof import encode_go_heap_profile
from heapwatch.formats.report import (
    KEY_TYPES,
    ROUTE_KEY,
    TOP_KEY_TYPES,
    Report,
    diff_report,
    format_text,
    min_age_note,
    to_json,
    top_report,
)
from heapwatch.formats.rows import group_route_rows, group_rows, route_rows
from heapwatch.runtime.route_names import name_of
from heapwatch.server.dumps import (
    DumpService,
    age_clock,
    dump_routes,
    iter_routed_traces,
    iter_traces,
)
from heapwatch.server.page import add_page_routes, live_view, page_response
from heapwatch.server.session import wants_page
from heapwatch.server.termination_log import crossing

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from heapwatch import _core
    from heapwatch.agent.interface import AgentView, Routes
    from heapwatch.formats.dump import AgeClock, AgedTrace

__all__ = [
    "ALLOCS_PATH",
    "DIFF_PATH",
    "INDEX_PATH",
    "LEAKS_PATH",
    "PPROF_PATH",
    "SNAPSHOT_PATH",
    "TOP_PATH",
    "VIEW_PATH",
    "BadParameter",
    "ReportQuery",
    "add_routes",
    "leaks_of",
    "parse_leaks_query",
    "parse_report_query",
]

log = logging.getLogger("heapwatch.debug")

INDEX_PATH = "/debug/heapwatch/"
SNAPSHOT_PATH = "/debug/heapwatch/snapshot"
TOP_PATH = "/debug/heapwatch/top"
DIFF_PATH = "/debug/heapwatch/diff"
LEAKS_PATH = "/debug/heapwatch/leaks"
PPROF_PATH = "/debug/pprof/heap"
VIEW_PATH = "/debug/heapwatch/view"
ALLOCS_PATH = "/debug/pprof/allocs"
# Every other /debug/pprof/ path (Alloy scrapes profile, goroutine, block and
# mutex by default) is the router's plain 404: no lock, no snapshot.

DEFAULT_LIMIT = 10
MAX_LIMIT = 10_000
_MAX_FIELDS = 16
_NO_STORE = ("Cache-Control", "no-store")

Headers = list[tuple[str, str]]
Q = TypeVar("Q")


class BadParameter(ValueError):
    """A query parameter is unknown, repeated or invalid; the message names it."""


class ReportQuery(NamedTuple):
    """What a top or diff request asks for."""

    key_type: str
    limit: int
    cumulative: bool
    as_json: bool
    min_age: float | None = None
    """Seconds: only live memory at least that old (top only)."""


def _shown(value: str) -> str:
    """A client's value in a message: quoted, and short (messages echo it back)."""
    return repr(value if len(value) <= 40 else value[:40] + "...")


def _query(environ: WSGIEnvironment, allowed: tuple[str, ...]) -> dict[str, str]:
    text = environ.get("QUERY_STRING", "")
    try:
        fields = parse_qs(text, keep_blank_values=True, max_num_fields=_MAX_FIELDS)
    except ValueError:
        raise BadParameter(f"at most {_MAX_FIELDS} query parameters") from None
    taken = ", ".join(allowed) if allowed else "no parameters"
    for name, values in fields.items():
        if name not in allowed:
            raise BadParameter(f"unknown parameter {_shown(name)}: this route takes {taken}")
        if len(values) > 1:
            raise BadParameter(f"parameter {_shown(name)} is given {len(values)} times")
    return {name: values[0] for name, values in fields.items()}


def _flag(params: Mapping[str, str], name: str) -> bool:
    # Exactly what the documentation says (0|1): "true" read as 1 would
    # make "false" and "no" look accepted too.
    value = params.get(name, "0")
    if value not in ("0", "1"):
        raise BadParameter(f"{name}={_shown(value)} is invalid: {name} is 0 or 1")
    return value == "1"


def parse_report_query(
    environ: WSGIEnvironment, *, ages: bool = False, routes: bool = False
) -> ReportQuery:
    """key_type, limit, cumulative and the output format of a top or diff
    request, and with ``ages`` its min_age; ``routes`` lets a top group by
    route; raises BadParameter naming the parameter and what it accepts."""
    names = ("key_type", "limit", "cumulative", "format")
    params = _query(environ, (*names, "min_age") if ages else names)
    key_type = params.get("key_type", "lineno")
    allowed = TOP_KEY_TYPES if routes else KEY_TYPES
    if key_type not in allowed:
        raise BadParameter(
            f"key_type={_shown(key_type)} is invalid: key_type is one of {', '.join(allowed)}"
        )
    limit = _limit(params)
    cumulative = _flag(params, "cumulative")
    if cumulative and key_type in ("traceback", ROUTE_KEY):
        raise BadParameter(
            f"cumulative=1 is invalid with key_type={key_type}: cumulative needs lineno or filename"
        )
    as_json = _as_json(params, environ)
    age = params.get("min_age")
    min_age = None
    if age is not None:
        try:
            min_age = parse_age(age)
        except ValueError as exc:
            raise BadParameter(f"min_age={_shown(age)} is invalid: min_age is {exc}") from None
    return ReportQuery(key_type, limit, cumulative, as_json, min_age)


def _limit(params: Mapping[str, str]) -> int:
    text = params.get("limit", str(DEFAULT_LIMIT))
    # At most 6 digits before int(): Python refuses to convert very long ones.
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or int(text) > MAX_LIMIT:
        raise BadParameter(
            f"limit={_shown(text)} is invalid: limit is an integer from 0 to {MAX_LIMIT}"
        )
    return int(text)


def _as_json(params: Mapping[str, str], environ: WSGIEnvironment) -> bool:
    form = params.get("format")
    if form is None:
        accept = environ.get("HTTP_ACCEPT", "")
        return "application/json" in accept.lower()
    if form not in ("text", "json"):
        raise BadParameter(f"format={_shown(form)} is invalid: format is text or json")
    return form == "json"


def parse_leaks_query(environ: WSGIEnvironment) -> tuple[int, bool]:
    """(limit, as_json) of a leaks request; raises BadParameter."""
    params = _query(environ, ("limit", "format"))
    return _limit(params), _as_json(params, environ)


def _respond(
    start_response: StartResponse,
    status: str,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    headers: Headers | None = None,
    exc_info: Any = None,
) -> list[bytes]:
    start_response(
        status,
        [("Content-Type", content_type), ("Content-Length", str(len(body))), _NO_STORE]
        + (headers or []),
        exc_info,
    )
    return [body]


def _error(
    start_response: StartResponse,
    status: str,
    message: str,
    headers: Headers | None = None,
    *,
    exc_info: Any = None,
) -> list[bytes]:
    body = f"{status}\n{message}\n".encode()
    return _respond(start_response, status, body, headers=headers, exc_info=exc_info)


def _meta(**more: Any) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "python_version": sys.version.split()[0],
        "timestamp": time.time(),
        **more,
    }


def _total(snap: _core.Snapshot, groups: _core.Groups, cumulative: bool) -> tuple[int, int]:
    # A cumulative grouping counts a block under each of its frames; the
    # traces' real total is a plain grouping's (by file: the fewest groups).
    return snap.group("filename").total if cumulative else groups.total


def top_of(
    snap: _core.Snapshot, query: ReportQuery, agent: AgentView | None = None, at: float = 0.0
) -> Report:
    """The top statistics of a core snapshot; with ``query.min_age``, of its
    traces (it was taken with them at ``at``) that old by the agent's epochs."""
    if query.min_age is not None:
        return _top_of_old(snap, query, query.min_age, age_clock(snap, at, agent), at)
    if query.key_type == ROUTE_KEY:
        names: dict[int, str] = {}
        grouped = route_rows(
            (names.get(rid) or names.setdefault(rid, name_of(rid)), row[3], row[4])
            for rid, row in zip(snap.routes(), snap.tracebacks())
        )
        return top_report(
            grouped.rows,
            grouped.total,
            key_type=ROUTE_KEY,
            cumulative=False,
            limit=query.limit,
            mode=snap.mode,
            sample_interval=snap.sample_interval,
            meta=_meta(),
        )
    groups = snap.group(cast("_core.KeyType", query.key_type), query.cumulative)
    return top_report(
        groups.statistics(),
        _total(snap, groups, query.cumulative),
        key_type=query.key_type,
        cumulative=query.cumulative,
        limit=query.limit,
        mode=snap.mode,
        sample_interval=snap.sample_interval,
        meta=_meta(),
    )


def _top_of_old(
    snap: _core.Snapshot, query: ReportQuery, min_age: float, clock: AgeClock, at: float
) -> Report:
    youngest = clock.youngest_age(min_age, at)
    # Ages are per trace, not per traceback: grouped in Python, weighed as the core weighs.
    if query.key_type == ROUTE_KEY:
        kept = []
        for item, rid in iter_routed_traces(snap):
            trace, age = cast("AgedTrace", item)  # (iter_traces': with its age)
            if youngest is not None and age is not None and age >= youngest:
                kept.append((trace, rid))
        grouped = group_route_rows(
            (trace for trace, _ in kept),
            (rid for _, rid in kept),
            {rid: name_of(rid) for rid in {rid for _, rid in kept}},
            snap.mode,
            snap.sample_interval,
        )
    else:
        old = (
            (domain, size, frames, total)
            for domain, size, frames, total, age in snap.traces(ages=True)
            if youngest is not None and age >= youngest
        )
        grouped = group_rows(
            old,
            cast("_core.KeyType", query.key_type),
            query.cumulative,
            snap.mode,
            snap.sample_interval,
        )
    return top_report(
        grouped.rows,
        grouped.total,
        key_type=query.key_type,
        cumulative=query.cumulative,
        limit=query.limit,
        mode=snap.mode,
        sample_interval=snap.sample_interval,
        notes=(min_age_note(min_age, clock, youngest),),
        meta=_meta(min_age=min_age),
    )


def diff_of(
    old: _core.Snapshot, old_time: float, new: _core.Snapshot, query: ReportQuery
) -> Report:
    """The top differences between two core snapshots."""
    key = cast("_core.KeyType", query.key_type)
    new_groups = new.group(key, query.cumulative)
    old_groups = old.group(key, query.cumulative)
    now = time.time()
    return diff_report(
        new_groups.compare(old_groups),
        _total(new, new_groups, query.cumulative),
        _total(old, old_groups, query.cumulative),
        key_type=query.key_type,
        cumulative=query.cumulative,
        limit=query.limit,
        mode=new.mode,
        sample_interval=new.sample_interval,
        notes=(f"since the agent's last cycle, {max(0.0, now - old_time):.1f}s ago",),
        meta=_meta(since=old_time),
    )


def leaks_of(
    agent: AgentView, snapshot: Callable[[], _core.Snapshot], limit: int, at: float
) -> LeakReport:
    """The agent's leak suspects (its last cycle's scores), their memory in
    a snapshot taken with its traces (``snapshot()``, only when there are
    suspects) at ``at``: how old it is and which tracebacks hold it."""
    readings = agent.readings()
    suspects = rank_scores(agent.leak_scores().items(), SUSPECT)[:limit]
    rows: dict[tuple[str, int], list[AgesRow]] = {site: [] for site, _score in suspects}
    mode, interval = readings.mode, readings.sample_interval
    clock = None
    if suspects:
        snap = snapshot()
        mode, interval = snap.mode, snap.sample_interval
        clock = age_clock(snap, at, agent)
        for row in snap.group("traceback", ages=True).ages():
            site = site_of(row[0])
            if site in rows:
                rows[site].append(row)
    return LeakReport(
        tuple(
            suspect_of(site, (s.score, s.rate, s.series, s.span), rows[site], clock=clock, at=at)
            for site, s in suspects
        ),
        agent.config.leak_window,
        SUSPECT,
        mode,
        interval if mode == "sample" else 0,
        notes=(f"the agent's last cycle; its epochs last at least {agent.config.interval:g}s",),
        meta=_meta(),
    )


def _render(report: Report, as_json: bool) -> tuple[bytes, str]:
    if as_json:
        return (json.dumps(to_json(report)) + "\n").encode(), "application/json"
    return format_text(report).encode("utf-8", "backslashreplace"), "text/plain; charset=utf-8"


class _Routes:
    """The WSGI applications of one DumpService."""

    def __init__(self, service: DumpService) -> None:
        self.service = service
        # The memory page's data, built once per cycle of the agent (what
        # identifies the cycle, the JSON): every open page refreshes every
        # few seconds, and the build holds the GIL for tens of milliseconds
        # on a large heap (docs/design/page.md, "Cost").
        self._view: tuple[tuple[int, int, float | None], bytes] | None = None

    def _busy(self, start_response: StartResponse) -> list[bytes]:
        retry = max(1, math.ceil(self.service.last_duration))
        return _error(
            start_response,
            "429 Too Many Requests",
            "another dump is being built; one at a time",
            [("Retry-After", str(retry))],
        )

    def _guarded(
        self,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        parse: Callable[[], Q],
        build: Callable[[Q], list[bytes]],
    ) -> list[bytes]:
        """Checks the method and the parameters (``parse``), then runs
        ``build`` under the dump lock, taken without waiting."""
        if environ.get("REQUEST_METHOD", "GET") != "GET":
            return _error(start_response, "405 Method Not Allowed", "only GET", [("Allow", "GET")])
        try:
            query = parse()
        except BadParameter as exc:
            return _error(start_response, "400 Bad Request", str(exc))
        lock = self.service.dump_lock
        if not lock.acquire(blocking=False):
            return self._busy(start_response)
        started = time.monotonic()
        try:
            return build(query)
        except _NotTracing as exc:
            return _error(start_response, "503 Service Unavailable", str(exc))
        except Exception:
            log.exception("heapwatch %s failed", environ.get("SCRIPT_NAME", "/debug/"))
            # Replaces the status, or re-raises if the body has begun (the
            # server then closes the connection).
            return _error(
                start_response,
                "500 Internal Server Error",
                "see the service's log",
                exc_info=sys.exc_info(),
            )
        finally:
            self.service.last_duration = time.monotonic() - started
            lock.release()

    def _snapshot(self, traces: bool) -> _core.Snapshot:
        try:
            return self.service.source.snapshot(traces)
        except RuntimeError as exc:
            raise _NotTracing(f"heapwatch cannot take a snapshot: {exc}") from None

    # ---- the routes ---------------------------------------------------------

    def index(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET") != "GET":
            return _error(start_response, "405 Method Not Allowed", "only GET", [("Allow", "GET")])
        try:
            params = _query(environ, ("format",))
            as_json = _as_json(params, environ)
        except BadParameter as exc:
            return _error(start_response, "400 Bad Request", str(exc))
        if "format" not in params and wants_page(environ):
            return page_response(start_response)
        agent = self.service.agent
        readings = agent.readings() if agent is not None else None
        previous = readings.previous_black_box if readings is not None else None
        watcher = getattr(self.service, "black_box", None)
        index = {
            **_meta(),
            "routes": {path: what for path, _method, what in _ROUTES},
            "black_box": None
            if watcher is None
            else {
                "thresholds": [str(t) for t in self.service.config.dump_at],
                "limit": watcher.limit,
                "directory": self.service.config.dump_dir,
                "written": list(watcher.written),
            },
            "previous_black_box": None if previous is None else previous._asdict(),
        }
        if as_json:
            return _respond(
                start_response, "200 OK", json.dumps(index).encode(), "application/json"
            )
        return _respond(start_response, "200 OK", _index_text(index).encode())

    def snapshot(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        def build(_params: dict[str, str]) -> list[bytes]:
            snap = self._snapshot(traces=True)
            header = self.service.header_of(snap, "http")
            name = f"heapwatch-{header.pid}-{int(header.timestamp)}.hwdump"
            write = start_response(
                "200 OK",
                [
                    ("Content-Type", "application/octet-stream"),
                    ("Content-Disposition", f'attachment; filename="{name}"'),
                    _NO_STORE,
                ],
            )
            # Written as it is produced, with no length: the connection's end
            # ends the body.  A dump cut short lacks its end record and
            # checksum, so every reader reports it as truncated.
            routes = dump_routes(snap)
            traces: Generator[Any, None, None] = (
                iter_traces(snap) if routes is None else iter_routed_traces(snap)
            )
            del snap  # the generator's: released when it is closed
            try:
                write_dump(cast("Any", _Writer(write)), header, traces, routes=routes)
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                log.debug("heapwatch dump: the client left before the end")
            finally:
                traces.close()  # a client that left: the snapshot goes now
            return []

        return self._guarded(environ, start_response, lambda: _query(environ, ()), build)

    def top(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        def build(query: ReportQuery) -> list[bytes]:
            snap = self._snapshot(traces=query.min_age is not None)
            at = self.service.clock()
            report = top_of(snap, query, self.service.agent, at)
            body, content_type = _render(report, query.as_json)
            return _respond(start_response, "200 OK", body, content_type)

        return self._guarded(
            environ,
            start_response,
            lambda: parse_report_query(environ, ages=True, routes=True),
            build,
        )

    def diff(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        def build(query: ReportQuery) -> list[bytes]:
            agent = self.service.agent
            last = agent.last_snapshot() if agent is not None else None
            if last is None:
                interval = agent.config.interval if agent is not None else 1.0
                return _error(
                    start_response,
                    "503 Service Unavailable",
                    "no agent cycle yet to compare with; retry after the first one",
                    [("Retry-After", str(max(1, math.ceil(interval))))],
                )
            old, old_time = last
            new = self._snapshot(traces=False)
            body, content_type = _render(diff_of(old, old_time, new, query), query.as_json)
            return _respond(start_response, "200 OK", body, content_type)

        return self._guarded(environ, start_response, lambda: parse_report_query(environ), build)

    def pprof(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        return self._go_profile(environ, start_response, "inuse_space", "heap.pb.gz")

    def allocs(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        return self._go_profile(environ, start_response, "alloc_space", "allocs.pb.gz")

    def _go_profile(
        self,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        default_sample_type: str,
        filename: str,
    ) -> list[bytes]:
        """Go's heap and allocs profiles: the same data, another default."""

        def build(collect: bool) -> list[bytes]:
            if collect:
                gc.collect()  # as Go's ?gc=1: only what is reachable
            snap = self._snapshot(traces=False)
            body = encode_go_heap_profile(
                snap,
                default_sample_type=default_sample_type,
                comments=[f"heapwatch pid {os.getpid()} on {socket.gethostname()}"],
                route_name=name_of,
            )
            return _respond(
                start_response,
                "200 OK",
                body,
                "application/octet-stream",
                headers=[("Content-Disposition", f'attachment; filename="{filename}"')],
            )

        def parse() -> bool:
            params = _query(environ, ("gc", "debug"))
            if params.get("debug", "0") != "0":
                raise BadParameter(
                    f"debug={_shown(params['debug'])} is not served: Go's text formats have "
                    "no Python equivalent; debug is 0 (the protobuf profile), and "
                    "go tool pprof -raw prints it as text"
                )
            return _flag(params, "gc")

        return self._guarded(environ, start_response, parse, build)

    def view(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        def build(_params: dict[str, str]) -> list[bytes]:
            agent = self.service.agent
            cycle = None
            if agent is not None:
                readings = agent.readings()
                last = readings.result
                cycle = (os.getpid(), readings.cycles, None if last is None else last.timestamp)
            cached = self._view
            if cycle is not None and cached is not None and cached[0] == cycle:
                body = cached[1]
            else:
                snap = self._snapshot(traces=True)
                at = self.service.clock()
                data = live_view(snap, agent, age_clock(snap, at, agent), at)
                body = json.dumps(data).encode()
                self._view = None if cycle is None else (cycle, body)
            return _respond(start_response, "200 OK", body, "application/json")

        return self._guarded(environ, start_response, lambda: _query(environ, ()), build)

    def leaks(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        def build(query: tuple[int, bool]) -> list[bytes]:
            limit, as_json = query
            agent = self.service.agent
            if agent is None:
                return _error(
                    start_response,
                    "503 Service Unavailable",
                    "no agent: the leak scores are its cycles'",
                )
            report = leaks_of(agent, lambda: self._snapshot(True), limit, self.service.clock())
            if as_json:
                body = (json.dumps(leaks_to_json(report)) + "\n").encode()
                return _respond(start_response, "200 OK", body, "application/json")
            body = format_leaks_text(report).encode("utf-8", "backslashreplace")
            return _respond(start_response, "200 OK", body)

        return self._guarded(environ, start_response, lambda: parse_leaks_query(environ), build)


class _NotTracing(Exception):
    """The tracer is not tracing: nothing to dump (503)."""


class _Writer:
    """A file-like object over WSGI's write callable."""

    def __init__(self, write: Callable[[bytes], object]) -> None:
        self._write = write

    def write(self, data: bytes) -> int:
        self._write(bytes(data))
        return len(data)


# Each route: its path, the _Routes method that answers it, and what the
# index says of it.
_ROUTES = (
    (INDEX_PATH, "index", "this listing; in a browser, the memory page"),
    (VIEW_PATH, "view", "the memory page's data: stacks, top sites, suspects, timeline (JSON)"),
    (SNAPSHOT_PATH, "snapshot", "every live trace, in heapwatch's dump format"),
    (TOP_PATH, "top", "top statistics (?key_type=, limit=, cumulative=, min_age=, format=json)"),
    (DIFF_PATH, "diff", "top differences since the agent's last cycle"),
    (LEAKS_PATH, "leaks", "the agent's leak suspects, their memory and its ages"),
    (PPROF_PATH, "pprof", "live memory and allocation totals, pprof (inuse_space; ?gc=1)"),
    (ALLOCS_PATH, "allocs", "the same profile, alloc_space by default (?gc=1)"),
)


def _index_text(index: Mapping[str, Any]) -> str:
    lines = [f"heapwatch agent, pid {index['pid']} on {index['hostname']}", "", "routes:"]
    lines += [f"  {path:<28} {what}" for path, what in index["routes"].items()]
    box = index["black_box"]
    lines.append("")
    if box is None:
        lines.append("black box: off (it needs HEAPWATCH_DUMP_DIR, HEAPWATCH_DUMP_AT and a limit)")
    else:
        lines.append(
            f"black box: on, at {','.join(box['thresholds'])} of the memory limit "
            f"({box['limit'] / (1 << 20):.1f} MiB), into {box['directory']}"
        )
        lines += [f"  written: {path}" for path in box["written"]]
    previous = index["previous_black_box"]
    if previous is not None:
        site = previous["site"]
        where = f"{site[0]}:{site[1]}" if site else "no traced site"
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(previous["timestamp"]))
        lines.append(
            f"previous black box: {previous['path']}: pid {previous['pid']}, which did not exit "
            f"cleanly, crossed {crossing(previous['threshold'], previous['limit'])} at {when}; "
            f"top site {where}"
        )
    return "\n".join(lines) + "\n"


def add_routes(router: Routes, service: DumpService) -> None:
    """Adds the ``/debug/`` routes, protected, to ``router``."""
    routes = _Routes(service)
    for path, method, _what in _ROUTES:
        app: WSGIApplication = getattr(routes, method)
        router.add(path, app, protected=True)
    add_page_routes(router)
