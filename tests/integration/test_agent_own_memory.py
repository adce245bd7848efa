"""heapwatch's own memory is never shown as the service's.

What heapwatch's threads allocate (a dump, the /debug/ routes, the agent's
cycle with its leak tracker's history), and what a cycle run from the
service's own thread allocates, is not traced; what they free of the
service's is untracked as ever.  The soak run found the case: a signal dump
in progress held its snapshot's frames tuples (28 MB for 12,651 tracebacks
of 25 frames), all traced at heapwatch/server/dumps.py as the service's top
site, and the tracer's memory grew with them.  Both modes, on the C core.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import heapwatch
from heapwatch import _core
from heapwatch.agent.config import AgentConfig
from heapwatch.runtime.threads import start_thread
from heapwatch.server import dumps
from heapwatch.server.dumps import DumpService
from support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("no_agent")

# Sample mode at 1 KiB: heapwatch's objects (tuples of 50 to 250 bytes, by
# the thousand) would be sampled by the hundred were they traced.
MODES = [("exact", 1), ("sample", 1024)]
PACKAGE = os.path.dirname(heapwatch.__file__)
# heapwatch's objects a test's main thread makes (a Thread, a config) are
# the test's doing; what heapwatch's own work allocated was 10 to 100 times this.
SLACK = 16 << 10
SERVICE_SITES = 300


def heapwatch_bytes(snap: _core.Snapshot) -> int:
    """Bytes of the live traces whose site (most recent frame) is a module
    of heapwatch's package."""
    return sum(
        size
        for _domain, frames, _total, size, _count in snap.tracebacks()
        if frames[0][0].startswith(PACKAGE)
    )


def service_data() -> list[Any]:
    """Objects of SERVICE_SITES distinct sites (a file each): as many
    tracebacks for a snapshot to turn into frames tuples."""
    made: list[Any] = []
    for n in range(SERVICE_SITES):
        code = compile("made.extend(bytes(100) for _ in range(20))", f"<service-{n}>", "exec")
        exec(code, {"made": made})  # a site per file
    return made


@pytest.fixture(params=MODES, ids=[mode for mode, _ in MODES])
def tracing(request: pytest.FixtureRequest) -> Iterator[str]:
    mode, interval = request.param
    _core.start(25, mode, interval)
    try:
        yield mode
    finally:
        _core.stop()


def test_a_signal_dump_in_progress_is_not_the_services_memory(
    tracing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a service with many sites, and a dump directory that is full:
    # the writer stops halfway, as the soak's full tmpfs made it
    data = service_data()
    halfway = threading.Event()
    resume = threading.Event()

    def full_disk(
        directory: str, name: str, header: Any, traces: Iterator[Any], routes: Any = None
    ) -> str:
        next(traces)
        halfway.set()
        resume.wait(60)
        raise OSError(28, "No space left on device", directory)

    monkeypatch.setattr(dumps, "write_dump_file", full_disk)
    service = DumpService(AgentConfig(mode=tracing, dump_dir=str(tmp_path)))
    failed: list[BaseException] = []

    def dump() -> None:
        try:
            service.dump_to_directory()
        except OSError as exc:
            failed.append(exc)

    before = heapwatch_bytes(_core.take_snapshot(traces=False))
    # When heapwatch's dump thread is in the middle of that dump
    thread = start_thread(dump, "heapwatch-dump")
    try:
        assert halfway.wait(60)
        during = _core.take_snapshot(traces=False)
    finally:
        resume.set()
        thread.join(60)
    # Then its snapshot's tuples, a batch of traces, are none of the
    # service's memory, while the service's own objects are
    assert heapwatch_bytes(during) - before <= SLACK
    sites = {frames[0][0] for _d, frames, *_ in during.tracebacks()}
    assert len({site for site in sites if site.startswith("<service-")}) > SERVICE_SITES // 2
    assert [type(exc) for exc in failed] == [OSError]
    assert data


def test_what_heapwatchs_thread_frees_of_the_services_is_untracked(tracing: str) -> None:
    # Given service blocks each past the sample interval (sampled, or traced)
    blocks = [bytearray(100_000) for _ in range(20)]  # SERVICE BLOCKS
    line = test_what_heapwatchs_thread_frees_of_the_services_is_untracked.__code__.co_firstlineno
    ours = [(__file__, line + 2)]

    def blocks_at_line(snap: _core.Snapshot) -> int:
        # The blocks themselves: on 3.9 the comprehension's frame, which its
        # code object keeps for the next call, may be a malloc at that line
        # too (or come from the frame free list), and stays.
        return sum(
            1
            for _d, size, frames, _t in snap.traces()
            if list(frames[:1]) == ours and size >= 100_000
        )

    assert blocks_at_line(_core.take_snapshot(traces=True)) >= 20 * 0.7
    # When heapwatch's own thread lets go of them
    thread = start_thread(blocks.clear, "heapwatch-test")
    thread.join(60)
    # Then their traces are gone: no stale trace of the service's memory
    assert blocks_at_line(_core.take_snapshot(traces=True)) == 0
    _core._check_invariants()


def test_the_leak_trackers_history_is_not_the_services_memory(tracing: str) -> None:
    # Given four sites the leak tracker watches (64 KiB or more)
    held = [bytearray(200_000)]
    held.append(bytearray(200_000))
    held.append(bytearray(200_000))
    held.append(bytearray(200_000))
    agent = heapwatch.start_agent(port=0, interval=0.05, exporters="none", dump_signal="none")
    assert agent is not None
    try:
        # When the agent's thread has run cycles, and the service's own
        # thread runs more through the API
        agent.run_cycle()
        first = heapwatch_bytes(_core.take_snapshot(traces=False))
        wait_for(lambda: agent.readings().cycles >= 60, what="60 cycles of the agent's thread")
        for _ in range(30):
            agent.run_cycle()
        last = _core.take_snapshot(traces=False)
    finally:
        heapwatch.stop_agent()
    # Then the history (an observation per site and cycle) is not traced
    leaks = heapwatch.formats.leaks.__file__
    assert [f for _d, f, *_ in last.tracebacks() if f[0][0] == leaks] == []
    assert heapwatch_bytes(last) - first <= SLACK
    assert held
