"""The drop-in's statistics as the core's raw tuples, most recent frame first
(``_core.pyi``): what ``heapwatch.formats.report`` renders."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from heapwatch._core import Frames, RawDiff, RawStatistic
    from heapwatch.tracemalloc.objects import Statistic, StatisticDiff, Traceback

__all__ = ["frames_of", "raw_diffs", "raw_statistics"]


def frames_of(traceback: Traceback) -> Frames:
    """A ``heapwatch.tracemalloc.Traceback``'s frames in raw order (most recent first)."""
    return tuple((frame.filename, frame.lineno) for frame in reversed(traceback))


def raw_statistics(stats: Iterable[Statistic]) -> list[RawStatistic]:
    return [(frames_of(s.traceback), s.size, s.count) for s in stats]


def raw_diffs(diffs: Iterable[StatisticDiff]) -> list[RawDiff]:
    return [(frames_of(d.traceback), d.size, d.size_diff, d.count, d.count_diff) for d in diffs]
