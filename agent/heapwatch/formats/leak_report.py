"""The leaks report, as text or JSON: one layout for the agent's
``/debug/heapwatch/leaks`` and the ``heapwatch leaks`` command.

Each suspect is a line, ranked by its leak score (``heapwatch.formats.leaks``)
then its rate, with its live memory, that memory's age profile and the
tracebacks holding it.  A suspect is built from rows shaped as the core's
``Groups.ages()`` rows of a grouping by traceback: ``(frames, size, count,
histogram)``, the histogram in the core's age buckets (bucket 0 for age 0,
bucket b for ages in [2**(b-1), 2**b)).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from heapwatch.formats.report import _kib, sample_note, source_line

if TYPE_CHECKING:
    from heapwatch._core import Frames
    from heapwatch.formats.dump import AgeClock

__all__ = [
    "AgeBand",
    "AgesRow",
    "LeakReport",
    "LeakSuspect",
    "format_leaks_text",
    "leaks_to_json",
    "suspect_of",
]

# (frames, size, count, histogram): a row of Groups.ages()
AgesRow = tuple["Frames", int, int, Sequence[int]]


class AgeBand(NamedTuple):
    """Live bytes whose age is ``low`` to ``high`` epochs; ``min_seconds``:
    how old they are at least (None without a clock)."""

    low: int
    high: int
    min_seconds: float | None
    size: int


class LeakSuspect(NamedTuple):
    filename: str
    lineno: int
    score: float
    rate: float
    """Bytes per second."""
    series: str
    """Which series scored: "old" (memory that survived), "live", or "ages"
    (the ages of the site's memory now, its history beyond the window)."""
    span: float
    """Seconds of history the score was found over."""
    size: int
    blocks: int
    ages: tuple[AgeBand, ...]
    tracebacks: tuple[tuple[Frames, int, int], ...]
    """(frames, size, count) of the tracebacks holding the live memory, biggest first."""


class LeakReport(NamedTuple):
    suspects: tuple[LeakSuspect, ...]
    window: float
    threshold: float
    mode: str
    sample_interval: int
    notes: tuple[str, ...] = ()
    meta: Mapping[str, Any] = {}


def _bands(histogram: Sequence[int], clock: AgeClock | None, at: float) -> tuple[AgeBand, ...]:
    bands = []
    for bucket, size in enumerate(histogram):
        if size <= 0:
            continue
        low = 0 if bucket == 0 else 1 << (bucket - 1)
        high = 0 if bucket == 0 else (1 << bucket) - 1
        seconds = None if clock is None else clock.min_seconds(low, at)
        bands.append(AgeBand(low, high, seconds, size))
    return tuple(bands)


def suspect_of(
    site: tuple[str, int],
    score: tuple[float, float, str, float],
    rows: Iterable[AgesRow],
    *,
    clock: AgeClock | None,
    at: float,
    tracebacks: int = 5,
) -> LeakSuspect:
    """The suspect ``site`` of ``score`` (score, rate, series, span), from
    the rows of the tracebacks whose most recent frame is that line."""
    mine = sorted(rows, key=lambda row: (row[1], row[2]), reverse=True)
    size = sum(row[1] for row in mine)
    count = sum(row[2] for row in mine)
    histogram: list[int] = []
    for row in mine:
        if len(histogram) < len(row[3]):
            histogram.extend([0] * (len(row[3]) - len(histogram)))
        for bucket, part in enumerate(row[3]):
            histogram[bucket] += part
    value, rate, series, span = score
    return LeakSuspect(
        site[0],
        site[1],
        value,
        rate,
        series,
        span,
        size,
        count,
        _bands(histogram, clock, at),
        tuple((row[0], row[1], row[2]) for row in mine[:tracebacks]),
    )


def _ages(band: AgeBand) -> str:
    epochs = str(band.low) if band.low == band.high else f"{band.low}-{band.high}"
    old = "" if band.min_seconds is None or band.low == 0 else f" (>= {band.min_seconds:.0f}s)"
    return f"{epochs}{old}: {_kib(band.size)}"


def format_leaks_text(report: LeakReport, *, sources: bool = True) -> str:
    """The report as lines of text ending in a newline; ``sources`` adds each
    suspect's source line."""
    lines = []
    if report.mode == "sample":
        lines.append(sample_note(report.sample_interval))
    lines.extend(f"# {note}" for note in report.notes)
    lines.append(
        f"Leak suspects (score >= {report.threshold:.2f} over a {report.window:g}s window): "
        f"{len(report.suspects)}"
    )
    for rank, suspect in enumerate(report.suspects, 1):
        lines.append(
            f"#{rank}: {suspect.filename}:{suspect.lineno}: score {suspect.score:.2f}, "
            f"{_kib(round(suspect.rate))}/s, {_kib(suspect.size)} live in {suspect.blocks} blocks"
        )
        line = source_line(suspect.filename, suspect.lineno) if sources else ""
        if line:
            lines.append(f"    {line}")
        if suspect.ages:
            lines.append("    ages in epochs: " + ", ".join(_ages(band) for band in suspect.ages))
        for frames, size, count in suspect.tracebacks:
            lines.append(f"    {_kib(size)} in {count} blocks:")
            lines.extend(f"      {filename}:{lineno}" for filename, lineno in frames)
    return "\n".join(lines) + "\n"


def leaks_to_json(report: LeakReport, *, sources: bool = True) -> dict[str, Any]:
    """The report as JSON-ready data: bytes, bytes per second, seconds."""
    suspects = []
    for rank, suspect in enumerate(report.suspects, 1):
        line = source_line(suspect.filename, suspect.lineno) if sources else ""
        suspects.append(
            {
                "rank": rank,
                "filename": suspect.filename,
                "lineno": suspect.lineno,
                "score": suspect.score,
                "rate": suspect.rate,
                "series": suspect.series,
                "span": suspect.span,
                "size": suspect.size,
                "count": suspect.blocks,
                "source": line or None,
                "ages": [band._asdict() for band in suspect.ages],
                "tracebacks": [
                    {"size": size, "count": count, "traceback": [[f, n] for f, n in frames]}
                    for frames, size, count in suspect.tracebacks
                ],
            }
        )
    return {
        "kind": "leaks",
        "window": report.window,
        "threshold": report.threshold,
        "mode": report.mode,
        "sample_interval": report.sample_interval,
        "estimates": report.mode == "sample",
        "notes": list(report.notes),
        "meta": dict(report.meta),
        "suspects": suspects,
    }
