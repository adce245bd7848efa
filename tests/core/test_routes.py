"""Route labels in the core (agent/csrc/routes.c): the route id read from a
ContextVar, or from OpenTelemetry's current span through the span table,
when an allocation is recorded; part of a traceback's identity; merged
again by every grouping."""

from __future__ import annotations

import asyncio
import contextvars
import math
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import pytest

SIZE = 20_000
BLOCK = sys.getsizeof(bytes(SIZE))
N = 200
MODES = [("exact", 1), ("sample", 64 * 1024)]

route_var: contextvars.ContextVar[int] = contextvars.ContextVar("test_route")
otel_var: contextvars.ContextVar[dict[str, object]] = contextvars.ContextVar("test_otel")
SPAN_KEY = "current-span-test"


class Span:
    """Stands for an OpenTelemetry span: only its address matters."""


def _alloc(keep: list[bytes], n: int = N) -> None:
    for _ in range(n):
        block = bytes(SIZE)  # route site
        keep.append(block)


SITE = _alloc.__code__.co_firstlineno + 2


@pytest.fixture
def routes(core: ModuleType) -> Iterator[ModuleType]:
    core.set_route_var(route_var)
    core.set_span_routes(otel_var, SPAN_KEY)
    try:
        yield core
    finally:
        core.set_route_var(None)
        core.set_span_routes(None, None)


def _by_route(core: ModuleType) -> dict[int, int]:
    """The estimated bytes of this file's route site, by route id."""
    snap = core.take_snapshot()
    sums: dict[int, int] = {}
    for route, row in zip(snap.routes(), snap.tracebacks(names=True)):
        filename, lineno, _ = row[1][0]
        if filename == __file__ and lineno == SITE:
            sums[route] = sums.get(route, 0) + row[3]
    return sums


def _close(mode: str, interval: int, got: int, blocks: int) -> bool:
    """Within six standard deviations of a sampled estimate of `blocks` blocks."""
    want = blocks * BLOCK
    if mode == "exact":
        return got == want
    p = 1 - math.exp(-BLOCK / interval)
    sd = math.sqrt(blocks * (1 - p) / p) * BLOCK
    return abs(got - want) <= 6 * sd


@pytest.mark.parametrize(("mode", "interval"), MODES)
def test_a_context_var_labels_what_is_allocated_under_it(
    routes: ModuleType, mode: str, interval: int
) -> None:
    routes.start(1, mode, interval)
    keep: list[bytes] = []
    _alloc(keep)
    token = route_var.set(5)
    _alloc(keep)
    route_var.reset(token)
    contextvars.copy_context().run(lambda: (route_var.set(7), _alloc(keep)))
    got = _by_route(routes)
    assert set(got) <= {0, 5, 7}
    for route in (0, 5, 7):
        assert _close(mode, interval, got.get(route, 0), N), (route, got)


def test_grouping_merges_the_routes_again(routes: ModuleType) -> None:
    routes.start(1, "exact")
    keep: list[bytes] = []
    for route in (0, 3, 4):
        token = route_var.set(route)
        _alloc(keep)
        route_var.reset(token)
    snap = routes.take_snapshot()
    assert sorted(set(snap.routes())) == [0, 3, 4]
    for key_type in ("lineno", "traceback"):
        rows = [r for r in snap.group(key_type).statistics() if r[0][0] == (__file__, SITE)]
        assert len(rows) == 1, rows
        assert rows[0][1] == 3 * N * BLOCK
    # One route's tracebacks, by mask.
    mask = bytes(route == 4 for route in snap.routes())
    rows = [r for r in snap.group("lineno", mask=mask).statistics() if r[0][0] == (__file__, SITE)]
    assert rows[0][1] == N * BLOCK


