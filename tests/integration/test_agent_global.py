"""start_agent()/stop_agent() with the C core, in this process."""

from __future__ import annotations

import logging
import tracemalloc
import urllib.request

import pytest

import heapwatch
import heapwatch.tracemalloc as hw_tracemalloc
from heapwatch import _core
from support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("no_agent")


def test_start_agent_runs_once_and_stop_agent_is_idempotent() -> None:
    agent = heapwatch.start_agent(port=0, interval=0.1, mode="exact", exporters=["prometheus"])
    assert agent is not None and agent.running
    assert heapwatch.get_agent() is agent
    assert heapwatch.start_agent(port=0) is agent  # the one running
    assert _core.is_tracing()
    url = agent.metrics_url
    assert url is not None
    kept = [bytearray(50_000) for _ in range(20)]
    body = wait_for(
        lambda: (
            b"test_agent_global.py" in (text := urllib.request.urlopen(url, timeout=5).read())
            and text
        )
    )
    assert b'heapwatch_info{mode="exact"' in body
    assert heapwatch.stop_agent() is True
    assert heapwatch.stop_agent() is True
    assert heapwatch.get_agent() is None
    assert not _core.is_tracing()  # the agent started tracing, so it stopped it
    del kept


def test_disabled_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEAPWATCH_ENABLED", "false")
    assert heapwatch.start_agent() is None
    assert not _core.is_tracing()
    # a value in code wins over the environment (exact mode: a sample-mode session
    # would leave this thread's sampling countdown to the tests that follow)
    agent = heapwatch.start_agent(enabled=True, exporters=[], interval=3600, mode="exact")
    assert agent is not None


def test_settings_from_the_environment_and_from_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEAPWATCH_TOP", "4")
    monkeypatch.setenv("HEAPWATCH_MODE", "exact")
    agent = heapwatch.start_agent(exporters="none", interval="1h")
    assert agent is not None
    assert (agent.config.top, agent.config.mode, agent.config.interval) == (4, "exact", 3600.0)
    assert agent.config.exporters == ()
    assert agent.metrics_url is None
    assert _core.get_config()["mode"] == "exact"


def test_the_stdlib_tracer_running_leaves_the_agent_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger="heapwatch.agent"):
            assert heapwatch.start_agent(exporters=[]) is None
    finally:
        tracemalloc.stop()
    assert "stdlib tracemalloc module is tracing" in caplog.text
    assert heapwatch.get_agent() is None


def test_an_already_tracing_core_keeps_its_configuration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _core.start(3, "exact")
    with caplog.at_level(logging.INFO, logger="heapwatch.agent"):
        agent = heapwatch.start_agent(mode="sample", exporters=[], interval=3600)
    assert agent is not None
    assert agent.readings().mode == "exact"
    assert agent.readings().sample_interval == 0
    assert "already tracing" in caplog.text
    assert _core.get_config()["profile"] == "tracemalloc"  # the drop-in's semantics stay
    heapwatch.stop_agent()
    assert _core.is_tracing()  # not the agent's to stop


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_the_agent_starts_the_core_in_its_own_profile(mode: str) -> None:
    """Neither the stdlib's whole depth nor its free-list re-stamps: the agent
    exports neither (core.md, "Profiles")."""
    agent = heapwatch.start_agent(mode=mode, exporters=[], interval=3600)
    assert agent is not None
    assert _core.get_config()["profile"] == "agent"
    heapwatch.stop_agent()


def test_the_dropin_started_while_the_agent_traces_gets_the_stdlibs_semantics() -> None:
    agent = heapwatch.start_agent(mode="exact", exporters=[], interval=3600)
    assert agent is not None
    try:
        hw_tracemalloc.start()
        assert _core.get_config()["profile"] == "tracemalloc"
    finally:
        heapwatch.stop_agent()


def _allocated_three_calls_deep() -> bytes:
    def one() -> bytes:
        return two()

    def two() -> bytes:
        return three()

    def three() -> bytes:
        return bytes(1 << 20)  # one block: the object is its own buffer

    return one()


@pytest.mark.parametrize(
    ("mode", "nframe", "expected"),
    [("sample", None, 64), ("exact", None, 1), ("sample", "2", 2), ("exact", "25", 25)],
)
def test_the_cores_traceback_depth_is_the_modes_default_unless_nframe_is_set(
    monkeypatch: pytest.MonkeyPatch, mode: str, nframe: str | None, expected: int
) -> None:
    """Sample mode walks the stack for sampled allocations only, so its
    default keeps the callers; exact mode keeps one frame; HEAPWATCH_NFRAME
    wins in both.  A sampled block's traceback holds its callers."""
    monkeypatch.setenv("HEAPWATCH_MODE", mode)
    if nframe is not None:
        monkeypatch.setenv("HEAPWATCH_NFRAME", nframe)
    # A 1 MiB block is sampled whatever the countdown at a 64 KiB interval.
    agent = heapwatch.start_agent(exporters=[], interval=3600, sample_interval="64KiB")
    assert agent is not None
    assert _core.get_traceback_limit() == expected
    block = _allocated_three_calls_deep()
    frames = _core.get_object_traceback(block)
    assert frames is not None
    # three(), two(), one(), _allocated_three_calls_deep(), this test, pytest's...
    assert min(expected, 5) <= len(frames) <= expected, frames
    assert frames[0][0] == __file__, frames
    heapwatch.stop_agent()
    del block
