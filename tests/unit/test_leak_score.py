"""The leak score (heapwatch.formats.leaks): growth of surviving memory against
its noise, on series built by hand."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from heapwatch.formats.leaks import (
    OLD_BUCKET,
    Ages,
    LeakTracker,
    Observation,
    leak_score,
    rank_scores,
)

WINDOW = 1800.0
CYCLE = 10.0
KIB = 1024.0
MIB = 1024.0 * KIB


def _series(
    old: Callable[[float], float],
    minutes: float,
    live: Callable[[float], float] | None = None,
    var: Callable[[float], float] | None = None,
) -> list[Observation]:
    steps = int(minutes * 60 / CYCLE)
    out = []
    for i in range(steps + 1):
        t = i * CYCLE
        o = old(t)
        v = var(t) if var is not None else 0.0
        out.append(Observation(t, live(t) if live is not None else o, o, v, v))
    return out


def _max_score(obs: list[Observation], since: float = 0.0) -> float:
    return max(leak_score(obs[: i + 1], WINDOW, since).score for i in range(len(obs)))


def test_a_steady_leak_is_flagged_within_two_thirds_of_the_window() -> None:
    # Given a site whose surviving bytes grow by 10 KiB/s from nothing
    obs = _series(lambda t: 10 * KIB * t, 20)
    # When scored after 20 minutes
    result = leak_score(obs, WINDOW, since=0.0)
    # Then it is flagged, with its rate
    assert result.score >= 0.9
    assert result.rate == pytest.approx(10 * KIB, rel=0.01)
    # and it was not after 10 minutes
    assert leak_score(obs[:61], WINDOW, since=0.0).score < 0.5


def test_a_cache_that_fills_then_evicts_is_not_a_leak() -> None:
    obs = _series(lambda t: min(t, 600.0) * 50 * MIB / 600, 180)
    assert _max_score(obs) < 0.5


def test_memory_that_saturates_is_not_a_leak() -> None:
    obs = _series(lambda t: 30 * MIB * (1 - math.exp(-t / 240)), 180)
    assert _max_score(obs) < 0.5


def test_a_batch_that_comes_and_goes_is_not_a_leak() -> None:
    obs = _series(lambda t: 100 * MIB if (t % 300) < 150 else 0.0, 180)
    assert _max_score(obs) < 0.5


def test_a_random_walk_is_not_a_leak() -> None:
    rng = random.Random(7)
    level = [20 * MIB]

    def wander(_t: float) -> float:
        level[0] = max(0.0, level[0] + rng.gauss(0, 0.1 * MIB) - 0.01 * (level[0] - 20 * MIB))
        return level[0]

    obs = _series(wander, 180)
    assert _max_score(obs) < 0.5


def test_a_new_site_that_holds_steady_memory_is_not_a_leak() -> None:
    obs = [o for o in _series(lambda t: 50 * MIB, 60) if o.time >= 600]
    assert leak_score(obs, WINDOW, since=0.0).score < 0.1


def _sampled_leak(rate: float, minutes: float, seed: int) -> list[Observation]:
    """A leak of small blocks sampled at 512 KiB: each sample adds 512 KiB to
    the estimate, and 512 KiB squared to its variance."""
    interval = 512 * KIB
    rng = random.Random(seed)
    state = {"next": rng.expovariate(rate / interval), "est": 0.0}

    def sampled(t: float) -> float:
        while state["next"] < t:
            state["next"] += rng.expovariate(rate / interval)
            state["est"] += interval
        return state["est"]

    return _series(sampled, minutes, var=lambda t: state["est"] * interval)


def test_sampling_noise_hides_growth_smaller_than_itself() -> None:
    # 1 KiB/s sampled at 512 KiB: a new sample every 8.5 minutes
    assert leak_score(_sampled_leak(KIB, 30, 3), WINDOW, since=0.0).score < 0.9


def _minutes_to_flag(obs: list[Observation]) -> float:
    for i in range(len(obs)):
        if leak_score(obs[: i + 1], WINDOW, since=0.0).score >= 0.9:
            return obs[i].time / 60
    return math.inf


def test_sampled_leak_at_10_kib_per_second_is_flagged_within_20_minutes() -> None:
    # Given 20 draws of a leak of 10 KiB/s sampled at 512 KiB: a sample every
    # 51 s, about 21 in the shortest plain span (18 minutes)
    minutes = [_minutes_to_flag(_sampled_leak(10 * KIB, 30, seed)) for seed in range(20)]
    # Then all but the unluckiest are flagged within 20 minutes (a flag
    # needing 18.3 samples left three of them past it), none much later
    assert sum(m <= 20 for m in minutes) >= 18
    assert max(minutes) <= 22


def test_a_leak_that_keeps_moving_is_caught_by_its_live_bytes() -> None:
    # a list's array: reallocated (young again) at each eighth of growth
    def array(t: float) -> float:
        return 10 * KIB * t + 4096

    def old(t: float) -> float:
        size = array(t)
        moved = 4096 * 1.125 ** math.floor(math.log(size / 4096, 1.125))
        return 0.0 if (size - moved) / (10 * KIB) < 80 else size

    result = leak_score(_series(old, 25, live=array), WINDOW, since=0.0)
    assert result.score >= 0.9 and result.series == "live"


def test_scores_are_in_the_unit_interval_and_empty_is_zero() -> None:
    assert leak_score([], WINDOW).score == 0.0
    obs = _series(lambda t: -t, 30)
    assert leak_score(obs, WINDOW).score == 0.0
    for o in (_series(lambda t: t * t, 30), _series(lambda t: 1e12 * t, 30)):
        assert 0.0 <= leak_score(o, WINDOW).score <= 1.0


def test_the_tracker_counts_missing_sites_as_empty_and_ranks_suspects() -> None:
    tracker: LeakTracker[str] = LeakTracker(WINDOW)
    for i in range(int(25 * 60 / CYCLE) + 1):
        t = i * CYCLE
        sites = {"leak": Observation(t, 10 * KIB * t, 10 * KIB * t)}
        if i % 2 == 0:
            sites["blinking"] = Observation(t, MIB, MIB)
        if t >= 300:
            sites["slow leak"] = Observation(t, 2 * KIB * (t - 300), 2 * KIB * (t - 300))
        tracker.observe(t, sites)
    suspects = tracker.suspects()
    assert [key for key, _ in suspects][:1] == ["leak"]
    assert tracker.scores()["blinking"].score < 0.5
    assert [key for key, _ in rank_scores(tracker.scores().items(), 0.9)] == ["leak", "slow leak"]


def test_the_tracker_forgets_what_left_a_window_ago() -> None:
    tracker: LeakTracker[str] = LeakTracker(100.0)
    tracker.observe(0.0, {"gone": Observation(0.0, 5.0, 5.0)})
    for t in range(10, 300, 10):
        tracker.observe(float(t), {})
    assert tracker.scores() == {}


def test_the_tracker_refuses_time_going_back_and_empty_windows() -> None:
    with pytest.raises(ValueError, match="window"):
        LeakTracker(0.0)
    tracker: LeakTracker[str] = LeakTracker(60.0)
    tracker.observe(10.0, {})
    with pytest.raises(ValueError, match="time"):
        tracker.observe(10.0, {})


# ---- the ages: a site's history beyond the window ---------------------------

SAMPLE_INTERVAL = 512 * KIB
AGE_BUCKETS = 17  # the core's: 0 for age 0, b for ages in [2**(b-1), 2**b) epochs


def _watched(
    births: Callable[[float], float],
    hours: float,
    mode: str,
    block: int,
    seed: int,
    *,
    cap: float | Callable[[float], float] = math.inf,
    window: float = WINDOW,
    sample_interval: float = SAMPLE_INTERVAL,
    every: int = 6,
    after_first_cycle: bool = False,
) -> Callable[[], list[tuple[float, float]]]:
    """A site that allocates births(t) bytes/s in blocks of ``block`` bytes
    and frees its oldest blocks beyond ``cap`` bytes, or beyond ``cap(t)``
    (a cache, a queue; none by default), fed to a tracker cycle by cycle as
    the agent feeds it (live, old and their variances; the bytes by age
    bucket, blocks and epoch); returns a function giving (minute, score)
    every ``every`` cycles (once a minute).  In sample mode each cycle's
    blocks are sampled as the core samples them, a sampled block weighing
    size / p.  ``after_first_cycle``: the site begins after the tracker's
    first cycle, as a service's sites do after the agent's first cycle,
    which runs as it starts."""
    rng = random.Random(seed)
    p = 1.0 if mode == "exact" else -math.expm1(-block / sample_interval)
    weight = block / p
    var = block * block * (1 - p) / (p * p)

    def run() -> list[tuple[float, float]]:
        tracker: LeakTracker[str] = LeakTracker(window)
        if after_first_cycle:
            tracker.observe(0.0, {})
        # (epoch allocated, blocks, sampled blocks), oldest first
        cohorts: list[tuple[int, float, float]] = []
        scores = []
        for epoch in range(1, int(hours * 3600 / CYCLE) + 1):
            t = epoch * CYCLE
            n = births(t) * CYCLE / block
            if mode == "exact":
                cohorts.append((epoch - 1, n, n))
            elif p < 0.01:  # Poisson: many blocks, each sampled with a small p
                k, threshold, prod = 0, math.exp(-n * p), rng.random()
                while prod > threshold:
                    k += 1
                    prod *= rng.random()
                cohorts.append((epoch - 1, n, float(k)))
            else:  # blocks of about the sample interval: each one drawn
                drawn = sum(rng.random() < p for _ in range(round(n)))
                cohorts.append((epoch - 1, n, float(drawn)))
            held = sum(count for _born, count, _drawn in cohorts) * block
            limit = cap(t) if callable(cap) else cap
            while cohorts and held > limit:
                held -= cohorts.pop(0)[1] * block
            histogram = [0.0] * AGE_BUCKETS
            variances = [0.0] * AGE_BUCKETS
            for born, _count, drawn in cohorts:
                bucket = min((epoch - born).bit_length(), AGE_BUCKETS - 1)
                histogram[bucket] += drawn * weight
                variances[bucket] += drawn * var
            live, old = sum(histogram), sum(histogram[OLD_BUCKET:])
            live_var, old_var = sum(variances), sum(variances[OLD_BUCKET:])
            blocks = sum(drawn for _born, _count, drawn in cohorts) / p
            tracker.observe(
                t,
                {"site": Observation(t, live, old, live_var, old_var)},
                {"site": Ages(tuple(histogram), tuple(variances), blocks, epoch)},
            )
            if epoch % every == 0:
                found = tracker.scores().get("site")  # none while it holds nothing
                scores.append((t / 60, found.score if found is not None else 0.0))
        return scores

    return run


def _suspect_seeds(
    seeds: range,
    births: Callable[[float], float],
    hours: float,
    mode: str,
    block: int,
    *,
    window: float,
    cap: float | Callable[[int], Callable[[float], float]] = math.inf,
) -> list[int]:
    """The seeds whose site ``_watched`` ever scores 0.5 or more, scored
    every cycle from after the tracker's first, sampled at 64 KiB; ``cap``
    a capacity, or a seed's capacity over time."""
    suspects = []
    for seed in seeds:
        scores = _watched(
            births,
            hours,
            mode,
            block,
            seed,
            cap=cap(seed) if callable(cap) else cap,
            window=window,
            sample_interval=64 * KIB,
            every=1,
            after_first_cycle=True,
        )()
        if max(score for _minute, score in scores) >= 0.5:
            suspects.append(seed)
    return suspects


