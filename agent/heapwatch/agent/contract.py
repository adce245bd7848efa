"""What the agent publishes, and what its components implement.

The types of the agent's interface, defined here so that the agent's own
modules (``agent``, ``cycle``) use them without importing its front door:
the layers above import every one of them from ``heapwatch.agent.interface``,
which re-exports them beside the process's agent, never from here.

* ``Site``, ``CycleResult`` and ``Readings``: what a cycle saw, and what
  exporters read (``AgentView.readings()``; a read never takes a snapshot).
* ``Component``: ``start(agent)`` / ``shutdown(timeout)`` /
  ``after_fork_in_child()``, the life of an exporter (or the dump service)
  inside the agent.
* ``AgentView``, ``Routes`` and ``Server``: what a component may use of the
  agent, its HTTP routes and the server that serves them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Protocol

from heapwatch.runtime.procmem import NATIVE_HEAP_UNAVAILABLE

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from _typeshed.wsgi import WSGIApplication

    from heapwatch.agent.config import AgentConfig
    from heapwatch.formats.leaks import LeakScore
    from heapwatch.formats.view import FoldedStacks
    from heapwatch.runtime.container import ContainerMemory, MemoryCgroup

__all__ = [
    "OTHER_FILE",
    "OTHER_LINE",
    "AgentView",
    "BlackBox",
    "Component",
    "CyclePoint",
    "CycleResult",
    "Readings",
    "ReadingsSource",
    "Routes",
    "Server",
    "Site",
    "StackPoint",
    "site_of",
]

# The series that sums every site outside the top ones (fixed: dashboards
# and alert rules select on it).
OTHER_FILE = "<other>"
OTHER_LINE = 0


def site_of(frames: Sequence[tuple[str, int]]) -> tuple[str, int]:
    """(file, line) of a traceback's innermost frame: a site, as the agent
    names them."""
    return (frames[0][0], frames[0][1]) if frames else ("<unknown>", 0)


class Site(NamedTuple):
    """One allocation site (file and line) in a cycle's result."""

    file: str
    line: int
    size: int
    """Live bytes allocated there (an estimate in sample mode)."""
    blocks: int
    growth: int
    """Change of ``size`` since the previous cycle (0 on the first cycle)."""
    peak: int = 0
    """Its bytes when the traced total reached the interval's peak (what it
    added to ``CycleResult.peak``; an estimate in sample mode)."""
    leak_score: float | None = 0.0
    """0 to 1: how much its surviving memory looks like a leak over the
    leak window (``heapwatch.formats.leaks``); None for ``<other>``."""
    leak_rate: float | None = 0.0
    """Bytes per second its memory grew at over the span scored; None for
    ``<other>``."""
    allocated: int = 0
    """Bytes allocated there since tracing started, freed or not (Go's
    alloc_space; an estimate in sample mode).  A counter, but it can go back
    when the core folds an idle site's totals (docs/design/core.md)."""


class CycleResult(NamedTuple):
    """What one cycle saw.  ``sites`` holds the top sites by size, then the
    top sites by peak not among them, then the leak suspects (score at least
    0.5) not among them, then the ``<other>`` site, so that
    their sizes sum to ``traced``, their growths to the change of ``traced``
    since the previous cycle and their peaks to ``peak``."""

    timestamp: float
    """Unix time of the snapshot."""
    duration: float
    """Seconds the cycle took."""
    traced: int
    peak: int
    """Peak traced bytes since the previous cycle."""
    blocks: int
    tracer_memory: int
    """Bytes the tracer itself uses."""
    dropped: int
    """Traces lost since tracing started (no memory to record them)."""
    sites: tuple[Site, ...]
    resident: int | None = None
    """The process's resident set, in bytes (None where unknown)."""
    untraced: int | None = None
    """Resident bytes neither traced nor the tracer's own: memory of C code,
    or heap the C allocator keeps (see ``native_retained``)."""
    native_in_use: int | None = None
    """Bytes the C allocator (glibc) has handed out and not had back: Python's
    large blocks and native code's alike; None without glibc's mallinfo2."""
    native_retained: int | None = None
    """Bytes free in the C allocator's heap, retained rather than given back."""
    epoch: int | None = None
    """The epoch of the cycle's snapshot: its traces of age 0 were recorded
    in it.  The cycle began it, or stayed in it when less than the interval
    had passed since it began (``heapwatch.agent.cycle``)."""
    epoch_started: float | None = None
    """A unix time no earlier than ``epoch`` began: ``timestamp`` of the cycle
    that began it, or of the first cycle that saw it (its beginning unknown)."""
    container: ContainerMemory | None = None
    """The memory of the process's cgroup (its limit, usage, working set, OOM
    kills, pressure), read with the traced bytes; None outside any memory
    cgroup (``heapwatch.runtime.container``)."""


class CyclePoint(NamedTuple):
    """One cycle's totals in the agent's recent history (``AgentView.history()``):
    what a timeline draws, a few numbers a cycle, never its sites."""

    timestamp: float
    traced: int
    resident: int | None
    untraced: int | None
    limit: int | None
    """The container's memory limit; None outside a memory cgroup or with none."""

    @classmethod
    def of(cls, result: CycleResult) -> CyclePoint:
        container = result.container
        limit = container.limit if container is not None else None
        return cls(result.timestamp, result.traced, result.resident, result.untraced, limit)


