"""One cycle of the agent, composed from what it reads, apart from its thread.

``compose_cycle`` takes the snapshot source, the state the previous cycle
left (``CycleState``), the leak tracker, the settings (``CycleSettings``)
and the readers of what lies beyond the snapshot (``CycleReaders``: the
clocks, the process's memory, the container's), and returns the
``CycleResult`` with the state the next cycle starts from (``Cycle``).  It
starts no thread, takes no lock and keeps nothing: ``heapwatch.agent.agent``
runs it in its thread (or in the caller's, ``Agent.run_cycle``) under its
cycle lock, and publishes what it returns; tests call it directly.  A
figure the cycle learns to read is read here, in this one function, as the
OpenTelemetry SDK keeps ``PeriodicExportingMetricReader`` (the thread)
apart from ``metric_reader_storage.py`` (what a collection makes of the
measurements).

The steps, in order (docs/design/agent.md, "The cycle"): begin an epoch
when an interval has passed since the current one began (``begins_epoch``),
take the snapshot (resetting the peak), group it by line, diff the top sites
against the previous cycle's grouping, score the leaks of the watched sites,
read every needed site's share of the peak, compose the exported sites and
``<other>``, then read the tracer's own figures, the process's memory and the
container's, let the core drain, and keep the grouping as the next baseline.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Callable, NamedTuple

from heapwatch.agent.contract import OTHER_FILE, OTHER_LINE, CycleResult, Site, site_of
from heapwatch.agent.route_cycle import RouteNames, RouteState, compose_routes
from heapwatch.agent.watch import WATCH_LOW, score_watched
from heapwatch.formats.leaks import SUSPECT, LeakScore, LeakTracker, rank_scores
from heapwatch.runtime.container import ContainerMemory
from heapwatch.runtime.procmem import ProcessMemory, compute_untraced
from heapwatch.runtime.source import SnapshotSource

__all__ = [
    "WATCH_LOW",
    "Cycle",
    "CycleReaders",
    "CycleSettings",
    "CycleState",
    "EpochStart",
    "begins_epoch",
    "compose_cycle",
]

Key = tuple[str, int]
"""A site: (file, line)."""

_NO_SIZES: Mapping[Key, int] = MappingProxyType({})


class EpochStart(NamedTuple):
    """When an epoch of the core began, as the agent knows it."""

    epoch: int
    timer: float
    """A timer reading no earlier than it began."""
    time: float
    """A unix time no earlier than it began (``CycleResult.epoch_started``)."""


class CycleState(NamedTuple):
    """What a cycle hands the next one.  ``CycleState()`` is the state before
    the first cycle, whose growths are all 0 (it is the baseline)."""

    groups: Any = None
    """The previous cycle's grouping by line, the baseline of growth; None
    before the first cycle."""
    sizes: Mapping[Key, int] = _NO_SIZES
    """The previous cycle's size of every site it read (the top ones, those
    by peak, the watched ones)."""
    traced: int = 0
    """The previous cycle's traced bytes."""
    watched: frozenset[Key] = frozenset()
    """The sites whose leak series the tracker keeps (``WATCH_LOW``)."""
    epoch_began: EpochStart | None = None
    """When the core's current epoch began, if the agent saw it begin (or
    first saw it)."""
    routes: RouteState = RouteState()
    """The previous cycle's routes (``heapwatch.agent.route_cycle``)."""
    allocated: Mapping[Key, int] = _NO_SIZES
    """The previous cycle's bytes allocated since tracing started, by site:
    what a site allocated in this interval is the difference."""
    hot: Mapping[Key, int] = _NO_SIZES
    """The sites exported for what they allocate (``ALLOC_HOLD``), with the
    last epoch each ranked among the top by bytes allocated."""

    def in_forked_child(self) -> CycleState:
        """The state a forked child's agent starts from: a baseline of its
        own, but the parent's epoch, in which the child's core carries on."""
        return CycleState(epoch_began=self.epoch_began)


# A site ranked among the top by bytes allocated in an interval keeps its
# series this many cycles after it last ranked: a counter series that comes
# and goes with each cycle's ranking would make rate() see gaps where the
# site kept allocating.
ALLOC_HOLD = 10


