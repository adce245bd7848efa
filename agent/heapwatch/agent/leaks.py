"""The leak score of a site, from the growth of its surviving memory against
the noise of its estimates.  Pure: no core, no clock, no I/O.

A leak is memory that keeps growing and survives: every part of a recent
span grows, and the growth is large against the noise.  Things that grow
for a while then stop (a cache filling, a dict of keys saturating, warm-up),
that come and go (a batch), or that wander (a queue, churn) fail the first
test; small growth under sampling noise fails the second.

For each site the caller gives, once a cycle, an :class:`Observation`: its
live bytes, its bytes older than some age (the core's per-trace age: memory
that survived that long), and the sampling variance of each estimate (0 in
exact mode).  Two series are scored, the old bytes and the live bytes, and
the higher score wins: the old bytes leave out the short-lived churn of the
same site; the live bytes catch a leak that keeps being moved (the array of a
list growing by ``append`` is young after each reallocation).

Over spans ending now, of 0.6, 0.8 and 1.0 times the window, a series ``y``
is scored so, with ``G`` its growth over the span:

* the noise of that growth is ``V = max(v_sampling, n * v_walk)``:
  ``v_sampling`` is how much the estimate's variance grew over the span (the
  variance of the blocks sampled meanwhile: an unbiased estimate's variance
  is additive over blocks; 0 in exact mode); ``v_walk`` is twice the mean
  square of the series' ``n`` steps down (what it does by itself: a random
  walk steps down as much as up, a leak never does, however lumpy);
* significance: ``z = G / sqrt(V + floor**2)``, ``significance = Phi(z - 3)``,
  0.5 at three standard deviations; ``floor`` is 64 KiB;
* shape: the span is cut into four quarters and a steady leak grows by
  ``G / 4`` in each, give or take ``s**2 = max(v_sampling / 4, L) +
  (0.2 * G / 4)**2 + (1 KiB)**2``: ``L = 3 G**2 / (16 k)`` is what ``k``
  lumps of ``G / k`` placed at random give a quarter, ``k = G**2 / sum(up
  steps**2)`` the lumps the growth came in, at least 4 (a leak of a block a
  minute, a list's array moved at each eighth of growth, a sampled leak's
  samples come in lumps; a step of warm-up is one lump, a smooth fill many),
  and a fifth of the growth is tolerated (a real leak's rate wanders);
  ``X2 = sum_k (g_k - G / 4)**2 / s**2`` is chi-square with 3 degrees of
  freedom for a steady leak, and ``shape`` goes from 0 to 1 as its
  p-value goes from 0.001 to 0.05: memory that grew then stopped (a cache, a
  dict of keys that saturates, warm-up), or came in one step, fails it;
* ``score = shape * significance``; the rate is the least-squares slope of
  ``y`` over the span, in bytes per second.

The shortest span, 0.6 of the window, sets how soon a leak can be flagged
(about 16 minutes of growth in a 30-minute window) and how long a fill must
last to look like one: a cache that fills for 10 minutes leaves a quarter of
the span (nearly) flat.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Deque, Dict, Generic, List, NamedTuple, Tuple, TypeVar

__all__ = [
    "OLD_EPOCHS",
    "SUSPECT",
    "LeakScore",
    "LeakTracker",
    "Observation",
    "leak_score",
    "observed",
]

SPANS = (0.6, 0.8, 1.0)
QUARTERS = 4
MIN_POINTS = 8
# Growth under three floors over a span is not called a leak, whatever the
# mode: a site's memory moves by that much without leaking (a dict resized,
# a tail of stragglers), and exact mode has no sampling noise to say so.
FLOOR_BYTES = 64.0 * 1024
# The shape's own floor: only to keep its divisions finite.
SHAPE_FLOOR_BYTES = 1024.0
# Growth in steps is tolerated down to this many steps a span.
LUMPS_MIN = 4.0
RELATIVE = 0.2
P_LOW, P_HIGH = 0.001, 0.05
Z_HALF = 3.0
# "Old" bytes are at least this many epochs (the agent's cycles) old: the
# churn of a site is younger.  The agent's cycle and ``heapwatch leaks`` both
# count them so.
OLD_EPOCHS = 8
# Sites scoring at least this are leak suspects: the agent exports them
# beyond the top ones, the leaks reports list them.
SUSPECT = 0.5

K = TypeVar("K", bound=Hashable)


# NamedTuples, not dataclasses: the agent keeps one Observation a watched
# site a cycle (a tuple is the smallest), and dataclasses imports inspect at
# every HEAPWATCH_ENABLED process's start.
class Observation(NamedTuple):
    """A site at one cycle; sizes in bytes, variances in bytes squared."""

    time: float
    live: float
    old: float
    live_var: float = 0.0
    old_var: float = 0.0


class LeakScore(NamedTuple):
    """score in [0, 1]; rate in bytes/s (0 when nothing grows); series
    ("old" or "live") and span (seconds) say where the score was found."""

    score: float
    rate: float
    series: str
    span: float


NO_LEAK = LeakScore(0.0, 0.0, "old", 0.0)


def observed(time: float, live: float, old: float, sample_interval: int) -> Observation:
    """A site's observation from its live and old bytes, estimated (in
    sample mode, ``sample_interval`` > 0) or exact (0): an estimate of n
    bytes has a variance of about n x the sample interval."""
    return Observation(time, live, old, live * sample_interval, old * sample_interval)


def _smoothstep(low: float, high: float, x: float) -> float:
    u = min(1.0, max(0.0, (x - low) / (high - low)))
    return u * u * (3.0 - 2.0 * u)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _chi2_3_sf(x: float) -> float:
    """P(X > x) for X chi-square with 3 degrees of freedom."""
    if x <= 0.0:
        return 1.0
    return math.erfc(math.sqrt(x / 2.0)) + math.sqrt(2.0 * x / math.pi) * math.exp(-x / 2.0)


def _at(times: Sequence[float], values: Sequence[float], t: float) -> float:
    """values at time t, linearly interpolated (times ascending, t within)."""
    lo, hi = 0, len(times) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if times[mid] <= t:
            lo = mid
        else:
            hi = mid
    t0, t1 = times[lo], times[hi]
    if t1 <= t0:
        return values[hi]
    w = min(1.0, max(0.0, (t - t0) / (t1 - t0)))
    return values[lo] + w * (values[hi] - values[lo])


def _slope(times: Sequence[float], values: Sequence[float]) -> float:
    n = len(times)
    mt = sum(times) / n
    my = sum(values) / n
    sxx = sum((t - mt) ** 2 for t in times)
    if sxx <= 0.0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in zip(times, values)) / sxx


def _score_span(
    times: Sequence[float], ys: Sequence[float], vs: Sequence[float], start: float
) -> Tuple[float, float]:
    """(score, rate) of the series over [start, times[-1]]."""
    end = times[-1]
    inside = [i for i, t in enumerate(times) if t >= start]
    if len(inside) < MIN_POINTS:
        return 0.0, 0.0
    y_at = [_at(times, ys, start + (end - start) * k / QUARTERS) for k in range(QUARTERS + 1)]
    v_at = [_at(times, vs, start + (end - start) * k / QUARTERS) for k in range(QUARTERS + 1)]
    growth = y_at[-1] - y_at[0]
    if growth <= 0.0:
        return 0.0, 0.0
    sub_t = [times[i] for i in inside]
    sub_y = [ys[i] for i in inside]
    steps = [b - a for a, b in zip(sub_y, sub_y[1:])]
    n = len(steps)
    v_walk = 2.0 * sum(s * s for s in steps if s < 0.0) / n
    v_sampling = max(v_at[-1] - v_at[0], 0.0)
    noise = max(v_sampling, n * v_walk)
    significance = _phi(growth / math.sqrt(noise + FLOOR_BYTES**2) - Z_HALF)
    quarter = growth / QUARTERS
    # k lumps of G / k placed at random: a quarter gets G**2 * 3 / (16 k).
    ups = sum(s * s for s in steps if s > 0.0)
    lumps = max(min(growth * growth / ups, n), LUMPS_MIN) if ups > 0.0 else float(n)
    v_lumps = growth * growth * (QUARTERS - 1) / (QUARTERS * QUARTERS * lumps)
    s2 = max(v_sampling / QUARTERS, v_lumps) + (RELATIVE * quarter) ** 2 + SHAPE_FLOOR_BYTES**2
    x2 = sum((y_at[k + 1] - y_at[k] - quarter) ** 2 for k in range(QUARTERS)) / s2
    shape = _smoothstep(P_LOW, P_HIGH, _chi2_3_sf(x2))
    return shape * significance, max(_slope(sub_t, sub_y), 0.0)


def leak_score(
    observations: Sequence[Observation], window: float, since: float | None = None
) -> LeakScore:
    """The score of one site over the window ending at its last observation.

    observations: in time order.  since: when watching began; a site seen
    for the first time later had 0 bytes until then (a new site starts from
    nothing).  Spans reaching back before it are not scored.
    """
    if not observations or window <= 0:
        return NO_LEAK
    obs = list(observations)
    end = obs[-1].time
    start = end - window if since is None else max(since, end - window)
    if since is not None and obs[0].time > start:
        # first seen within the window, after watching began: new
        obs.insert(0, Observation(start, 0.0, 0.0))
    times = [o.time for o in obs]
    best = NO_LEAK
    for name, ys, vs in (
        ("old", [o.old for o in obs], [o.old_var for o in obs]),
        ("live", [o.live for o in obs], [o.live_var for o in obs]),
    ):
        for fraction in SPANS:
            span = window * fraction
            start = end - span
            if start < times[0]:
                continue
            score, rate = _score_span(times, ys, vs, start)
            if score > best.score:
                best = LeakScore(score, rate, name, span)
    return best


class LeakTracker(Generic[K]):
    """The sliding window of every site's observations.

    Sites are keyed by anything hashable (the agent's (filename, lineno)).
    A site missing from a cycle had 0 bytes then; a site absent for a whole
    window is forgotten.
    """

    def __init__(self, window: float) -> None:
        if window <= 0:
            raise ValueError(f"window must be > 0 seconds, got {window!r}")
        self.window = window
        self._since: float | None = None
        self._now: float | None = None
        self._series: Dict[K, Deque[Observation]] = {}

    def observe(self, time: float, sites: Mapping[K, Observation]) -> None:
        """One cycle: every site's observation at ``time`` (their own
        ``time`` fields are ignored)."""
        if self._now is not None and time <= self._now:
            raise ValueError(f"time must increase: {time!r} after {self._now!r}")
        if self._since is None:
            self._since = time
        self._now = time
        horizon = time - self.window
        for key, obs in sites.items():
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = deque()
            series.append(Observation(time, obs.live, obs.old, obs.live_var, obs.old_var))
        gone: List[K] = []
        for key, series in self._series.items():
            if key not in sites:
                series.append(Observation(time, 0.0, 0.0))
            # Keep one observation at or before the horizon, for interpolation.
            while len(series) > 1 and series[1].time <= horizon:
                series.popleft()
            if all(o.live == 0.0 and o.old == 0.0 for o in series):
                gone.append(key)
        for key in gone:
            del self._series[key]

    def scores(self) -> Dict[K, LeakScore]:
        """Every site's score.  A site whose series ends less than
        FLOOR_BYTES above its lowest point (0 for a site new in the window)
        grew less than that over any span, which scores at most
        Phi(1 - Z_HALF) = 0.023: it gets NO_LEAK without the full test, so
        that a cycle pays for the sites that grow, not for every site."""
        scored: Dict[K, LeakScore] = {}
        for key, series in self._series.items():
            if self._may_grow(series):
                scored[key] = leak_score(series, self.window, self._since)
            else:
                scored[key] = NO_LEAK
        return scored

    def _may_grow(self, series: Deque[Observation]) -> bool:
        last = series[-1]
        start = last.time - self.window
        if self._since is not None and series[0].time > max(self._since, start):
            low_live = low_old = 0.0  # new: leak_score counts it from nothing
        else:
            low_live = min(o.live for o in series)
            low_old = min(o.old for o in series)
        return last.live - low_live >= FLOOR_BYTES or last.old - low_old >= FLOOR_BYTES

    def suspects(self, threshold: float = 0.5) -> List[Tuple[K, LeakScore]]:
        """Sites scoring at least threshold, by score then rate, descending."""
        return ranked(self.scores().items(), threshold)


def ranked(
    scores: Iterable[Tuple[K, LeakScore]], threshold: float = 0.0
) -> List[Tuple[K, LeakScore]]:
    """(site, score) pairs at or above threshold, by score then rate, descending."""
    kept = [(key, s) for key, s in scores if s.score >= threshold]
    kept.sort(key=lambda item: (item[1].score, item[1].rate), reverse=True)
    return kept
