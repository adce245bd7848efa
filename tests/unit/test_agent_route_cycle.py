"""A cycle's routes (issue 26), composed by ``compose_cycle`` from a model of
the core whose memory is labelled with route ids, and a registry given as
``RouteNames``: the top routes, <none> and <other> summing to the traced
bytes, each route's top sites, and the routes' leak scores."""

from __future__ import annotations

import pytest

from heapwatch.agent.cycle import Cycle, CycleReaders, CycleSettings, CycleState, compose_cycle
from heapwatch.agent.interface import ROUTE_SITES, Route, RouteSite
from heapwatch.agent.route_cycle import RouteNames
from heapwatch.formats.leaks import SUSPECT, LeakTracker
from heapwatch.runtime.procmem import ProcessMemory
from support.agent_model import FakeClock, ModelSource, TickingTimer

NAMES = {0: "<none>", 1: "<other>", 2: "/items/{id}", 3: "/users/{uid}", 4: "/health"}
KiB = 1024


def registry(folded: int = 0) -> RouteNames:
    return RouteNames(NAMES.__getitem__, lambda: folded, none=0, other=1)


def readers(timer: TickingTimer, folded: int = 0) -> CycleReaders:
    return CycleReaders(
        clock=FakeClock(1000.0),
        timer=timer,
        memory=lambda: ProcessMemory(None, None, None),
        container=lambda: None,
        routes=registry(folded),
    )


class Run:
    """Cycles composed one after the other, as the agent runs them."""

    def __init__(self, top_routes: int = 2, step: float = 10.0, window: float = 600.0) -> None:
        self.source = ModelSource()
        self.state = CycleState()
        self.timer = TickingTimer(step / 2)  # read twice a cycle
        self.sites: LeakTracker[tuple[str, int]] = LeakTracker(window)
        self.routes: LeakTracker[str] = LeakTracker(window)
        self.settings = CycleSettings(
            top=5, interval=step / 2, sample_interval=0, top_routes=top_routes
        )

    def cycle(self, folded: int = 0) -> Cycle:
        done = compose_cycle(
            self.source,
            self.state,
            self.sites,
            self.settings,
            readers(self.timer, folded),
            route_tracker=self.routes,
        )
        self.state = done.state
        return done


def by_name(routes: tuple[Route, ...]) -> dict[str, Route]:
    return {route.name: route for route in routes}


def test_without_any_route_a_cycle_has_no_route_series() -> None:
    run = Run()
    run.source.allocate("app.py", 1, 5000)
    assert run.cycle().result.routes == ()
    run.source.allocate("app.py", 1, 5000)
    assert run.cycle().result.route_sites == ()


def test_top_routes_then_none_and_other_sum_to_the_traced_bytes() -> None:
    run = Run(top_routes=1)
    # The same line reached from three routes, and outside any request.
    run.source.allocate("shared.py", 7, 9000, 3, route=2)
    run.source.allocate("shared.py", 7, 4000, 2, route=3)
    run.source.allocate("shared.py", 7, 1000, 1, route=4)
    run.source.allocate("boot.py", 1, 2500, 5)
    first = run.cycle(folded=3).result
    # Only the top route by size has its own series; <other> holds the rest.
    assert first.routes == (
        Route("/items/{id}", 9000, 3, 0, 0.0, 0.0),
        Route("<none>", 2500, 5, 0, 0.0, 0.0),
        Route("<other>", 5000, 3, 0, None, None),
    )
    assert sum(route.size for route in first.routes) == first.traced
    assert first.routes_folded == 3
    # The next cycle's growths are each route's, and sum to the traced growth.
    run.source.allocate("shared.py", 7, 700, 1, route=2)
    run.source.allocate("shared.py", 7, 300, 1, route=3)
    run.source.free("boot.py", 1, 500, 1)
    second = run.cycle().result
    growth = {route.name: route.growth for route in second.routes}
    assert growth == {"/items/{id}": 700, "<none>": -500, "<other>": 300}
    assert sum(growth.values()) == second.traced - first.traced


