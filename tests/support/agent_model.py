"""A pure-Python stand-in for heapwatch._core as the agent uses it.

``ModelSource`` keeps live bytes and blocks per (file, line) and answers
``take_snapshot()`` with grouped statistics ordered as the core orders them,
so the agent's cycle can be tested with exact, hand-made figures.
``ModelGroups`` is a ``heapwatch._core.GroupsLike`` and ``ModelSource`` a
``SnapshotSource``: ``make lint`` has mypy check this module against both.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Literal, overload

if TYPE_CHECKING:
    from heapwatch import _core
    from heapwatch.runtime.source import SnapshotSource

Key = tuple[str, int]


AGE_BUCKETS = 17


def age_bucket(age: int) -> int:
    """As the core: 0 for age 0, b for ages in [2**(b-1), 2**b)."""
    return min(age.bit_length(), AGE_BUCKETS - 1)


class ModelGroups:
    def __init__(
        self,
        sites: Mapping[Key, tuple[int, int]],
        peaks: Mapping[Key, int] | None = None,
        histograms: Mapping[Key, tuple[int, ...]] | None = None,
    ) -> None:
        self.sites = {key: value for key, value in sites.items() if value[0] or value[1]}
        self.site_peaks = dict(peaks or {})
        self.histograms = dict(histograms or {})

    def ages(
        self, limit: int | None = None
    ) -> list[tuple[tuple[Key, ...], int, int, tuple[int, ...]]]:
        return [
            (frames, size, count, self.histograms.get(frames[0], (0,) * AGE_BUCKETS))
            for frames, size, count in self.statistics(limit)
        ]

    def peaks(self, limit: int | None = None) -> list[tuple[tuple[Key, ...], int, int, int]]:
        """As the core: every site by peak, those with nothing live included."""
        keys = set(self.sites) | {key for key, peak in self.site_peaks.items() if peak}
        rows: list[tuple[tuple[Key, ...], int, int, int]] = [
            ((key,), *self.sites.get(key, (0, 0)), self.site_peaks.get(key, 0)) for key in keys
        ]
        rows.sort(key=lambda row: (row[3], row[1], row[2], row[0]), reverse=True)
        return rows[:limit] if limit is not None else rows

    @property
    def total(self) -> tuple[int, int]:
        return sum(s for s, _ in self.sites.values()), sum(c for _, c in self.sites.values())

    def statistics(self, limit: int | None = None) -> list[tuple[tuple[Key, ...], int, int]]:
        ordered = sorted(
            self.sites.items(), key=lambda item: (item[1][0], item[1][1], item[0]), reverse=True
        )
        if limit is not None:
            ordered = ordered[:limit]
        return [((key,), size, count) for key, (size, count) in ordered]

    def growth(
        self, old: ModelGroups | None, limit: int | None = None
    ) -> list[tuple[tuple[Key, ...], int, int, int, int]]:
        previous = old.sites if old is not None else {}
        out = []
        for frames, size, count in self.statistics(limit):
            old_size, old_count = previous.get(frames[0], (0, 0))
            out.append((frames, size, size - old_size, count, count - old_count))
        return out


class ModelSnapshot:
    def __init__(
        self,
        sites: Mapping[Key, tuple[int, int]],
        peak: int,
        peaks: Mapping[Key, int],
        histograms: Mapping[Key, tuple[int, ...]],
        epoch: int = 0,
        *,
        routed: Mapping[tuple[int, Key], tuple[int, int]] | None = None,
        routed_histograms: Mapping[tuple[int, Key], tuple[int, ...]] | None = None,
        allocated: Mapping[Key, int] | None = None,
    ) -> None:
        self._groups = ModelGroups(sites, peaks, histograms)
        self._allocated = dict(allocated) if allocated is not None else None
        self.epoch = epoch
        self.traced, self.blocks = self._groups.total
        self.peak = peak
        self._rows = _route_rows(sites, histograms, routed or {}, routed_histograms or {})

    @property
    def ntracebacks(self) -> int:
        return len(self._rows)

    def group(self, key_type: str, *, mask: bytes | None = None, ages: bool = False) -> ModelGroups:
        assert key_type in ("lineno", "filename")
        if mask is None:
            assert key_type == "lineno"
            return self._groups
        assert len(mask) == len(self._rows)
        sites: dict[Key, tuple[int, int]] = {}
        histograms: dict[Key, tuple[int, ...]] = {}
        for keep, (_route, key, size, count, histogram) in zip(mask, self._rows):
            if keep:
                old_size, old_count = sites.get(key, (0, 0))
                sites[key] = (old_size + size, old_count + count)
                old = histograms.get(key, (0,) * AGE_BUCKETS)
                histograms[key] = tuple(a + b for a, b in zip(old, histogram))
        return ModelGroups(sites, None, histograms)

    def routes(self, peaks: bool = False, allocs: bool = False) -> list[int]:
        """As the core: the route of each row of tracebacks()."""
        routes = [row[0] for row in self._rows]
        return routes + [0] * len(self._allocs_only()) if allocs else routes

    def _allocs_only(self) -> list[Key]:
        """Sites that hold nothing but allocated since tracing started: the
        core's rows of tracebacks holding only allocation totals."""
        if self._allocated is None:
            return []
        held = {row[1] for row in self._rows}
        return [key for key, total in self._allocated.items() if total and key not in held]

    @overload
    def tracebacks(
        self, names: bool = False, peaks: Literal[False] = False, allocs: Literal[False] = False
    ) -> list[_core.RawTracebackInfo]: ...
    @overload
    def tracebacks(
        self, names: bool = False, peaks: bool = False, *, allocs: Literal[True]
    ) -> list[_core.RawTracebackAllocInfo]: ...
    def tracebacks(
        self, names: bool = False, peaks: bool = False, allocs: bool = False
    ) -> list[Any]:
        """As the core: one row per site and route (a frame with a name with
        names=True), in the order of routes(); with allocs=True the model's
        sites allocated what they hold and never freed (a site's peak on its
        first row)."""
        rows: list[Any] = []
        seen: set[Key] = set()
        for _route, key, size, count, _histogram in self._rows:
            frame = (*key, "model") if names else key
            if not allocs:
                rows.append((0, (frame,), 1, size, count))
                continue
            first = key not in seen
            peak = self._groups.site_peaks.get(key, 0) if first else 0
            seen.add(key)
            allocated = size  # a snapshot built by hand: what the site holds
            if self._allocated is not None:
                allocated = self._allocated.get(key, 0) if first else 0
            rows.append((0, (frame,), 1, size, count, peak, allocated, count))
        if allocs:
            for key in self._allocs_only():
                frame = (*key, "model") if names else key
                peak = self._groups.site_peaks.get(key, 0)
                assert self._allocated is not None
                rows.append((0, (frame,), 1, 0, 0, peak, self._allocated[key], 0))
        return rows

    @property
    def allocs_folded(self) -> tuple[int, int, int]:
        return (0, 0, 0)


