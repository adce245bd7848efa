"""The routes of one cycle: whose request the memory of each traceback was
allocated for (issue 26), summed by route, scored, and bounded.

The core labels each traceback with a route id (``Snapshot.routes()``, in
the order of ``Snapshot.tracebacks()``); the registry
(``heapwatch.runtime.routes``, given as ``RouteNames``) names them.  A
cycle exports the top routes by size, then the leak suspects among the
others, then ``<none>`` (memory allocated outside any request) and
``<other>`` (every other route, and those the registry folded past its
cap), so that the routes' sizes sum to the traced bytes as the sites' do;
and the top ``ROUTE_SITES`` lines of each route it exports by name.  A
route's leak score is a line's: the same tracker, watching rule and
observations, over the route's memory (its bytes by age from a grouping
masked to its tracebacks).

Until some traceback carries a route, a cycle exports no route at all: a
service that never sets one has no route series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Callable, NamedTuple

from heapwatch.agent.contract import ROUTE_SITES, Route, RouteSite, site_of
from heapwatch.agent.watch import WATCH_LOW, score_watched
from heapwatch.formats.leaks import FLOOR_BYTES, SUSPECT, LeakTracker, rank_scores

__all__ = ["RouteCycle", "RouteNames", "RouteState", "compose_routes"]

Key = tuple[str, int]

_NO_SIZES: Mapping[str, int] = MappingProxyType({})
_ZEROES = bytes(256)


class RouteNames(NamedTuple):
    """The registry, as a cycle reads it."""

    name: Callable[[int], str]
    """A route id's name (``<none>``, ``<other>`` or the template)."""
    folded: Callable[[], int]
    """Names refused past the registry's cap so far."""
    none: int
    """The id of memory allocated outside any request."""
    other: int
    """The id of the names the registry refused."""


class RouteState(NamedTuple):
    """What a cycle hands the next one of its routes."""

    seen: bool = False
    """Whether any traceback carried a route yet."""
    sizes: Mapping[str, int] = _NO_SIZES
    """The previous cycle's size of every route, the baseline of growth."""
    watched: frozenset[str] = frozenset()
    """The routes whose leak series the tracker keeps."""


class RouteCycle(NamedTuple):
    routes: tuple[Route, ...]
    sites: tuple[RouteSite, ...]
    folded: int
    state: RouteState


