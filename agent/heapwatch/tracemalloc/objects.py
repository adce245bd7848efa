"""The value classes of heapwatch.tracemalloc, over the raw tuples of _core.

Each class wraps the tuple the C core returns (see ``_core.pyi``) and builds
nothing else until asked: a Snapshot of a million traces holds a million
tuples, not a million objects.  str(), repr(), ordering, hashing and equality
are byte-for-byte the stdlib's, so code that prints or sorts them cannot tell
the two modules apart.
"""

# The stdlib formats with %: the f-strings below convert explicitly as % does
# ("%s" is !s, "%i" is int()), so that the output stays identical even for
# attributes that are not ints (a float count prints truncated, as there).

from __future__ import annotations

import linecache
from collections.abc import Iterable, Iterator, Sequence
from functools import total_ordering
from typing import TYPE_CHECKING, ClassVar, Union, cast, overload

if TYPE_CHECKING:
    from heapwatch._core import Frames, FrameTuple, RawTrace

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _format_size(size: float, sign: bool) -> str:
    """A size as the stdlib prints it: 3 significant digits below 100 of a
    unit ("12.5 KiB"), 4 or 5 digits otherwise ("4855 KiB"), bytes as is."""
    for unit in _UNITS:
        if abs(size) < 100 and unit != "B":
            return f"{size:+.1f} {unit}" if sign else f"{size:.1f} {unit}"
        if abs(size) < 10 * 1024 or unit == "TiB":
            return f"{size:+.0f} {unit}" if sign else f"{size:.0f} {unit}"
        size /= 1024
    raise AssertionError("unreachable: the last unit always returns")


@total_ordering
class Frame:
    """One frame of a traceback: a filename and a line number."""

    __slots__ = ("_frame",)

    def __init__(self, frame: FrameTuple) -> None:
        self._frame = frame

    @property
    def filename(self) -> str:
        return self._frame[0]

    @property
    def lineno(self) -> int:
        return self._frame[1]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return self._frame == other._frame

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return self._frame < other._frame

    def __hash__(self) -> int:
        return hash(self._frame)

    def __str__(self) -> str:
        return f"{self.filename!s}:{self.lineno!s}"

    def __repr__(self) -> str:
        return f"<Frame filename={self.filename!r} lineno={self.lineno!r}>"


@total_ordering
class Traceback(Sequence[Frame]):
    """Frames from the oldest to the most recent.

    ``frames`` arrive in the core's raw order, most recent first, and are
    reversed once here.  ``total_nframe`` is the depth of the stack before
    truncation to the traceback limit, or None when unknown.
    """

    __slots__ = ("_frames", "_total_nframe")

    def __init__(self, frames: Sequence[FrameTuple], total_nframe: int | None = None) -> None:
        self._frames: Frames = tuple(reversed(frames))
        self._total_nframe = total_nframe

    @property
    def total_nframe(self) -> int | None:
        return self._total_nframe

    def __len__(self) -> int:
        return len(self._frames)

    @overload
    def __getitem__(self, index: int) -> Frame: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Frame, ...]: ...
    def __getitem__(self, index: Union[int, slice]) -> Union[Frame, tuple[Frame, ...]]:
        if isinstance(index, slice):
            return tuple(Frame(frame) for frame in self._frames[index])
        return Frame(self._frames[index])

    def __iter__(self) -> Iterator[Frame]:
        return (Frame(frame) for frame in self._frames)

    def __contains__(self, frame: object) -> bool:
        # As the stdlib: anything without a _frame raises AttributeError.
        return cast(Frame, frame)._frame in self._frames

    def __hash__(self) -> int:
        return hash(self._frames)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Traceback):
            return NotImplemented
        return self._frames == other._frames

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Traceback):
            return NotImplemented
        return self._frames < other._frames

    def __str__(self) -> str:
        return str(self[0])

    def __repr__(self) -> str:
        text = f"<Traceback {tuple(self)}"
        if self._total_nframe is None:
            return text + ">"
        return text + f" total_nframe={self._total_nframe}>"

    def format(self, limit: int | None = None, most_recent_first: bool = False) -> list[str]:
        """The frames as lines, with their source lines from linecache.

        A positive ``limit`` keeps the ``limit`` most recent frames, a negative
        one the ``abs(limit)`` oldest; ``most_recent_first`` reverses the order.
        """
        frames: Sequence[Frame] = self
        if limit is not None:
            frames = self[-limit:] if limit > 0 else self[:limit]
        if most_recent_first:
            frames = frames[::-1]
        lines = []
        for frame in frames:
            lines.append(f'  File "{frame.filename!s}", line {frame.lineno!s}')
            line = linecache.getline(frame.filename, frame.lineno).strip()
            if line:
                lines.append(f"    {line}")
        return lines


class Trace:
    """One traced memory block: its domain, size and traceback."""

    __slots__ = ("_trace",)

    def __init__(self, trace: RawTrace) -> None:
        self._trace = trace

    @property
    def domain(self) -> int:
        return self._trace[0]

    @property
    def size(self) -> int:
        return self._trace[1]

    @property
    def traceback(self) -> Traceback:
        # Older raw traces have no total_nframe: the stdlib accepts both.
        return Traceback(*self._trace[2:])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return self._trace == other._trace

    def __hash__(self) -> int:
        return hash(self._trace)

    def __str__(self) -> str:
        return f"{self.traceback!s}: {_format_size(self.size, False)}"

    def __repr__(self) -> str:
        size = _format_size(self.size, False)
        return f"<Trace domain={self.domain!s} size={size}, traceback={self.traceback!r}>"


