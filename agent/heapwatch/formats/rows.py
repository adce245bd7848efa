"""Rows: the one shape of grouped memory, from the core to every report.

A row is the core's raw statistic, ``(frames, size, count)`` with frames
most recent first (``_core.pyi``), and a difference row its raw diff,
``(frames, size, size_diff, count, count_diff)``.  ``_core.Groups`` returns
them for a live snapshot; ``group_rows`` builds the same from raw traces (a
dump, a pickle, a selection by age) in the stdlib's grouping and the core's
weights (``heapwatch.formats.estimates``), and ``compare_rows`` diffs them.
``/debug/heapwatch/top``, ``heapwatch top``/``diff``, the page and the HTML
report all render rows; the drop-in's ``Statistic`` objects are built from
the same sums (``heapwatch.tracemalloc.grouping``) and never turned back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from heapwatch.formats.estimates import Weigh, round_count, weigher

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from heapwatch._core import Frames, KeyType, Mode, RawDiff, RawStatistic, RawTrace

__all__ = [
    "NO_ROUTE",
    "GroupedRows",
    "compare_rows",
    "group_route_rows",
    "group_rows",
    "route_rows",
    "sort_rows",
    "sum_traces",
]

NO_ROUTE = "<none>"
"""The name of memory allocated outside any request (route id 0), as the
agent's registry names it (issue 26)."""


class GroupedRows(NamedTuple):
    rows: list[RawStatistic]
    """Every group, biggest first, in the order of ``Snapshot.statistics()``."""
    total: tuple[int, int]
    """The traces' own (size, count): a cumulative grouping counts a block
    under each of its frames, this once."""


def sum_traces(
    traces: Iterable[RawTrace], key_type: KeyType, cumulative: bool, weigh: Weigh
) -> dict[Frames, list[int]]:
    """[estimated size, fixed-point count] of each group's key, as the
    stdlib's ``Snapshot._group_by`` keys them (cumulative: every frame, a
    repeated one each time); key_type and cumulative are already checked."""
    sums: dict[Frames, list[int]] = {}

    def add(key: Frames, est_size: int, count_fp: int) -> None:
        acc = sums.get(key)
        if acc is None:
            sums[key] = [est_size, count_fp]
        else:
            acc[0] += est_size
            acc[1] += count_fp

    by_filename = key_type == "filename"
    for _domain, size, frames, _total_nframe in traces:
        est_size, count_fp = weigh(size)
        if cumulative:
            for filename, lineno in frames:
                add(((filename, 0 if by_filename else lineno),), est_size, count_fp)
        elif key_type == "traceback":
            add(frames, est_size, count_fp)
        else:
            filename, lineno = frames[0]
            add(((filename, 0 if by_filename else lineno),), est_size, count_fp)
    return sums


def _statistic_key(row: RawStatistic) -> tuple[int, int, Frames]:
    # The drop-in's Traceback compares its frames oldest first.
    return (row[1], row[2], row[0][::-1])


def sort_rows(rows: Iterable[RawStatistic]) -> list[RawStatistic]:
    """Biggest first, by size, count and traceback, as ``Snapshot.statistics()``."""
    return sorted(rows, key=_statistic_key, reverse=True)


def group_rows(
    traces: Iterable[RawTrace], key_type: KeyType, cumulative: bool, mode: Mode, interval: int
) -> GroupedRows:
    """The rows of traces sampled (or not) as ``mode`` says, with their total
    counted in the same pass: the traces may be a stream."""
    weigh = weigher(mode, interval)
    total = [0, 0]

    def counted() -> Iterator[RawTrace]:
        for trace in traces:
            size, count_fp = weigh(trace[1])
            total[0] += size
            total[1] += count_fp
            yield trace

    sums = sum_traces(counted(), key_type, cumulative, weigh)
    rows = sort_rows((key, size, round_count(count_fp)) for key, (size, count_fp) in sums.items())
    return GroupedRows(rows, (total[0], round_count(total[1])))


def route_rows(sums: Iterable[tuple[str, int, int]]) -> GroupedRows:
    """The rows of (route name, bytes, blocks) items, summed by name, each
    keyed ``((name, 0),)`` as a file's row is: a top by route."""
    by_name: dict[str, list[int]] = {}
    for name, size, count in sums:
        acc = by_name.setdefault(name, [0, 0])
        acc[0] += size
        acc[1] += count
    rows = sort_rows((((name, 0),), size, count) for name, (size, count) in by_name.items())
    return GroupedRows(rows, (sum(r[1] for r in rows), sum(r[2] for r in rows)))


def group_route_rows(
    traces: Iterable[RawTrace],
    routes: Iterable[int],
    names: Mapping[int, str],
    mode: Mode,
    interval: int,
) -> GroupedRows:
    """The rows by route of traces (a dump's, with each one's route id and
    the ids' names), weighed as ``group_rows`` weighs them."""
    weigh = weigher(mode, interval)
    sums: dict[str, list[int]] = {}
    for trace, route in zip(traces, routes):
        size, count_fp = weigh(trace[1])
        name = names.get(route, NO_ROUTE) if route else NO_ROUTE
        acc = sums.setdefault(name, [0, 0])
        acc[0] += size
        acc[1] += count_fp
    return route_rows(
        (name, size, round_count(count_fp)) for name, (size, count_fp) in sums.items()
    )


def _diff_key(row: RawDiff) -> tuple[int, int, int, int, Frames]:
    frames, size, size_diff, count, count_diff = row
    return (abs(size_diff), size, abs(count_diff), count, frames[::-1])


def compare_rows(old: Sequence[RawStatistic], new: Sequence[RawStatistic]) -> list[RawDiff]:
    """One difference row per key of either side, biggest change first, as
    ``Snapshot.compare_to()`` orders them."""
    before = {frames: (size, count) for frames, size, count in old}
    diffs: list[RawDiff] = []
    for frames, size, count in new:
        old_size, old_count = before.pop(frames, (0, 0))
        diffs.append((frames, size, size - old_size, count, count - old_count))
    diffs.extend((frames, 0, -size, 0, -count) for frames, (size, count) in before.items())
    return sorted(diffs, key=_diff_key, reverse=True)
