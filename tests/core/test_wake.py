"""wake_after(): a callable run from the main thread once the process
allocates past a deadline, with no thread of ours to watch the clock.

A forked child restarts the agent this way at its first cycle's deadline
(docs/design/agent.md, "Fork").  The hooks read the clock every 64th
allocation made with the GIL while a wake-up is armed; the call itself is a
pending call, run between two bytecodes of the main thread.
"""

from __future__ import annotations

import os
import sys
import time
from types import FrameType, ModuleType

import pytest
from test_sampling import _tolerance

MODES = [("exact", 512 * 1024), ("sample", 512 * 1024)]


def allocate_for(seconds: float, until: list[float]) -> None:
    deadline = time.monotonic() + seconds
    while not until and time.monotonic() < deadline:
        _ = [str(i) for i in range(20)]


@pytest.mark.parametrize(("mode", "interval"), MODES)
def test_the_callback_runs_once_at_the_first_allocation_past_the_deadline(
    core: ModuleType, mode: str, interval: int
) -> None:
    core.start(1, mode, interval)
    calls: list[float] = []
    armed = time.monotonic()
    core.wake_after(0.2, lambda: calls.append(time.monotonic()))
    allocate_for(0.1, [])
    assert calls == []  # not before the deadline
    allocate_for(5.0, calls)
    assert len(calls) == 1
    assert 0.2 <= calls[0] - armed < 1.0
    allocate_for(0.2, [])
    assert len(calls) == 1  # once
    assert core.wake_cancel() is False  # spent


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_process_that_allocates_little_is_woken_in_time(core: ModuleType, mode: str) -> None:
    # About 1 KiB a millisecond, and no sample point in sight (1 GiB apart):
    # sample mode's fast path must still leave to read the clock.
    core.start(1, mode, 1 << 30)
    calls: list[float] = []
    armed = time.monotonic()
    core.wake_after(0.2, lambda: calls.append(time.monotonic()))
    deadline = armed + 5.0
    while not calls and time.monotonic() < deadline:
        _ = [str(i) for i in range(20)]
        time.sleep(0.001)
    assert len(calls) == 1
    assert 0.2 <= calls[0] - armed < 1.0


def test_cancelled_it_never_runs(core: ModuleType) -> None:
    core.start(1, "exact", 512 * 1024)
    calls: list[int] = []
    core.wake_after(0.0, lambda: calls.append(1))
    assert core.wake_cancel() is True
    allocate_for(0.2, [])
    assert calls == []


def test_a_failing_callback_surfaces_nowhere(core: ModuleType) -> None:
    # The pending call runs in the service's code: an exception there would
    # be raised from whatever line the main thread was running.
    core.start(1, "exact", 512 * 1024)
    calls: list[int] = []

    def fail() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    core.wake_after(0.0, fail)
    allocate_for(2.0, calls)
    assert calls == [1]


@pytest.mark.parametrize("delay", [-1.0, float("nan"), float("inf")])
def test_a_delay_must_be_finite_and_not_negative(core: ModuleType, delay: float) -> None:
    with pytest.raises(ValueError, match="finite number of seconds >= 0"):
        core.wake_after(delay, lambda: None)


def test_the_callback_must_be_callable(core: ModuleType) -> None:
    with pytest.raises(TypeError, match="must be callable, not int"):
        core.wake_after(1.0, 3)  # type: ignore[arg-type]


def test_call_soon_runs_at_the_next_safe_point_of_the_frame_given(core: ModuleType) -> None:
    # The agent's threads start again in the parent once os.fork() returns
    # (3.13+ counts them after the at-fork hooks): a pending call may come
    # due in a hook registered later, and must wait for the forking frame.
    events: list[str] = []
    forking: list[FrameType] = []

    def ours() -> None:
        if forking:
            core.call_soon(lambda: events.append("called"), sys._getframe(1))

    def later_hook() -> None:
        if forking:
            for i in range(100):  # safe points of its own
                _ = [str(i)]
            events.append("later hook")

    os.register_at_fork(after_in_parent=ours)
    os.register_at_fork(after_in_parent=later_hook)
    forking.append(sys._getframe())
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        events.append("returned")
        os.waitpid(pid, 0)
    finally:
        forking.clear()
    assert events == ["later hook", "called", "returned"]


def test_call_soon_without_a_frame_runs_at_the_next_safe_point(core: ModuleType) -> None:
    events: list[str] = []
    core.call_soon(lambda: events.append("called"))
    events.append("next")
    assert events == ["called", "next"]


def _small_blocks(count: int) -> list[bytearray]:
    return [bytearray(100) for _ in range(count)]  # 2 pymalloc blocks each


SMALL_BLOCKS_LINE = _small_blocks.__code__.co_firstlineno + 1


def _at_small_blocks_line(core: ModuleType) -> int:
    stats = core.take_snapshot(traces=False).group("lineno").statistics()
    return sum(size for frames, size, _count in stats if frames[0] == (__file__, SMALL_BLOCKS_LINE))


def test_an_armed_wake_up_leaves_the_sample_points_where_they_were(core: ModuleType) -> None:
    # While a wake-up is armed, sample mode's fast path leaves for the slow
    # path at least once per stride of the countdown (8 KiB) to poll it.  The
    # countdown must go on across those visits: lost bytes would bring the
    # sample points closer and the estimates up, bytes counted twice down.
    count, rounds, interval = 20_000, 10, 64 * 1024
    core.start(1, "exact")
    keep = _small_blocks(count)
    exact = _at_small_blocks_line(core)
    core.stop()
    del keep
    blocks = [56, 101] * count  # a bytearray's object and its buffer
    tolerance = _tolerance(blocks, interval, rounds)
    total = 0
    core.wake_after(3600.0, lambda: None)
    try:
        for _ in range(rounds):
            core.start(1, "sample", interval)
            keep = _small_blocks(count)
            total += _at_small_blocks_line(core)
            core.stop()
            del keep
    finally:
        assert core.wake_cancel() is True  # armed all along, never called
    assert abs(total / rounds - exact) <= tolerance, (total / rounds, exact, tolerance)