def test_routes_first_seen_later_grow_from_none() -> None:
    run = Run()
    run.source.allocate("boot.py", 1, 2000)
    assert run.cycle().result.routes == ()
    # A request's memory, the first labelled: it grew from nothing, and
    # <none> by what it grew since the last cycle.
    run.source.allocate("view.py", 3, 800, route=2)
    run.source.allocate("boot.py", 1, 100)
    routes = by_name(run.cycle().result.routes)
    assert (routes["/items/{id}"].growth, routes["<none>"].growth) == (800, 100)
    assert routes["<other>"].growth == 0


def test_each_leading_route_has_its_top_sites_bounded() -> None:
    run = Run(top_routes=1)
    for line in range(1, ROUTE_SITES + 3):
        run.source.allocate("view.py", line, 100 * line, route=2)
    run.source.allocate("other.py", 1, 100_000, route=3)
    run.source.allocate("view.py", 1, 50, route=3)
    sites = run.cycle().result.route_sites
    # One route exported, the largest: its sites only.
    assert {site.route for site in sites} == {"/users/{uid}"}
    assert sites[0] == RouteSite("/users/{uid}", "other.py", 1, 100_000, 1)
    # Two routes exported: /items/{id}'s largest lines too, ROUTE_SITES of them.
    run.settings = run.settings._replace(top_routes=2)
    sites = run.cycle().result.route_sites
    items = [site for site in sites if site.route == "/items/{id}"]
    assert [site.line for site in items] == list(range(ROUTE_SITES + 2, 2, -1))
    assert len(items) == ROUTE_SITES
    users = [site for site in sites if site.route == "/users/{uid}"]
    assert [(s.file, s.line, s.size) for s in users] == [
        ("other.py", 1, 100_000),
        ("view.py", 1, 50),
    ]


def test_a_routes_leak_is_scored_as_a_lines_and_a_full_cache_is_not() -> None:
    run = Run(top_routes=3)
    # One line, two routes: /items/{id} keeps 100 KiB a cycle for good;
    # /users/{uid} fills a cache in its first cycles, then holds it.
    for number in range(150):
        run.source.allocate("shared.py", 7, 100 * KiB, 4, route=2)
        if number < 10:
            run.source.allocate("shared.py", 7, 400 * KiB, 8, route=3)
        result = run.cycle().result
    routes = by_name(result.routes)
    assert routes["/items/{id}"].leak_score is not None
    assert routes["/items/{id}"].leak_score >= 0.9
    assert routes["/items/{id}"].leak_rate == pytest.approx(100 * KiB / 10.0, rel=0.05)
    assert routes["/users/{uid}"].leak_score == pytest.approx(0.0, abs=0.05)
    assert routes["<other>"].leak_score is None
    assert run.state.routes.watched == {"/items/{id}", "/users/{uid}"}


def test_a_suspect_past_the_top_routes_gets_its_series() -> None:
    run = Run(top_routes=1)
    run.source.allocate("big.py", 1, 50_000 * KiB, route=3)
    for _ in range(150):
        run.source.allocate("leak.py", 1, 100 * KiB, route=2)
        result = run.cycle().result
    routes = by_name(result.routes)
    assert list(routes) == ["/users/{uid}", "/items/{id}", "<none>", "<other>"]
    assert routes["/items/{id}"].leak_score is not None
    assert routes["/items/{id}"].leak_score >= SUSPECT


def test_once_seen_routes_keep_their_series_when_their_memory_is_gone() -> None:
    run = Run()
    run.source.allocate("view.py", 3, 800, route=2)
    run.source.allocate("boot.py", 1, 200)
    run.cycle()
    run.source.free("view.py", 3, 800, route=2)
    result = run.cycle().result
    # <none> and <other> stay (a dashboard's lines do not vanish), and the
    # route that held the memory is gone from the top: its fall is <other>'s.
    assert [route.name for route in result.routes] == ["<none>", "<other>"]
    assert by_name(result.routes)["<other>"].growth == -800
    assert sum(route.size for route in result.routes) == result.traced == 200