class _Traces(Sequence[Trace]):
    """A sequence of raw traces that builds a Trace only for the item asked."""

    def __init__(self, traces: Sequence[RawTrace]) -> None:
        self._traces = traces

    def __len__(self) -> int:
        return len(self._traces)

    @overload
    def __getitem__(self, index: int) -> Trace: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Trace, ...]: ...
    def __getitem__(self, index: Union[int, slice]) -> Union[Trace, tuple[Trace, ...]]:
        if isinstance(index, slice):
            return tuple(Trace(trace) for trace in self._traces[index])
        return Trace(self._traces[index])

    def __contains__(self, trace: object) -> bool:
        return cast(Trace, trace)._trace in self._traces

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Traces):
            return NotImplemented
        return bool(self._traces == other._traces)

    # Compared by content and holding a mutable list, as the stdlib's: unhashable.
    __hash__: ClassVar[None] = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Traces len={len(self)}>"


class Statistic:
    """Size and count of the memory blocks grouped under one traceback."""

    __slots__ = ("count", "size", "traceback")

    def __init__(self, traceback: Traceback, size: int, count: int) -> None:
        self.traceback = traceback
        self.size = size
        self.count = count

    def __hash__(self) -> int:
        return hash((self.traceback, self.size, self.count))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Statistic):
            return NotImplemented
        return (
            self.traceback == other.traceback
            and self.size == other.size
            and self.count == other.count
        )

    def __str__(self) -> str:
        text = f"{self.traceback!s}: size={_format_size(self.size, False)}, count={int(self.count)}"
        if self.count:
            text += f", average={_format_size(self.size / self.count, False)}"
        return text

    def __repr__(self) -> str:
        return (
            f"<Statistic traceback={self.traceback!r} "
            f"size={int(self.size)} count={int(self.count)}>"
        )

    def _sort_key(self) -> tuple[int, int, Traceback]:
        return (self.size, self.count, self.traceback)


class StatisticDiff:
    """A Statistic in a new snapshot and its difference from an old one."""

    __slots__ = ("count", "count_diff", "size", "size_diff", "traceback")

    def __init__(
        self, traceback: Traceback, size: int, size_diff: int, count: int, count_diff: int
    ) -> None:
        self.traceback = traceback
        self.size = size
        self.size_diff = size_diff
        self.count = count
        self.count_diff = count_diff

    def __hash__(self) -> int:
        return hash((self.traceback, self.size, self.size_diff, self.count, self.count_diff))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StatisticDiff):
            return NotImplemented
        return (
            self.traceback == other.traceback
            and self.size == other.size
            and self.size_diff == other.size_diff
            and self.count == other.count
            and self.count_diff == other.count_diff
        )

    def __str__(self) -> str:
        text = (
            f"{self.traceback!s}: size={_format_size(self.size, False)} "
            f"({_format_size(self.size_diff, True)}), "
            f"count={int(self.count)} ({int(self.count_diff):+d})"
        )
        if self.count:
            text += f", average={_format_size(self.size / self.count, False)}"
        return text

    def __repr__(self) -> str:
        return (
            f"<StatisticDiff traceback={self.traceback!r} "
            f"size={int(self.size)} ({int(self.size_diff):+d}) "
            f"count={int(self.count)} ({int(self.count_diff):+d})>"
        )

    def _sort_key(self) -> tuple[int, int, int, int, Traceback]:
        return (abs(self.size_diff), self.size, abs(self.count_diff), self.count, self.traceback)


def sort_statistics(stats: Iterable[Statistic]) -> list[Statistic]:
    """``stats`` biggest first, as ``Snapshot.statistics()`` orders them: by
    size, count and traceback."""
    return sorted(stats, key=Statistic._sort_key, reverse=True)


def sort_diffs(diffs: Iterable[StatisticDiff]) -> list[StatisticDiff]:
    """``diffs`` biggest change first, as ``Snapshot.compare_to()`` orders
    them: by |size_diff|, size, |count_diff|, count and traceback."""
    return sorted(diffs, key=StatisticDiff._sort_key, reverse=True)


def compare_grouped_stats(
    old_group: dict[Traceback, Statistic], new_group: dict[Traceback, Statistic]
) -> list[StatisticDiff]:
    """One StatisticDiff per traceback of either group (unsorted); consumes old_group."""
    diffs = []
    for traceback, stat in new_group.items():
        previous = old_group.pop(traceback, None)
        old_size, old_count = (0, 0) if previous is None else (previous.size, previous.count)
        diffs.append(
            StatisticDiff(
                traceback, stat.size, stat.size - old_size, stat.count, stat.count - old_count
            )
        )
    for traceback, stat in old_group.items():
        diffs.append(StatisticDiff(traceback, 0, -stat.size, 0, -stat.count))
    return diffs