def test_the_rows_follow_tracebacks_order_with_peaks_and_allocs(routes: ModuleType) -> None:
    routes.start(1, "exact")
    keep: list[bytes] = []
    token = route_var.set(11)
    _alloc(keep, 10)
    route_var.reset(token)
    keep.clear()  # a site holding only a peak and allocation totals
    snap = routes.take_snapshot()
    for peaks, allocs in ((False, False), (True, False), (False, True)):
        rows = snap.tracebacks(names=True, peaks=peaks, allocs=allocs)
        labels = snap.routes(peaks=peaks, allocs=allocs)
        assert len(rows) == len(labels)
        ours = [lab for lab, row in zip(labels, rows) if row[1][0][:2] == (__file__, SITE)]
        assert ours == ([] if not (peaks or allocs) else [11])


def test_values_that_are_no_route_id_give_no_route(routes: ModuleType) -> None:
    routes.start(1, "exact")
    keep: list[bytes] = []
    for value in (-1, 65536, 2**70, "5", 5.0, True):
        token = route_var.set(value)  # type: ignore[arg-type]
        _alloc(keep, 5)
        route_var.reset(token)
    assert set(_by_route(routes)) == {0}


@pytest.mark.parametrize(("mode", "interval"), MODES)
def test_the_current_span_labels_through_the_span_table(
    routes: ModuleType, mode: str, interval: int
) -> None:
    routes.start(1, mode, interval)
    keep: list[bytes] = []
    span, child, unknown = Span(), Span(), Span()
    routes.span_route(span, 9)
    routes.span_route(child, 9)  # the span processor gives a child its parent's route
    assert routes.get_stats()["span_routes"] == 2

    def in_span(s: Span) -> None:
        otel_var.set({SPAN_KEY: s, "other": 1})
        _alloc(keep)

    contextvars.copy_context().run(in_span, span)
    contextvars.copy_context().run(in_span, child)
    contextvars.copy_context().run(in_span, unknown)
    # heapwatch's own var wins over the span.
    contextvars.copy_context().run(lambda: (route_var.set(2), in_span(span)))
    routes.span_route(span, 0)  # on_end
    contextvars.copy_context().run(in_span, span)
    routes.span_route(child, 0)
    got = _by_route(routes)
    assert _close(mode, interval, got.get(9, 0), 2 * N), got
    assert _close(mode, interval, got.get(2, 0), N), got
    assert _close(mode, interval, got.get(0, 0), 2 * N), got
    assert routes.get_stats()["span_routes"] == 0


def test_turning_the_span_source_off_forgets_every_span(routes: ModuleType) -> None:
    spans = [Span() for _ in range(10)]
    for span in spans:
        routes.span_route(span, 3)
    routes.set_span_routes(None, None)
    assert routes.get_stats()["span_routes"] == 0


def test_the_span_table_is_bounded_and_counts_what_it_refused(routes: ModuleType) -> None:
    spans = [Span() for _ in range(routes.SPAN_ROUTES + 10)]
    for span in spans:
        routes.span_route(span, 1)
    stats = routes.get_stats()
    assert stats["span_routes"] == routes.SPAN_ROUTES
    assert stats["span_routes_dropped"] == 10
    # Removing in any order keeps every other entry findable.
    for span in spans[::2]:
        routes.span_route(span, 0)
    routes.start(1, "exact")
    keep: list[bytes] = []
    kept = spans[1 : routes.SPAN_ROUTES : 2][-50:]  # the table took these

    def in_span(span: Span) -> None:
        otel_var.set({SPAN_KEY: span})
        _alloc(keep, 1)

    for span in kept:
        contextvars.copy_context().run(in_span, span)
    # 3.9 puts a small object of the loop on the line too: count blocks.
    assert _by_route(routes).get(1, 0) // BLOCK == 50
    for span in spans:
        routes.span_route(span, 0)
    assert routes.get_stats()["span_routes"] == 0


