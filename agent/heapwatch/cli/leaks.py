"""``heapwatch leaks DUMP DUMP...``: the leak suspects of one process from a
series of its dumps, scored by the agent's own scorer
(``heapwatch.formats.leaks``) over the agent's window (``--window``) and
shown as ``/debug/heapwatch/leaks`` shows them.

The agent scores a site each cycle from its live bytes and its bytes at
least ``OLD_EPOCHS`` cycles old.  A dump holds each live trace's age, so the
dumps say what part of those series survived: at the start of epoch k, the
traces of a later dump recorded before k were live, and those recorded
before k - OLD_EPOCHS were old.  The series rebuilt so are lower bounds,
exact for memory never freed (a leak); the dumps of one process give the
tightest (the highest) of them.  Where they are not exact, what survived
cannot tell a leak from a cache that evicts its oldest entries (both leave
memory of every age): so a site's series is rebuilt over the whole window,
before the first dump too, only when its dumps show it kept what it held
(``kept_what_it_held``: of its old memory at the first dump, the last
still holds all but a leak's share, and enough was born since that a
cache's deaths would have shown).  Two dumps minutes apart score a leak
as the agent does.  The other sites are scored from the first dump on,
when every span holds a dump before the last (a later dump shows what was
freed since an earlier one); the report's notes say which dumps would
score them.  The agent also scores each site's bytes by age at its last
cycle (its history beyond the window): the last epoch gets the last
dump's, which are those.  Epochs are dated by the dumps' clocks (when each
began), between two dumps linearly, before the first at the agent's
interval; the dumps themselves by when they were taken.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
from typing import TYPE_CHECKING, Any, NamedTuple

from heapwatch.agent.config import DEFAULTS, parse_leak_window
from heapwatch.cli.dump_input import (
    InputError,
    add_inflate_option,
    format_when,
    limit_type,
    parsed_by,
    print_text,
    run_guarded,
)
from heapwatch.formats.dump import AgeClock, DumpHeader, iter_dump, sniff
from heapwatch.formats.estimates import round_count, weigher
from heapwatch.formats.leak_report import (
    LeakReport,
    format_leaks_text,
    leaks_to_json,
    suspect_of,
)
from heapwatch.formats.leaks import (
    FLOOR_BYTES,
    OLD_EPOCHS,
    SHORTEST_SPAN,
    SUSPECT,
    LeakScore,
    LeakTracker,
    Observation,
    kept_what_it_held,
    observe_ages,
    observe_site,
    rank_scores,
)

if TYPE_CHECKING:
    from heapwatch._core import Frames

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["AgedDump", "Scored", "add_parser", "read_aged", "score_dumps"]

Site = tuple[str, int]


class AgedDump(NamedTuple):
    path: str
    header: DumpHeader
    clock: AgeClock
    by_epoch: dict[Site, tuple[list[int], list[int]]]
    """Per site: the epochs its live traces were recorded in (ascending) and
    the bytes recorded up to each of them (a running sum)."""
    tracebacks: dict[Frames, tuple[int, int, list[int]]]
    """Per traceback: bytes, blocks and bytes by age bucket."""
    ages: dict[Site, tuple[list[int], int]]
    """Per site: bytes by age bucket and blocks, as the agent's groups."""


def _age_buckets() -> int:
    # The core's, its one home (the rule: bucket 0 for age 0, b for [2**(b-1), 2**b)).
    from heapwatch import _core  # noqa: PLC0415 (the C core: only when used)

    return _core.AGE_BUCKETS


