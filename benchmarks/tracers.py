"""The tracer configurations a child process can run under.

Every child imports both tracers whatever its configuration (and the
hooks-only extension when run.py built one), so that the same code is loaded
in every run; only ``start`` differs.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass
from types import ModuleType

import floor
from heapwatch import _core
from heapwatch.agent.config import DEFAULT_NFRAME
from heapwatch.runtime.routes import ROUTE_NONE, current_route, route_id

FLOOR = floor.load()

SAMPLE_INTERVAL = 512 * 1024


@dataclass(frozen=True)
class Tracer:
    """How to start one configuration.  Labels, targets and the pairing with
    the stdlib live in run.py, which never imports a tracer."""

    name: str
    family: str  # "untraced", "stdlib", "heapwatch" or "floor" (floor.py's hooks)
    nframe: int
    mode: str  # "exact" or "sample"; "" when untraced; "countdown" for floor.COUNTDOWN_CONFIG
    # heapwatch's start profile: "agent" as the agent starts the core
    # (heapwatch.runtime.source.CoreSource), "tracemalloc" as the drop-in does.
    profile: str = "tracemalloc"
    # Whether the workload runs inside a request: the core reads the route
    # variable at each sampled allocation, as the agent sets it up in sample
    # mode (threads the workload starts have no route: the read finds none).
    route: bool = False

    def start(self) -> None:
        if self.family == "stdlib":
            tracemalloc.start(self.nframe)
        elif self.family == "heapwatch":
            if self.mode == "sample":
                _core.start(self.nframe, "sample", SAMPLE_INTERVAL)
                if self.route:
                    _core.set_route_var(current_route)
                    current_route.set(route_id("/bench/items/{id}"))
            else:
                _core.start(self.nframe, "exact", profile=self.profile)  # type: ignore[arg-type]
        elif self.family == "floor":
            if self.mode == "countdown":
                floor_module().start_countdown()
            else:
                floor_module().start()

    def stop(self) -> None:
        if self.family == "stdlib":
            tracemalloc.stop()
        elif self.family == "heapwatch":
            if self.route:
                _core.set_route_var(None)
                current_route.set(ROUTE_NONE)
            _core.stop()
        elif self.family == "floor":
            floor_module().stop()
            if self.mode == "countdown" and floor_module().ran_out():
                # It would have stood for sampling's work: no longer a floor.
                raise RuntimeError("the floor's countdown ran out: the run sampled")

    def traced_memory(self) -> tuple[int, int]:
        """(current, peak) traced bytes; (0, 0) when untraced."""
        if self.family == "stdlib":
            return tracemalloc.get_traced_memory()
        if self.family == "heapwatch":
            return _core.get_traced_memory()
        return (0, 0)

    def tracer_memory(self) -> int:
        """The tracer's own memory, as its get_tracemalloc_memory() reports it."""
        if self.family == "stdlib":
            return tracemalloc.get_tracemalloc_memory()
        if self.family == "heapwatch":
            return _core.get_tracemalloc_memory()
        return 0

    def live_traces(self) -> int:
        """Live traced blocks.  For the stdlib this copies every trace: call it
        after the measurements it would disturb."""
        if self.family == "stdlib":
            return len(tracemalloc._get_traces())  # type: ignore[attr-defined]
        if self.family == "heapwatch":
            return _core.get_stats()["live_traces"]
        return 0

    def recorded(self) -> int | None:
        """Traces recorded since start (heapwatch only; in exact mode, the
        number of allocations the tracer saw)."""
        if self.family == "heapwatch":
            return _core.get_stats()["recorded"]
        return None


TRACERS: dict[str, Tracer] = {
    t.name: t
    for t in (
        Tracer("untraced", "untraced", 0, ""),
        Tracer("stdlib-1", "stdlib", 1, "exact"),  # tracemalloc.start(1)
        Tracer("stdlib-25", "stdlib", 25, "exact"),  # tracemalloc.start(25)
        # The agent's exact mode: _core.start(n, "exact", profile="agent").
        Tracer("hw-exact-1", "heapwatch", 1, "exact", "agent"),
        Tracer("hw-exact-25", "heapwatch", 25, "exact", "agent"),
        # The drop-in's: _core.start(n, "exact"), the stdlib's semantics.
        Tracer("hw-dropin-1", "heapwatch", 1, "exact"),
        Tracer("hw-dropin-25", "heapwatch", 25, "exact"),
        Tracer("hw-sample", "heapwatch", 1, "sample"),
        Tracer("hw-sample-1g", "heapwatch", 1, "sample"),  # _core.start(1, "sample", 512 KiB)
        # The agent's default in sample mode: the same, at its default nframe.
        Tracer("hw-sample-deep", "heapwatch", DEFAULT_NFRAME["sample"], "sample"),
        # The agent's sample mode inside a request: allocations labelled.
        Tracer("hw-sample-route", "heapwatch", DEFAULT_NFRAME["sample"], "sample", route=True),
        # What any hook costs where sample mode's hooks go (floor.py).
        Tracer(floor.CONFIG, "floor", 0, ""),
        # The same, taking the bytes off a countdown as any byte sampler must.
        Tracer(floor.COUNTDOWN_CONFIG, "floor", 0, "countdown"),
    )
}


def floor_module() -> ModuleType:
    if FLOOR is None:
        raise RuntimeError(
            f"{', '.join(floor.CONFIGS)} need the extension run.py builds ({floor.FLOOR_ENV})"
        )
    return FLOOR
