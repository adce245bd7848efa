"""The leak-score scenario bank (issue 14): time to flag each leak, highest
score of each non-leak, in exact mode and in sample mode at the default
512 KiB interval.  A measurement, never a test.

    python benchmarks/leaks.py                 # the table, a few minutes
    python benchmarks/leaks.py --hours 1 --scenarios cache,leak_10k
    python benchmarks/leaks.py --real --seeds 6   # as real processes (leaks_real.py)

What runs: heapwatch.formats.leaks.LeakTracker, the real scorer, on a simulated
clock (10 s cycles, window 30 min, "old" = 8 cycles and more, the age bucket
the agent would read).  What it is fed is a model, not the core: three hours
of 1 GiB/min of churn through the real hooks would take hours here.  The
model, per scenario:

* 50 churning sites, 1 GiB/min between them, block lifetimes exponential
  with means from 10 ms to 20 s; at each cycle a site's live blocks are a
  Poisson count (its rate times its mean lifetime), those older than the age
  threshold a Poisson count of the surviving fraction (exact for lifetimes
  well under a cycle, which is most of the churn; the longer ones come out
  less correlated from cycle to cycle than they are);
* the scenario's own sites as cohorts of blocks (the blocks one cycle
  allocated at one site: a count, a size, a birth, a death), each cohort
  sampled at birth as the core samples: Binomial(n, p) blocks with
  p = 1 - exp(-size / interval), each weighing size / p, the variance of the
  estimate summed as size**2 (1 - p) / p**2 per sampled block (the unbiased
  estimate the agent gets from the same weights).

Sample mode flags nothing the data cannot show: a 1 KiB/s leak gets a sample
every 8.5 minutes at 512 KiB, so a 30-minute window holds three or four.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agent"))

from heapwatch.formats.leaks import OLD_BUCKET, Ages, LeakTracker, Observation

CYCLE = 10.0
WINDOW = 1800.0
OLD_AGE = 8 * CYCLE  # bucket [8, 16) epochs and older
AGE_BUCKETS = 17  # the core's HW_AGE_BUCKETS: ages up to 2**15 epochs
INTERVAL = 512 * 1024
KIB = 1024
MIB = 1024 * KIB
FLAG = 0.9
SUSPECT = 0.5
CHURN_SITES = 50
CHURN_BYTES_PER_S = (1 << 30) / 60.0


@dataclass
class Cohort:
    birth: float
    n: int
    size: int
    death: float = math.inf
    sampled: int = 0  # sample mode: blocks drawn at birth


Step = Callable[["Site", float, "Sampler"], None]


@dataclass
class Site:
    """A scenario site: cohorts of blocks, born and freed by its behaviour."""

    name: str
    leak_start: float | None  # None: not a leak
    step: Step
    cohorts: List[Cohort] = field(default_factory=list)
    state: Dict[str, float] = field(default_factory=dict)


class Sampler:
    def __init__(self, mode: str, rng: random.Random) -> None:
        self.mode = mode
        self.rng = rng

    def p(self, size: int) -> float:
        return 1.0 if self.mode == "exact" else -math.expm1(-size / INTERVAL)

    def binomial(self, n: int, p: float) -> int:
        if p >= 1.0:
            return n
        if n <= 64:
            return sum(self.rng.random() < p for _ in range(n))
        if n * p < 30:
            return min(n, self.poisson(n * p))  # small p: the Poisson limit
        return max(0, min(n, round(self.rng.gauss(n * p, math.sqrt(n * p * (1 - p))))))

    def poisson(self, lam: float) -> int:
        if lam <= 0:
            return 0
        if lam < 30:
            k, threshold, prod = 0, math.exp(-lam), self.rng.random()
            while prod > threshold:
                k += 1
                prod *= self.rng.random()
            return k
        return max(0, round(self.rng.gauss(lam, math.sqrt(lam))))

    def observe_cohorts(self, cohorts: List[Cohort], now: float) -> Tuple[Observation, Ages]:
        """A site as the agent sees it: its live bytes, the old ones, and
        its bytes by age bucket (a cohort born at a cycle was allocated
        during the cycle before it: one epoch old then)."""
        live = live_var = blocks = 0.0
        histogram = [0.0] * AGE_BUCKETS
        variances = [0.0] * AGE_BUCKETS
        for c in cohorts:
            if c.birth > now or c.death <= now:
                continue
            p = self.p(c.size)
            if self.mode == "exact":
                est, var, n = float(c.n * c.size), 0.0, float(c.n)
            else:
                est = c.sampled * c.size / p
                var = c.sampled * c.size**2 * (1 - p) / p**2
                n = c.sampled / p
            live += est
            live_var += var
            blocks += n
            bucket = age_bucket(round((now - c.birth) / CYCLE) + 1)
            histogram[bucket] += est
            variances[bucket] += var
        old, old_var = sum(histogram[OLD_BUCKET:]), sum(variances[OLD_BUCKET:])
        return (
            Observation(now, live, old, live_var, old_var),
            Ages(tuple(histogram), tuple(variances), blocks, round(now / CYCLE)),
        )


def age_bucket(age: int) -> int:
    """The core's (agent/csrc/groups.c): 0 for age 0, b for ages in
    [2**(b-1), 2**b) epochs, the oldest bucket for older ones."""
    return min(age.bit_length(), AGE_BUCKETS - 1)


def _add(site: Site, sampler: Sampler, now: float, n: int, size: int) -> Cohort:
    c = Cohort(now, n, size)
    c.sampled = n if sampler.mode == "exact" else sampler.binomial(n, sampler.p(size))
    site.cohorts.append(c)
    return c


# ---- behaviours: each adds and frees the cohorts of one cycle -------------


def leak(rate: float, size: int, start: float = 0.0) -> Step:
    def step(site: Site, now: float, sampler: Sampler) -> None:
        if now < start:
            return
        owed = site.state.get("owed", 0.0) + rate * CYCLE
        n = int(owed // size)
        site.state["owed"] = owed - n * size
        if n:
            _add(site, sampler, now, n, size)

    return step


def growing_list(rate: float) -> Step:
    """A list's array of 8-byte slots growing by append, reallocated by an
    eighth when full: each move is a young block, the old one freed."""

    def step(site: Site, now: float, sampler: Sampler) -> None:
        items = site.state.get("items", 0.0) + rate * CYCLE / 8
        site.state["items"] = items
        capacity = site.state.get("capacity", 0.0)
        if items > capacity or not site.cohorts:
            while capacity < items:
                capacity = max(capacity * 1.125 + 6, 8)
            site.state["capacity"] = capacity
            for c in site.cohorts:
                c.death = min(c.death, now)
            _add(site, sampler, now, 1, int(capacity * 8) + 56)

    return step


def cache(fill_s: float, cap: float, entry: int, steady_rate: float) -> Step:
    def step(site: Site, now: float, sampler: Sampler) -> None:
        rate = cap / fill_s if now < fill_s else steady_rate
        n = int(rate * CYCLE / entry)
        _add(site, sampler, now, n, entry)
        live = [c for c in site.cohorts if c.death > now]
        total = sum(c.n * c.size for c in live)
        for c in live:  # evict the oldest entries first
            if total <= cap:
                break
            c.death = now
            total -= c.n * c.size

    return step


def batch(every: float, hold: float, size: float, block: int) -> Step:
    def step(site: Site, now: float, sampler: Sampler) -> None:
        if now % every < CYCLE:
            _add(site, sampler, now, int(size / block), block).death = now + hold

    return step


def queue(mean: float, item: int, throughput: float) -> Step:
    """A FIFO queue whose size wanders within about 20% of its mean."""

    def step(site: Site, now: float, sampler: Sampler) -> None:
        level = site.state.get("level", 0.0)
        level += -level * CYCLE / 300.0 + sampler.rng.gauss(0, 0.035)
        level = max(-0.2, min(0.2, level))
        site.state["level"] = level
        target = mean * (1 + level)
        _add(site, sampler, now, int(throughput * CYCLE / item), item)
        live = [c for c in site.cohorts if c.death > now]
        total = sum(c.n * c.size for c in live)
        for c in live:
            if total <= target:
                break
            c.death = now
            total -= c.n * c.size

    return step


def warm_up(size: float, block: int, until: float) -> Step:
    def step(site: Site, now: float, sampler: Sampler) -> None:
        if now < until:
            _add(site, sampler, now, int(size * CYCLE / until / block), block)

    return step


def saturating_dict(keys: int, per_s: float, entry: int, start: float = 0.0) -> Step:
    """Inserts drawn from a fixed key space: new keys come ever more rarely."""

    def step(site: Site, now: float, sampler: Sampler) -> None:
        if now < start:
            return
        seen = site.state.get("seen", 0.0)
        fresh = (keys - seen) * -math.expm1(-per_s * CYCLE / keys)
        owed = site.state.get("owed", 0.0) + fresh
        n = int(owed)
        site.state["owed"] = owed - n
        site.state["seen"] = seen + fresh
        if n:
            _add(site, sampler, now, n, entry)

    return step


HOUR = 3600.0
SCENARIOS: Dict[str, List[Tuple[str, float | None, Step]]] = {
    "leak_10k": [("leak 10 KiB/s", 0.0, leak(10 * KIB, 64))],
    # ten times the evidence: flagged sooner
    "leak_100k": [("leak 100 KiB/s", 0.0, leak(100 * KIB, 64))],
    "leak_1k": [("leak 1 KiB/s", 0.0, leak(1 * KIB, 64))],
    "leak_1mib_per_min": [("1 MiB/min", 0.0, leak(MIB / 60, MIB))],
    "list_append": [("list.append 10 KiB/s", 0.0, growing_list(10 * KIB))],
    "leak_after_1h": [("leak 10 KiB/s from 1 h", HOUR, leak(10 * KIB, 64, HOUR))],
    "two_leaks": [
        ("leak 10 KiB/s", 0.0, leak(10 * KIB, 64)),
        ("leak 2 KiB/s", 0.0, leak(2 * KIB, 200)),
    ],
    "cache": [("cache 50 MiB", None, cache(600.0, 50 * MIB, KIB, 20 * KIB))],
    "batch": [("batch 100 MiB / 5 min", None, batch(300.0, 240.0, 100 * MIB, 64 * KIB))],
    "churn": [],
    "queue": [("queue ±20%", None, queue(20 * MIB, 4 * KIB, 100 * KIB))],
    "warm_up": [("warm-up", None, warm_up(30 * MIB, 512, 60.0))],
    # new keys every 200 s (e-folding), as fast as the cache fills
    "dict": [("dict saturating", None, saturating_dict(200_000, 1000.0, 100))],
    # twice as slow: the limit of what 30 samples can tell from a leak
    "dict_slow": [("dict saturating slowly", None, saturating_dict(200_000, 500.0, 100))],
    # the same, begun after an hour: its ages cannot be told from older ones
    # by the process's age (no age exceeds the epoch)
    "dict_slow_late": [
        ("dict saturating slowly from 1 h", None, saturating_dict(200_000, 500.0, 100, HOUR))
    ],
    # Issue 23's service, at its 20 s window (a bank second is 1/90 of its
    # seconds): an LRU cache of 64 KiB entries filling to 20 MiB in 6.4 s,
    # then evicting at the same rate, beside a leak of 2 MiB/s.
    "lru": [
        ("LRU 20 MiB of 64 KiB", None, cache(576.0, 20 * MIB, 64 * KIB, 20 * MIB / 576.0)),
        ("leak 2 MiB/s at 20 s", 0.0, leak(2 * MIB / 90.0, 4 * KIB)),
    ],
}
# Scenarios whose sites begin after an hour: run an hour longer.
LATE = ("leak_after_1h", "dict_slow_late")


def churn_sites(rng: random.Random) -> List[Tuple[float, float, int]]:
    """(bytes/s, mean lifetime s, block size) of the 50 churning sites."""
    sites = []
    for i in range(CHURN_SITES):
        life = 0.01 * (2000.0 ** (i / (CHURN_SITES - 1)))  # 10 ms .. 20 s
        sites.append((CHURN_BYTES_PER_S / CHURN_SITES, life, rng.choice([32, 64, 256, 1024])))
    return sites


@dataclass
class Outcome:
    scenario: str
    mode: str
    # per leak site: (name, seconds from leak start to a score >= FLAG, rank then)
    flagged: List[Tuple[str, float | None, int | None]]
    highest: float  # highest score of a non-leak site (scenario's or churn)
    highest_site: str


def run(scenario: str, mode: str, hours: float, seed: int) -> Outcome:
    rng = random.Random(seed)
    sampler = Sampler(mode, rng)
    churn = churn_sites(rng)
    sites = [Site(name, start, step) for name, start, step in SCENARIOS[scenario]]
    tracker: LeakTracker[str] = LeakTracker(WINDOW)
    flagged: Dict[str, Tuple[float, int]] = {}
    leaks = {s.name for s in sites if s.leak_start is not None}
    highest, highest_site = 0.0, "-"
    cycles = int(hours * HOUR / CYCLE)
    for i in range(1, cycles + 1):
        now = i * CYCLE
        observations: Dict[str, Observation] = {}
        ages: Dict[str, Ages] = {}
        for s in sites:
            s.step(s, now, sampler)
            s.cohorts = [c for c in s.cohorts if c.death > now]
            observations[s.name], ages[s.name] = sampler.observe_cohorts(s.cohorts, now)
        for k, (rate, life, size) in enumerate(churn):
            lam = rate * life / size
            p = sampler.p(size)
            n_live = sampler.poisson(lam * p)
            n_old = sampler.binomial(n_live, math.exp(-OLD_AGE / life))
            w = size / p
            var = size**2 * (1 - p) / p**2
            name = f"churn {k}"
            observations[name] = Observation(now, n_live * w, n_old * w, n_live * var, n_old * var)
            # Its young blocks one epoch old, its old ones 8 to 15 (a
            # lifetime of 20 s at most leaves few older).
            histogram = [0.0] * AGE_BUCKETS
            variances = [0.0] * AGE_BUCKETS
            histogram[1], histogram[OLD_BUCKET] = (n_live - n_old) * w, n_old * w
            variances[1], variances[OLD_BUCKET] = (n_live - n_old) * var, n_old * var
            ages[name] = Ages(tuple(histogram), tuple(variances), n_live / p, i)
        tracker.observe(now, observations, ages)
        if i % 6 and not leaks - set(flagged):
            continue  # the whole table once a minute; leak sites every cycle
        scores = (
            tracker.scores()
            if i % 6 == 0
            else {name: s for name, s in tracker.scores().items() if name in leaks}
        )
        order = sorted(scores, key=lambda n: (scores[n].score, scores[n].rate), reverse=True)
        for name in leaks - set(flagged):
            if name in scores and scores[name].score >= FLAG:
                start = next(s.leak_start for s in sites if s.name == name)
                assert start is not None
                flagged[name] = (now - start, order.index(name) + 1)
        for name, found in scores.items():
            if name not in leaks and found.score > highest:
                highest, highest_site = found.score, name
    return Outcome(
        scenario,
        mode,
        [(n, *flagged.get(n, (None, None))) for n in sorted(leaks)],
        highest,
        highest_site,
    )


def _minutes(seconds: float | None) -> str:
    return "not flagged" if seconds is None else f"{seconds / 60:.1f} min"


def table(outcomes: List[Outcome], hours: float) -> Iterator[str]:
    yield f"window {WINDOW / 60:.0f} min, cycles {CYCLE:.0f} s, old = {OLD_AGE:.0f} s and more, "
    yield f"{hours:g} h simulated per scenario; flagged: score >= {FLAG}"
    yield ""
    modes = list(dict.fromkeys(o.mode for o in outcomes))
    names = {"exact": "exact", "sample": "sample (512 KiB)"}
    yield "| scenario | site | " + " | ".join(names[m] for m in modes) + " |"
    yield "|---|---|" + "---|" * len(modes)
    by: Dict[Tuple[str, str], Outcome] = {(o.scenario, o.mode): o for o in outcomes}
    for scenario in dict.fromkeys(o.scenario for o in outcomes):
        cells: Dict[str, List[str]] = {}
        for mode in modes:
            o = by[(scenario, mode)]
            for name, seconds, rank in o.flagged:
                rank_s = f", rank {rank}" if rank is not None else ""
                cells.setdefault(name, []).append(f"{_minutes(seconds)}{rank_s}")
            cells.setdefault("highest non-leak", []).append(f"{o.highest:.2f} ({o.highest_site})")
        for name, values in cells.items():
            yield f"| {scenario} | {name} | " + " | ".join(values) + " |"


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--modes", default="exact,sample")
    parser.add_argument("--seed", type=int, default=1)
    real = parser.add_argument_group("real processes (--real: benchmarks/leaks_real.py)")
    real.add_argument("--real", action="store_true", help="run each scenario as a real process")
    real.add_argument("--seeds", type=int, default=3, help="runs per scenario and mode")
    real.add_argument("--jobs", type=int, default=2, help="processes at a time")
    real.add_argument("--window", default="20s", help="HEAPWATCH_LEAK_WINDOW")
    real.add_argument("--interval", type=float, default=0.5, help="HEAPWATCH_INTERVAL")
    real.add_argument("--sample-interval", default="64KiB", help="HEAPWATCH_SAMPLE_INTERVAL")
    real.add_argument("--duration", type=float, default=60.0, help="real seconds a run, at most")
    real.add_argument("--dumps", type=int, default=0, help="dumps a run takes of itself")
    real.add_argument("--dump-every", type=float, default=5.0, help="seconds between dumps")
    args = parser.parse_args(argv)
    if args.real:
        # Only here: it needs the built core, the simulated bank does not.
        import leaks_real

        hours = {name: args.hours + (1.0 if name in LATE else 0.0) for name in SCENARIOS}
        return leaks_real.main(args, hours)
    outcomes = []
    for scenario in args.scenarios.split(","):
        for mode in args.modes.split(","):
            hours = args.hours + (1.0 if scenario in LATE else 0.0)
            outcome = run(scenario, mode, hours, args.seed)
            print(f"# {scenario} {mode}: {outcome}", file=sys.stderr, flush=True)
            outcomes.append(outcome)
    for line in table(outcomes, args.hours):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
