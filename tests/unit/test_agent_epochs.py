"""The agent's epochs, on a pure-Python model of the core: every epoch but
the current one and the first lasts at least the agent's interval, whoever
runs its cycles (the thread, ``Agent.run_cycle()`` through the API, the
first cycle at start, the last at stop, a forked child's first), so that an
age in epochs is a lower bound of a duration (``AgeClock``) and the leak
score's "old" bytes are old."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.formats.leaks import Observation
from support.agent_model import FakeClock, ModelSource
from support.leak_recording import record_observations
from support.waiting import wait_for

MODES = pytest.mark.parametrize("mode", ["exact", "sample"])
INTERVAL = 60.0
SITE = ("app.py", 10)


def make_agent(source: ModelSource, timer: FakeClock, clock: FakeClock, **settings: Any) -> Agent:
    config = AgentConfig(exporters=(), interval=INTERVAL, **settings)
    return Agent(config, source=source, exporters=[], clock=clock, timer=timer)


def advance(seconds: float, *clocks: FakeClock) -> None:
    for clock in clocks:
        clock.advance(seconds)


@MODES
def test_cycles_run_early_stay_in_the_epoch_until_an_interval_has_passed(mode: str) -> None:
    # Given an agent whose first cycle began epoch 1
    source = ModelSource(mode)
    timer, clock = FakeClock(100.0), FakeClock(1_700_000_000.0)
    agent = make_agent(source, timer, clock, mode=mode)
    first = agent.run_cycle()
    assert (source.epoch, first.epoch, first.epoch_started) == (1, 1, first.timestamp)
    # When cycles are run through the API every 5 s, for less than an interval
    for _ in range(11):
        advance(5.0, timer, clock)
        source.allocate(*SITE, 1000)
        result = agent.run_cycle()
        # Then each publishes its figures, in the same epoch, begun with the first
        assert result.traced == source.traced
        assert (source.epoch, result.epoch, result.epoch_started) == (1, 1, first.timestamp)
    # and once an interval has passed since it began, the next cycle begins another
    advance(5.0, timer, clock)
    result = agent.run_cycle()
    assert (source.epoch, result.epoch, result.epoch_started) == (2, 2, result.timestamp)
    advance(INTERVAL - 0.5, timer, clock)
    assert agent.run_cycle().epoch == 2


@pytest.fixture
def observations(monkeypatch: pytest.MonkeyPatch) -> list[Mapping[Any, Observation]]:
    """Each cycle's observations, as the agent gives them to its leak tracker."""
    return record_observations(monkeypatch)


@MODES
def test_the_leak_scores_old_bytes_are_never_young_memory(
    mode: str, observations: list[Mapping[Any, Observation]]
) -> None:
    # Given an agent that has run its first cycle, then a site's 1 MiB
    source = ModelSource(mode, 64 * 1024)
    timer, clock = FakeClock(100.0), FakeClock(1_700_000_000.0)
    agent = make_agent(source, timer, clock, mode=mode, sample_interval=64 * 1024)
    agent.run_cycle()
    source.allocate(*SITE, 1 << 20)
    # When a dozen cycles are run early, a second apart
    for _ in range(12):
        advance(1.0, timer, clock)
        agent.run_cycle()
    # Then the scorer saw the site's memory live, and none of it old
    assert [seen[SITE].live for seen in observations[1:]] == [1 << 20] * 12
    assert [seen[SITE].old for seen in observations[1:]] == [0.0] * 12
    # and once eight epochs have begun since (cycles an interval apart), it is old
    for _ in range(8):
        advance(INTERVAL, timer, clock)
        agent.run_cycle()
    assert [seen[SITE].old for seen in observations[-2:]] == [0.0, 1 << 20]


def test_an_epoch_the_agent_did_not_see_begin_lasts_an_interval_from_its_first_cycle() -> None:
    # Given a core in epoch 5 (another agent's, or a parent's before a fork)
    source = ModelSource()
    source.epoch = 5
    timer, clock = FakeClock(100.0), FakeClock(1_700_000_000.0)
    agent = make_agent(source, timer, clock)
    # When the agent's first cycles run, within an interval of the first
    result = agent.run_cycle()
    advance(INTERVAL - 1.0, timer, clock)
    agent.run_cycle()
    # Then they stay in it: it began no later than the first, which says so
    assert source.epoch == 5
    assert (result.epoch, result.epoch_started) == (5, result.timestamp)
    advance(1.0, timer, clock)
    assert agent.run_cycle().epoch == 6


def test_a_forked_childs_first_cycle_keeps_the_parents_epoch() -> None:
    # Given an agent whose cycle began an epoch
    source = ModelSource()
    timer, clock = FakeClock(100.0), FakeClock(1_700_000_000.0)
    agent = make_agent(source, timer, clock)
    agent.run_cycle()
    # When the process forks (the child drops the parent's state) and the
    # child's agent cycles at once, as it does when it restarts
    agent._after_fork_in_child()
    advance(1.0, timer, clock)
    agent.run_cycle()
    # Then the child's cycle stays in the parent's epoch, until its interval is up
    assert source.epoch == 1
    advance(INTERVAL - 1.0, timer, clock)
    agent.run_cycle()
    assert source.epoch == 2


def test_a_cycle_that_fails_after_beginning_an_epoch_leaves_the_next_in_it() -> None:
    # Given an agent whose cycle fails once it has begun an epoch
    source = ModelSource()
    timer, clock = FakeClock(100.0), FakeClock(1_700_000_000.0)
    agent = make_agent(source, timer, clock)
    agent.run_cycle()
    advance(INTERVAL, timer, clock)
    source.fail = RuntimeError("snapshot failed")
    with pytest.raises(RuntimeError):
        agent.run_cycle()
    assert source.epoch == 2
    # When the next cycle runs early
    source.fail = None
    advance(1.0, timer, clock)
    result = agent.run_cycle()
    # Then it stays in that epoch, begun no later than itself
    assert (source.epoch, result.epoch, result.epoch_started) == (2, 2, result.timestamp)


def test_the_last_cycle_at_stop_stays_in_the_epoch() -> None:
    # Given an agent whose thread ran its first cycle (epoch 1), with an
    # interval of an hour
    source = ModelSource()
    agent = Agent(AgentConfig(exporters=(), interval=3600), source=source, exporters=[])
    assert agent.start()
    wait_for(lambda: agent.readings().cycles == 1, 10, 0.01)
    # When it stops, running its last cycle at once
    assert agent.stop(5.0)
    # Then that cycle ran in the first cycle's epoch
    readings = agent.readings()
    assert readings.cycles == 2
    assert readings.result is not None and readings.result.epoch == 1
    assert source.epoch == 1
