"""Per-site peaks: each site's live bytes at the moment the traced total
reached the interval's peak (Groups.peaks(), Snapshot.tracebacks(peaks=True)).

Site A allocates 50 MiB and frees it within the interval while site B holds
10 MiB: the sizes show B alone, the peaks show A at 50 MiB and B at 10 MiB,
and the per-site peaks sum to the traced peak."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pytest

MIB = 1 << 20
A_BLOCKS = 50
MODES = [("exact", 1), ("sample", 512 * 1024)]


def _site_a(blocks: list[Any]) -> None:
    for i in range(len(blocks)):
        blocks[i] = bytearray(MIB)  # site A


def _site_b(n: int) -> list[bytes]:
    """10 MiB in n blocks."""
    size = 10 * MIB // n - 33  # bytes' header
    return [bytes(size) for _ in range(n)]  # site B


SITE_A_LINE = _site_a.__code__.co_firstlineno + 2
SITE_B_LINE = _site_b.__code__.co_firstlineno + 3


@contextmanager
def _churning(threads: int = 2) -> Iterator[None]:
    """Threads that allocate and free small objects until the block ends."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            keep = [bytes(64) for _ in range(200)]
            del keep

    workers = [threading.Thread(target=churn) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join()


def _by_line(rows: list[Any]) -> dict[int, Any]:
    return {frames[0][1]: row for row in rows for frames in [row[0]] if frames[0][0] == __file__}


def _a_tolerance(mode: str, interval: int) -> float:
    """Six standard deviations of the estimate of A's 50 blocks of 1 MiB."""
    if mode == "exact":
        return 64 * 1024  # the bytearray objects themselves
    p = -math.expm1(-MIB / interval)
    return 6 * math.sqrt(A_BLOCKS * MIB * MIB * (1 - p) / p) + 64 * 1024


@pytest.mark.parametrize(("mode", "interval"), MODES)
@pytest.mark.parametrize("nframe", [1, 25])
@pytest.mark.parametrize("b_blocks", [2_000, 80_000])  # 80_000: the queued table
def test_a_site_that_came_and_went_keeps_its_peak(
    core: ModuleType, mode: str, interval: int, nframe: int, b_blocks: int
) -> None:
    # Given B holding its blocks and threads churning
    core.start(nframe, mode, interval)
    b = _site_b(b_blocks)
    core.take_snapshot(traces=False, reset_peak=True)
    with _churning():
        # When A allocates 50 MiB and frees it within the interval
        blocks: list[Any] = [None] * A_BLOCKS
        _site_a(blocks)
        del blocks
        snap = core.take_snapshot(traces=False, reset_peak=True)
    groups = snap.group("lineno")

    # Then the sizes show B alone, the peaks A and B
    sizes = _by_line(groups.statistics())
    assert SITE_A_LINE not in sizes
    b_size = sizes[SITE_B_LINE][1]
    assert b_size > 0
    peaks = _by_line(groups.peaks())
    assert peaks[SITE_B_LINE][3] == b_size
    a_peak = peaks[SITE_A_LINE][3]
    assert peaks[SITE_A_LINE][1:3] == (0, 0)
    assert abs(a_peak - A_BLOCKS * MIB) <= _a_tolerance(mode, interval)
    # and the per-site peaks sum to the traced peak, in both modes (the
    # estimates of sample mode are the same ones the total sums)
    assert sum(row[3] for row in groups.peaks()) == groups.peak == snap.peak
    assert groups.total[0] == snap.traced
    del b


@pytest.mark.parametrize(("mode", "interval"), MODES)
def test_peaks_are_ordered_and_limited(core: ModuleType, mode: str, interval: int) -> None:
    core.start(1, mode, interval)
    b = _site_b(2_000)
    core.take_snapshot(traces=False, reset_peak=True)
    blocks: list[Any] = [None] * A_BLOCKS
    _site_a(blocks)
    del blocks
    peaks = core.take_snapshot(traces=False).group("lineno").peaks(1)
    assert len(peaks) == 1
    assert peaks[0][0][0] == (__file__, SITE_A_LINE)
    del b


def test_a_reset_forgets_the_peaks_of_the_last_interval(core: ModuleType) -> None:
    core.start(1)
    b = _site_b(2_000)
    blocks: list[Any] = [None] * A_BLOCKS
    _site_a(blocks)
    del blocks
    core.take_snapshot(traces=False, reset_peak=True)
    snap = core.take_snapshot(traces=False)
    peaks = _by_line(snap.group("lineno").peaks())
    assert SITE_A_LINE not in peaks
    assert peaks[SITE_B_LINE][3] == peaks[SITE_B_LINE][1]
    core.reset_peak()
    assert snap.group("lineno").peak == snap.peak
    del b


def test_a_drain_does_not_sweep_the_tracebacks_that_made_the_peak(core: ModuleType) -> None:
    # Given A's traceback idle after its blocks were freed
    core.start(25)
    core.reset_peak()
    blocks: list[Any] = [None] * A_BLOCKS
    _site_a(blocks)
    del blocks
    # When the idle tracebacks are swept
    core.drain()
    # Then A still shows its peak
    snap = core.take_snapshot(traces=False)
    peaks = _by_line(snap.group("lineno").peaks())
    assert peaks[SITE_A_LINE][3] >= A_BLOCKS * MIB
    rows = snap.tracebacks(peaks=True)
    assert len(rows) > snap.ntracebacks == len(snap.tracebacks())
    assert sum(row[5] for row in rows) == snap.peak
    assert all(row[3] == row[4] == 0 for row in rows[snap.ntracebacks :])


def test_a_realloc_that_grows_counts_at_its_largest(core: ModuleType) -> None:
    core.start(1)
    core.reset_peak()

    def grow() -> None:
        buf = bytearray()
        for _ in range(40):
            buf += b"x" * (256 * 1024)  # the realloc site
        del buf

    grow()
    line = grow.__code__.co_firstlineno + 3
    peaks = _by_line(core.take_snapshot(traces=False).group("lineno").peaks())
    # bytearray over-allocates by an eighth; the operand is on the line too
    assert 10 * MIB <= peaks[line][3] <= 12 * MIB


def test_blocks_of_other_domains_count(core: ModuleType) -> None:
    core.start(1)
    core.reset_peak()
    for ptr in (0x1000, 0x2000, 0x3000):
        assert core._track(7, ptr, 10 * MIB) == 0  # the domain's site
    for ptr in (0x1000, 0x2000, 0x3000):
        assert core._untrack(7, ptr) == 0
    line = test_blocks_of_other_domains_count.__code__.co_firstlineno + 4
    snap = core.take_snapshot(traces=False)
    rows = [row for row in snap.tracebacks(peaks=True) if row[0] == 7]
    assert rows[0][1][0] == (__file__, line)
    assert [(row[0], row[3], row[5]) for row in rows] == [(7, 0, 30 * MIB)]
    assert sum(row[5] for row in snap.tracebacks(peaks=True)) == snap.peak


def test_a_mask_selects_peak_only_tracebacks_too(core: ModuleType) -> None:
    core.start(1)
    core.reset_peak()
    blocks: list[Any] = [None] * A_BLOCKS
    _site_a(blocks)
    del blocks
    snap = core.take_snapshot(traces=False)
    rows = snap.tracebacks(peaks=True)
    keep_a = bytes(row[1][0] == (__file__, SITE_A_LINE) for row in rows)
    assert [row[0][0] for row in snap.group("lineno", mask=keep_a).peaks()] == [
        (__file__, SITE_A_LINE)
    ]
    assert snap.group("lineno", mask=keep_a).statistics() == []
    live_only = bytes(1 for _ in range(snap.ntracebacks))
    assert snap.group("lineno", mask=live_only).statistics() == snap.group("lineno").statistics()


def test_clear_traces_drops_the_peaks(core: ModuleType) -> None:
    core.start(1)
    blocks: list[Any] = [None] * 5
    _site_a(blocks)
    del blocks
    core.clear_traces()
    snap = core.take_snapshot(traces=False)
    assert SITE_A_LINE not in _by_line(snap.group("lineno").peaks())
    assert snap.group("lineno").peak == snap.peak