def _route_rows(
    sites: Mapping[Key, tuple[int, int]],
    histograms: Mapping[Key, tuple[int, ...]],
    routed: Mapping[tuple[int, Key], tuple[int, int]],
    routed_histograms: Mapping[tuple[int, Key], tuple[int, ...]],
) -> list[tuple[int, Key, int, int, tuple[int, ...]]]:
    """(route, site, bytes, blocks, bytes by age) per traceback: a site's
    routed memory on rows of their own, the rest on route 0's."""
    rows = []
    for key, (size, count) in sites.items():
        histogram = list(histograms.get(key, (0,) * AGE_BUCKETS))
        for (route, routed_key), (routed_size, routed_count) in routed.items():
            if routed_key != key or not (routed_size or routed_count):
                continue
            routed_histogram = routed_histograms.get((route, key), (0,) * AGE_BUCKETS)
            rows.append((route, key, routed_size, routed_count, routed_histogram))
            size, count = size - routed_size, count - routed_count
            histogram = [a - b for a, b in zip(histogram, routed_histogram)]
        if size or count:
            rows.append((0, key, size, count, tuple(histogram)))
    return rows


class ModelSource:
    """Live memory per site, a peak, and switches to make snapshots fail or hang."""

    def __init__(self, mode: str = "exact", sample_interval: int = 512 * 1024) -> None:
        self.sites: dict[Key, tuple[int, int]] = {}
        self.peak = 0
        # Each site's bytes in the state where traced reached the peak.
        self.peak_sites: dict[Key, int] = {}
        # Each site's live bytes as [epoch, bytes] chunks, oldest first (a
        # free takes the youngest first); the agent's cycle moves the epoch.
        self.chunks: dict[Key, list[list[int]]] = {}
        # What of them was allocated under a route (0: none), and its chunks.
        self.routed: dict[tuple[int, Key], tuple[int, int]] = {}
        self.routed_chunks: dict[tuple[int, Key], list[list[int]]] = {}
        # Each site's bytes allocated since tracing started, freed or not.
        self.allocated: dict[Key, int] = {}
        self.epoch = 0
        self.tracing = False
        self.mode = mode
        self.sample_interval = sample_interval
        self.dropped_count = 0
        self.memory = 4096
        self.fail: BaseException | None = None
        self.start_error: BaseException | None = None
        self.hang: threading.Event | None = None
        self.snapshots = 0
        self.drains = 0
        self.started_with: tuple[int, str, int] | None = None
        self.wakeup: tuple[float, Callable[[], object]] | None = None

    # ---- the workload
    def allocate(self, file: str, line: int, size: int, count: int = 1, route: int = 0) -> None:
        old_size, old_count = self.sites.get((file, line), (0, 0))
        self.sites[(file, line)] = (old_size + size, old_count + count)
        self.allocated[(file, line)] = self.allocated.get((file, line), 0) + size
        self.chunks.setdefault((file, line), []).append([self.epoch, size])
        if route:
            key = (route, (file, line))
            old_size, old_count = self.routed.get(key, (0, 0))
            self.routed[key] = (old_size + size, old_count + count)
            self.routed_chunks.setdefault(key, []).append([self.epoch, size])
        if self.traced > self.peak:
            self._mark_peak()

    def free(self, file: str, line: int, size: int, count: int = 1, route: int = 0) -> None:
        """Frees the youngest of the site's memory (of ``route``'s, when given)."""
        old_size, old_count = self.sites[(file, line)]
        self.sites[(file, line)] = (old_size - size, old_count - count)
        _take_youngest(self.chunks[(file, line)], size)
        if route:
            key = (route, (file, line))
            old_size, old_count = self.routed[key]
            self.routed[key] = (old_size - size, old_count - count)
            _take_youngest(self.routed_chunks[key], size)

    def histograms(self) -> dict[Key, tuple[int, ...]]:
        return {key: self._histogram(chunks) for key, chunks in self.chunks.items()}

    def routed_histograms(self) -> dict[tuple[int, Key], tuple[int, ...]]:
        return {key: self._histogram(chunks) for key, chunks in self.routed_chunks.items()}

    def _histogram(self, chunks: list[list[int]]) -> tuple[int, ...]:
        histogram = [0] * AGE_BUCKETS
        for epoch, size in chunks:
            histogram[age_bucket(self.epoch - epoch)] += size
        return tuple(histogram)

    def _mark_peak(self) -> None:
        self.peak = self.traced
        self.peak_sites = {key: size for key, (size, _count) in self.sites.items()}

    @property
    def traced(self) -> int:
        return sum(size for size, _ in self.sites.values())

    # ---- the SnapshotSource protocol
    def start(self, nframe: int, mode: str, sample_interval: int) -> bool:
        if self.start_error is not None:
            raise self.start_error
        if self.tracing:
            return False
        self.tracing = True
        self.started_with = (nframe, mode, sample_interval)
        self.mode, self.sample_interval = mode, sample_interval
        return True

    def stop(self) -> None:
        self.tracing = False

    def configuration(self) -> tuple[str, int]:
        return self.mode, self.sample_interval

    def take_snapshot(self) -> ModelSnapshot:
        if self.hang is not None:
            self.hang.wait()
        if self.fail is not None:
            raise self.fail
        self.snapshots += 1
        snapshot = self.snapshot(traces=True)
        self._mark_peak()
        return snapshot

    def snapshot(self, traces: bool) -> ModelSnapshot:
        return ModelSnapshot(
            self.sites,
            self.peak,
            self.peak_sites,
            self.histograms(),
            self.epoch,
            routed=self.routed,
            routed_histograms=self.routed_histograms(),
            allocated=self.allocated,
        )

    def current_epoch(self) -> int:
        return self.epoch

    def next_epoch(self) -> None:
        self.epoch += 1

    def reset_peak(self) -> None:
        self._mark_peak()

    def tracer_memory(self) -> int:
        return self.memory

    def dropped(self) -> int:
        return self.dropped_count

    def drain(self) -> None:
        self.drains += 1

    def wake_after(self, delay: float, callback: Callable[[], object]) -> bool:
        # Nothing allocates through a model: the test wakes it (wake()).
        self.wakeup = (delay, callback)
        return True

    def cancel_wake(self) -> None:
        self.wakeup = None

    def call_soon(self, callback: Callable[[], object], frame: FrameType | None) -> bool:
        return False  # the agent calls it at once

    def wake(self) -> None:
        """What the allocator does once the wake-up's deadline has passed."""
        wakeup, self.wakeup = self.wakeup, None
        assert wakeup is not None, "no wake-up was arranged"
        wakeup[1]()


if TYPE_CHECKING:
    # What the model stands in for: mypy fails here when the agent reads
    # something of the core that the model lacks, or reads it differently.
    _groups: _core.GroupsLike = ModelGroups({})
    _source: SnapshotSource = ModelSource()


def _take_youngest(chunks: list[list[int]], size: int) -> None:
    left = size
    while left > 0:
        taken = min(left, chunks[-1][1])
        chunks[-1][1] -= taken
        left -= taken
        if not chunks[-1][1]:
            chunks.pop()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TickingTimer:
    """A monotonic timer that moves ``step`` seconds at every reading."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.now = 100.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now
