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
    ) -> None:
        self._groups = ModelGroups(sites, peaks, histograms)
        self.epoch = epoch
        self.traced, self.blocks = self._groups.total
        self.peak = peak

    def group(self, key_type: str, *, ages: bool = False) -> ModelGroups:
        assert key_type == "lineno"
        return self._groups

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
        """As the core: one frame per site (a name with names=True); with
        allocs=True the model's sites allocated what they hold and never
        freed."""
        if not allocs:
            return [
                (0, ((*key, "model") if names else key,), 1, size, count)
                for key, (size, count) in self._groups.sites.items()
            ]
        return [
            (0, (key,), 1, size, count, self._groups.site_peaks.get(key, 0), size, count)
            for key, (size, count) in self._groups.sites.items()
        ]

    @property
    def allocs_folded(self) -> tuple[int, int, int]:
        return (0, 0, 0)


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
    def allocate(self, file: str, line: int, size: int, count: int = 1) -> None:
        old_size, old_count = self.sites.get((file, line), (0, 0))
        self.sites[(file, line)] = (old_size + size, old_count + count)
        self.chunks.setdefault((file, line), []).append([self.epoch, size])
        if self.traced > self.peak:
            self._mark_peak()

    def free(self, file: str, line: int, size: int, count: int = 1) -> None:
        old_size, old_count = self.sites[(file, line)]
        self.sites[(file, line)] = (old_size - size, old_count - count)
        chunks, left = self.chunks[(file, line)], size
        while left > 0:
            taken = min(left, chunks[-1][1])
            chunks[-1][1] -= taken
            left -= taken
            if not chunks[-1][1]:
                chunks.pop()

    def histograms(self) -> dict[Key, tuple[int, ...]]:
        out = {}
        for key, chunks in self.chunks.items():
            histogram = [0] * AGE_BUCKETS
            for epoch, size in chunks:
                histogram[age_bucket(self.epoch - epoch)] += size
            out[key] = tuple(histogram)
        return out

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
        snapshot = ModelSnapshot(
            self.sites, self.peak, self.peak_sites, self.histograms(), self.epoch
        )
        self._mark_peak()
        return snapshot

    def snapshot(self, traces: bool) -> ModelSnapshot:
        return ModelSnapshot(self.sites, self.peak, self.peak_sites, self.histograms(), self.epoch)

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