def _first_flagged(scores: list[tuple[float, float]]) -> float:
    return next((minute for minute, score in scores if score >= 0.9), math.inf)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_slow_sampled_leak_is_flagged_by_the_ages_of_its_memory(seed: int) -> None:
    # Given 1 KiB/s of small blocks sampled at 512 KiB: a sample every 8.5
    # minutes, 3 or 4 in a window, too few for the window alone
    scores = _watched(lambda t: KIB, 3.0, "sample", 64, seed)()
    # Then the ages (hours of samples, none freed) flag it within 3 hours
    assert _first_flagged(scores) <= 180
    # and not in its first half hour (too few samples, even over its ages)
    assert max(score for minute, score in scores if minute <= 30) < 0.9


@pytest.mark.parametrize("mode", ["exact", "sample"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_slowly_saturating_dict_is_not_a_leak(mode: str, seed: int) -> None:
    # Given a dict of 100-byte entries over 200,000 keys, inserting 500 a
    # second: new keys ever more rarely (e-folding in 400 s), 20 MB in all
    def births(t: float) -> float:
        return 500 * 100 * math.exp(-t / 400)

    scores = _watched(births, 3.0, mode, 100, seed)()
    # Then its old memory, thick and young-less, never looks like a leak
    assert max(score for _minute, score in scores) < 0.5


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_leak_is_flagged_with_its_ages_as_soon_as_without(mode: str) -> None:
    # Given a leak of 10 KiB/s: the window flags it in about 18 minutes
    scores = _watched(lambda t: 10 * KIB, 0.5, mode, 64, 1)()
    # Then the ages do not hold it back
    assert _first_flagged(scores) <= 20


def test_growth_of_memory_turned_over_is_as_noisy_as_both_estimates() -> None:
    # Given a sampled site whose estimate went from 100 to 130 samples of
    # 512 KiB over the window, steadily, but whose ages say that all of it
    # is younger than a minute (turned over: a fresh draw of samples)
    w = SAMPLE_INTERVAL

    def live(t: float) -> float:
        return (100 + 30 * t / WINDOW) * w

    obs = _series(lambda t: 0.0, 30, live=live)
    obs = [o._replace(live_var=o.live * w) for o in obs]
    young = [0.0] * AGE_BUCKETS
    young[3] = obs[-1].live
    ages = Ages(tuple(young), tuple(b * w for b in young), obs[-1].live / 1024, 2000)
    # Then its growth is weighed against the variance of both estimates, not
    # only of what was added: 30 samples against about 15 standard ones
    assert leak_score(obs, WINDOW, ages=ages).score < 0.5
    # while the same growth of memory that survives (a leak's: 100 samples
    # born evenly over the 18 hours before the window, 30 within it) is a
    # leak
    rate = 30 * w / (WINDOW / CYCLE)  # bytes an epoch
    kept = [0.0] * AGE_BUCKETS
    for age in range(1, 6661):
        kept[age.bit_length()] += rate if age <= 180 else 100 * w / 6480

    def old(t: float) -> float:  # all but its last 8 epochs' births
        return live(t) - 8 * rate

    obs = [o._replace(old=old(o.time), old_var=old(o.time) * w) for o in obs]
    ages = Ages(tuple(kept), tuple(b * w for b in kept), obs[-1].live / 1024, 6661)
    assert leak_score(obs, WINDOW, ages=ages).score >= 0.9


@pytest.mark.parametrize("mode", ["exact", "sample"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_a_sampled_cache_that_evicts_is_not_a_leak(mode: str, seed: int) -> None:
    # Given a cache of 1 KiB entries filling to 50 MiB in 10 minutes, then
    # inserting 20 KiB/s and evicting its oldest: sampled at 512 KiB its
    # estimate is a hundred samples turned over every 43 minutes, which
    # wander (a 30-minute window sees about 70 born and 70 evicted)
    def births(t: float) -> float:
        return 50 * MIB / 600 if t <= 600 else 20 * KIB

    scores = _watched(births, 3.0, mode, 1024, seed, cap=50 * MIB)()
    # Then its wandering is no leak: what it held a while ago is gone
    assert max(score for _minute, score in scores) < 0.5


@pytest.mark.parametrize("mode", ["exact", "sample"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_a_dict_that_begins_to_fill_late_is_not_a_leak(mode: str, seed: int) -> None:
    # Given the slowly saturating dict begun after an hour: a new site,
    # about 40 samples of a fill that slows down
    def births(t: float) -> float:
        return 0.0 if t <= 3600 else 500 * 100 * math.exp(-(t - 3600) / 400)

    scores = _watched(births, 2.0, mode, 100, seed)()
    # Then no span that begins before the site existed makes it look steady
    assert max(score for _minute, score in scores) < 0.5


@pytest.mark.parametrize("seed", [7, 11, 12, 40, 41])
def test_a_dict_begun_late_is_not_a_leak_once_the_window_has_left_its_start(seed: int) -> None:
    # Given the slowly saturating dict begun after an hour, sampled, on draws
    # that half an hour on hold more samples in their oldest bucket than a
    # steady rate since tracing began would (its memory is 30 minutes old,
    # the bucket holds ages of 21 to 43 minutes)
    def births(t: float) -> float:
        return 0.0 if t <= 3600 else 500 * 100 * math.exp(-(t - 3600) / 400)

    scores = _watched(births, 1.75, "sample", 100, seed)()
    # Then its first sighting still bounds its ages once the window no
    # longer holds it: a fill that slowed down, not steady births
    assert max(score for _minute, score in scores) < 0.5


def test_births_that_slow_down_since_tracing_began_are_not_even_ages() -> None:
    # Given a site watched from the first cycle whose 34 samples of 512 KiB
    # were born over the 132 epochs since tracing began, most of them in the
    # first half (a dict saturating, as one draw of the scenario bank had
    # it): 3 in the bucket of ages 128 to 255, which the epoch cuts at 132
    w = SAMPLE_INTERVAL
    end = 132

    def spread(first: float, last: float, n: int) -> list[int]:
        return [round(first + (last - first) * (k + 0.5) / n) for k in range(n)]

    born = spread(0, 4, 3) + spread(5, 68, 23) + spread(69, 100, 4)
    born += spread(101, 116, 3) + spread(117, 124, 1)
    obs = []
    for epoch in range(1, end + 1):
        live = sum(1 for b in born if b < epoch) * w
        old = sum(1 for b in born if b <= epoch - 8) * w
        obs.append(Observation(epoch * CYCLE, live, old, live * w, old * w))
    histogram = [0.0] * AGE_BUCKETS
    for b in born:
        histogram[(end - b).bit_length()] += w
    ages = Ages(tuple(histogram), tuple(b * w for b in histogram), len(born) * w / 100, end)
    # Then their mean age, the bucket the epoch cuts included, is too old
    # for steady births since tracing began
    assert leak_score(obs, WINDOW, CYCLE, ages).score < 0.5


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_leak_begun_late_is_flagged_as_soon(mode: str) -> None:
    # Given a leak of 10 KiB/s begun after an hour (a new site)
    scores = _watched(lambda t: 0.0 if t <= 3600 else 10 * KIB, 1.5, mode, 64, 1)()
    # Then it is flagged within 20 minutes of its start
    assert _first_flagged(scores) <= 80


def test_a_sampled_site_is_counted_from_when_its_births_began() -> None:
    # Given a leak of 10 KiB/s begun after an hour, sampled at 512 KiB: a
    # sample every 51.2 s, the first 51.2 s after it began (when the site is
    # first seen: the tracker's series of it begins there)
    w = SAMPLE_INTERVAL

    def estimate(t: float) -> float:
        return w * max(math.floor((t - 3600) / 51.2), 0)

    obs = [o for o in _series(estimate, 100, var=lambda t: estimate(t) * w) if o.live > 0]
    flagged = next(
        o.time for i, o in enumerate(obs) if leak_score(obs[: i + 1], WINDOW, 0.0).score >= 0.9
    )
    # Then its shortest span may begin when its births began, about a
    # sample's bytes before its first sample, not only a cycle before
    assert (flagged - 3600) / 60 <= 0.6 * WINDOW / 60 + 2 * CYCLE / 60


def test_memory_turned_over_is_not_a_leak_by_its_ages() -> None:
    # Given hand-built ages of a cache that evicts its oldest entries: even
    # births up to 2 hours (a leak's, at one instant), the window flat
    rate = 100 * KIB  # bytes an epoch
    histogram = [0.0] * AGE_BUCKETS
    for age in range(1, 720):
        histogram[age.bit_length()] += rate
    ages = Ages(tuple(histogram), (0.0,) * AGE_BUCKETS, sum(histogram) / 1000, 2000)
    flat = _series(lambda t: sum(histogram[OLD_BUCKET:]), 30)
    # Then it is no suspect: what it held a window ago is gone
    assert leak_score(flat, WINDOW, ages=ages).score < 0.1
    # while the same ages on a window that grew by them are a leak's
    grew = _series(lambda t: sum(histogram[OLD_BUCKET:]) - (1800 - t) / CYCLE * rate, 30)
    assert leak_score(grew, WINDOW, ages=ages).score >= 0.9


# ---- early spans: a strong leak flagged before 0.6 of the window -------------


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_strong_leak_is_flagged_before_the_plain_spans(mode: str) -> None:
    # Given a leak of 100 KiB/s from the start, hand-built (sampled: a sample
    # every 5 s) and taken cycle by cycle with its ages
    if mode == "exact":
        built = _series(lambda t: 100 * KIB * t, 20)
    else:
        built = _sampled_leak(100 * KIB, 20, 1)
    taken = _watched(lambda t: 100 * KIB, 20 / 60, mode, 64, 1)()
    # Then both are flagged before 0.6 of the window (18 minutes), once it
    # grew well beyond what any 12 minutes held (a fill of 0.4 of the window)
    assert _minutes_to_flag(built) < 18
    assert _first_flagged(taken) < 18


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_faster_sampled_leak_is_flagged_sooner(seed: int) -> None:
    # Given sampled leaks of small blocks at 10 and 100 KiB/s: 1.2 and 11.7
    # samples a minute
    slow = _first_flagged(_watched(lambda t: 10 * KIB, 0.5, "sample", 64, seed)())
    fast = _first_flagged(_watched(lambda t: 100 * KIB, 0.5, "sample", 64, seed)())
    # Then the more samples, the sooner the growth is told from a fill
    assert fast < 18
    assert fast < slow


@pytest.mark.parametrize("begin", [0.0, 7.0])
@pytest.mark.parametrize("fill_minutes", [6.0, 10.0, 12.0])
@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_fill_that_stops_within_0_4_of_the_window_is_no_leak_at_any_rate(
    mode: str, fill_minutes: float, begin: float
) -> None:
    # Given a cache filling to 500 MiB (a thousand samples of 512 KiB: as
    # strong as sampled evidence gets) in up to 0.4 of the window, from the
    # start or after 7 minutes of 20 KiB/s, then flat, hand-built and taken
    # with its ages (evicting as it inserts)
    fill, start = fill_minutes * 60, begin * 60
    size = 500 * MIB

    def held(t: float) -> float:
        return 20 * KIB * min(t, start) + min(max(t - start, 0.0), fill) * size / fill

    def births(t: float) -> float:
        return size / fill if start < t <= start + fill else 20 * KIB

    if mode == "exact":
        built = _series(held, 60)
    else:
        built = _series(held, 60, var=lambda t: held(t) * SAMPLE_INTERVAL)
    taken = _watched(births, 1.0, mode, 1024, 1, cap=size)()
    # Then no span makes it a leak: one shorter than 0.6 of the window may
    # hold all of the fill and pass the quarters' test, but it grew nothing
    # beyond what 12 minutes of it held
    assert _max_score(built) < 0.5
    assert max(score for _minute, score in taken) < 0.5


@pytest.mark.parametrize("seed", range(1, 13))
def test_a_cache_filled_at_the_start_of_a_short_window_is_not_a_leak(seed: int) -> None:
    # Given the agent at a short window, as a service owner tries it: 40
    # cycles a window (20 s at 0.5 s; here 400 s at 10 s, the score knows
    # no seconds), sampled at 64 KiB; an LRU cache of 64 KiB entries
    # filling to 20 MiB in 0.32 of the window from the first cycle, then
    # inserting as fast and evicting its oldest: each cycle's step of the
    # fill is one of a few, and afterwards its estimate is a fresh draw of
    # samples every 0.32 of the window
    window = 40 * CYCLE
    fill = 0.32 * window

    def births(t: float) -> float:
        return 20 * MIB / fill

    scores = _watched(
        births,
        3 * window / 3600,
        "sample",
        64 * 1024,
        seed,
        cap=20 * MIB,
        window=window,
        sample_interval=64 * KIB,
        every=1,
    )()
    # Then no cycle calls it a suspect: not its steps, all in a few cycles
    # at the start of the first spans, nor its wandering since
    assert max(score for _minute, score in scores) < 0.5


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_cache_filled_in_a_window_of_twelve_cycles_is_rarely_a_suspect(mode: str) -> None:
    # Given the same cache at 12 cycles a window (issue 23's second try: a
    # 1-minute window, 5 s cycles), filling in 0.32 of it, 4 cycles: no old
    # memory can be seen to die in so few cycles, and the spans' shape has
    # four steps of eight to go by, as a leak's lumps could be
    window = 12 * CYCLE
    fill = 0.32 * window

    def births(t: float) -> float:
        return 20 * MIB / fill

    suspects = _suspect_seeds(
        range(1, 41), births, 4 * window / 3600, mode, 64 * 1024, window=window, cap=20 * MIB
    )
    # Then what it grew does not survive, and its fill is no suspect.  One
    # draw in 40 is (seed 31): sampled, the cache's estimate, a fresh draw of
    # samples every 4 cycles, wandered up by 3.6 MiB over the 12 cycles,
    # steadily, about 3 standard deviations, and its deaths were within
    # their noise.  Before the short window's deaths were read, 8 of 40.
    assert len(suspects) <= (1 if mode == "sample" else 0), suspects


def _queue_level(seed: int, mean: float, window: float) -> Callable[[float], float]:
    """The scenario bank's FIFO queue's size at time t (called once a
    cycle, in order): its mean, wandering within 20% of it, back towards it
    over a sixth of the window."""
    rng = random.Random(-seed)
    level = 0.0

    def at(_t: float) -> float:
        nonlocal level
        level += -level * CYCLE / (window / 6) + rng.gauss(0.0, 0.075)
        level = max(-0.2, min(0.2, level))
        return mean * (1.0 + level)

    return at


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_queue_whose_items_never_grow_old_is_no_suspect(mode: str) -> None:
    # Given the scenario bank's queue at 40 cycles a window, as issue 23's
    # real processes ran it (20 s at 0.5 s): 4 KiB items leaving in FIFO
    # order after about 4.6 cycles, so that none of its memory is ever
    # OLD_EPOCHS old, around 20 MiB that wanders within 20%; it fills
    # after the agent's first cycle
    window = 40 * CYCLE
    residence = 4.6 * CYCLE

    suspects = _suspect_seeds(
        range(1, 21),
        lambda t: 20 * MIB / residence,
        3 * window / 3600,
        mode,
        4096,
        window=window,
        cap=lambda seed: _queue_level(seed, 20 * MIB, window),
    )
    # Then its live bytes' rise over the window (its fill, then its
    # wander) is no leak: what it held OLD_EPOCHS cycles ago is all gone.
    # Before that was read outside short windows, real processes scored it
    # up to 0.94, and seeds here were suspects in both modes.
    assert suspects == []


def test_a_leak_whose_cycles_begin_no_epoch_is_scored_by_its_live_bytes() -> None:
    # Given a site that leaks 100 kB a cycle, exact, whose cycles are run
    # sooner than the agent's interval (run_cycle(): they begin no epoch),
    # so that all its memory is of age 0 and none is old
    window = 50 * CYCLE
    tracker: LeakTracker[str] = LeakTracker(window)
    tracker.observe(0.0, {})
    score = 0.0
    for cycle in range(1, 41):
        t = cycle * CYCLE
        live = cycle * 100e3
        histogram = (live,) + (0.0,) * (AGE_BUCKETS - 1)
        tracker.observe(
            t,
            {"site": Observation(t, live, 0.0, 0.0, 0.0)},
            {"site": Ages(histogram, (0.0,) * AGE_BUCKETS, live / 1000, 1)},
        )
        score = tracker.scores()["site"].score
    # Then nothing old is no sign that its growth died (none of it could
    # be OLD_EPOCHS epochs old): its live bytes flag it
    assert score >= 0.9


def _bank_cache(window: float) -> tuple[Callable[[float], float], float]:
    """The scenario bank's cache at a window: (births, cap).  50 MiB of 1
    KiB entries filled in a third of the window, then inserting what
    evicts its oldest within 17 cycles."""
    cap = 50 * MIB
    fill = window / 3

    def births(t: float) -> float:
        return cap / fill if t <= fill else cap / (17 * CYCLE)

    return births, cap


def test_a_cache_of_long_lived_entries_in_a_window_of_twelve_cycles_is_no_suspect() -> None:
    # Given the scenario bank's cache at 12 cycles a window, exact: 50 MiB
    # of 1 KiB entries filled in a third of the window, then inserting
    # what evicts its oldest within 17 cycles, longer than the window:
    # nothing is seen to die before the fill has left the shortest span
    window = 12 * CYCLE
    births, cap = _bank_cache(window)

    scores = _watched(
        births,
        6 * window / 3600,
        "exact",
        1024,
        1,
        cap=cap,
        window=window,
        every=1,
        after_first_cycle=True,
    )()
    # Then its fill, growth within 0.4 of the window, is no leak at any
    # span (at 12 cycles the spans' shape cannot tell: it scored 1.00)
    assert max(score for _minute, score in scores) < 0.5


def test_a_sampled_cache_turning_over_in_a_window_of_twelve_cycles_is_no_suspect() -> None:
    # Given the same cache sampled at 64 KiB: full, its estimate is the sum
    # of the 17 cycles' draws it holds, a fresh one in and the oldest out
    # each cycle, and wanders up by a few MiB over 8 of them now and then;
    # its old bytes at a span's start that are alive at its end are 8
    # epochs older than the span, not as old as the span
    window = 12 * CYCLE
    births, cap = _bank_cache(window)

    suspects = _suspect_seeds(
        range(1, 41), births, 6 * window / 3600, "sample", 1024, window=window, cap=cap
    )
    # Then the old bytes' growth over 8 cycles has the variance of the 16
    # draws turned over, not of the 4 the span's age alone left: no draw is
    # a suspect (19 of 40 were, up to 1.00: the old bytes' span took what
    # became old within it for what lived through it)
    assert suspects == []


@pytest.mark.parametrize("mode", ["exact", "sample"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_leak_in_a_window_of_twelve_cycles_is_flagged_within_it(mode: str, seed: int) -> None:
    window = 12 * CYCLE
    scores = _watched(
        lambda t: 2 * MIB / 30,  # issue 23's 2 MiB/s, at a 1-minute window
        4 * window / 3600,
        mode,
        4 * 1024,
        seed,
        window=window,
        sample_interval=64 * KIB,
        every=1,
        after_first_cycle=True,
    )()
    # (the first span scored, 0.6 of the window, ends a cycle or two later)
    assert _first_flagged(scores) <= 0.8 * window / 60


@pytest.mark.parametrize("seed", range(1, 21))
def test_a_sampled_dict_saturating_in_a_window_of_forty_cycles_is_not_a_leak(seed: int) -> None:
    # Given the bank's slowly saturating dict (new keys ever rarer, a time
    # constant of 0.22 of the window) at 40 cycles a window (issue 23's
    # 20 s at 0.5 s), entries of 133 bytes sampled at 64 KiB: its last
    # spans hold a few dozen samples, whose quarters a steady leak's could
    # have, and it grew beyond their noise
    window = 40 * CYCLE
    tau = 0.222 * window

    def births(t: float) -> float:
        return 26.6e6 / tau * math.exp(-t / tau)

    scores = _watched(
        births,
        3 * window / 3600,
        "sample",
        133,
        seed,
        window=window,
        sample_interval=64 * KIB,
        every=1,
        after_first_cycle=True,
    )()
    # Then its ages, older the fuller (births that slow down), say it is no
    # leak: a span of 20 to 40 cycles has two old buckets to weigh them by
    # (every draw scored 0.64 to 1.00 while a span needed three)
    assert max(score for _minute, score in scores) < 0.5