def read_aged(path: str, max_inflate_ratio: float | None) -> AgedDump:
    """A dump's live memory by site and by traceback with its ages; an
    InputError for a file whose traces carry none."""
    if sniff(path) == "pickle":
        raise InputError(f"{path}: a pickle: its traces carry no ages (the agent's dumps do)")
    ratio = {} if max_inflate_ratio is None else {"max_inflate_ratio": max_inflate_ratio}
    header, pairs = iter_dump(path, ages=True, **ratio)
    clock = header.ages
    if clock is None:
        pairs.close()  # type: ignore[attr-defined]
        raise InputError(
            f"{path}: its traces carry no ages (a dump written before format 1.1): "
            "heapwatch leaks reads the agent's dumps"
        )
    weigh = weigher(header.mode, header.sample_interval)  # type: ignore[arg-type]
    nbuckets = _age_buckets()
    epochs: dict[Site, dict[int, int]] = {}
    sums: dict[Frames, list[Any]] = {}
    by_site: dict[Site, list[Any]] = {}
    for trace, age in pairs:
        assert age is not None  # a dump with ages gives one per trace
        size, count_fp = weigh(trace[1])
        frames = trace[2]
        site = frames[0]
        epoch = clock.epoch - age
        per = epochs.setdefault(site, {})
        per[epoch] = per.get(epoch, 0) + size
        row = sums.get(frames)
        if row is None:
            row = sums[frames] = [0, 0, [0] * nbuckets]
        bucket = min(age.bit_length(), nbuckets - 1)
        row[0] += size
        row[1] += count_fp
        row[2][bucket] += size
        aged_row = by_site.get(site)
        if aged_row is None:
            aged_row = by_site[site] = [[0] * nbuckets, 0]
        aged_row[0][bucket] += size
        aged_row[1] += count_fp
    by_epoch: dict[Site, tuple[list[int], list[int]]] = {}
    for site, per in epochs.items():
        ordered = sorted(per)
        running, total = [], 0
        for epoch in ordered:
            total += per[epoch]
            running.append(total)
        by_epoch[site] = (ordered, running)
    tracebacks = {frames: (row[0], round_count(row[1]), row[2]) for frames, row in sums.items()}
    # Blocks summed, then rounded: a line's count as the core's groups give it.
    ages = {site: (row[0], round_count(row[1])) for site, row in by_site.items()}
    return AgedDump(path, header, clock, by_epoch, tracebacks, ages)


def _recorded_by(dump: AgedDump, site: Site, epoch: int) -> int:
    """Bytes of the site's live traces in ``dump`` recorded in ``epoch`` or before."""
    series = dump.by_epoch.get(site)
    if series is None:
        return 0
    index = bisect.bisect_right(series[0], epoch)
    return series[1][index - 1] if index else 0


def _process(dump: AgedDump) -> tuple[int, str | None]:
    return dump.header.pid, dump.header.extra.get("hostname")


def _checked(dumps: list[AgedDump]) -> list[AgedDump]:
    first = dumps[0]
    for dump in dumps[1:]:
        if _process(dump) != _process(first):
            pid, host = _process(dump)
            raise InputError(
                f"{dump.path} is a dump of pid {pid} on {host or 'an unknown host'}, "
                f"{first.path} of pid {first.header.pid} on "
                f"{first.header.extra.get('hostname') or 'an unknown host'}: heapwatch leaks "
                "reads a series of dumps of one process"
            )
        if (dump.header.mode, dump.header.sample_interval) != (
            first.header.mode,
            first.header.sample_interval,
        ):
            raise InputError(
                f"{dump.path} was taken in {dump.header.mode} mode, {first.path} in "
                f"{first.header.mode} mode (or at another sample interval): not one series"
            )
    dumps = sorted(dumps, key=lambda d: (d.clock.epoch, d.header.timestamp))
    last = dumps[-1]
    if not last.clock.interval > 0:
        raise InputError(
            f"{last.path}: its epochs are of unknown length (no agent cycled them): "
            "they cannot be dated"
        )
    return dumps


class _Dates:
    """When each epoch began: between two dumps' epochs linearly (before the
    first dump's at the agent's interval, for a clock that went back)."""

    def __init__(self, dumps: list[AgedDump]) -> None:
        self.epochs: list[int] = []
        self.times: list[float] = []
        for dump in dumps:
            epoch, started = dump.clock.epoch, dump.clock.started
            if self.epochs and (epoch <= self.epochs[-1] or started <= self.times[-1]):
                continue  # the same epoch again, or a clock that went back
            self.epochs.append(epoch)
            self.times.append(started)
        self.interval = dumps[-1].clock.interval

    def __call__(self, epoch: int) -> float:
        if epoch <= self.epochs[0]:
            return self.times[0] - (self.epochs[0] - epoch) * self.interval
        index = bisect.bisect_left(self.epochs, epoch)
        e0, e1 = self.epochs[index - 1], self.epochs[index]
        t0, t1 = self.times[index - 1], self.times[index]
        return t0 + (t1 - t0) * (epoch - e0) / (e1 - e0)


