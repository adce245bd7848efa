"""The age of each live trace: the epoch (the agent's cycle) it was allocated
in, kept in the high bits of its slot's address word (docs/design/core.md,
"Age").  Snapshot.traces(ages=True) gives each trace's age in epochs;
Snapshot.group(..., ages=True).ages() a histogram of each group's bytes by
age, in power-of-two buckets."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import pytest

MODES = [("exact", 1), ("sample", 1)]  # a 1-byte interval samples every block


def _alloc(n: int, size: int) -> list[bytes]:
    return [bytes(size) for _ in range(n)]  # the allocation site


SITE = _alloc.__code__.co_firstlineno + 1


def _ages_at_site(snap: Any, size: int = 200) -> list[int]:
    """The ages of the bytes objects (not the list) allocated at SITE."""
    block = sys.getsizeof(bytes(size))
    return sorted(
        age
        for _domain, traced, frames, _total, age in snap.traces(ages=True)
        if frames[0] == (__file__, SITE) and traced == block
    )


def _bucket(age: int) -> int:
    return age.bit_length()


@pytest.mark.parametrize(("mode", "interval"), MODES)
@pytest.mark.parametrize("nframe", [1, 25])
@pytest.mark.parametrize("n", [100, 80_000])  # 80_000: the queued table
def test_each_trace_carries_the_epoch_it_was_allocated_in(
    core: ModuleType, mode: str, interval: int, nframe: int, n: int
) -> None:
    # Given blocks allocated in epochs 5 and 9
    core.start(nframe, mode, interval)
    core.set_epoch(5)
    old = _alloc(n, 200)
    core.set_epoch(9)
    young = _alloc(n, 200)
    # When a snapshot is taken in epoch 9
    snap = core.take_snapshot()
    # Then the old ones are 4 epochs old, the young ones 0
    assert snap.epoch == core.get_epoch() == 9
    assert _ages_at_site(snap) == [0] * n + [4] * n
    del old, young


@pytest.mark.parametrize(("mode", "interval"), MODES)
def test_groups_histogram_bytes_by_age(core: ModuleType, mode: str, interval: int) -> None:
    core.start(1, mode, interval)
    core.set_epoch(100)
    old = _alloc(50, 1000)
    core.set_epoch(103)
    young = _alloc(20, 1000)
    core.set_epoch(110)
    snap = core.take_snapshot()
    (row,) = [r for r in snap.group("lineno", ages=True).ages() if r[0][0] == (__file__, SITE)]
    frames, size, count, histogram = row
    assert len(histogram) == core.AGE_BUCKETS
    assert sum(histogram) == size
    assert (size, count) == next(
        (s, c) for f, s, c in snap.group("lineno").statistics() if f == frames
    )
    # 10 epochs old: bucket [8, 16); 7 epochs old: bucket [4, 8)
    assert histogram[_bucket(10)] > 0 and histogram[_bucket(7)] > 0
    assert histogram[_bucket(10)] == pytest.approx(histogram[_bucket(7)] * 50 / 20, rel=0.05)
    assert sum(h for b, h in enumerate(histogram) if b not in (_bucket(10), _bucket(7))) == 0
    del old, young


def test_ages_need_traces_and_a_plain_grouping(core: ModuleType) -> None:
    core.start(1)
    with pytest.raises(ValueError, match="traces"):
        core.take_snapshot(traces=False).group("lineno", ages=True)
    snap = core.take_snapshot()
    with pytest.raises(ValueError, match="cumulative"):
        snap.group("lineno", True, ages=True)
    with pytest.raises(ValueError, match="ages=True"):
        snap.group("lineno").ages()


def test_the_epoch_only_moves_forward_and_starts_at_0(core: ModuleType) -> None:
    assert core.get_epoch() == 0
    core.start(1)
    core.set_epoch(3)
    with pytest.raises(ValueError, match="epoch"):
        core.set_epoch(2)
    with pytest.raises((ValueError, OverflowError)):
        core.set_epoch(1 << 32)
    core.stop()
    assert core.get_epoch() == 0


def test_ages_saturate_and_never_wrap(core: ModuleType) -> None:
    core.start(1)
    base = core.get_epoch()
    old = _alloc(10, 300)
    core.set_epoch(base + 40_000)
    assert _ages_at_site(core.take_snapshot(), 300) == [core.MAX_AGE] * 10
    core.set_epoch(base + 70_000)
    young = _alloc(10, 300)
    # 65,541 epochs later: 5 modulo the 16 bits a slot keeps
    core.set_epoch(base + 70_000 + 65_536 + 5)
    assert _ages_at_site(core.take_snapshot(), 300) == [core.MAX_AGE] * 20
    for step in range(1, 70):  # cycle by cycle across a 32768 boundary
        core.set_epoch(core.get_epoch() + 1000)
        assert _ages_at_site(core.take_snapshot(), 300) == [core.MAX_AGE] * 20, step
    del old, young


def test_a_reallocated_block_is_as_young_as_its_move(core: ModuleType) -> None:
    core.start(1)
    core.set_epoch(core.get_epoch() + 1)
    buf = bytearray(100)
    core.set_epoch(core.get_epoch() + 6)
    buf += b"x" * 100_000  # moved: a new block
    ages = [
        age for _d, size, _f, _t, age in core.take_snapshot().traces(ages=True) if size >= 100_000
    ]
    assert ages == [0]
    del buf


def test_addresses_beyond_48_bits_are_refused_not_confused(core: ModuleType) -> None:
    core.start(1)
    assert core._track(7, 0x1000, 10) == 0
    assert core._track(7, (1 << 60) | 0x1000, 10) == -1  # dropped: no room for the epoch
    assert core._untrack(7, (1 << 60) | 0x1000) == 0
    traces = [t for t in core.take_snapshot().traces() if t[0] == 7]
    assert [t[1] for t in traces] == [10]
    assert core.get_stats()["dropped"] >= 1
    core._untrack(7, 0x1000)


def test_clear_traces_keeps_the_epoch(core: ModuleType) -> None:
    core.start(1)
    core.set_epoch(core.get_epoch() + 2)
    epoch = core.get_epoch()
    core.clear_traces()
    assert core.get_epoch() == epoch
    kept = _alloc(3, 100)
    assert _ages_at_site(core.take_snapshot(), 100) == [0, 0, 0]
    del kept
