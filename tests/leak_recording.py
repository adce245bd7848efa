"""What the agent hands its leak tracker each cycle, for tests to read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import heapwatch.agent.agent as agent_module
from heapwatch.agent.leaks import Ages, LeakTracker, Observation


def record_observations(monkeypatch: pytest.MonkeyPatch) -> list[Mapping[Any, Observation]]:
    """Makes the agents created from now on record each cycle's observations
    (their sites as the tracker gets them) in the list returned."""
    seen: list[Mapping[Any, Observation]] = []

    class Recording(LeakTracker[Any]):
        def observe(
            self,
            time: float,
            sites: Mapping[Any, Observation],
            ages: Mapping[Any, Ages] | None = None,
        ) -> None:
            seen.append(dict(sites))
            super().observe(time, sites, ages)

    monkeypatch.setattr(agent_module, "LeakTracker", Recording)
    return seen
