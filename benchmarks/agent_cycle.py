"""The agent's collection cycle, heapwatch's and the stdlib's, and the live
heap it runs against.

``make_heapwatch_cycle`` runs the real ``heapwatch.Agent`` cycle (what the
agent does every interval, minus the export).  The cycle and pause suites of
run.py only call what it returns.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Callable

Cycle = Callable[[], object]
# Seconds spent in each step of a cycle, summed over the cycles that ran.
Phases = dict[str, float]

TOP = 20


def make_heapwatch_cycle(phases: Phases | None = None) -> Cycle:
    """One cycle of the real agent per call: ``heapwatch.Agent.run_cycle`` of
    an agent with no exporters (a snapshot resetting the peak, grouping by
    line, growth since the previous cycle, the top sites, the tracer's memory,
    a drain).  The tracer is already running; the agent only reads it."""
    from heapwatch import Agent, AgentConfig

    agent = Agent(AgentConfig(exporters=(), top=TOP), exporters=())
    laps = phases if phases is not None else {}

    def cycle() -> object:
        t0 = time.perf_counter()
        result = agent.run_cycle()
        if phases is not None:
            laps["agent.run_cycle"] = laps.get("agent.run_cycle", 0.0) + time.perf_counter() - t0
        return result

    return cycle


def make_stdlib_cycle(phases: Phases | None = None) -> Cycle:
    """The same cycle with the stdlib: take_snapshot, statistics("lineno"),
    compare_to(previous, "lineno"), reset_peak."""
    previous: tracemalloc.Snapshot | None = None
    laps = phases if phases is not None else {}

    def cycle() -> object:
        nonlocal previous
        t0 = time.perf_counter()
        snap = tracemalloc.take_snapshot()
        t1 = time.perf_counter()
        top = snap.statistics("lineno")[:TOP]
        t2 = time.perf_counter()
        growth = snap.compare_to(previous, "lineno")[:TOP] if previous is not None else []
        t3 = time.perf_counter()
        tracemalloc.reset_peak()
        t4 = time.perf_counter()
        previous = snap
        if phases is not None:
            for step, seconds in (
                ("take_snapshot", t1 - t0),
                ("statistics", t2 - t1),
                ("compare_to", t3 - t2),
                ("reset_peak", t4 - t3),
            ):
                laps[step] = laps.get(step, 0.0) + seconds
        return (growth, top)

    return cycle


# ---- the live heap ----------------------------------------------------------

SITES_FILENAME = "<heapwatch-bench-sites>"


class LiveHeap:
    """About ``blocks`` live blocks allocated from ``sites`` distinct lines of
    code, Zipf-distributed (site k holds a share proportional to 1/(k+1)), as
    an application's heap is: a few big sites and a long tail."""

    def __init__(self, blocks: int, sites: int = 1000) -> None:
        source = "\n".join(
            f"def site_{k}(n):\n    return [object() for _ in range(n)]" for k in range(sites)
        )
        namespace: dict[str, object] = {}
        exec(compile(source, SITES_FILENAME, "exec"), namespace)
        self.sites: list[Callable[[int], list[object]]] = [
            namespace[f"site_{k}"]  # type: ignore[misc]
            for k in range(sites)
        ]
        weights = [1.0 / (k + 1) for k in range(sites)]
        total = sum(weights)
        self.counts = [max(1, round(blocks * w / total)) for w in weights]
        self.held: list[list[object]] = [[] for _ in range(sites)]
        self.turn = 0

    def populate(self) -> None:
        for k, site in enumerate(self.sites):
            self.held[k] = site(self.counts[k])

    def mutate(self, fraction: float = 0.01) -> None:
        """Between cycles: a few sites grow and a few shrink, so that growth
        has something to report (about ``fraction`` of the blocks are freed
        or allocated)."""
        budget = int(sum(self.counts) * fraction)
        k = self.turn
        while budget > 0:
            k = (k + 7) % len(self.sites)
            old = len(self.held[k])
            new = old + max(1, old // 10) if (k + self.turn) % 2 else max(1, old - old // 10)
            self.held[k] = self.sites[k](new)
            budget -= old + new
        self.turn += 1
