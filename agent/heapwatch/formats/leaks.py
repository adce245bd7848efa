"""The leak score of a site, from the growth of its surviving memory against
the noise of its estimates, and from the ages of its memory.  Pure: no
core, no clock, no I/O.

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

Over spans ending now, of 0.6, 0.8 and 1.0 times the window (and over its
whole life, for a site watched for less than the window and more than 0.6
of it: all of its evidence), a series ``y`` is scored so, with ``G`` its
growth over the span:

* the noise of that growth is ``V = max(v_sampling, n * v_walk)``:
  ``v_sampling`` is the variance of the blocks sampled meanwhile that
  survive plus that of the blocks alive at the start that died (an
  unbiased estimate's variance is additive over blocks; 0 in exact mode):
  the variances at the start and at the end added, less twice that of the
  memory that may have survived the span (from the ages: the bucket of the
  span's age and the older ones, at most the start's variance; for the old
  bytes, of the span's age and ``OLD_EPOCHS`` more, which an old byte that
  lived through it has; a leak's growth has the variance of its new blocks
  alone, a cache's turned over that of its births and deaths); without
  ages, the end's less the
  start's; ``v_walk`` is twice the mean square of the series' ``n`` steps
  down (what it does by itself: a random walk steps down as much as up, a
  leak never does, however lumpy);
* significance: ``z = G / sqrt(V + floor**2)``, ``significance =
  Phi(2 (z - 3))``, 0.5 at three standard deviations, 0.9 at 3.64; ``floor``
  is 64 KiB.  A suspect (0.5) is where it was at ``Phi(z - 3)``; only the
  step from suspect to flagged is steeper (0.9 at 4.28 took a sampled leak
  of 10 KiB/s, a sample every 51 s, past 20 minutes on a third of draws:
  18.3 samples where 13.3 now do);
* shape: the span is cut into four quarters and a steady leak grows by
  ``G / 4`` in each, give or take ``s**2 = max(v_sampling / 4, L) +
  (0.2 * G / 4)**2 + (1 KiB)**2``: ``L = 3 G**2 / 16 * (n / k - 1) / (n -
  1)`` is what a quarter holds of ``n`` steps (one a cycle) in any order,
  drawn without replacement, whose squares sum as those of ``k`` lumps of
  ``G / k``: ``k = G**2 / sum(up steps**2)``, at least 4 (a leak of a block
  a minute, a list's array moved at each eighth of growth, a sampled leak's
  samples come in lumps; a step of warm-up is one lump); one lump gives
  ``3 G**2 / 16``, ``n`` equal steps nothing (a fill that grew at every
  cycle of half the span cannot have come later; with few cycles a span,
  a short window's, taking its steps for lumps at random times let it
  pass), and a fifth of the growth is tolerated (a real leak's rate wanders);
  ``X2 = sum_k (g_k - G / 4)**2 / s**2`` is chi-square with 3 degrees of
  freedom for a steady leak, and ``shape`` goes from 0 to 1 as its
  p-value goes from 0.001 to 0.05: memory that grew then stopped (a cache, a
  dict of keys that saturates, warm-up), or came in one step, fails it;
* ``score = shape * significance``; the rate is the least-squares slope of
  ``y`` over the span, in bytes per second.

The shortest of these spans, 0.6 of the window, sets how long a fill must
last to look like a leak: a cache that fills for 10 minutes leaves a quarter
of an 18-minute span (nearly) flat.  Shorter spans, of 0.45, 0.5 and 0.55 of
the window, flag a leak sooner where its evidence is strong.  Over them a
fill can pass the shape test (a flat tenth at each end, say), so their
score is also weighed by ``B``, what the span grew beyond the most the
series grew in any stretch of ``FILL`` (0.4) of the window within it (the
series is linear between its points: the most is where a stretch begins or
ends at one), with ``r = 1 - FILL * window / span`` the part of the span
outside such a stretch:

* ``Phi(2 (z - 3))``, ``z = B / sqrt(V_r + floor**2)``: it grew beyond,
  as surely as a span must grow.  ``V_r`` is the rest's share of the
  span's births (``r`` of them) plus the variance of the memory alive at
  the start of each piece of the rest that died within it (from the ages,
  as for the span, each bucket's ages taken as even): a sampled cache that
  turns over wanders by its whole size's noise in a few cycles, which the
  rest's share of the span's noise took for a leak's growth;
* and a factor from 0 to 1 as ``B / (r * G)`` goes from a quarter to a half:
  the rest grew about as fast as the span, not only a little beside a fill
  (a cache that filled for 10 minutes after a few of slow growth).

Growth that lasts 0.4 of the window or less and stops, wherever it lies (a
cache filling, for a third of the window in the scenario bank: a fifth to
spare), has nothing beyond: it is no leak, however strong its evidence.  A
leak has its rate times the rest: 10 KiB/s in exact mode, 900 KiB beyond at
0.45 of the window (flagged after 13.5 minutes), 2 KiB/s at 0.5; sampled at
512 KiB it needs about 13 samples beyond, which 100 KiB/s (a sample every
5 s) has in a few minutes and 10 KiB/s (one every 51 s) not before the
plain spans.  The more evidence, the sooner.

A site first seen within the window held 0 bytes before; sampled, it was
first seen at its first sample, which comes about a sample's bytes (its
estimate's variance per byte) after its births began, at the rate it grew
since: no span starts earlier than that and the cycle before (a span that
began while it did not exist would take a few dozen samples of a fill that
slows down, after a start flat by construction, for steady growth).

The ages.  A site's live memory now carries its history, which the window
does not keep: the caller also gives, at the last cycle, the site's
:class:`Ages` (bytes by the core's power-of-two age buckets, an epoch a
cycle; their variances; its blocks; the epoch, which no age exceeds).
Memory born at a steady rate and never freed holds in each bucket bytes in
proportion to its width, from the youngest old bucket ([8, 16) epochs: the
younger ones hold the site's churn) up to the leak's age.  Births that slow
down (a dict of keys saturating, a cache filling, warm-up) leave the older
buckets fuller.  A bucket's bytes vary as ``u`` times their expected value,
``u`` the variance per byte: the sampling variance of the old bytes over
them, plus the mean size of the site's blocks (they come as a count of
blocks: a list's array is one).  Evenness over buckets ``[8, 2**top)``:

* ``rate`` is the mean of the whole buckets below ``top``; bucket ``top``
  and the next may be partly filled (the births began there) but hold no
  more than the rate times the ages they can hold: up to the epoch, or,
  for a site first seen after watching began (it held nothing worth
  watching before), up to its first sighting, and what it held then, for
  as long as it is watched: a dict begun an hour ago that saturates is not
  a rate over the hours before, once the window has moved past its start;
* its p-value is the lowest of a chi-square over the buckets (each given
  ``u * e + (0.2 * e)**2``, ``e`` its expected bytes), a one-sided test of
  the excess in ``top`` and above, and a one-sided test of the mean age
  below ``top`` against even ages (a fifth of drift tolerated): births that
  slow down show in one sum with a few samples, bucket by bucket only with
  many; ``evenness`` goes from 0 to 1 as it goes from 0.001 to 0.05.  A
  site whose oldest possible age (its first sighting, or the epoch) is in
  bucket ``top`` had even births up to there: the mean age takes in
  ``top`` too, its bytes at the middle of their ages (a dict begun late,
  sampled, is not its few samples in ``top`` against the rate below, which
  they hardly move, but a mean age far older than its life's half).

The ages add three things to the window's score:

* agreement: a span's window score is multiplied by the evenness of the
  buckets of the span's ages (``top`` the bucket holding the span's
  start): growth that looked steady in a few samples but whose ages say
  that births slow down is not a leak;
* survival (below): a span's window score is multiplied by it, as the
  ages' own score is: a cache that evicts, sampled, has an estimate that
  wanders (a hundred samples turned over), which may grow for a while as
  steadily as a leak's;
* a score of their own, for the memory older than the window (a slow leak
  sampled at 512 KiB gets 3 or 4 samples a window, but one every 8.5
  minutes for hours): for each ``top`` whose whole buckets span at least
  0.6 of the window (no fill is told apart) and that the site's memory
  reaches, ``evenness x significance x survival``, the best of them,
  series "ages".
  Significance is ``Phi(z - 2)``, ``z`` the old bytes up to ``top`` over
  the square root of their variance plus ``floor**2``: their bytes are
  blocks alive, not a noisy growth, so the bar is only that there be
  enough for their spread to say something (about 11 samples for 0.9).
  Survival: even ages are also those of a cache that evicts its oldest
  entries; a leak keeps what it held.  For a = 16, 32, ... epochs back
  within the window, the old bytes held then less those a epochs older
  now (the buckets from a on) are what died since; their share of the
  turnover (died / (died + the bytes born since that survive)) is 0 for a
  leak, about a half for a full cache; survival goes from 1 to 0 as the
  largest share goes from 0.1 to 0.4.  Deaths of fewer bytes than two of
  the site's blocks (their mean size) are not counted: a list's array,
  reallocated as it grows by ``append``, is one block that dies and is
  young again, its memory not turned over.  The rate is the even rate, per
  second.

Survival is read from the live bytes instead where old bytes cannot show
deaths (``_young_deaths``): in a short window (below), and at a site that
holds nothing old.  For a = 4 and 8 epochs back, what the live bytes grew
up to then, from their lowest before (a churn of the site's own line keeps
its level, and cancels), less what is a epochs old or older now, is growth
that did not survive; beyond ``Z_HALF`` deviations of the two estimates,
its share of that growth weighs survival as the old bytes' deaths do.  A
cache or a queue whose entries live a few cycles keeps nothing of its
fill.  "a epochs back" is the last cycle of the epoch a before the current
one: a cycle run before the interval was up begins no epoch, and a site
whose cycles begin none holds nothing old without having lost anything.
A FIFO queue of 4 KiB items living about 4.6 cycles, wandering within 20%
of 20 MiB, scored up to 0.94 as a real process at a 40-cycle window
(issue 23) before its live bytes were read there: nothing it held was
ever old, so nothing said its rise did not survive.

A window of fewer than ``2 * OLD_EPOCHS`` cycles (a 1-minute window at 5 s
cycles: 12) is short, and two things change there:

* no old bytes can be seen to die within it: survival is read from the
  live bytes, as above, at every site;
* a span has too few cycles for its shape to tell a fill from a leak's
  lumps (a fill of 4 steps in 8 cycles passes as 4 lumps could): the
  plain spans, too, are weighed by what they grew beyond any stretch of
  ``FILL`` of the window, as the early ones are.

An LRU cache of 64 KiB entries filling in 0.32 of such a window scored
0.5 or more in 8 of 40 sampled draws, and 8 of 8 real processes; now 1
draw in 40 (its estimate, a fresh draw of samples every 4 cycles, wandered
up steadily by about 3 deviations).  A cache of 1 KiB entries living
longer than the window scored 1.00 in exact mode; now nothing.  Sampled,
its estimate's wander as it turns over was a suspect in 19 of 40 draws:
the old bytes' spans took what became old within them for what lived
through them (the span's age, not ``OLD_EPOCHS`` more), leaving a few
cycles' draws of the turnover's noise; now none.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Deque, Dict, Generic, List, NamedTuple, Tuple, TypeVar

__all__ = [
    "OLD_BUCKET",
    "OLD_EPOCHS",
    "SHORTEST_SPAN",
    "SUSPECT",
    "Ages",
    "LeakScore",
    "LeakTracker",
    "Observation",
    "kept_what_it_held",
    "leak_score",
    "observe_ages",
    "observe_site",
    "rank_scores",
]

SPANS = (0.6, 0.8, 1.0)
# Shorter spans, scored only for growth beyond what any stretch of FILL of
# the window holds: growth that lasts no longer and stops (a cache filling,
# a third of the window in the scenario bank, with a fifth to spare) is no
# leak.
EARLY_SPANS = (0.55, 0.5, 0.45)  # the longest first: they share its stretches
FILL = 0.4
# and what it grew beyond, against a leak's share of its growth: from a
# quarter of it (nothing) to a half (all), not a little beside a fill.
SHARE_LOW, SHARE_HIGH = 0.25, 0.5
# The shortest span scored, of the window.
SHORTEST_SPAN = min(EARLY_SPANS + SPANS)
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
# How fast a span's significance goes from 0.5 (Z_HALF standard deviations)
# to 1: 0.9 at Z_HALF + 1.28 / STEEP.
STEEP = 2.0
# The ages' significance is half at two standard deviations, not three: their
# bytes are not a noisy series' growth but blocks alive now (sampled ones are
# real blocks), so the bar is only that there be enough of them for their
# spread over the ages to say something (about 11 samples for 0.9).
Z_HALF_AGES = 2.0
# "Old" bytes are at least this many epochs (the agent's cycles) old: the
# churn of a site is younger.  The agent's cycle and ``heapwatch leaks`` both
# count them so.
OLD_EPOCHS = 8
# The age bucket of OLD_EPOCHS (the core's buckets: 0 for age 0, b for ages
# in [2**(b-1), 2**b) epochs): buckets from it on hold the old bytes.
OLD_BUCKET = OLD_EPOCHS.bit_length()
# Deaths of the memory a site held a while ago, as a fraction of what it
# was born meanwhile: up to the low one, a leak (that also frees a little);
# from the high one, memory that is turned over (a cache that evicts).
DEATHS_LOW, DEATHS_HIGH = 0.1, 0.4
# Deaths of fewer bytes than this many of a site's blocks (their mean size)
# are a block moved, not memory turned over.
MOVED_BLOCKS = 2.0
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


class Ages(NamedTuple):
    """A site's live memory now by age: bytes by age bucket (the core's:
    bucket 0 for age 0, b for ages in [2**(b-1), 2**b) epochs, an epoch a
    cycle), their variances (0 in exact mode), the site's live blocks
    (estimated in sample mode) and the current epoch (the oldest age
    possible: no memory is older than tracing; 0 if not known).  Only the
    last cycle's are kept: they carry the site's history."""

    bytes: Tuple[float, ...]
    var: Tuple[float, ...]
    blocks: float
    epoch: int = 0


class LeakScore(NamedTuple):
    """score in [0, 1]; rate in bytes/s (0 when nothing grows); series
    ("old" or "live") and span (seconds) say where the score was found."""

    score: float
    rate: float
    series: str
    span: float


NO_LEAK = LeakScore(0.0, 0.0, "old", 0.0)


def observe_site(time: float, live: float, old: float, sample_interval: int) -> Observation:
    """A site's observation from its live and old bytes, estimated (in
    sample mode, ``sample_interval`` > 0) or exact (0): an estimate of n
    bytes has a variance of about n x the sample interval."""
    return Observation(time, live, old, live * sample_interval, old * sample_interval)


def observe_ages(
    histogram: Sequence[float], blocks: float, epoch: int, sample_interval: int
) -> Ages:
    """A site's Ages from its bytes by age bucket, its live blocks and the
    current epoch, each bucket's variance as ``observe_site`` has it."""
    return Ages(
        tuple(float(b) for b in histogram),
        tuple(float(b) * sample_interval for b in histogram),
        float(blocks),
        epoch,
    )