class StackPoint(NamedTuple):
    """Memory by stack at one cycle, folded (``heapwatch.formats.view``): a
    baseline the memory page colours the growing stacks against."""

    timestamp: float
    stacks: FoldedStacks


class BlackBox(NamedTuple):
    """A dump written as the container's working set crossed a threshold of
    its memory limit, before the kernel's OOM killer could act."""

    path: str
    timestamp: float
    """Unix time of the dump."""
    pid: int
    """The process that wrote it."""
    threshold: str
    """The threshold crossed, as configured (``"95%"``, ``"1610612736B"``)."""
    working_set: int
    limit: int
    site: tuple[str, int] | None
    """The top allocation site (file, line) by live bytes, if any."""
    site_size: int = 0


class Readings(NamedTuple):
    """What exporters publish: the last successful cycle and the agent's counters."""

    result: CycleResult | None
    cycles: int
    """Cycles run, failed ones included."""
    errors: int
    """Cycles that failed."""
    mode: str
    sample_interval: int
    """Bytes between samples on average; 0 in exact mode."""
    native_heap: str = NATIVE_HEAP_UNAVAILABLE
    """Where ``native_in_use`` and ``native_retained`` come from: "mallinfo2",
    or "unavailable" (another C library, or another malloc preloaded)."""
    black_boxes: int = 0
    """Black boxes this process wrote (``BlackBox``)."""
    previous_black_box: BlackBox | None = None
    """The black box an earlier process wrote in the dump directory before it
    died without exiting cleanly (an OOM kill), found at start."""


ReadingsSource = Callable[[], Optional[Readings]]
"""What exporters read: the agent's ``readings``, or None without an agent."""


class Routes(Protocol):
    """The agent's HTTP routes (``heapwatch.server.router.Router``)."""

    token: str | None
    """The bearer token protected routes need; None closes them (403)."""

    def add(self, path: str, app: WSGIApplication, *, protected: bool = False) -> None: ...
    def paths(self) -> list[str]: ...
    def __bool__(self) -> bool:
        """Whether there is any route to serve."""


class Server(Protocol):
    """The HTTP server of the agent's routes (``heapwatch.server.http.Server``),
    built as ``server(routes, host, port, port_range)``."""

    @property
    def address(self) -> tuple[str, int] | None: ...
    @property
    def url(self) -> str | None: ...
    def start(self) -> bool:
        """Binds the first free port of the range and serves; False if none is free."""

    def stop(self, timeout: float = 5.0) -> bool: ...
    def pause(self, deadline: float) -> bool:
        """Ends its threads for a fork, by the monotonic ``deadline``,
        keeping the socket open; whether they ended."""

    def resume(self) -> None:
        """Serves again after ``pause`` (in the parent, after the fork)."""

    def close_in_child(self) -> None:
        """In a forked child: closes the parent's socket, without shutting it down."""


class AgentView(Protocol):
    """What a component sees of the agent that starts it."""

    config: AgentConfig
    router: Routes
    retain_last_snapshot: bool
    """Set to keep each cycle's snapshot for ``last_snapshot()``."""

    @property
    def cgroup(self) -> MemoryCgroup | None:
        """The process's memory cgroup, found at start; None outside one."""

    def black_box_written(self, box: BlackBox) -> None:
        """Counts a black box this process wrote."""

    def black_box_found(self, box: BlackBox) -> None:
        """Publishes the black box an earlier process left (found at start)."""

    def readings(self) -> Readings: ...
    def history(self) -> Sequence[CyclePoint]:
        """The recent successful cycles' totals, oldest first (bounded)."""

    def stack_points(self) -> Sequence[StackPoint]:
        """Memory by stack every few minutes of the last half hour and
        more, oldest first (bounded)."""

    def wake_in_child(self) -> None:
        """In a forked child whose agent has not restarted yet (its first
        cycle is not due): restarts it now (the dump signal's handler)."""

    def last_snapshot(self) -> tuple[Any, float] | None: ...
    def leak_scores(self) -> Mapping[tuple[str, int], LeakScore]:
        """The last cycle's leak score of each site it watched."""


class Component(Protocol):
    """A part the agent starts and stops: an exporter, the dump service.

    ``start`` may add routes to ``agent.router`` and read ``agent.readings()``
    whenever it likes; it is called again in a forked child after
    ``after_fork_in_child``, which must drop what belongs to the parent
    process without any I/O.  ``shutdown`` is bounded by its timeout.  A
    component that pushes the readings as it shuts down has a true
    ``pushes`` attribute: at the process's exit the agent runs its last
    cycle only for such a component.

    A component that runs threads of its own also has ``pause_for_fork(deadline)``,
    which ends them by the monotonic ``deadline`` and says whether they ended,
    and ``resume_after_fork()``, which starts them again in the parent: the
    agent calls them around every ``fork()`` (docs/design/agent.md, "Fork"),
    if the component has them.
    """

    name: str

    def start(self, agent: AgentView) -> None: ...
    def shutdown(self, timeout: float) -> None: ...
    def after_fork_in_child(self) -> None: ...
