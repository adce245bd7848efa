"""Pure-Python grouping of raw traces: the path of hand-built and loaded snapshots.

It follows the stdlib's ``Snapshot._group_by`` (keys, cumulative counting of
every frame, repeats included) and weighs each trace as the C core does
(``heapwatch.formats.estimates``), so that for the same traces this path and
``_core.Snapshot.group()`` give identical statistics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from heapwatch.formats.estimates import Weigh, round_count, weigher
from heapwatch.tracemalloc.objects import Statistic, Traceback

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from heapwatch._core import Frames, KeyType, Mode, RawTrace

__all__ = ["Grouped", "group_counted", "group_traces"]


class Grouped(NamedTuple):
    by_traceback: dict[Traceback, Statistic]
    total: tuple[int, int]
    """The traces' own (size, count): a cumulative grouping counts a block
    under each of its frames, this once."""


def group_counted(
    traces: Iterable[RawTrace], key_type: KeyType, cumulative: bool, mode: Mode, interval: int
) -> Grouped:
    """group_traces() of traces sampled (or not) as ``mode`` says, with their
    total counted in the same pass: the traces may be a stream."""
    weigh = weigher(mode, interval)
    total = [0, 0]

    def counted() -> Iterator[RawTrace]:
        for trace in traces:
            size, count_fp = weigh(trace[1])
            total[0] += size
            total[1] += count_fp
            yield trace

    grouped = group_traces(counted(), key_type, cumulative, weigh)
    return Grouped(grouped, (total[0], round_count(total[1])))


def group_traces(
    traces: Iterable[RawTrace], key_type: KeyType, cumulative: bool, weigh: Weigh
) -> dict[Traceback, Statistic]:
    """The traces' statistics grouped by key_type, keyed by their Traceback.

    Sums are kept per raw key, so a Traceback is built once per group, not
    once per trace.  key_type and cumulative must have passed check_key_type().
    """
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
            # As the stdlib: every frame counts, a repeated frame each time.
            for filename, lineno in frames:
                add(((filename, 0 if by_filename else lineno),), est_size, count_fp)
        elif key_type == "traceback":
            add(frames, est_size, count_fp)
        else:
            filename, lineno = frames[0]
            add(((filename, 0 if by_filename else lineno),), est_size, count_fp)
    grouped = {}
    for key, (size_sum, count_fp_sum) in sums.items():
        traceback = Traceback(key)
        grouped[traceback] = Statistic(traceback, size_sum, round_count(count_fp_sum))
    return grouped