def _hot_sites(
    allocated: Mapping[Key, int],
    previous: CycleState,
    top: int,
    epoch: int,
    first: bool,
) -> dict[Key, int]:
    """The sites to export for what they allocate: this interval's top ones
    by bytes allocated (churn that a live view never shows: a line that
    allocates and frees holds nothing at a cycle's end), and those that
    ranked within the last ALLOC_HOLD epochs.  Site -> the epoch it last
    ranked."""
    held = {key: seen for key, seen in previous.hot.items() if epoch - seen < ALLOC_HOLD}
    if first or top <= 0:
        return held
    before = previous.allocated
    ranked = heapq.nlargest(
        top,
        ((total - before.get(key, 0), key) for key, total in allocated.items()),
    )
    held.update((key, epoch) for delta, key in ranked if delta > 0)
    return held


class CycleSettings(NamedTuple):
    """What the agent's configuration and its tracer say to a cycle."""

    top: int
    """Sites exported by size, and as many more by peak and as suspects."""
    interval: float
    """The shortest epoch but the first (docs/design/agent.md, "Epochs")."""
    sample_interval: int
    """Bytes between samples on average; 0 in exact mode."""
    retain_snapshot: bool = False
    """Whether to keep a snapshot (without traces) for ``last_snapshot()``."""
    top_routes: int = 0
    """Routes exported by size (and as many more as suspects); 0: none."""
    stacks: bool = False
    """Whether to read the snapshot's memory by stack, names resolved."""


class CycleReaders(NamedTuple):
    """What a cycle reads beyond the snapshot, each once, in this order:
    ``timer`` as it starts, ``clock`` after the snapshot, ``memory`` and
    ``container`` after the sites are composed, ``timer`` again at the end."""

    clock: Callable[[], float]
    """Unix time, for the result's timestamp."""
    timer: Callable[[], float]
    """A monotonic clock, for the cycle's duration and the epochs."""
    memory: Callable[[], ProcessMemory]
    """The process's resident set and C heap."""
    container: Callable[[], ContainerMemory | None]
    """The memory of the process's cgroup; None outside one."""
    routes: RouteNames | None = None
    """The route registry, read after the sites are composed; None: no
    routes."""


class Cycle(NamedTuple):
    """What ``compose_cycle`` returns."""

    result: CycleResult
    state: CycleState
    """What the next cycle starts from."""
    scores: dict[Key, LeakScore]
    """The leak score of every site the tracker keeps."""
    last_snapshot: tuple[Any, float] | None
    """A snapshot without traces and its unix time, when asked for."""
    stacks: list[Any] | None = None
    """The snapshot's ``tracebacks(names=True)``, when asked for."""


def begins_epoch(current: int, began: EpochStart | None, now: float, interval: float) -> bool:
    """Whether a cycle starting at ``now`` (a timer reading) begins an epoch,
    the core being in epoch ``current``: the first since tracing started
    (epoch 0) may end at once, any other once ``interval`` has passed since
    it began (an epoch the agent has not seen begin, from the first cycle
    that saw it)."""
    if current == 0:
        return True
    return began is not None and began.epoch == current and now - began.timer >= interval