def kept_what_it_held(
    held: float, still: float, born: float, per_byte: float, block: float = 0.0
) -> bool:
    """Whether a site kept the memory it held at an earlier time, as a leak
    does (its old bytes then, ``held``; ``still`` of them alive now):
    its deaths since, against them and the bytes ``born`` since that
    survive, are no more of its turnover than a leak's (``DEATHS_LOW``,
    as the score's survival has it), and ``born`` is enough that a site
    turning its memory over would have shown deaths (as significant as a
    span's growth must be: ``Z_HALF`` deviations of its estimate, of
    variance ``born * per_byte``, above the floor).  Deaths of fewer bytes
    than ``MOVED_BLOCKS`` of its ``block`` (mean size) are a block moved.
    ``heapwatch leaks`` reads a site's memory before its first dump only
    when its dumps say so."""
    died = max(held - still, 0.0)
    if died <= max(SHAPE_FLOOR_BYTES, MOVED_BLOCKS * block):
        died = 0.0
    if born < Z_HALF * math.sqrt(born * per_byte + FLOOR_BYTES**2):
        return False
    return died <= DEATHS_LOW * (died + born)


def _smoothstep(low: float, high: float, x: float) -> float:
    u = min(1.0, max(0.0, (x - low) / (high - low)))
    return u * u * (3.0 - 2.0 * u)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _significance(z: float) -> float:
    """A span's growth of z standard deviations, from 0 to 1."""
    return _phi(STEEP * (z - Z_HALF))