def compose_routes(
    snapshot: Any,
    rows: Sequence[tuple[Any, ...]],
    previous: RouteState,
    tracker: LeakTracker[str],
    names: RouteNames,
    *,
    top: int,
    now: float,
    previous_traced: int | None,
    sample_interval: int,
) -> RouteCycle:
    """The routes of ``snapshot``, whose ``tracebacks(allocs=True)`` are
    ``rows``; ``previous_traced`` is the previous cycle's traced bytes
    (None on the first cycle, whose growths are all 0)."""
    folded = names.folded()
    ids: list[int] = snapshot.routes(allocs=True)
    if top <= 0 or not (previous.seen or folded or any(ids)):
        return RouteCycle((), (), folded, previous)
    none, other = names.name(names.none), names.name(names.other)
    name_of: dict[int, str] = {}
    totals: dict[str, list[int]] = {none: [0, 0]}
    by_site: dict[str, dict[Key, list[int]]] = {}
    for rid, row in zip(ids, rows):
        size, count = row[3], row[4]
        if not (size or count):
            continue
        name = name_of.get(rid)
        if name is None:
            name = name_of[rid] = names.name(rid)
        total = totals.setdefault(name, [0, 0])
        total[0] += size
        total[1] += count
        if name not in (none, other):
            site = by_site.setdefault(name, {}).setdefault(site_of(row[1]), [0, 0])
            site[0] += size
            site[1] += count
    ranked = sorted(
        (name for name in totals if name not in (none, other)),
        key=lambda name: (-totals[name][0], name),
    )
    scores, watched = score_watched(
        tracker,
        now,
        _route_ages(
            snapshot, ids, name_of, totals, [*ranked[: 2 * top], none], watched=previous.watched
        ),
        epoch=snapshot.epoch,
        watched=previous.watched,
        sample_interval=sample_interval,
    )
    exported = ranked[:top]
    leading = set(exported)
    # Then the leak suspects past the top ones: a young leak's route gets
    # its series as soon as it is suspected.
    suspects = [
        name
        for name, _score in rank_scores(scores.items(), SUSPECT)
        if name not in leading and name in totals and name != none
    ]
    exported += suspects[:top]
    exported.append(none)
    if previous_traced is None:
        previous_sizes: Mapping[str, int] = {name: size for name, (size, _) in totals.items()}
    elif not previous.seen:
        # Before any route was seen, all of the memory was <none>'s.
        previous_sizes = {none: previous_traced}
    else:
        previous_sizes = previous.sizes
    routes = []
    for name in exported:
        size, count = totals.get(name, (0, 0))
        score = scores.get(name)
        routes.append(
            Route(
                name,
                size,
                count,
                size - previous_sizes.get(name, 0),
                score.score if score is not None else 0.0,
                score.rate if score is not None else 0.0,
            )
        )
    traced = snapshot.traced
    # <other> is what the exported routes leave of the totals, so sums over
    # routes equal the totals exactly (routes that vanished included).
    traced_before = traced if previous_traced is None else previous_traced
    routes.append(
        Route(
            other,
            traced - sum(r.size for r in routes),
            max(0, snapshot.blocks - sum(r.blocks for r in routes)),
            (traced - traced_before) - sum(r.growth for r in routes),
            None,
            None,
        )
    )
    sites = [
        RouteSite(name, key[0], key[1], size, count)
        for name in exported
        if name != none
        for key, (size, count) in sorted(
            by_site.get(name, {}).items(), key=lambda item: (-item[1][0], item[0])
        )[:ROUTE_SITES]
    ]
    state = RouteState(True, {name: size for name, (size, _count) in totals.items()}, watched)
    return RouteCycle(tuple(routes), tuple(sites), folded, state)


def _route_ages(
    snapshot: Any,
    ids: Sequence[int],
    name_of: Mapping[int, str],
    totals: Mapping[str, Sequence[int]],
    candidates: Sequence[str],
    *,
    watched: frozenset[str],
) -> list[tuple[str, int, int, Sequence[int]]]:
    """(route, bytes, blocks, bytes by age) of the candidates that may be
    watched: one grouping masked to each one's tracebacks, so only a few
    (twice the routes exported, and <none>)."""
    chosen = [
        name
        for name in candidates
        if totals[name][0] >= FLOOR_BYTES or (name in watched and totals[name][0] >= WATCH_LOW)
    ]
    # Each traceback's candidate as one byte (0: none), in one pass; each
    # mask is then a translation of it, in C (a pass per candidate in
    # Python was half the route step's time at 200,000 traces).
    number = {name: index for index, name in enumerate(chosen, start=1)}
    code_of = {rid: number.get(name, 0) for rid, name in name_of.items()}
    live = ids[: snapshot.ntracebacks]
    one_byte = len(chosen) < len(_ZEROES)
    codes = bytes([code_of.get(rid, 0) for rid in live]) if one_byte else b""
    out: list[tuple[str, int, int, Sequence[int]]] = []
    for index, name in enumerate(chosen, start=1):
        if one_byte:
            # The table that turns this candidate's byte into 1, any other into 0.
            mask = codes.translate(_ZEROES[:index] + b"\x01" + _ZEROES[index + 1 :])
        else:
            mask = bytes(name_of.get(rid) == name for rid in live)
        histogram: list[int] = []
        count = 0
        size = 0
        for _frames, group_size, group_count, ages in snapshot.group(
            "filename", mask=mask, ages=True
        ).ages():
            size += group_size
            count += group_count
            if len(histogram) < len(ages):
                histogram.extend([0] * (len(ages) - len(histogram)))
            for bucket, held in enumerate(ages):
                histogram[bucket] += held
        out.append((name, size, count, histogram))
    return out
