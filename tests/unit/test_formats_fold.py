"""Memory by stack folded for the agent's baselines, and the ones the page offers."""

from __future__ import annotations

from heapwatch.agent.interface import StackPoint
from heapwatch.formats.view import (
    FOLDED_FRAMES,
    FOLDED_STACKS,
    OTHER_STACKS,
    fold_stacks,
    unfold_stacks,
)
from heapwatch.server.page import baselines_offered


def row(frames: tuple[tuple[str, int, str], ...], size: int, count: int = 1) -> tuple:
    return (0, frames, len(frames), size, count)


def test_fold_keeps_the_biggest_stacks_and_sums_the_rest() -> None:
    leaf, main = ("leak.py", 3, "leak"), ("main.py", 1, "<module>")
    rows = [row((leaf, main), 1_000_000, 10)]
    rows += [row((("x.py", n, "f"), main), 10 + n) for n in range(FOLDED_STACKS + 20)]
    folded = fold_stacks(rows)
    stacks = unfold_stacks(folded)
    # The biggest first, frames most recent first as the core gives them
    assert stacks[0] == ((leaf, main), 1_000_000, 10)
    assert len(stacks) == FOLDED_STACKS + 1
    assert stacks[-1][0] == ((OTHER_STACKS, 0, ""),)
    # Nothing is lost: the rest is one stack
    assert sum(s[1] for s in stacks) == sum(r[3] for r in rows)
    assert sum(s[2] for s in stacks) == sum(r[4] for r in rows)
    # Each distinct frame is stored once
    assert len(folded.frames) == len(set(folded.frames)) == FOLDED_STACKS + 1


def test_fold_bounds_the_frames_of_deep_stacks() -> None:
    deep = tuple(("deep.py", n, "f") for n in range(FOLDED_FRAMES // 3 + 1))
    rows = [row(deep, 100 - n) for n in range(4)] + [row((("small.py", 1, "g"),), 1)]
    folded = fold_stacks(rows)
    assert len(folded.ids) <= FOLDED_FRAMES
    stacks = unfold_stacks(folded)
    # Two deep ones fit; what the others hold goes with the rest
    assert [s[1] for s in stacks] == [100, 99, 1, 98 + 97]


def test_fold_shares_the_previous_readings_frames() -> None:
    def frames() -> tuple[tuple[str, int, str], ...]:
        return (("a.py", 1000, "f" + "x" * 3), ("m.py", 2000, "main"))

    first = fold_stacks([row(frames(), 10)])
    second = fold_stacks([row(frames(), 20), row((("new.py", 1, "n"),), 5)], first)
    assert second.frames[0] is first.frames[0] and second.frames[1] is first.frames[1]
    assert second.frames[2] == ("new.py", 1, "n")


def test_the_page_is_offered_the_readings_5_15_30_minutes_old_and_the_oldest() -> None:
    now = 10_000.0
    points = [
        StackPoint(now - age, fold_stacks([row((("a.py", int(age), "f"),), 1)]))
        for age in (2400, 1900, 1750, 950, 850, 400, 250, 100)
    ]
    offered = baselines_offered(points, now)
    ages = [now - at for at, _stacks in offered]
    assert ages == [400, 950, 1900, 2400]
    assert offered[0][1] == [((("a.py", 400, "f"),), 1, 1)]
    # Younger than 5 minutes: only the oldest, and nothing without a reading
    assert [now - at for at, _ in baselines_offered(points[-2:], now)] == [250]
    assert baselines_offered([], now) == []
