"""The agent's cycle and thread, on a pure-Python model of the core."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from heapwatch import HeapwatchError
from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.agent.interface import OTHER_FILE, OTHER_LINE, CyclePoint, Site
from heapwatch.runtime.procmem import ProcessMemory
from heapwatch.runtime.threads import own_threads
from support.agent_model import FakeClock, ModelSource, TickingTimer
from support.waiting import wait_for


def make_agent(source: ModelSource, **settings: Any) -> Agent:
    config = AgentConfig(exporters=(), interval=settings.pop("interval", 60.0), **settings)
    return Agent(config, source=source, exporters=[], clock=FakeClock(), timer=TickingTimer(0.25))


def by_site(sites: tuple[Site, ...]) -> dict[tuple[str, int], Site]:
    return {(site.file, site.line): site for site in sites}


def test_first_cycle_is_the_baseline_with_no_growth() -> None:
    # Given memory at two sites
    source = ModelSource()
    source.allocate("app.py", 10, 1000, 2)
    source.allocate("lib.py", 5, 300, 3)
    agent = make_agent(source, top=5)
    # When the first cycle runs
    result = agent.run_cycle()
    # Then it publishes sizes, blocks, no growth, and the peak's bytes
    assert result.traced == 1300
    assert result.blocks == 5
    assert by_site(result.sites) == {
        ("app.py", 10): Site("app.py", 10, 1000, 2, 0, peak=1000, allocated=1000),
        ("lib.py", 5): Site("lib.py", 5, 300, 3, 0, peak=300, allocated=300),
        (OTHER_FILE, OTHER_LINE): Site(OTHER_FILE, OTHER_LINE, 0, 0, 0, 0, None, None),
    }


def test_growth_is_the_change_since_the_previous_cycle() -> None:
    source = ModelSource()
    source.allocate("app.py", 10, 1000)
    agent = make_agent(source, top=5)
    agent.run_cycle()
    # When the leak grows and another site shrinks to nothing between cycles
    source.allocate("app.py", 10, 500)
    source.allocate("new.py", 1, 64)
    result = agent.run_cycle()
    sites = by_site(result.sites)
    assert sites["app.py", 10].growth == 500
    assert sites["new.py", 1].growth == 64
    # (freed before the interval's peak, it holds no peak; it keeps its series
    # as a site that allocated lately, the counter of bytes allocated's)
    source.free("new.py", 1, 64)
    source.allocate("app.py", 10, 250)
    result = agent.run_cycle()
    assert by_site(result.sites)["app.py", 10].growth == 250
    assert by_site(result.sites)["new.py", 1].growth == -64
    assert by_site(result.sites)[OTHER_FILE, OTHER_LINE].growth == 0
    assert sum(site.growth for site in result.sites) == 250 - 64


def test_only_the_top_sites_get_series_and_other_sums_the_rest() -> None:
    source = ModelSource()
    for line in range(1, 11):
        source.allocate("app.py", line, line * 100, line)
    agent = make_agent(source, top=3)
    first = agent.run_cycle()
    # the top 3 by size, then the top 3 by peak not among them, then <other>
    assert [(s.file, s.line) for s in first.sites] == [
        ("app.py", 10),
        ("app.py", 9),
        ("app.py", 8),
        ("app.py", 7),
        ("app.py", 6),
        ("app.py", 5),
        (OTHER_FILE, OTHER_LINE),
    ]
    other = first.sites[-1]
    assert other.size == sum(line * 100 for line in range(1, 5))
    assert other.blocks == sum(range(1, 5))
    # sum() over sites equals the traced total
    assert sum(site.size for site in first.sites) == first.traced
    assert sum(site.blocks for site in first.sites) == first.blocks
    # When small sites grow outside the top, <other> carries the growth of
    # those exported neither by size nor peak nor as the top 3 allocating
    for line in range(1, 5):
        source.allocate("app.py", line, 50)
    second = agent.run_cycle()
    assert ("app.py", 1) not in by_site(second.sites)
    assert second.sites[-1].growth == 50
    assert sum(site.growth for site in second.sites) == second.traced - first.traced


def test_top_zero_publishes_only_other() -> None:
    source = ModelSource()
    source.allocate("app.py", 1, 10)
    result = make_agent(source, top=0).run_cycle()
    assert result.sites == (Site(OTHER_FILE, OTHER_LINE, 10, 1, 0, 10, None, None, 10),)


def test_peak_is_the_peak_during_the_interval_and_resets() -> None:
    source = ModelSource()
    agent = make_agent(source)
    source.allocate("app.py", 1, 5000)
    source.free("app.py", 1, 4000)
    assert agent.run_cycle().peak == 5000
    assert agent.run_cycle().peak == 1000


def test_the_result_carries_clock_timer_overhead_and_drops() -> None:
    source = ModelSource()
    source.memory = 12345
    source.dropped_count = 3
    clock = FakeClock(1000.0)
    agent = Agent(
        AgentConfig(exporters=()), source=source, exporters=[], clock=clock, timer=TickingTimer(0.5)
    )
    result = agent.run_cycle()
    assert result.timestamp == 1000.0
    assert result.duration == 0.5
    assert result.tracer_memory == 12345
    assert result.dropped == 3
    assert source.drains == 1


def memory_agent(source: ModelSource, *readings: ProcessMemory) -> Agent:
    """An agent whose memory reader answers readings, one per call (the last
    repeats)."""
    queue = list(readings)

    def memory() -> ProcessMemory:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return Agent(
        AgentConfig(exporters=()),
        source=source,
        exporters=[],
        clock=FakeClock(),
        timer=TickingTimer(0.1),
        memory=memory,
    )


def test_the_result_splits_resident_memory_into_traced_tracer_and_untraced() -> None:
    # given 1300 traced bytes, a tracer of 4096, a process of 1 MB resident
    source = ModelSource()
    source.allocate("app.py", 10, 1300)
    memory = ProcessMemory(resident=1_000_000, native_in_use=700_000, native_retained=200_000)
    # when a cycle runs
    result = memory_agent(source, memory).run_cycle()
    # then what tracing leaves of resident is untraced, beside glibc's split
    assert result.resident == 1_000_000
    assert result.untraced == 1_000_000 - 1300 - 4096
    assert (result.native_in_use, result.native_retained) == (700_000, 200_000)


def test_untraced_is_never_negative_and_unknown_without_a_resident_size() -> None:
    # Traced bytes are allocated, not necessarily resident (numpy.zeros).
    source = ModelSource()
    source.allocate("app.py", 10, 80_000_000)
    small = ProcessMemory(resident=30_000_000, native_in_use=None, native_retained=None)
    assert memory_agent(source, small).run_cycle().untraced == 0
    unknown = ProcessMemory(resident=None, native_in_use=None, native_retained=None)
    result = memory_agent(source, unknown).run_cycle()
    assert (result.resident, result.untraced, result.native_in_use) == (None, None, None)


@pytest.mark.parametrize(
    ("native_in_use", "native_heap"), [(700_000, "mallinfo2"), (None, "unavailable")]
)
def test_readings_say_whether_the_c_heap_can_be_split(
    native_in_use: int | None, native_heap: str
) -> None:
    memory = ProcessMemory(1_000_000, native_in_use, None if native_in_use is None else 1)
    agent = memory_agent(ModelSource(), memory)
    assert agent.start()
    try:
        assert agent.readings().native_heap == native_heap
    finally:
        agent.stop()


def test_readings_before_and_after_a_cycle() -> None:
    source = ModelSource(mode="sample", sample_interval=4096)
    agent = make_agent(source, mode="sample", sample_interval=4096)
    readings = agent.readings()
    assert readings.result is None
    assert (readings.cycles, readings.errors) == (0, 0)
    assert (readings.mode, readings.sample_interval) == ("sample", 4096)
    result = agent.run_cycle()
    readings = agent.readings()
    assert readings.result == result
    assert readings.cycles == 1


def test_exact_mode_reads_sample_interval_zero() -> None:
    agent = make_agent(ModelSource(), mode="exact")
    assert agent.start()
    try:
        assert agent.readings().sample_interval == 0
    finally:
        agent.stop()


def test_the_thread_is_a_named_daemon_that_cycles_every_interval() -> None:
    source = ModelSource()
    agent = make_agent(source, interval=0.05)
    assert agent.start()
    try:
        (thread,) = [t for t in own_threads() if t.name == "heapwatch-agent"]
        assert thread.daemon
        assert source.started_with == (64, "sample", 512 * 1024)
        wait_for(lambda: agent.readings().cycles >= 3, 10, 0.01)
    finally:
        assert agent.stop()
    assert not thread.is_alive()


@pytest.mark.parametrize(
    ("settings", "nframe"),
    [
        ({"mode": "sample"}, 64),
        ({"mode": "exact"}, 1),
        ({"mode": "sample", "nframe": 3}, 3),
        ({"mode": "exact", "nframe": 3}, 3),
    ],
)
def test_tracing_starts_at_the_modes_default_nframe_unless_one_is_given(
    settings: dict[str, Any], nframe: int
) -> None:
    source = ModelSource()
    agent = make_agent(source, **settings)
    assert agent.start()
    try:
        assert source.started_with is not None
        assert source.started_with[:2] == (nframe, settings["mode"])
    finally:
        agent.stop()


def test_stop_runs_one_last_cycle_and_is_idempotent() -> None:
    source = ModelSource()
    agent = make_agent(source, interval=3600)
    agent.start()
    wait_for(lambda: agent.readings().cycles == 1, 10, 0.01)
    source.allocate("late.py", 1, 99)
    assert agent.stop(timeout=5)
    readings = agent.readings()
    assert readings.cycles == 2
    assert readings.result is not None and readings.result.traced == 99
    assert agent.stop() is True
    assert agent.running is False
    assert source.tracing is False  # the agent started tracing, so it stops it


def test_stop_is_bounded_by_its_deadline_when_a_cycle_hangs() -> None:
    source = ModelSource()
    source.hang = threading.Event()
    agent = make_agent(source, interval=3600)
    agent.start()
    try:
        started = time.monotonic()
        assert agent.stop(timeout=0.3) is False
        assert time.monotonic() - started < 2.0
    finally:
        source.hang.set()


def test_a_failing_cycle_is_logged_once_counted_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = ModelSource()
    source.fail = RuntimeError("snapshot went wrong")
    agent = make_agent(source, interval=0.02)
    with caplog.at_level(logging.DEBUG, logger="heapwatch.agent"):
        agent.start()
        wait_for(lambda: agent.readings().errors >= 3, 10, 0.01)
        source.fail = None
        wait_for(lambda: agent.readings().result is not None, 10, 0.01)
        agent.stop()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "retrying every 0.02s" in errors[0].getMessage()
    assert errors[0].exc_info is not None
    assert any("succeeded again" in r.getMessage() for r in caplog.records)
    readings = agent.readings()
    assert readings.cycles > readings.errors >= 3


def test_a_source_that_cannot_start_leaves_the_agent_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = ModelSource()
    source.start_error = RuntimeError("the stdlib tracemalloc module is tracing")
    agent = make_agent(source)
    with caplog.at_level(logging.WARNING, logger="heapwatch.agent"):
        assert agent.start() is False
    assert "stdlib tracemalloc module is tracing" in caplog.records[0].getMessage()
    assert agent.running is False
    assert not [t for t in own_threads() if t.name == "heapwatch-agent"]


def test_an_agent_does_not_restart_after_stop() -> None:
    agent = make_agent(ModelSource())
    agent.start()
    agent.stop()
    with pytest.raises(HeapwatchError, match="cannot restart"):
        agent.start()


def test_tracing_started_by_someone_else_is_left_running() -> None:
    source = ModelSource()
    source.tracing = True
    agent = make_agent(source)
    assert agent.start()
    agent.stop()
    assert source.tracing is True


class RecordingExporter:
    def __init__(self, name: str, fail_start: bool = False, fail_shutdown: bool = False) -> None:
        self.name = name
        self.fail_start = fail_start
        self.fail_shutdown = fail_shutdown
        self.events: list[str] = []

    def start(self, agent: Agent) -> None:
        self.events.append("start")
        if self.fail_start:
            raise OSError("cannot start")

    def shutdown(self, timeout: float) -> None:
        self.events.append("shutdown")
        if self.fail_shutdown:
            raise OSError("cannot shut down")

    def after_fork_in_child(self) -> None:
        self.events.append("fork")


def test_exporter_failures_are_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    good = RecordingExporter("good", fail_shutdown=True)
    bad = RecordingExporter("bad", fail_start=True)
    agent = Agent(AgentConfig(exporters=()), source=ModelSource(), exporters=[bad, good])
    with caplog.at_level(logging.WARNING, logger="heapwatch.agent"):
        assert agent.start()
        assert agent.exporters == (good,)
        assert agent.stop()
    # one line each, naming the exporter and the reason, no traceback
    messages = [r.getMessage() for r in caplog.records]
    assert "heapwatch exporter 'bad' failed to start; left out: OSError('cannot start')" in messages
    assert "heapwatch exporter 'good' did not shut down cleanly: cannot shut down" in messages
    assert not [r for r in caplog.records if r.exc_info]
    assert good.events == ["start", "shutdown"]


def test_exporters_added_and_removed_while_running() -> None:
    agent = make_agent(ModelSource())
    agent.start()
    late = RecordingExporter("late")
    assert agent.add_exporter(late)
    assert late in agent.exporters
    agent.remove_exporter(late)
    assert late.events == ["start", "shutdown"]
    assert late not in agent.exporters
    agent.stop()


def test_a_site_that_allocated_and_freed_within_the_interval_shows_in_the_peaks() -> None:
    # Given site B holding 10 MiB and site A allocating 50 MiB then freeing it
    mib = 1 << 20
    source = ModelSource()
    agent = make_agent(source, top=1)
    agent.run_cycle()
    source.allocate("b.py", 2, 10 * mib)
    source.allocate("a.py", 1, 50 * mib)
    source.free("a.py", 1, 50 * mib)
    # When the cycle runs
    result = agent.run_cycle()
    sites = by_site(result.sites)
    # Then the sizes show B alone, the peaks A at 50 MiB and B at 10 MiB
    assert {key: site.size for key, site in sites.items() if site.size} == {("b.py", 2): 10 * mib}
    assert sites["a.py", 1].peak == 50 * mib
    assert sites["b.py", 2].peak == 10 * mib
    assert result.peak == 60 * mib
    # and the next interval, with no peak of its own, shows B's bytes alone
    # (A keeps a series a while, for the bytes it allocated, with no peak)
    result = agent.run_cycle()
    peaks = {(s.file, s.line): s.peak for s in result.sites}
    assert {key: peak for key, peak in peaks.items() if peak} == {("b.py", 2): 10 * mib}
    assert peaks[OTHER_FILE, OTHER_LINE] == 0


def test_peaks_of_the_sites_and_other_sum_to_the_traced_peak() -> None:
    source = ModelSource()
    agent = make_agent(source, top=2)
    agent.run_cycle()
    for line in range(1, 8):
        source.allocate("app.py", line, line * 1000, line)
    for line in range(1, 8, 2):
        source.free("app.py", line, line * 1000, line)
    source.allocate("app.py", 9, 100)
    result = agent.run_cycle()
    assert sum(site.peak for site in result.sites) == result.peak
    assert sum(site.size for site in result.sites) == result.traced
    assert sum(site.blocks for site in result.sites) == result.blocks
    assert sum(site.growth for site in result.sites) == result.traced
    # the top 2 by size, then the top 2 by peak not among them, then <other>
    assert [(s.file, s.line) for s in result.sites] == [
        ("app.py", 6),
        ("app.py", 4),
        ("app.py", 7),
        ("app.py", 5),
        (OTHER_FILE, OTHER_LINE),
    ]
    # a site exported for its peak carries its size and growth too
    assert by_site(result.sites)["app.py", 7] == Site("app.py", 7, 0, 0, 0, 7000, allocated=7000)


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_leak_outside_the_top_sites_gets_a_score_and_a_series_and_churn_does_not(
    mode: str,
) -> None:
    # Given two big flat sites (the top 1 by size and the top 1 by peak), a
    # site that grows every cycle and a site that replaces its memory each cycle
    source = ModelSource()
    source.allocate("big.py", 1, 20 << 20)
    source.allocate("big.py", 2, 15 << 20)
    source.allocate("churn.py", 1, 1 << 20)
    timer = FakeClock(100.0)
    config = AgentConfig(
        exporters=(), top=1, leak_window=10.0, mode=mode, sample_interval=16 * 1024
    )
    agent = Agent(config, source=source, exporters=[], clock=FakeClock(), timer=timer)
    leak, churn = ("leak.py", 1), ("churn.py", 1)
    first_suspected = None
    for cycle in range(40):
        # When cycles run every 0.5 s for 20 s (a window of 10 s)
        source.allocate(*leak, 100 * 1024, 100)
        source.free(*churn, 1 << 20)
        source.allocate(*churn, 1 << 20)
        result = agent.run_cycle()
        timer.advance(0.5)
        sites = by_site(result.sites)
        # Then churn is never a suspect (its series, when it has one, is for
        # the bytes it allocates: the top site by allocation)
        assert churn not in sites or sites[churn].leak_score == 0.0
        if leak in sites and first_suspected is None:
            first_suspected = cycle
            # the leak is exported as a suspect: neither the top by size nor by peak
            assert [(s.file, s.line) for s in result.sites][:2] == [("big.py", 1), ("big.py", 2)]
            assert sites[leak].leak_score >= 0.5
            # 100 KiB a cycle, a cycle every 0.5 s
            assert sites[leak].leak_rate == pytest.approx(200 * 1024, rel=0.05)
    assert first_suspected is not None
    # within the shortest span scored (0.6 of the window) and a few cycles more
    assert first_suspected <= 24
    # and the flat sites score nothing
    assert by_site(result.sites)["big.py", 1].leak_score == 0.0
    assert by_site(result.sites)[leak].leak_score >= 0.9


class PushingExporter(RecordingExporter):
    pushes = True


@pytest.mark.parametrize("pushing", [False, True], ids=["no pusher", "a pusher"])
def test_at_exit_the_last_cycle_runs_only_for_an_exporter_that_pushes(pushing: bool) -> None:
    # Given an agent that has run its first cycle
    source = ModelSource()
    exporter = PushingExporter("otlp") if pushing else RecordingExporter("prometheus")
    agent = Agent(AgentConfig(exporters=(), interval=3600), source=source, exporters=[exporter])
    assert agent.start()
    wait_for(lambda: agent.readings().cycles == 1, 10, 0.01)
    # When the process exits (the agent's at-exit hook)
    assert agent._stop(5.0, at_exit=True)
    # Then a last cycle ran only for an exporter that pushes it
    assert agent.readings().cycles == (2 if pushing else 1)
    assert exporter.events == ["start", "shutdown"]


def test_an_explicit_stop_runs_the_last_cycle_whoever_exports() -> None:
    agent = Agent(
        AgentConfig(exporters=(), interval=3600),
        source=ModelSource(),
        exporters=[RecordingExporter("prometheus")],
    )
    assert agent.start()
    wait_for(lambda: agent.readings().cycles == 1, 10, 0.01)
    assert agent.stop(5.0)
    assert agent.readings().cycles == 2


def test_history_keeps_the_last_cycles_totals_bounded() -> None:
    from heapwatch.agent.agent import HISTORY_CYCLES

    # Given an agent whose traced memory grows by 100 bytes a cycle
    source = ModelSource()
    agent = make_agent(source)
    for cycle in range(HISTORY_CYCLES + 5):
        source.allocate("app.py", 1, 100, 1)
        agent.run_cycle()
        if cycle == 0:
            (first,) = agent.history()
            assert first.traced == 100
    # Then it keeps the last HISTORY_CYCLES, oldest first, a point per cycle
    history = agent.history()
    assert len(history) == HISTORY_CYCLES
    assert [p.traced for p in history] == [100 * n for n in range(6, HISTORY_CYCLES + 6)]
    assert history[-1] == CyclePoint.of(agent.readings().result)  # type: ignore[arg-type]
    assert all(a.timestamp <= b.timestamp for a, b in zip(history, history[1:]))


def test_stack_points_every_few_minutes_bounded() -> None:
    from heapwatch.agent.agent import STACK_POINT_SECONDS, STACK_POINTS
    from heapwatch.formats.view import unfold_stacks

    # Given an agent whose clock moves a third of the spacing a cycle
    source = ModelSource()
    clock = FakeClock()
    agent = Agent(
        AgentConfig(exporters=(), interval=60.0),
        source=source,
        exporters=[],
        clock=clock,
        timer=TickingTimer(0.25),
    )
    taken = []
    for cycle in range(3 * (STACK_POINTS + 4)):
        source.allocate("app.py", 7, 100, 1)
        agent.run_cycle()
        if len(agent.stack_points()) > len(taken) or agent.stack_points()[-1] != taken[-1]:
            taken.append(agent.stack_points()[-1])
            assert cycle % 3 == 0, cycle
        clock.advance(STACK_POINT_SECONDS / 3 + 0.01)
    # Then the first cycle took one, then one every STACK_POINT_SECONDS, the last kept
    points = agent.stack_points()
    assert len(points) == STACK_POINTS
    assert points == tuple(taken[-STACK_POINTS:])
    first, last = points[0], points[-1]
    assert last.timestamp - first.timestamp >= (STACK_POINTS - 1) * STACK_POINT_SECONDS
    # and each holds the memory by stack of its cycle, names resolved
    cycles = 3 * len(taken) - 2
    assert unfold_stacks(last.stacks) == [((("app.py", 7, "model"),), 100 * cycles, cycles)]


def test_threading_lists_no_thread_of_the_agent_even_when_its_cycle_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # logging names each record's thread with threading.current_thread(),
    # which makes threading a _DummyThread for a thread it does not know.
    before = threading.enumerate()
    source = ModelSource()
    source.fail = RuntimeError("snapshot went wrong")
    interval = 0.4
    agent = make_agent(source, interval=interval)
    with caplog.at_level(logging.DEBUG, logger="heapwatch.agent"):
        assert agent.start()
        try:
            (thread,) = [t for t in own_threads() if t.name == "heapwatch-agent"]
            wait_for(lambda: agent.readings().errors >= 2, 10, 0.01)
            assert {r.thread for r in caplog.records} >= {thread.ident}
            # Between two cycles (a failing one takes well under a
            # millisecond), what the last one logged names no thread.
            errors = agent.readings().errors
            wait_for(lambda: agent.readings().errors > errors, 10, 0.005)
            time.sleep(interval / 2)
            listed = threading.enumerate()
            assert listed == before, listed
        finally:
            agent.stop()
    assert threading.enumerate() == before
