"""What the agent (or ``heapwatch leaks``) hands its leak tracker each cycle,
for tests to read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Optional, TypeVar

import pytest

import heapwatch.agent.agent as agent_module
from heapwatch.formats.leaks import Ages, LeakTracker, Observation

T = TypeVar("T")
AgesGiven = Optional[Mapping[Any, Ages]]


def _record(
    monkeypatch: pytest.MonkeyPatch,
    module: ModuleType,
    keep: Callable[[Mapping[Any, Observation], AgesGiven], T],
) -> list[T]:
    """Makes the trackers ``module`` creates from now on append what ``keep``
    takes of each cycle (its sites and ages) to the list returned."""
    seen: list[T] = []

    class Recording(LeakTracker[Any]):
        def observe(
            self,
            time: float,
            sites: Mapping[Any, Observation],
            ages: AgesGiven = None,
        ) -> None:
            seen.append(keep(sites, ages))
            super().observe(time, sites, ages)

    monkeypatch.setattr(module, "LeakTracker", Recording)
    return seen


def record_observations(monkeypatch: pytest.MonkeyPatch) -> list[Mapping[Any, Observation]]:
    """Makes the agents created from now on record each cycle's observations
    (their sites as the tracker gets them) in the list returned."""
    return _record(monkeypatch, agent_module, lambda sites, _ages: dict(sites))


def record_ages(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[AgesGiven]:
    """Makes the trackers ``module`` creates from now on record each cycle's
    ages (None when it gives none) in the list returned."""
    return _record(monkeypatch, module, lambda _sites, ages: ages)
