"""Snapshot: a frozen set of traces, and statistics over them.

A Snapshot has one of two backings:

* core-backed (take_snapshot()): a ``_core.Snapshot`` plus an optional mask,
  one byte per core traceback, non-zero to keep it.  statistics() and
  compare_to() run in C, filter_traces() evaluates the filters once per
  distinct traceback and narrows the mask, and ``traces`` is built only when
  read.  Snapshots filtered from one another share the core snapshot.
* hand-built (``Snapshot(traces, traceback_limit)``, load()): a sequence of
  raw trace tuples, grouped in Python with the stdlib's semantics and the
  core's weights (see heapwatch.formats.estimates), so that both backings agree exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from heapwatch import _core
from heapwatch.formats.estimates import weigher
from heapwatch.tracemalloc.checks import check_key_type, check_mode, check_sample_interval
from heapwatch.tracemalloc.dump import SnapshotParts, read_parts, write_parts
from heapwatch.tracemalloc.filters import BaseFilter, DomainFilter, Filter, _keeps
from heapwatch.tracemalloc.grouping import group_traces
from heapwatch.tracemalloc.objects import (
    Statistic,
    StatisticDiff,
    Traceback,
    _Traces,
    compare_grouped_stats,
    sort_diffs,
    sort_statistics,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from heapwatch import _core
    from heapwatch._core import Frames, KeyType, Mode, RawTrace, RawTracebackInfo
    from heapwatch.formats.snapshot_file import PathArg

_S = TypeVar("_S", bound="Snapshot")

# Filters whose _match() reads only the domain and the frames: safe to
# evaluate once per traceback.  Any other filter makes filter_traces() take
# the per-trace path.
_PER_TRACEBACK_FILTERS = (Filter, DomainFilter)


# The instance attributes a Snapshot sets itself; any other is the user's.
_OWN_ATTRIBUTES = frozenset(
    ("_mode", "_sample_interval", "_source", "_mask", "_traces", "traceback_limit")
)


class _CoreBacking:
    """What backs a core-backed Snapshot: a core snapshot and its traceback
    table, shared by the Snapshots filtered from one take_snapshot() (not a
    source of snapshots, as the agent's CoreSource is)."""

    __slots__ = ("_tracebacks", "snap")

    def __init__(self, snap: _core.Snapshot) -> None:
        self.snap = snap
        self._tracebacks: list[RawTracebackInfo] | None = None

    def tracebacks(self) -> list[RawTracebackInfo]:
        """(domain, frames, total_nframe, size, count) per traceback, in mask order."""
        if self._tracebacks is None:
            self._tracebacks = self.snap.tracebacks()
        return self._tracebacks


class Snapshot:
    """Traces of memory blocks at one moment, and statistics over them.

    ``Snapshot(traces, traceback_limit)`` takes the stdlib's raw trace tuples
    ``(domain, size, frames, total_nframe)``.  ``mode="sample"`` with the
    ``sample_interval`` the traces were sampled at makes statistics weigh
    each trace as heapwatch's sampling tracer does.
    """

    def __init__(
        self,
        traces: Sequence[RawTrace],
        traceback_limit: int,
        *,
        mode: str = "exact",
        sample_interval: int = 0,
    ) -> None:
        self._mode: Mode = check_mode(mode)
        self._sample_interval = check_sample_interval(
            sample_interval, lowest=1 if self._mode == "sample" else 0
        )
        self._source: _CoreBacking | None = None
        self._mask: bytes | None = None
        self._traces: _Traces | None = _Traces(traces)
        self.traceback_limit = traceback_limit

    @classmethod
    def _from_core(
        cls: type[_S], source: _CoreBacking, mask: bytes | None, traceback_limit: int
    ) -> _S:
        """A core-backed snapshot of the tracebacks the mask keeps (all if None)."""
        self = cls.__new__(cls)
        self._mode = source.snap.mode
        self._sample_interval = source.snap.sample_interval
        self._source = source
        self._mask = mask
        self._traces = None
        self.traceback_limit = traceback_limit
        return self

    @property
    def traces(self) -> _Traces:
        """The traces: a sequence of Trace, in no particular order."""
        if self._traces is None:
            self._traces = _Traces(self._raw_traces())
        return self._traces

    @property
    def mode(self) -> Mode:
        """'exact', or 'sample' if the traces are samples (sizes and counts are
        then estimates)."""
        return self._mode

    @property
    def sample_interval(self) -> int:
        """Mean bytes between two samples, as configured when the traces were taken."""
        return self._sample_interval

    def _raw_traces(self) -> Sequence[RawTrace]:
        if self._traces is not None:
            return self._traces._traces
        assert self._source is not None  # one backing or the other
        return self._source.snap.traces(self._mask)

    def _weigh_like(self, traces: Sequence[RawTrace]) -> Snapshot:
        return Snapshot(
            traces, self.traceback_limit, mode=self._mode, sample_interval=self._sample_interval
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # A core snapshot cannot be pickled: pickle the traces it holds, and
        # the user's attributes as the state (restored into __dict__).
        return (
            _restore,
            (
                type(self),
                self._raw_traces(),
                self.traceback_limit,
                self._mode,
                self._sample_interval,
            ),
            self._attributes() or None,
        )

    def _attributes(self) -> dict[str, object]:
        """What a user set on this snapshot: the stdlib's pickle keeps it."""
        return {k: v for k, v in vars(self).items() if k not in _OWN_ATTRIBUTES}

    def dump(self, filename: PathArg) -> None:
        """Writes the snapshot to filename in heapwatch's dump format (not a
        pickle); load() reads it back, with the attributes set on the snapshot
        (JSON values only: TypeError names any other)."""
        # The encoding's own objects (a dict of strings, its buffers) end in
        # free lists still traced, and would show in the next snapshot as the
        # service's memory: heapwatch's own work is not traced.
        previous = _core.set_thread_traced(False)
        try:
            parts = SnapshotParts(
                self._raw_traces(),
                self.traceback_limit,
                self._mode,
                self._sample_interval,
                self._attributes(),
            )
            write_parts(filename, parts)
        finally:
            _core.set_thread_traced(previous)

    @classmethod
    def load(cls: type[_S], filename: PathArg, *, allow_pickle: bool = False) -> _S:
        """The snapshot that dump() wrote to filename.

        A pickle (what the stdlib's dump() writes) raises PickleRefusedError:
        unpickling runs arbitrary code from the file.  With allow_pickle=True
        it is unpickled and converted; pass it only for a file you trust.
        """
        parts = read_parts(filename, allow_pickle)
        snapshot = cls(
            parts.traces,
            parts.traceback_limit,
            mode=parts.mode,
            sample_interval=parts.sample_interval,
        )
        for name, value in parts.attributes.items():
            if name in _OWN_ATTRIBUTES:
                continue  # a pickled snapshot's own state, rebuilt above
            setattr(snapshot, name, value)
        return snapshot

    def filter_traces(self, filters: Iterable[BaseFilter]) -> Snapshot:
        """A new Snapshot with the traces that some inclusive filter matches (if
        there is any inclusive filter) and that no exclusive filter excludes.
        With no filters, a copy."""
        if not isinstance(filters, Iterable):
            raise TypeError(f"filters must be a list of filters, not {type(filters).__name__}")
        filters = list(filters)
        include = [f for f in filters if f.inclusive]
        exclude = [f for f in filters if not f.inclusive]
        if self._source is not None and all(type(f) in _PER_TRACEBACK_FILTERS for f in filters):
            return self._filter_tracebacks(self._source, include, exclude)
        traces = self._raw_traces()
        if filters:
            return self._weigh_like([t for t in traces if _keeps(include, exclude, t)])
        return self._weigh_like(list(traces))

    def _filter_tracebacks(
        self, source: _CoreBacking, include: list[BaseFilter], exclude: list[BaseFilter]
    ) -> Snapshot:
        mask = bytearray(b"\x01" * source.snap.ntracebacks if self._mask is None else self._mask)
        if include or exclude:
            for i, (domain, frames, total_nframe, size, _count) in enumerate(source.tracebacks()):
                trace = (domain, size, cast("Frames", frames), total_nframe)
                if mask[i] and not _keeps(include, exclude, trace):
                    mask[i] = 0
        return Snapshot._from_core(source, bytes(mask), self.traceback_limit)

    def _group_by(self, key_type: object, cumulative: object) -> dict[Traceback, Statistic]:
        """Statistics keyed by their Traceback, unsorted (the stdlib's _group_by)."""
        checked = check_key_type(key_type, cumulative)
        if self._source is not None:
            return {stat.traceback: stat for stat in self._core_statistics(checked, cumulative)}
        weigh = weigher(self._mode, self._sample_interval)
        return group_traces(self._raw_traces(), checked, bool(cumulative), weigh)

    def _core_groups(self, key_type: KeyType, cumulative: object) -> _core.Groups:
        assert self._source is not None
        return self._source.snap.group(key_type, bool(cumulative), self._mask)

    def _core_statistics(self, key_type: KeyType, cumulative: object) -> list[Statistic]:
        return [
            Statistic(Traceback(frames), size, count)
            for frames, size, count in self._core_groups(key_type, cumulative).statistics()
        ]

    def statistics(self, key_type: str, cumulative: bool = False) -> list[Statistic]:
        """Statistics grouped by 'traceback', 'filename' or 'lineno', sorted by
        size, count and traceback, biggest first.  cumulative counts a trace
        under every frame of its traceback ('filename' and 'lineno' only)."""
        checked = check_key_type(key_type, cumulative)
        if self._source is not None:
            return self._core_statistics(checked, cumulative)
        return sort_statistics(self._group_by(checked, cumulative).values())

    def compare_to(
        self, old_snapshot: Snapshot, key_type: str, cumulative: bool = False
    ) -> list[StatisticDiff]:
        """Differences from old_snapshot, grouped as statistics() groups,
        sorted by |size_diff|, size, |count_diff|, count and traceback,
        biggest first."""
        checked = check_key_type(key_type, cumulative)
        if not isinstance(old_snapshot, Snapshot):
            raise TypeError(
                "old_snapshot must be a heapwatch.tracemalloc.Snapshot, "
                f"not {type(old_snapshot).__name__}"
            )
        if self._source is not None and old_snapshot._source is not None:
            old = old_snapshot._core_groups(checked, cumulative)
            return [
                StatisticDiff(Traceback(frames), size, size_diff, count, count_diff)
                for frames, size, size_diff, count, count_diff in self._core_groups(
                    checked, cumulative
                ).compare(old)
            ]
        return sort_diffs(
            compare_grouped_stats(
                old_snapshot._group_by(checked, cumulative), self._group_by(checked, cumulative)
            )
        )


def _restore(
    cls: type[_S],
    traces: Sequence[RawTrace],
    traceback_limit: int,
    mode: str,
    sample_interval: int,
) -> _S:
    """Unpickles a Snapshot (see Snapshot.__reduce__)."""
    return cls(traces, traceback_limit, mode=mode, sample_interval=sample_interval)


def snapshot_of_core(snap: _core.Snapshot) -> Snapshot:
    """A core-backed Snapshot of every trace of a core snapshot."""
    return Snapshot._from_core(_CoreBacking(snap), None, snap.traceback_limit)
