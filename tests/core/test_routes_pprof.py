"""A real snapshot's routes become the pprof samples' ``http.route`` labels
(``heapwatch.formats.pprof.go_heap_samples`` with the registry's names)."""

from __future__ import annotations

import contextvars
from types import ModuleType

from heapwatch.formats.pprof import ROUTE_LABEL, decode_profile, encode_go_heap_profile

route_var: contextvars.ContextVar[int] = contextvars.ContextVar("test_pprof_route")
NAMES = {7: "/items/{id}", 8: "/users/{uid}"}


def _keep(kept: list[bytes]) -> None:
    for _ in range(50):
        block = bytes(10_000)  # the labelled site
        kept.append(block)


SITE = _keep.__code__.co_firstlineno + 2


def test_each_routes_samples_carry_its_name(core: ModuleType) -> None:
    core.set_route_var(route_var)
    kept: list[bytes] = []
    try:
        core.start(1, "exact", profile="agent")
        _keep(kept)  # no route
        for rid in NAMES:
            token = route_var.set(rid)
            try:
                _keep(kept)
            finally:
                route_var.reset(token)
        snap = core.take_snapshot()
    finally:
        core.set_route_var(None)
    looked_up: list[int] = []

    def name(rid: int) -> str:
        looked_up.append(rid)
        return NAMES[rid]

    profile = decode_profile(
        encode_go_heap_profile(snap, default_sample_type="inuse_space", route_name=name)
    )
    strings = profile["string_table"]
    functions = {f["id"]: f for f in profile["function"]}
    locations = {loc["id"]: loc for loc in profile["location"]}
    by_route: dict[str, int] = {}
    for sample in profile["sample"]:
        leaf = locations[sample["location_id"][0]]["line"][0]
        if leaf["line"] != SITE or strings[functions[leaf["function_id"]]["filename"]] != __file__:
            continue
        routes = [
            strings[label["str"]]
            for label in sample["label"]
            if strings[label["key"]] == ROUTE_LABEL
        ]
        key = routes[0] if routes else ""
        by_route[key] = by_route.get(key, 0) + sample["value"][3]
    # Three samples of the same line: two labelled, the one of no route not.
    assert set(by_route) == {"", "/items/{id}", "/users/{uid}"}
    assert by_route["/items/{id}"] == by_route["/users/{uid}"] == by_route[""] >= 50 * 10_000
    # Each id is named once, however many tracebacks carry it.
    assert sorted(looked_up) == [7, 8]
