"""Pure-Python grouping of raw traces: the path of hand-built and loaded snapshots.

The sums are the rows' (``heapwatch.formats.rows.sum_traces``: the stdlib's
``Snapshot._group_by`` keys, every trace weighed as the C core weighs it), so
that for the same traces this path, ``_core.Snapshot.group()`` and every
report give identical statistics; here they become the drop-in's objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from heapwatch.formats.estimates import Weigh, round_count
from heapwatch.formats.rows import sum_traces
from heapwatch.tracemalloc.objects import Statistic, Traceback

if TYPE_CHECKING:
    from collections.abc import Iterable

    from heapwatch._core import KeyType, RawTrace

__all__ = ["group_traces"]


def group_traces(
    traces: Iterable[RawTrace], key_type: KeyType, cumulative: bool, weigh: Weigh
) -> dict[Traceback, Statistic]:
    """The traces' statistics grouped by key_type, keyed by their Traceback.

    A Traceback is built once per group, not once per trace.  key_type and
    cumulative must have passed check_key_type().
    """
    grouped = {}
    for key, (size_sum, count_fp_sum) in sum_traces(traces, key_type, cumulative, weigh).items():
        traceback = Traceback(key)
        grouped[traceback] = Statistic(traceback, size_sum, round_count(count_fp_sum))
    return grouped