def _window(window: float | None, last: AgedDump) -> float:
    if window is not None:
        return float(window)
    try:  # the agent's own, which its dumps record
        return parse_leak_window(last.header.extra.get("leak_window", ""))
    except ValueError:
        return DEFAULTS.leak_window


def _kept(first: AgedDump, last: AgedDump, site: Site, interval: int) -> bool:
    """Whether the dumps show the site keeping the memory it held at the
    first of them (``kept_what_it_held``): its old bytes then, what of them
    the last still holds, and the bytes born since that the last holds old."""
    cut = first.clock.epoch - OLD_EPOCHS
    held = _recorded_by(first, site, cut)
    still = _recorded_by(last, site, cut)
    born = _recorded_by(last, site, last.clock.epoch - OLD_EPOCHS) - still
    histogram, blocks = last.ages.get(site, ((), 0))
    block = sum(histogram) / blocks if blocks else 0.0
    return kept_what_it_held(held, still, born, interval, block)


def _scores(
    dumps: list[AgedDump],
    date: _Dates,
    sites: set[Site],
    *,
    epochs: range,
    window: float,
    interval: int,
) -> dict[Site, LeakScore]:
    """The sites' scores, the tracker fed the epochs' rebuilt observations
    as the agent's cycles fed it."""
    last, end = dumps[-1], epochs[-1]
    tracker: LeakTracker[Site] = LeakTracker(window)
    previous = -math.inf
    for epoch in epochs:
        at = max(date(epoch), previous + 1e-6)
        previous = at
        later = [dump for dump in dumps if dump.clock.epoch >= epoch]
        observations: dict[Site, Observation] = {}
        for site in sites:
            live = max(_recorded_by(dump, site, epoch - 1) for dump in later)
            old = max(_recorded_by(dump, site, epoch - OLD_EPOCHS) for dump in later)
            if live or old:
                observations[site] = observe_site(at, live, old, interval)
        # The ages of the last epoch are the last dump's, as the agent's
        # cycle had them (only the last cycle's are scored).
        ages = None
        if epoch == end:
            ages = {
                site: observe_ages(histogram, blocks, end, interval)
                for site, (histogram, blocks) in last.ages.items()
                if site in observations
            }
        tracker.observe(at, observations, ages)
    return tracker.scores()


class Scored(NamedTuple):
    """What a series of dumps of one process scores."""

    dumps: list[AgedDump]
    """The dumps, oldest first."""
    scores: dict[Site, LeakScore]
    window: float
    notes: list[str]


def score_dumps(dumps: list[AgedDump], window: float | None = None) -> Scored:
    """The leak score of each line of ``dumps`` (two or more of one
    process, in any order), over ``window`` seconds or the agent's window
    its dumps record; an InputError when they are not such a series."""
    dumps = _checked(dumps)
    first, last = dumps[0], dumps[-1]
    date = _Dates(dumps)
    end = last.clock.epoch
    seconds = _window(window, last)
    notes = [
        f"{len(dumps)} dumps of pid {last.header.pid}, from "
        f"{format_when({'timestamp': first.header.timestamp})} to "
        f"{format_when({'timestamp': last.header.timestamp})}; "
        "the epochs from the ages of what survived"
    ]
    if not date(end) > date(first.clock.epoch):
        raise InputError(f"{last.path}: the dumps cover no time (epoch {end}): nothing to score")
    sites = {
        site
        for dump in dumps
        for site, (_epochs, running) in dump.by_epoch.items()
        if running[-1] >= FLOOR_BYTES
    }
    interval = last.header.sample_interval if last.header.mode == "sample" else 0
    start = max(0, end - math.ceil(seconds / date.interval) - 1)
    # Before a dump, only what survived to it is known: the whole of a
    # leak's memory, but of a cache that evicts only its youngest entries,
    # which would grow there like a leak.  A site's memory is read so only
    # when the dumps show it kept what it held; the others are scored from
    # the first dump on, as the dumps show what was freed between them.
    known = {site for site in sites if _kept(first, last, site, interval)}
    scores = _scores(
        dumps, date, known, epochs=range(start, end + 1), window=seconds, interval=interval
    )
    unknown = sites - known
    if unknown:
        scores.update(
            _score_since_first(dumps, date, unknown, window=seconds, interval=interval, notes=notes)
        )
    return Scored(dumps, scores, seconds, notes)