def test_threads_and_tasks_take_the_context_they_run_in(routes: ModuleType) -> None:
    routes.start(1, "exact")
    keep: list[bytes] = []
    route_var.set(21)
    # A thread starts in an empty context (3.9 to 3.13; 3.14 may copy it):
    # what it allocates is labelled only if its context says so.
    plain = threading.Thread(target=_alloc, args=(keep,))
    plain.start()
    plain.join()
    copied = threading.Thread(target=contextvars.copy_context().run, args=(_alloc, keep))
    copied.start()
    copied.join()
    # concurrent.futures does not copy the context either.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(_alloc, keep).result()
        pool.submit(contextvars.copy_context().run, _alloc, keep).result()

    async def request(route: int) -> None:
        route_var.set(route)
        for _ in range(4):
            _alloc(keep, N // 4)
            await asyncio.sleep(0)  # the requests interleave

    async def main() -> None:
        await asyncio.gather(request(31), request(32))

    route_var.set(0)
    asyncio.run(main())
    got = _by_route(routes)
    inherits = bool(getattr(sys.flags, "thread_inherit_context", 0))
    assert got.get(21, 0) == (3 if inherits else 2) * N * BLOCK, got
    assert got.get(31, 0) == N * BLOCK
    assert got.get(32, 0) == N * BLOCK


def test_an_exception_being_handled_stays_as_it_is(routes: ModuleType) -> None:
    """Allocations recorded while an exception is set (building its
    traceback) read the route without clearing or replacing it."""
    routes.start(1, "exact")
    otel_var.set({SPAN_KEY: Span()})
    route_var.set(0)
    errors: list[BaseException] = []
    for i in range(200):
        try:
            raise KeyError(i)
        except KeyError as exc:
            errors.append(exc)
    assert [e.args[0] for e in errors] == list(range(200))


@pytest.mark.parametrize(("mode", "interval"), [("exact", 1), ("sample", 256)])
def test_reading_a_route_leaves_the_hosts_variables_as_they_are(
    routes: ModuleType, mode: str, interval: int
) -> None:
    """An allocation recorded inside ContextVar.reset() must not leave the
    value being removed in the variable's cache (PyContextVar_Get's): the
    host's get() would then return it, freed by then."""
    own: contextvars.ContextVar[int] = contextvars.ContextVar("fresh_route")
    otel: contextvars.ContextVar[dict[str, object]] = contextvars.ContextVar("fresh_otel")
    routes.set_route_var(own)
    routes.set_span_routes(otel, SPAN_KEY)

    def run() -> int:
        for i in range(20):
            contextvars.ContextVar(f"other{i}").set(1)  # reset() then allocates
        stale = 0
        for _ in range(2000):
            token = own.set(3)
            own.reset(token)
            span_token = otel.set({SPAN_KEY: Span()})
            otel.reset(span_token)
            if own.get(None) is not None or otel.get(None) is not None:
                stale += 1
        return stale

    routes.start(1, mode, interval)
    assert contextvars.Context().run(run) == 0


def test_bad_arguments_name_the_value(routes: ModuleType) -> None:
    with pytest.raises(TypeError, match="ContextVar or None, not int"):
        routes.set_route_var(3)
    with pytest.raises(ValueError, match="neither"):
        routes.set_span_routes(otel_var, None)
    with pytest.raises(TypeError, match="must be a str, not bytes"):
        routes.set_span_routes(otel_var, b"k")
    with pytest.raises(ValueError, match="from 0 to 65535, not 70000"):
        routes.span_route(Span(), 70000)
    with pytest.raises(ValueError, match="not -1"):
        routes.span_route(Span(), -1)


def test_without_a_source_nothing_is_labelled(core: ModuleType) -> None:
    core.start(1, "exact")
    keep: list[bytes] = []
    token = route_var.set(5)
    _alloc(keep, 10)
    route_var.reset(token)
    assert set(_by_route(core)) == {0}


def test_routes_count_toward_the_traceback_total(routes: ModuleType) -> None:
    """The drop-in counts tracebacks by frames; a route makes another."""
    routes.start(1, "exact")
    keep: list[Any] = []
    before = routes.take_snapshot().ntracebacks
    for route in range(1, 6):
        token = route_var.set(route)
        _alloc(keep, 1)
        route_var.reset(token)
    assert routes.take_snapshot().ntracebacks - before >= 5