def compose_cycle(
    source: SnapshotSource,
    previous: CycleState,
    tracker: LeakTracker[Key],
    settings: CycleSettings,
    readers: CycleReaders,
    *,
    route_tracker: LeakTracker[str] | None = None,
) -> Cycle:
    """Runs one cycle on ``source``: its result, the next cycle's state, the
    leak scores and, when ``settings.retain_snapshot``, the diff's baseline.

    ``tracker`` gets the cycle's observations (unless the timer has not
    moved since its last ones); everything else the cycle changes is in what
    it returns.  ``route_tracker`` is the routes' (their scores are in the
    result's routes); without it, or without ``readers.routes``, the cycle
    has no routes.  Raises what failed: the caller keeps ``previous``.
    """
    started = readers.timer()
    if begins_epoch(source.current_epoch(), previous.epoch_began, started, settings.interval):
        source.next_epoch()
    snapshot = source.take_snapshot()
    timestamp = readers.clock()
    traced = snapshot.traced
    groups = snapshot.group("lineno", ages=True)
    # The first cycle is the baseline: no growth.
    first = previous.groups is None
    baseline = groups if first else previous.groups
    previous_traced = traced if first else previous.traced
    top = groups.growth(baseline, settings.top) if settings.top > 0 else []
    top_keys = {site_of(row[0]) for row in top}
    ages = _watchable(groups, previous.watched)
    scores, watched = score_watched(
        tracker,
        started,
        ((site_of(frames), size, count, histogram) for frames, size, count, histogram in ages),
        epoch=snapshot.epoch,
        watched=previous.watched,
        sample_interval=settings.sample_interval,
    )
    suspects = [key for key, _score in rank_scores(scores.items(), SUSPECT)]
    # Sites by peak, those whose memory is all gone included (a site
    # that allocated and freed within the interval made the peak too).
    by_peak = _by_peak(groups, settings.top, top_keys | set(suspects[: settings.top * 2]))
    peaks = {site_of(row[0]): row[3] for row in by_peak}
    traceback_rows = snapshot.tracebacks(allocs=True)
    allocated, live, allocated_total = _allocated_by_site(traceback_rows, snapshot.allocs_folded)
    known = {site_of(row[0]): (row[1], row[2]) for row in by_peak}
    known.update((site_of(row[0]), (row[1], row[2])) for row in ages)
    all_previous: dict[Key, int] | None = None

    def previous_size(key: Key) -> int:
        nonlocal all_previous
        if key in previous.sizes:
            return previous.sizes[key]
        if all_previous is None:
            # Rarely: a site exported now that was small last cycle.
            all_previous = {site_of(row[0]): row[1] for row in baseline.statistics()}
        return all_previous.get(key, 0)

    def site(key: Key, growth: int | None = None) -> Site:
        size, count = known.get(key) or live.get(key, (0, 0))
        if growth is None:
            growth = 0 if first else size - previous_size(key)
        score = scores.get(key)
        return Site(
            key[0],
            key[1],
            size,
            count,
            growth,
            peaks.get(key, 0),
            score.score if score is not None else 0.0,
            score.rate if score is not None else 0.0,
            allocated.get(key, 0),
        )

    sites = [site(site_of(row[0]), row[2]) for row in top]
    exported = {(s.file, s.line) for s in sites}

    def add(keys: Iterator[Key]) -> None:
        added = 0
        for key in keys:
            if added >= settings.top:
                break
            if key not in exported:
                exported.add(key)
                sites.append(site(key))
                added += 1

    # Then the top sites by peak that are not among them: what made the
    # peak gets a series even when it is gone by the end of the interval.
    add(site_of(row[0]) for row in by_peak if row[3] > 0)
    # Then the leak suspects: a young leak gets its series as soon as it
    # is suspected, long before it is among the biggest.
    add(iter(suspects))
    # Then the sites that allocate the most, freed or not: the counter of
    # bytes allocated shows where the churn is (GC and allocator pressure).
    hot = _hot_sites(allocated, previous, settings.top, snapshot.epoch, first)
    add(key for _seen, key in sorted(((-seen, key) for key, seen in hot.items())))
    # <other> is what the exported sites leave of the totals, so sums
    # over sites equal the totals exactly (sites that vanished included).
    sites.append(
        Site(
            OTHER_FILE,
            OTHER_LINE,
            traced - sum(s.size for s in sites),
            max(0, snapshot.blocks - sum(s.blocks for s in sites)),
            (traced - previous_traced) - sum(s.growth for s in sites),
            snapshot.peak - sum(s.peak for s in sites),
            None,
            None,
            allocated_total - sum(s.allocated for s in sites),
        )
    )
    route_cycle = None
    if readers.routes is not None and route_tracker is not None:
        route_cycle = compose_routes(
            snapshot,
            traceback_rows,
            previous.routes,
            route_tracker,
            readers.routes,
            top=settings.top_routes,
            now=started,
            previous_traced=None if first else previous_traced,
            sample_interval=settings.sample_interval,
        )
    del traceback_rows
    dropped = source.dropped()
    tracer_memory = source.tracer_memory()
    # Read beside the snapshot, so that the untraced figure compares
    # figures of one moment.
    memory = readers.memory()
    container = readers.container()
    stacks = snapshot.tracebacks(names=True) if settings.stacks else None
    # Releases code objects no trace refers to any more.
    source.drain()
    # The diff's baseline needs no traces: a snapshot of its own (a pass over
    # the tracebacks, the same moment give or take a few microseconds) lets
    # the cycle's copy of every trace go now, not an interval later.
    last_snapshot = (source.snapshot(traces=False), timestamp) if settings.retain_snapshot else None
    finished = readers.timer()
    began = previous.epoch_began
    if began is None or began.epoch != snapshot.epoch:
        # Both read after the snapshot, so after its epoch began (a cycle
        # that failed after beginning one leaves it unknown till now).
        began = EpochStart(snapshot.epoch, finished, timestamp)
    result = CycleResult(
        timestamp=timestamp,
        duration=max(0.0, finished - started),
        traced=traced,
        peak=snapshot.peak,
        blocks=snapshot.blocks,
        tracer_memory=tracer_memory,
        dropped=dropped,
        sites=tuple(sites),
        resident=memory.resident,
        untraced=compute_untraced(memory.resident, traced, tracer_memory),
        native_in_use=memory.native_in_use,
        native_retained=memory.native_retained,
        epoch=snapshot.epoch,
        epoch_started=began.time,
        container=container,
    )
    if route_cycle is not None:
        result = result._replace(
            routes=route_cycle.routes,
            route_sites=route_cycle.sites,
            routes_folded=route_cycle.folded,
        )
    state = CycleState(
        groups=groups,
        sizes={key: size for key, (size, _count) in known.items()},
        traced=traced,
        watched=watched,
        epoch_began=began,
        routes=route_cycle.state if route_cycle is not None else previous.routes,
        allocated=allocated,
        hot=hot,
    )
    return Cycle(result, state, scores, last_snapshot, stacks)


