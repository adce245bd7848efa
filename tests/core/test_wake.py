"""wake_after(): a callable run from the main thread once the process
allocates past a deadline, with no thread of ours to watch the clock.

A forked child restarts the agent this way at its first cycle's deadline
(docs/design/agent.md, "Fork").  The hooks read the clock every 64th
allocation made with the GIL while a wake-up is armed; the call itself is a
pending call, run between two bytecodes of the main thread.
"""

from __future__ import annotations

import time
from types import ModuleType

import pytest

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