def _chi2_sf(x: float, dof: int) -> float:
    """P(X > x) for X chi-square with dof >= 1 degrees of freedom: the
    regularised upper gamma function at dof / 2, a finite sum there."""
    if x <= 0.0:
        return 1.0
    h = x / 2.0
    if dof % 2 == 0:
        term = total = math.exp(-h)
        for i in range(1, dof // 2):
            term *= h / i
            total += term
    else:
        total = math.erfc(math.sqrt(h))
        term = 2.0 * math.sqrt(h / math.pi) * math.exp(-h)
        for i in range(1, dof // 2 + 1):
            if i > 1:
                term *= h / (i - 0.5)
            total += term
    return min(1.0, total)


def _between(times: Sequence[float], lo: int, t: float) -> Tuple[int, int, float]:
    """(lo, hi, w): a value at time t, from point lo (the last at or before
    it), is values[lo] + w * (values[hi] - values[lo]), linearly
    interpolated (times ascending, t within)."""
    hi = min(lo + 1, len(times) - 1)
    t0, t1 = times[lo], times[hi]
    if t1 <= t0:
        return hi, hi, 0.0
    return lo, hi, min(1.0, max(0.0, (t - t0) / (t1 - t0)))


def _where(times: Sequence[float], t: float) -> Tuple[int, int, float]:
    """_between(times, lo, t), lo found by bisection."""
    return _between(times, max(min(bisect_right(times, t) - 1, len(times) - 2), 0), t)


def _at(times: Sequence[float], values: Sequence[float], t: float) -> float:
    """values at time t, linearly interpolated (times ascending, t within)."""
    lo, hi, w = _where(times, t)
    return values[lo] + w * (values[hi] - values[lo])


def _slope(times: Sequence[float], values: Sequence[float]) -> float:
    n = len(times)
    mt = sum(times) / n
    my = sum(values) / n
    sxx = sum((t - mt) ** 2 for t in times)
    if sxx <= 0.0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in zip(times, values)) / sxx


def _along(times: Sequence[float], values: Sequence[float], at: Sequence[float]) -> List[float]:
    """values at each of the times ``at`` (ascending), as _at has them, in
    one pass."""
    out = []
    lo, top = 0, max(len(times) - 2, 0)
    for t in at:
        while lo < top and times[lo + 1] <= t:
            lo += 1
        a, b, w = _between(times, lo, t)
        out.append(values[a] + w * (values[b] - values[a]))
    return out


class _Series:
    """A series, its variances, and from each point on the sums of its
    steps up and down squared (every span ends at the last point)."""

    __slots__ = (
        "_begins",
        "_fill",
        "_from",
        "_most",
        "_where",
        "downs",
        "times",
        "ups",
        "vs",
        "ys",
    )

    def __init__(self, times: Sequence[float], ys: Sequence[float], vs: Sequence[float]) -> None:
        self.times, self.ys, self.vs = times, ys, vs
        self.ups = [0.0] * len(ys)
        self.downs = [0.0] * len(ys)
        up = down = 0.0
        for i in range(len(ys) - 2, -1, -1):
            step = ys[i + 1] - ys[i]
            if step > 0.0:
                up += step * step
            else:
                down += step * step
            self.ups[i] = up
            self.downs[i] = down
        self._fill = self._from = 0.0
        self._begins: List[float] = []
        self._most: List[float] = []
        self._where: List[float] = []

    def most(self, start: float, fill: float) -> Tuple[float, float]:
        """The most the series grew over a stretch of ``fill`` within
        [start, times[-1]], and where that stretch begins.  It is linear
        between its points: the most is where a stretch begins or ends at
        one (found once for the starts from the earliest asked for on)."""
        times, ys, end = self.times, self.ys, self.times[-1]
        first = min(max(start, times[0]), end - fill)
        if fill != self._fill or first < self._from:
            self._fill, self._from = fill, first
            i, j = bisect_left(times, first), bisect_right(times, end - fill)
            begins = sorted(
                {*times[i:j], *(t - fill for t in times[bisect_left(times, first + fill) :])}
            )
            ends = _along(times, ys, [t + fill for t in begins])
            grew = [b - a for a, b in zip(_along(times, ys, begins), ends)]
            where = list(begins)
            for k in range(len(grew) - 2, -1, -1):  # the most from each on
                if grew[k + 1] > grew[k]:
                    grew[k], where[k] = grew[k + 1], where[k + 1]
            self._begins, self._most, self._where = begins, grew, where
        most = _at(times, ys, first + fill) - _at(times, ys, first)
        k = bisect_left(self._begins, first)
        if k < len(self._most) and self._most[k] > most:
            return self._most[k], self._where[k]
        return most, first


def _growth_var(v_then: float, v_now: float, kept: float | None) -> Tuple[float, float]:
    """The sampling variance of a growth from an estimate of variance
    ``v_then`` to one of ``v_now``, as (births, deaths): what was born since
    and survives, less what was alive then and died, two estimates whose
    variances add.  kept: the variance of the memory that may have lived
    through it (None if not known: then none of it is taken to have died)."""
    if kept is None:
        return max(v_now - v_then, 0.0), 0.0
    kept = min(max(kept, 0.0), v_then, v_now)
    return v_now - kept, v_then - kept


def _no_ages(_seconds: float) -> float | None:
    return None


def _score_span(
    series: _Series,
    start: float,
    kept: Callable[[float], float | None] = _no_ages,
    fill: float = 0.0,
) -> float:
    """The score of the series over [start, times[-1]].  kept: the
    variance of the memory older than so many seconds now (from its ages;
    None if not known: then none of the memory at a start is taken to have
    died).  fill: how long a growth confined to one stretch of the span may
    last and be no leak (0: none)."""
    times, ys, vs = series.times, series.ys, series.vs
    end = times[-1]
    first = bisect_left(times, start)
    if len(times) - first < MIN_POINTS:
        return 0.0
    y_at: List[float] = []
    v_at: List[float] = []
    for k in range(QUARTERS + 1):
        lo, hi, w = _where(times, start + (end - start) * k / QUARTERS)
        y_at.append(ys[lo] + w * (ys[hi] - ys[lo]))
        v_at.append(vs[lo] + w * (vs[hi] - vs[lo]))
    growth = y_at[-1] - y_at[0]
    if growth <= 0.0:
        return 0.0
    n = len(times) - 1 - first
    v_walk = 2.0 * series.downs[first] / n
    births, deaths = _growth_var(v_at[0], v_at[-1], kept(end - start))
    v_sampling = births + deaths
    noise = max(v_sampling, n * v_walk)
    significance = _significance(growth / math.sqrt(noise + FLOOR_BYTES**2))
    quarter = growth / QUARTERS
    # The growth came in n steps, one a cycle, as if in k lumps of G / k;
    # a quarter holds n / 4 of them, drawn without replacement: G**2 * 3 /
    # 16 * (n / k - 1) / (n - 1), 3 G**2 / 16 for one lump, 0 for n equal
    # steps (a fill at every cycle is not lumps that could have come later).
    ups = series.ups[first]
    lumps = max(min(growth * growth / ups, n), LUMPS_MIN) if ups > 0.0 else float(n)
    v_lumps = _lumps_var(growth, lumps, n)
    s2 = max(v_sampling / QUARTERS, v_lumps) + (RELATIVE * quarter) ** 2 + SHAPE_FLOOR_BYTES**2
    x2 = sum((y_at[k + 1] - y_at[k] - quarter) ** 2 for k in range(QUARTERS)) / s2
    score = _smoothstep(P_LOW, P_HIGH, _chi2_sf(x2, QUARTERS - 1)) * significance
    if fill > 0.0 and score > 0.0:
        # What it grew beyond its most in any stretch of ``fill``, as noisy
        # as the growth of the rest of the span: a leak's share of it.
        most, begin = series.most(start, fill)
        most = max(most, 0.0)
        rest = 1.0 - fill / (end - start)
        # The rest is [start, begin] and [begin + fill, end].  Its births
        # are the rest's share of the span's, but the memory alive at the
        # start of each piece that died within it is all of its variance,
        # however short the piece: a sampled cache that turns over wanders
        # by its whole size's noise in a few cycles.
        v_rest = rest * births
        if begin > start:  # what lived through the span lived through the piece
            v_rest += _growth_var(v_at[0], _at(times, vs, begin), kept(end - start))[1]
        after = begin + fill
        v_rest += _growth_var(_at(times, vs, after), v_at[-1], kept(end - after))[1]
        z = (growth - most) / math.sqrt(max(v_rest, rest * n * v_walk) + FLOOR_BYTES**2)
        share = (growth - most) / (rest * growth)
        score *= _significance(z) * _smoothstep(SHARE_LOW, SHARE_HIGH, share)
    return score


def _lumps_var(growth: float, lumps: float, steps: int) -> float:
    """The variance of a quarter's growth, of ``steps`` steps summing to
    ``growth`` whose squares sum to growth**2 / lumps (the steps are taken
    in any order; a quarter holds a quarter of them)."""
    if steps <= 1:
        return 0.0
    share = 1.0 / QUARTERS
    return growth * growth * share * (1.0 - share) * max(steps / lumps - 1.0, 0.0) / (steps - 1)


def _kept_var(ages: Ages | None, epochs: float) -> float | None:
    """The variance of the memory of a site at least ``epochs`` old now:
    its ages' buckets older than that age, and the share of the bucket
    holding it that is as old, its ages taken as even (a leak's are; a
    whole bucket would count as lived through a short stretch the memory
    of twice its age, most of a cache turned over within it); None without
    ages."""
    if ages is None or not ages.var:
        return None
    age = max(math.ceil(epochs), 0)
    last = len(ages.var) - 1
    bucket = min(age.bit_length(), last)
    kept = sum(ages.var[bucket:])
    if 0 < bucket < last:  # bucket b holds ages [2**(b-1), 2**b)
        low = 1 << (bucket - 1)
        kept -= ages.var[bucket] * (age - low) / low
    return kept


class _Weighed(NamedTuple):
    """A site's bytes by age bucket now, and what weighs them."""

    bytes: Sequence[float]
    var: Sequence[float]
    per_byte: float  # the variance of a bucket's bytes, per byte
    block: float  # the mean size of the site's blocks
    cycle: float  # seconds an epoch
    oldest: float  # the oldest age possible, in epochs (inf if not known)
    before: float  # bytes that may be older than that (a new site's first)


def _weighed(
    ages: Ages | None, cycle: float, seen: float = math.inf, held: float = 0.0
) -> _Weighed | None:
    """A site's ages, weighed; None without old bytes.  seen: the epochs
    since a site first seen after watching began was first seen, held: its
    bytes then (before, it held nothing worth watching: no more than those
    are older than that)."""
    if ages is None or len(ages.bytes) < OLD_BUCKET + 3 or not cycle > 0.0:
        return None
    h = ages.bytes
    old = sum(h[OLD_BUCKET:])
    if not old > 0.0:
        return None
    var = ages.var if len(ages.var) == len(h) else (0.0,) * len(h)
    # A bucket's bytes come in blocks (a Poisson count of them, each its
    # size) and, sampled, with the sampling variance of their estimate.
    block = sum(h) / ages.blocks if ages.blocks > 0.0 else 0.0
    oldest = min(float(ages.epoch) if ages.epoch > 0 else math.inf, seen)
    per_byte = sum(var[OLD_BUCKET:]) / old + block
    return _Weighed(h, var, per_byte, block, cycle, oldest, held)


def _evenness(ages: _Weighed, top: int, above: int = 1) -> Tuple[float, float]:
    """(rate in bytes an epoch, p-value) of steady births: the old buckets
    below ``top`` hold bytes in proportion to their width (the rate is their
    mean), and ``top`` and the ``above`` buckets after it no more than their
    share of the ages they can hold (the births may have begun within them;
    no age is older than the epoch).  The p-value is the lowest of three
    tests': bucket by bucket (chi-square); the excess of ``top`` and above
    alone and the mean age below ``top`` (one-sided: births that slow down
    leave the old buckets fuller than the young ones, which a few samples
    show in one sum sooner than bucket by bucket)."""
    h = ages.bytes
    low, high = 1 << (OLD_BUCKET - 1), 1 << (top - 1)
    grown = sum(h[OLD_BUCKET:top])
    rate = grown / (high - low)
    x2 = aged = excess = excess_var = 0.0
    last = min(top + above, len(h) - 1)
    allowed = ages.before  # the oldest bytes, which may predate the births
    for b in range(last, OLD_BUCKET - 1, -1):
        width = 1 << (b - 1)
        share = rate * (width if b < top else max(min(width, ages.oldest + 1.0 - width), 0.0))
        s2 = ages.per_byte * share + (RELATIVE * share) ** 2 + SHAPE_FLOOR_BYTES**2
        if b < top:
            miss = h[b] - share
            aged += h[b] * (3 * width - 1) / 2.0  # the bucket's mean age
        else:
            miss = max(h[b] - share - allowed, 0.0)
            allowed = max(allowed - max(h[b] - share, 0.0), 0.0)
            excess += miss
            excess_var += s2
        x2 += miss * miss / s2
    p = min(_chi2_sf(x2, last - OLD_BUCKET), _phi(-excess / math.sqrt(excess_var)))
    oldest = high
    if high <= ages.oldest < 2 * high and top < len(h):
        # Its births began within bucket top (at its first sighting, or
        # when tracing began): even births fill it up to there, mean age
        # halfway.
        oldest = int(ages.oldest) + 1
        grown += h[top]
        aged += h[top] * (high + oldest - 1) / 2.0
    if grown > 0.0:
        # Ages even over [low, oldest): mean (low + oldest - 1) / 2,
        # variance (oldest - low)**2 / 12 an age; a rate that moves by a
        # fifth over the span moves the mean by (oldest - low) / 60, which
        # is tolerated.
        spread2 = (oldest - low) ** 2 / 12.0
        sd = math.sqrt(spread2 * ages.per_byte / grown + RELATIVE**2 * spread2 / 12.0)
        p = min(p, _phi(((low + oldest - 1) / 2.0 - aged / grown) / sd))
    return rate, p


def _agreement(ages: _Weighed | None, span: float) -> float:
    """How well the ages agree with steady births over a span (seconds): 1
    unless the memory of the span's age, or of the bucket just older, is
    denser the older it is (births that slow down: a dict of keys
    saturating, a cache filling).  A leak that began before the span left
    as much in that bucket, one that began within it nothing.  From spans
    of 16 epochs on (two old buckets: 40 cycles a window has spans of 18
    to 40): there a sampled dict that saturates has a few dozen samples a
    span, whose quarters a steady leak's could have."""
    if ages is None:
        return 1.0
    epochs = max(math.ceil(span / ages.cycle), 1)
    top = min((epochs - 1).bit_length(), len(ages.bytes) - 1)
    if top < OLD_BUCKET + 1:
        return 1.0
    return _smoothstep(P_LOW, P_HIGH, _evenness(ages, top)[1])


def _deaths(times: Sequence[float], olds: Sequence[float], ages: _Weighed, window: float) -> float:
    """The largest fraction of its memory's turnover a site shows within
    the window: for a (a power of two) epochs ago, the old bytes it held
    then that are gone now (they are now a epochs older: what the buckets
    from a on do not hold) against those and the bytes born since that
    survive (ages 8 to a).  0 for a leak, about 1/2 for a full cache."""
    h = ages.bytes
    end = times[-1]
    worst = 0.0
    a = 2 * OLD_EPOCHS
    while a * ages.cycle <= window and end - a * ages.cycle >= times[0] and a.bit_length() < len(h):
        died = _at(times, olds, end - a * ages.cycle) - sum(h[a.bit_length() :])
        # Not the rounding of sums, nor a block moved: a list's array
        # reallocated as it grows is one block, dead and young again.
        if died > max(SHAPE_FLOOR_BYTES, MOVED_BLOCKS * ages.block):
            worst = max(worst, died / (died + sum(h[OLD_BUCKET : a.bit_length()])))
        a *= 2
    return worst


def _survival(
    times: Sequence[float], olds: Sequence[float], ages: _Weighed | None, window: float
) -> float:
    """1 for memory that survives (a leak), 0 for memory turned over."""
    if ages is None:
        return 1.0
    return 1.0 - _smoothstep(DEATHS_LOW, DEATHS_HIGH, _deaths(times, olds, ages, window))


def _young_deaths(
    times: Sequence[float],
    obs: Sequence[Observation],
    ages: Ages,
    cycle: float,
    window: float,
    *,
    epochs: Sequence[Tuple[float, int]] = (),
) -> float:
    """``_deaths`` read from the live bytes, where old bytes cannot show
    them: in a window of fewer than ``2 * OLD_EPOCHS`` cycles (they are
    ``OLD_EPOCHS`` old, and as many epochs more pass before their deaths
    show), or at a site that holds nothing old.  The share of what the live
    bytes grew up to a epochs ago (a = 4, 8; from their lowest before then,
    so that a churn of the site's own keeps its level) that is not a epochs
    old or older now.  A cache or a queue whose entries live a few cycles
    keeps none of its growth; a leak keeps it all.  Only deaths beyond the
    estimates' noise count (``Z_HALF`` deviations, as a span's growth
    must be).

    epochs: (time, epoch) of the cycles, oldest first.  A ago is the last
    cycle of epoch ``ages.epoch - a`` or before: every block alive then is
    a epochs old or older now.  A cycle run before its interval was up
    begins no epoch (``run_cycle()``), so cycles are not epochs; without
    epochs, one a cycle is assumed."""
    h = ages.bytes
    end = times[-1]
    block = sum(h) / ages.blocks if ages.blocks > 0.0 else 0.0
    worst = 0.0
    for a in (OLD_EPOCHS // 2, OLD_EPOCHS):
        if a.bit_length() >= len(h):
            continue
        if epochs and ages.epoch > 0:
            # From the newest: the cycle sought is a few from the end, and
            # a day's window at 10 s cycles holds 8640.
            found = next((t for t, e in reversed(epochs) if e <= ages.epoch - a), None)
            if found is None:
                continue  # no epoch that old in the window
            then = found
        else:
            then = end - a * cycle
        if end - then > window or then < times[0]:
            continue
        i, j, u = _where(times, then)
        live = obs[i].live + u * (obs[j].live - obs[i].live)
        var = obs[i].live_var + u * (obs[j].live_var - obs[i].live_var)
        low = min((o for o in obs[: i + 1]), key=lambda o: o.live)
        grown = live - low.live
        # (the buckets are powers of two: from a's on, ages of a or more)
        died = grown - sum(h[a.bit_length() :])
        noise = math.sqrt(var + low.live_var + FLOOR_BYTES**2)
        if died > max(Z_HALF * noise, MOVED_BLOCKS * block) and grown > 0.0:
            worst = max(worst, min(died / grown, 1.0))
    return worst


def _score_ages(ages: _Weighed, window: float, survival: float) -> LeakScore:
    """The score of the site's old memory by its ages: steady births over
    at least the shortest plain span, that survived."""
    best = NO_LEAK
    if not survival > 0.0:
        return best
    h, var = ages.bytes, ages.var
    shortest = SPANS[0] * window / ages.cycle
    for top in range(OLD_BUCKET + 2, len(h)):
        # The span's whole buckets must be at least the shortest plain span,
        # and the site's memory as old as them (a younger site's would look
        # thin).
        if (1 << (top - 1)) - (1 << (OLD_BUCKET - 1)) < shortest or not sum(h[top:]) > 0.0:
            continue
        grown = sum(h[OLD_BUCKET : top + 1])
        if not grown > 0.0:
            continue
        rate, p = _evenness(ages, top)
        noise = sum(var[OLD_BUCKET : top + 1])
        significance = _phi(grown / math.sqrt(noise + FLOOR_BYTES**2) - Z_HALF_AGES)
        score = _smoothstep(P_LOW, P_HIGH, p) * significance * survival
        if score > best.score:
            best = LeakScore(score, rate / ages.cycle, "ages", (1 << top) * ages.cycle)
    return best


def leak_score(
    observations: Sequence[Observation],
    window: float,
    since: float | None = None,
    ages: Ages | None = None,
    first: Observation | None = None,
    *,
    epochs: Sequence[Tuple[float, int]] = (),
) -> LeakScore:
    """The score of one site over the window ending at its last observation.

    observations: in time order, one a cycle (an epoch).  ages: the site's
    at the last observation, if known.  since: when watching began; a site seen for
    the first time later had 0 bytes until then (a new site starts from
    nothing; sampled, from about a sample's bytes before its first
    sample).  Spans reaching back before it are not scored.  first: the
    site's first observation, if that was after watching began, even if the
    window has moved past it: no memory of the site is older, but for what
    it held then.  epochs: (time, epoch) of the cycles in the window, oldest
    first, where known (``_young_deaths``).
    """
    if not observations or window <= 0:
        return NO_LEAK
    obs = list(observations)
    end = obs[-1].time
    cycle = (end - obs[0].time) / (len(obs) - 1) if len(obs) > 1 else 0.0
    start = end - window if since is None else max(since, end - window)
    if since is not None and obs[0].time > start:
        first = obs[0]  # first seen within the window, after watching began
        if first.live_var > 0.0 and first.live > 0.0:
            # Sampled: no span starts before its births began (the
            # module's docstring says why), about a sample's bytes before
            # its first sample.
            rate = obs[-1].live / (end - first.time) if end > first.time else 0.0
            gap = first.live_var / first.live / rate if rate > 0.0 else 0.0
            start = max(start, first.time - cycle - gap)
        obs.insert(0, Observation(start, 0.0, 0.0))
    if first is not None and cycle > 0.0:
        # Its ages are bounded by its life, long after the window has moved
        # past its start: a dict begun an hour ago that saturates is not
        # even births over the hours before.
        weighed = _weighed(ages, cycle, round((end - first.time) / cycle), first.live)
    else:
        weighed = _weighed(ages, cycle)
    times = [o.time for o in obs]
    olds = [o.old for o in obs]
    survival = _survival(times, olds, weighed, window)
    short = cycle > 0.0 and window < 2 * OLD_EPOCHS * cycle
    if ages is not None and (short or weighed is None):
        # A short window's, or a site's that holds nothing old: its
        # memory's turnover from the live bytes.
        young = _young_deaths(times, obs, ages, cycle, window, epochs=epochs)
        survival = min(survival, 1.0 - _smoothstep(DEATHS_LOW, DEATHS_HIGH, young))
    if not survival > 0.0:
        return NO_LEAK
    # (span, how long a growth confined to one stretch of it is no leak);
    # a short window's plain spans have too few cycles for their shape to
    # tell a fill from a leak's lumps: the stretch decides there too.
    plain_fill = window * FILL if short else 0.0
    spans = [(window * f, window * FILL) for f in EARLY_SPANS]
    spans += [(window * f, plain_fill) for f in SPANS]
    life = end - times[0]
    if window * SPANS[0] < life < window:
        spans.append((life, plain_fill))  # all of a young site's evidence
    if short:
        spans.sort(reverse=True)  # the longest first: they share its stretches
    best = NO_LEAK
    found: Sequence[float] = ()  # the best span's series

    def kept_by(older: int) -> Callable[[float], float | None]:
        # What of a series' memory lived through the last ``seconds``: its
        # ages now are those seconds and the series' own threshold more (an
        # old byte at a span's start that survives is OLD_EPOCHS older than
        # the span; counting the span's age alone took a cache turned over
        # for kept, and its wander for growth).
        def kept(seconds: float) -> float | None:
            if cycle <= 0.0:
                return None
            return _kept_var(ages, math.floor(seconds / cycle) + older)

        return kept

    # No memory is old until OLD_EPOCHS cycles after tracing began: the
    # old bytes' first cycles are 0 whatever the site does, and a span
    # beginning in them would take the first memory to age for growth.
    old_from = -math.inf if since is None else since + OLD_EPOCHS * cycle
    for name, series, earliest, older in (
        ("old", _Series(times, olds, [o.old_var for o in obs]), old_from, OLD_EPOCHS),
        ("live", _Series(times, [o.live for o in obs], [o.live_var for o in obs]), -math.inf, 0),
    ):
        kept = kept_by(older)
        for span, fill in spans:
            start = end - span
            if start < times[0] or start < earliest:
                continue
            score = _score_span(series, start, kept, fill) * survival
            if score > best.score:
                score *= _agreement(weighed, span)
            if score > best.score:
                best, found = LeakScore(score, 0.0, name, span), series.ys
    if best.score > 0.0:
        # The rate of the best span alone: a slope is a pass over its points.
        i = bisect_left(times, end - best.span)
        best = best._replace(rate=max(_slope(times[i:], found[i:]), 0.0))
    if weighed is not None:
        by_ages = _score_ages(weighed, window, survival)
        if by_ages.score > best.score:
            best = by_ages
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
        # The first observation of a site first seen after watching began,
        # kept while its series is: its memory is no older.
        self._first: Dict[K, Observation] = {}
        self._ages: Mapping[K, Ages] = {}
        # (time, the core's epoch) of the cycles whose ages were given: one
        # at or before the window's start, as the series keep.
        self._epochs: Deque[Tuple[float, int]] = deque()

    @property
    def last_time(self) -> float | None:
        """The time of the last cycle observed; None before the first."""
        return self._now

    def observe(
        self,
        time: float,
        sites: Mapping[K, Observation],
        ages: Mapping[K, Ages] | None = None,
    ) -> None:
        """One cycle: every site's observation at ``time`` (their own
        ``time`` fields are ignored), and the ages of those whose ages are
        known (kept until the next cycle: they carry the site's history)."""
        if self._now is not None and time <= self._now:
            raise ValueError(f"time must increase: {time!r} after {self._now!r}")
        if self._since is None:
            self._since = time
        self._now = time
        horizon = time - self.window
        for key, obs in sites.items():
            series = self._series.get(key)
            seen = Observation(time, obs.live, obs.old, obs.live_var, obs.old_var)
            if series is None:
                series = self._series[key] = deque()
                if time > self._since:
                    self._first[key] = seen
            series.append(seen)
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
            self._first.pop(key, None)
        self._ages = ages if ages is not None else {}
        epoch = next((a.epoch for a in self._ages.values() if a.epoch > 0), None)
        if epoch is not None:
            self._epochs.append((time, epoch))
        while len(self._epochs) > 1 and self._epochs[1][0] <= horizon:
            self._epochs.popleft()

    def scores(self) -> Dict[K, LeakScore]:
        """Every site's score.  A site whose series ends less than
        FLOOR_BYTES above its lowest point (0 for a site new in the window)
        grew less than that over any span, which scores at most
        _significance(1) = 3e-5: it gets NO_LEAK without the full test, so
        that a cycle pays for the sites that grow, not for every site."""
        scored: Dict[K, LeakScore] = {}
        for key, series in self._series.items():
            if self._may_grow(series):
                scored[key] = leak_score(
                    series,
                    self.window,
                    self._since,
                    self._ages.get(key),
                    self._first.get(key),
                    epochs=self._epochs,
                )
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
        return rank_scores(self.scores().items(), threshold)


def rank_scores(
    scores: Iterable[Tuple[K, LeakScore]], threshold: float = 0.0
) -> List[Tuple[K, LeakScore]]:
    """(site, score) pairs at or above threshold, by score then rate, descending."""
    kept = [(key, s) for key, s in scores if s.score >= threshold]
    kept.sort(key=lambda item: (item[1].score, item[1].rate), reverse=True)
    return kept
