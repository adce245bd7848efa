"""One cycle composed by ``heapwatch.agent.cycle.compose_cycle``, called
directly: no Agent, no thread, no lock; what it reads is given, what it
changes is returned."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import heapwatch.agent.cycle as cycle_module
from heapwatch.agent.cycle import (
    WATCH_LOW,
    Cycle,
    CycleReaders,
    CycleSettings,
    CycleState,
    EpochStart,
    begins_epoch,
    compose_cycle,
)
from heapwatch.agent.interface import OTHER_FILE, OTHER_LINE, Site
from heapwatch.formats.leaks import FLOOR_BYTES, Ages, LeakTracker, Observation
from heapwatch.runtime.container import ContainerMemory
from heapwatch.runtime.procmem import ProcessMemory
from support.agent_model import FakeClock, ModelSource, TickingTimer

Key = tuple[str, int]
MEMORY = ProcessMemory(resident=1_000_000, native_in_use=700_000, native_retained=200_000)
CONTAINER = ContainerMemory(2 << 30, None, 1 << 30, 900 << 20, 0, 1.5, 0.25)
SETTINGS = CycleSettings(top=5, interval=60.0, sample_interval=0)


class RecordingTracker(LeakTracker[Key]):
    """A leak tracker that keeps what each cycle gave it."""

    def __init__(self) -> None:
        super().__init__(1800.0)
        self.given: list[tuple[float, dict[Key, Observation]]] = []

    def observe(
        self, time: float, sites: Mapping[Key, Observation], ages: Mapping[Key, Ages] | None = None
    ) -> None:
        self.given.append((time, dict(sites)))
        super().observe(time, sites, ages)


def readers(
    timer: Any = None,
    clock: Any = None,
    memory: ProcessMemory = MEMORY,
    container: ContainerMemory | None = None,
) -> CycleReaders:
    return CycleReaders(
        clock=clock if clock is not None else FakeClock(1000.0),
        timer=timer if timer is not None else TickingTimer(0.25),
        memory=lambda: memory,
        container=lambda: container,
    )


def cycle(
    source: ModelSource,
    previous: CycleState | None = None,
    tracker: LeakTracker[Key] | None = None,
    settings: CycleSettings = SETTINGS,
    given: CycleReaders | None = None,
) -> Cycle:
    return compose_cycle(
        source,
        previous if previous is not None else CycleState(),
        tracker if tracker is not None else RecordingTracker(),
        settings,
        given if given is not None else readers(),
    )


def by_site(sites: tuple[Site, ...]) -> dict[Key, Site]:
    return {(site.file, site.line): site for site in sites}


def test_the_first_cycle_is_the_baseline_and_hands_its_state_on() -> None:
    # Given memory at two sites and no previous cycle
    source = ModelSource()
    source.allocate("app.py", 10, 1000, 2)
    source.allocate("lib.py", 5, 300, 3)
    # When a cycle is composed
    first = cycle(source)
    # Then every growth is 0, <other> sums the rest, and it began epoch 1
    assert by_site(first.result.sites) == {
        ("app.py", 10): Site("app.py", 10, 1000, 2, 0, peak=1000, allocated=1000),
        ("lib.py", 5): Site("lib.py", 5, 300, 3, 0, peak=300, allocated=300),
        (OTHER_FILE, OTHER_LINE): Site(OTHER_FILE, OTHER_LINE, 0, 0, 0, 0, None, None),
    }
    assert (source.epoch, first.result.epoch) == (1, 1)
    # and the state says what the next cycle compares with
    assert first.state.traced == 1300
    assert first.state.sizes == {("app.py", 10): 1000, ("lib.py", 5): 300}
    assert first.state.groups is not None
    assert first.state.epoch_began == EpochStart(1, 100.5, 1000.0)


def test_growth_is_since_the_state_given_which_is_never_changed() -> None:
    source = ModelSource()
    source.allocate("app.py", 10, 1000)
    first = cycle(source)
    state = first.state
    # When the site grows and two cycles are composed from the same state
    source.allocate("app.py", 10, 500)
    second = cycle(source, state)
    again = cycle(source, state)
    # Then both measure the growth since that state, which stayed as it was
    assert by_site(second.result.sites)["app.py", 10].growth == 500
    assert by_site(again.result.sites)["app.py", 10].growth == 500
    assert state == first.state
    # and from the second's state, nothing grew
    assert by_site(cycle(source, second.state).result.sites)["app.py", 10].growth == 0


def test_readers_are_read_once_each_in_order_into_the_result() -> None:
    # Given readers that record their calls
    calls: list[str] = []

    def reading(name: str, value: Any) -> Any:
        def read() -> Any:
            calls.append(name)
            return value() if callable(value) else value

        return read

    source = ModelSource()
    source.allocate("app.py", 10, 1300)
    timer = TickingTimer(0.5)
    given = CycleReaders(
        clock=reading("clock", 1000.0),
        timer=reading("timer", timer),
        memory=reading("memory", MEMORY),
        container=reading("container", CONTAINER),
    )
    # When a cycle is composed
    result = cycle(source, given=given).result
    # Then the timer frames it, and the memory is read after the snapshot's time
    assert calls == ["timer", "clock", "memory", "container", "timer"]
    assert (result.timestamp, result.duration) == (1000.0, 0.5)
    assert result.resident == 1_000_000
    assert result.untraced == 1_000_000 - 1300 - source.memory
    assert (result.native_in_use, result.native_retained) == (700_000, 200_000)
    assert result.container == CONTAINER
    assert source.drains == 1


def test_outside_any_cgroup_the_container_is_none() -> None:
    assert cycle(ModelSource(), given=readers(container=None)).result.container is None


@pytest.mark.parametrize("retain", [False, True])
def test_the_diffs_baseline_is_taken_only_when_asked_for(retain: bool) -> None:
    settings = SETTINGS._replace(retain_snapshot=retain)
    last = cycle(ModelSource(), settings=settings).last_snapshot
    if retain:
        assert last is not None and last[1] == 1000.0
    else:
        assert last is None


@pytest.mark.parametrize(
    ("current", "began", "now", "begins"),
    [
        (0, None, 100.0, True),  # the first epoch since tracing started ends at once
        (3, None, 100.0, False),  # an epoch the agent did not see begin
        (3, EpochStart(2, 0.0, 0.0), 100.0, False),  # ... nor any other
        (3, EpochStart(3, 50.0, 0.0), 109.9, False),  # less than an interval
        (3, EpochStart(3, 50.0, 0.0), 110.0, True),  # an interval since it began
    ],
)
def test_an_epoch_begins_only_an_interval_after_the_last(
    current: int, began: EpochStart | None, now: float, begins: bool
) -> None:
    assert begins_epoch(current, began, now, 60.0) is begins


def test_a_cycle_run_early_stays_in_the_epoch_and_keeps_when_it_began() -> None:
    source = ModelSource()
    timer = FakeClock(100.0)
    first = cycle(source, given=readers(timer=timer))
    timer.advance(5.0)
    early = cycle(source, first.state, given=readers(timer=timer))
    assert (source.epoch, early.result.epoch) == (1, 1)
    assert early.state.epoch_began == first.state.epoch_began
    timer.advance(60.0)
    assert cycle(source, early.state, given=readers(timer=timer)).result.epoch == 2


def test_a_forked_childs_state_keeps_only_when_the_epoch_began() -> None:
    source = ModelSource()
    source.allocate("app.py", 10, 1000)
    state = cycle(source).state
    child = state.in_forked_child()
    assert child == CycleState(epoch_began=state.epoch_began)


def test_sites_are_watched_from_the_floor_down_to_an_eighth_of_it() -> None:
    # Given a tracker, and a site at the leak score's floor
    tracker = RecordingTracker()
    timer = TickingTimer(10.0)
    source = ModelSource()
    source.allocate("big.py", 1, int(FLOOR_BYTES))
    source.allocate("small.py", 1, int(WATCH_LOW))
    state = cycle(source, tracker=tracker, given=readers(timer=timer)).state
    # Then only the site at the floor is observed, and watched
    assert set(tracker.given[-1][1]) == {("big.py", 1)}
    assert state.watched == {("big.py", 1)}
    # When it shrinks, it stays watched while it holds WATCH_LOW or more
    source.free("big.py", 1, int(FLOOR_BYTES - WATCH_LOW))
    state = cycle(source, state, tracker, given=readers(timer=timer)).state
    assert set(tracker.given[-1][1]) == {("big.py", 1)}
    source.free("big.py", 1, 1)
    state = cycle(source, state, tracker, given=readers(timer=timer)).state
    assert tracker.given[-1][1] == {}
    assert state.watched == frozenset()


def test_a_timer_that_did_not_move_adds_no_point_to_the_leak_series() -> None:
    tracker = RecordingTracker()
    timer = FakeClock(100.0)
    source = ModelSource()
    source.allocate("big.py", 1, int(FLOOR_BYTES))
    first = cycle(source, tracker=tracker, given=readers(timer=timer))
    # When a second cycle reads the same time, the tracker is not fed twice
    second = cycle(source, first.state, tracker, given=readers(timer=timer))
    assert [time for time, _sites in tracker.given] == [100.0]
    assert second.scores.keys() == first.scores.keys() == {("big.py", 1)}


def test_a_failing_snapshot_raises_and_the_state_given_still_serves() -> None:
    source = ModelSource()
    source.allocate("app.py", 10, 1000)
    state = cycle(source).state
    source.fail = RuntimeError("no snapshot")
    with pytest.raises(RuntimeError, match="no snapshot"):
        cycle(source, state)
    source.fail = None
    source.allocate("app.py", 10, 24)
    assert by_site(cycle(source, state).result.sites)["app.py", 10].growth == 24


def test_the_sites_that_allocate_most_are_exported_and_held() -> None:
    """A line that allocates and frees a lot holds nothing at a cycle's end;
    the counter of bytes allocated must still show it (issue 25)."""
    settings = CycleSettings(top=2, interval=60.0, sample_interval=0)
    source = ModelSource()
    for line in range(1, 6):  # five sites that hold more than the churn ever does
        source.allocate("big.py", line, 1_000_000 * line)
    state = cycle(source, settings=settings).state
    # When a line churns: 5,000 blocks of 10 kB, each freed before the next
    source.next_epoch()
    for _ in range(5_000):
        source.allocate("churn.py", 7, 10_000)
        source.free("churn.py", 7, 10_000)
    churned = cycle(source, state, settings=settings)
    # Then it is exported with what it allocated, though it holds nothing
    site = by_site(churned.result.sites)["churn.py", 7]
    assert (site.size, site.allocated) == (0, 50_000_000)
    # and it keeps its series for a while after it stops (rate() sees no gap)
    state = churned.state
    for _ in range(cycle_module.ALLOC_HOLD - 1):
        source.next_epoch()
        held = cycle(source, state, settings=settings)
        assert ("churn.py", 7) in by_site(held.result.sites)
        state = held.state
    source.next_epoch()
    later = cycle(source, state, settings=settings)
    assert ("churn.py", 7) not in by_site(later.result.sites)
    # and the sites and <other> count every byte allocated once
    assert sum(s.allocated for s in later.result.sites) == sum(source.allocated.values())
