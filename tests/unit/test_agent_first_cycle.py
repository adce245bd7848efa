"""The agent's first cycle opens nothing while the service starts: the
process's memory it publishes was read by start(), in the service's thread."""

from __future__ import annotations

import threading
import time

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.runtime.procmem import ProcessMemory
from support.agent_model import FakeClock, ModelSource, TickingTimer


def test_only_start_reads_the_processs_memory_for_the_first_cycle() -> None:
    # Given an agent whose memory reader notes the thread that calls it
    callers: list[str] = []

    def memory() -> ProcessMemory:
        callers.append(threading.current_thread().name)
        resident = 1_000_000 + len(callers)
        return ProcessMemory(resident=resident, native_in_use=None, native_retained=None)

    agent = Agent(
        AgentConfig(exporters=(), interval=60),
        source=ModelSource(),
        exporters=[],
        clock=FakeClock(),
        timer=TickingTimer(0.1),
        memory=memory,
    )
    # When it starts and its first cycle has run (the next is a minute away)
    assert agent.start()
    try:
        deadline = time.monotonic() + 10
        while agent.readings().cycles < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        result = agent.readings().result
    finally:
        agent.stop(timeout=0)
    # Then the only reading was start()'s, in the starting thread, and the
    # first cycle published it: the agent's thread opened nothing (reading
    # /proc/self/statm there as the service starts showed the service a
    # descriptor: CPython's test_subprocess test_close_fds)
    assert callers[:1] == [threading.current_thread().name]
    assert result is not None and result.resident == 1_000_001