def _leaks(options: argparse.Namespace) -> int:
    if len(options.dumps) < 2:
        options.parser.error(
            f"needs at least 2 dumps of one process (a series), got {len(options.dumps)}"
        )
    scored = score_dumps(
        [read_aged(path, options.max_inflate_ratio) for path in options.dumps], options.window
    )
    dumps, scores, window, notes = scored
    last = dumps[-1]
    interval = last.header.sample_interval if last.header.mode == "sample" else 0
    suspects = rank_scores(scores.items(), SUSPECT)[: options.limit]
    rows: dict[Site, list[Any]] = {site: [] for site, _score in suspects}
    for frames, (size, count, histogram) in last.tracebacks.items():
        if frames[0] in rows:
            rows[frames[0]].append((frames, size, count, histogram))
    at = last.header.timestamp
    report = LeakReport(
        tuple(
            suspect_of(
                site, (s.score, s.rate, s.series, s.span), rows[site], clock=last.clock, at=at
            )
            for site, s in suspects
        ),
        window,
        SUSPECT,
        last.header.mode,
        interval,
        notes=tuple(notes),
        meta={"files": [dump.path for dump in dumps], "pid": last.header.pid},
    )
    if options.json:
        print_text(json.dumps(leaks_to_json(report)) + "\n")
    else:
        print_text(format_leaks_text(report))
    return 0


def _score_since_first(
    dumps: list[AgedDump],
    date: _Dates,
    sites: set[Site],
    *,
    window: float,
    interval: int,
    notes: list[str],
) -> dict[Site, LeakScore]:
    """The scores of the sites whose memory before the first dump is not
    known, from the first dump on, with a note of what would score them.
    Every span scored must hold a dump before the last: after it, only the
    last dump's survivors are known."""
    first, last = dumps[0], dumps[-1]
    taken = [dump.header.timestamp for dump in dumps]
    gap = date(last.clock.epoch) - date(dumps[-2].clock.epoch)
    covered = date(last.clock.epoch) - date(first.clock.epoch)
    shortest = SHORTEST_SPAN * window
    lines = f"{len(sites)} line{'s' if len(sites) > 1 else ''}"
    why = (
        f"{lines} freed memory held at the first dump, or kept too little since to tell: "
        "scored from the first dump on"
    )
    if gap > shortest:
        notes.append(
            f"{why}, not at all: the last two dumps were taken {taken[-1] - taken[-2]:.1f}s "
            f"apart, more than {SHORTEST_SPAN:g} of the {window:g}s window (what was freed "
            f"between them is not known); dumps at most {shortest:.1f}s apart would score them"
        )
        return {}
    if covered < shortest:
        notes.append(
            f"{why}, not at all: the dumps cover {taken[-1] - taken[0]:.1f}s, under "
            f"{SHORTEST_SPAN:g} of the {window:g}s window; dumps over {shortest:.1f}s or more "
            "would score them"
        )
        return {}
    notes.append(why)
    epochs = range(first.clock.epoch, last.clock.epoch + 1)
    return _scores(dumps, date, sites, epochs=epochs, window=window, interval=interval)


_window_type = parsed_by(parse_leak_window, "duration")


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "leaks",
        help="the leak suspects of a process, from a series of its dumps",
        description="Scores each line of DUMP... (dumps of one process, taken over time by its "
        "agent) as the agent scores leaks, and shows the suspects like /debug/heapwatch/leaks: "
        "their rate, live memory, its ages and the tracebacks holding it.",
    )
    parser.add_argument("dumps", metavar="DUMP", nargs="+", help="the agent's dumps, 2 or more")
    parser.add_argument(
        "--window",
        type=_window_type,
        metavar="DURATION",
        help="the leak score's window (default: the agent's HEAPWATCH_LEAK_WINDOW, which its "
        "dumps record); it may reach before the first dump",
    )
    parser.add_argument(
        "--limit", type=limit_type, default=10, metavar="N", help="suspects shown (default 10)"
    )
    parser.add_argument("--json", action="store_true", help="JSON instead of text")
    add_inflate_option(parser)  # no --allow-pickle: a pickle carries no ages
    parser.set_defaults(func=run_guarded, command=_leaks)
