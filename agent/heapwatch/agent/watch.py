"""Which series the leak tracker watches, and what a cycle tells it of them.

Shared by the cycle's sites (``heapwatch.agent.cycle``) and its routes
(``heapwatch.agent.route_cycle``): one rule for both, so a route is watched
and scored exactly as a line is.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TypeVar

from heapwatch.formats.leaks import (
    FLOOR_BYTES,
    OLD_BUCKET,
    Ages,
    LeakScore,
    LeakTracker,
    Observation,
    observe_ages,
    observe_site,
)

__all__ = ["WATCH_LOW", "score_watched"]

# A watched series stays watched down to this many bytes (it starts at the
# score's floor, FLOOR_BYTES): a site hovering at the floor keeps its series.
WATCH_LOW = FLOOR_BYTES / 8

K = TypeVar("K", bound=Hashable)


def score_watched(
    tracker: LeakTracker[K],
    now: float,
    rows: Iterable[tuple[K, int, int, Sequence[int]]],
    *,
    epoch: int,
    watched: frozenset[K],
    sample_interval: int,
) -> tuple[dict[K, LeakScore], frozenset[K]]:
    """Feeds the leak tracker this cycle's (key, bytes, blocks, bytes by
    age) rows, the ages at ``epoch`` (the snapshot's), and scores them;
    returns the scores and the keys now watched.

    A key is watched from the cycle its live bytes reach FLOOR_BYTES
    (growth smaller than that never scores above 0.02: a key below it
    cannot be a suspect) until they fall under an eighth of it, so that
    the window holds a few hundred series, not every line that ever
    allocated; before it is watched a key counts as holding nothing.
    """
    series: dict[K, Observation] = {}
    by_age: dict[K, Ages] = {}
    for key, size, count, histogram in rows:
        if size < FLOOR_BYTES and not (key in watched and size >= WATCH_LOW):
            continue
        # Memory that survived OLD_EPOCHS cycles: the churn of the same
        # line is left out of it.
        old = float(sum(histogram[OLD_BUCKET:]))
        series[key] = observe_site(now, size, old, sample_interval)
        by_age[key] = observe_ages(histogram, count, epoch, sample_interval)
    # A timer that did not move (an injected one) adds no point to the
    # series: the tracker needs increasing times.
    last = tracker.last_time
    if last is None or now > last:
        tracker.observe(now, series, by_age)
    return tracker.scores(), frozenset(series)