def _allocated_by_site(
    rows: Sequence[Any], folded: tuple[int, int, int]
) -> tuple[dict[Key, int], dict[Key, tuple[int, int]], int]:
    """Bytes allocated per site since tracing started, the live bytes and
    blocks of those sites, and the total allocated with what the core
    folded: one pass over the snapshot's ``tracebacks(allocs=True)``."""
    allocated: dict[Key, int] = {}
    live: dict[Key, tuple[int, int]] = {}
    for _domain, frames, _total, size, count, _peak, alloc_size, _blocks in rows:
        key = site_of(frames)
        allocated[key] = allocated.get(key, 0) + alloc_size
        old_size, old_count = live.get(key, (0, 0))
        live[key] = (old_size + size, old_count + count)
    total = sum(allocated.values()) + folded[0]
    return allocated, live, total


def _watchable(groups: Any, watched: frozenset[Key]) -> list[tuple[Any, int, int, Sequence[int]]]:
    """The sites by size, with their bytes by age, down to the first one
    under WATCH_LOW: a few hundred rows, where all of them would cost tens
    of milliseconds at thousands of sites (each row's lines resolved)."""
    limit = max(64, 2 * len(watched))
    while True:
        rows: list[tuple[Any, int, int, Sequence[int]]] = groups.ages(limit)
        if len(rows) < limit or rows[-1][1] < WATCH_LOW:
            return rows
        limit *= 4


def _by_peak(groups: Any, top: int, needed: set[Key]) -> list[tuple[Any, int, int, int]]:
    """The sites by peak, down to the top ones not among ``needed`` and
    every one of ``needed`` with a peak (the rest have none): rows ordered
    by peak, so a missing site has no more than the last row's."""
    limit = 2 * top + len(needed) + 16
    while True:
        rows: list[tuple[Any, int, int, int]] = groups.peaks(limit)
        if len(rows) < limit or rows[-1][3] == 0:
            return rows
        if needed <= {site_of(row[0]) for row in rows}:
            return rows
        limit *= 4
