"""The route registry: names as ids for the core (heapwatch.runtime.routes)."""

from __future__ import annotations

import subprocess
import sys
import threading
from contextvars import copy_context

import pytest

from heapwatch import _core
from heapwatch.runtime import routes
from heapwatch.runtime.routes import (
    MAX_ROUTES,
    ROUTE_NONE,
    ROUTE_OTHER,
    current_route,
    folded_routes,
    route_id,
    route_name,
)


def test_reserved_ids_have_their_names() -> None:
    assert (ROUTE_NONE, ROUTE_OTHER) == (0, 1)
    assert route_name(ROUTE_NONE) == "<none>"
    assert route_name(ROUTE_OTHER) == "<other>"
    assert route_id("<none>") == ROUTE_NONE
    assert route_id("<other>") == ROUTE_OTHER


def test_a_name_is_interned_once_and_keeps_its_id() -> None:
    rid = route_id("/test/items/{id}")
    assert rid >= 2
    assert route_id("/test/items/{id}") == rid
    assert route_name(rid) == "/test/items/{id}"
    assert route_id("/test/users/<int:uid>") not in (rid, ROUTE_NONE, ROUTE_OTHER)


def test_the_cap_fits_the_core_route_ids() -> None:
    assert MAX_ROUTES + 1 <= _core.MAX_ROUTE


def test_current_route_is_none_outside_any_request() -> None:
    assert copy_context().run(current_route.get) == ROUTE_NONE


def test_threads_interning_one_name_agree_on_its_id() -> None:
    names = [f"/test/race/{i}" for i in range(50)]
    seen: list[list[int]] = []
    start = threading.Barrier(8)

    def intern() -> None:
        start.wait()
        seen.append([route_id(n) for n in names])

    threads = [threading.Thread(target=intern) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and all(ids == seen[0] for ids in seen)
    assert len(set(seen[0])) == len(names)
    assert [route_name(rid) for rid in seen[0]] == names


def test_past_the_cap_names_fold_into_other_and_are_counted_once() -> None:
    registry = routes._Registry(max_routes=3)
    kept = [registry.route_id(f"/r{i}") for i in range(3)]
    assert kept == [2, 3, 4]
    assert registry.route_id("/late") == ROUTE_OTHER
    assert registry.route_id("/late") == ROUTE_OTHER
    assert registry.route_id("/later") == ROUTE_OTHER
    assert registry.folded_routes() == 2
    # Names interned before the cap keep their ids.
    assert registry.route_id("/r1") == 3


def test_the_folded_count_stays_bounded_in_memory_and_keeps_counting() -> None:
    registry = routes._Registry(max_routes=2)
    registry.route_id("/a")
    registry.route_id("/b")
    for i in range(10):
        registry.route_id(f"/raw/path/{i}")
    assert registry.folded_routes() == 10
    assert len(registry._folded) == 2


def test_the_process_registry_folds_past_max_routes() -> None:
    # In a fresh process: the test process's registry must keep its room.
    code = (
        "from heapwatch.runtime.routes import *\n"
        "ids = [route_id(f'/r/{i}') for i in range(MAX_ROUTES)]\n"
        "assert ids == list(range(2, MAX_ROUTES + 2)), ids[-3:]\n"
        "assert route_id('/one/more') == ROUTE_OTHER\n"
        "assert folded_routes() == 1\n"
        "assert route_name(MAX_ROUTES + 1) == f'/r/{MAX_ROUTES - 1}'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_bad_names_and_ids_are_refused_with_what_is_allowed() -> None:
    with pytest.raises(TypeError, match="must be a str, not bytes"):
        route_id(b"/x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1 to 512 characters long, got 0"):
        route_id("")
    with pytest.raises(ValueError, match="got 513"):
        route_id("/" * 513)
    with pytest.raises(ValueError, match="unknown route id 65000: interned ids are 0 to"):
        route_name(65000)
    with pytest.raises(TypeError, match="must be an int, not str"):
        route_name("2")  # type: ignore[arg-type]
    assert folded_routes() == 0
