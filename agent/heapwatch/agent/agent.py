"""The agent: a daemon thread that turns the core's snapshots into metrics.

Every ``interval`` seconds, in a thread named ``heapwatch-agent`` (the
OpenTelemetry ``PeriodicExportingMetricReader`` way: ``Event.wait(interval)``,
one last cycle at shutdown), the agent runs a cycle (``heapwatch.agent.cycle``,
which knows nothing of the thread): it begins a new epoch (the age of a trace
is the number of epochs begun since it was recorded), takes a snapshot
(resetting the peak in the same critical section), groups it by line in C,
diffs the top sites against the previous cycle's grouping, reads each site's
share of the peak, scores the leaks (``heapwatch.formats.leaks``); the agent
publishes its ``CycleResult``.  Components only read the last result: a
scrape never takes a snapshot.  This module is the thread's life: start,
the cycles' timing and publication, components, exit and fork.

Every epoch but the current one lasts at least ``interval``: a cycle begins
one only when that long has passed since the current one began, and a cycle
run sooner (``run_cycle()`` through the API, the last one at stop, a forked
child's first) publishes its figures in the current epoch.  Only the first
epoch since tracing started may be shorter: no trace is older than it, so its
length bounds no age.  That is what turns an age into a duration
(``heapwatch.formats.dump.AgeClock``: ``--min-age``, ``?min_age=``, the leak
score's "old" bytes, ``heapwatch leaks``); docs/design/agent.md says why this
and not a record of when each epoch began.

Failure policy: a failing cycle is logged (once, until it recovers) and
retried at the next interval; an exporter that fails to start is logged and
left out; nothing is raised into the application.  ``stop`` is idempotent and
bounded by a deadline, and runs at exit.  Around ``fork()`` its threads end
and start again in the parent, so that none is alive as the interpreter
counts them; in the child the agent restarts once its first cycle is due
(the core notices the deadline at an allocation), with a fresh baseline, its
own endpoint (the port rule in ``heapwatch.server.http``) and no state from
the parent but when the core's epoch began (the child's core carries on in
it).  docs/design/agent.md has the whole picture.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable

from heapwatch._errors import HeapwatchError
from heapwatch.agent import plugins
from heapwatch.agent.config import AgentConfig
from heapwatch.agent.contract import (
    BlackBox,
    Component,
    CyclePoint,
    CycleResult,
    Readings,
    Routes,
    Server,
    StackPoint,
)
from heapwatch.agent.cycle import CycleReaders, CycleSettings, CycleState, compose_cycle
from heapwatch.agent.route_cycle import RouteNames
from heapwatch.formats.leaks import LeakScore, LeakTracker
from heapwatch.formats.view import fold_stacks
from heapwatch.runtime import route_labels
from heapwatch.runtime.container import (
    ContainerMemory,
    MemoryCgroup,
    find_memory_cgroup,
    read_container_memory,
)
from heapwatch.runtime.forks import call_around_fork, call_in_forked_child, forking_frame
from heapwatch.runtime.procmem import (
    NATIVE_HEAP_SOURCE,
    NATIVE_HEAP_UNAVAILABLE,
    ProcessMemory,
    read_process_memory,
)
from heapwatch.runtime.route_names import name_of
from heapwatch.runtime.routes import ROUTE_NONE, ROUTE_OTHER, folded_routes
from heapwatch.runtime.source import CoreSource, SnapshotSource
from heapwatch.runtime.threads import (
    Lifeline,
    OwnThread,
    forget_dummy,
    in_own_thread,
    join_thread,
    outlive_nobody,
    own_work,
    owned,
    run_detached,
    signals_blocked,
    start_thread,
)

if TYPE_CHECKING:
    ServerFactory = Callable[[Routes, str, int, int], Server]

__all__ = [
    "AT_EXIT_TIMEOUT",
    "FORK_PAUSE_TIMEOUT",
    "HISTORY_CYCLES",
    "STACK_POINTS",
    "STACK_POINT_SECONDS",
    "Agent",
    "get_agent",
    "start_agent",
    "stop_agent",
]

log = logging.getLogger("heapwatch.agent")

AT_EXIT_TIMEOUT = 2.0

# The cycles history() keeps: an hour at the default interval, a few numbers
# each (about 60 KiB at most), for the page's timeline.
HISTORY_CYCLES = 360

# Memory by stack, folded (formats/view.py: at most FOLDED_STACKS stacks and
# FOLDED_FRAMES frame references each), taken by the first cycle and then by
# the first one at least STACK_POINT_SECONDS after the last: the memory
# page's baselines, the oldest 35 minutes old once the agent has run that
# long (docs/design/page.md gives what they weigh).
STACK_POINT_SECONDS = 150.0
STACK_POINTS = 15

# How long a fork() waits, at most, for heapwatch's threads to end before it
# goes ahead with them (a cycle, a dump or an export in progress): they end
# in well under a millisecond otherwise (docs/design/agent.md, "Fork").
FORK_PAUSE_TIMEOUT = 0.5

# Where os.fork() counts the threads to warn of them: 3.12 before the
# after_in_parent hooks; 3.13+ after them (once it has started the world
# again), so there the threads start again a moment later, from the main
# thread right after os.fork() returns.
_COUNTS_AFTER_PARENT_HOOKS = sys.version_info >= (3, 13)


def _shutdown_failed(exporter: Component, exc: Exception) -> None:
    log.warning(
        "heapwatch exporter %r did not shut down cleanly: %s",
        exporter.name,
        " ".join(str(exc).split()) or type(exc).__name__,
        exc_info=log.isEnabledFor(logging.DEBUG),
    )


# The extra named in the message when an exporter's requirements are missing.
_EXTRAS = {"otlp": "heapwatch[otlp]"}


def _exporters_for(
    config: AgentConfig, settings: Mapping[str, Mapping[str, Any]]
) -> list[Component]:
    exporters: list[Component] = []
    for name in config.exporters:
        try:
            factory = plugins.exporter(name)
            exporters.append(factory(config, **settings.get(name, {})))
        except (ImportError, LookupError) as exc:
            extra = _EXTRAS.get(name, "heapwatch")
            log.warning(
                "heapwatch exporter %r is unavailable (pip install %s): %s", name, extra, exc
            )
    # Last: it serves its /debug/ routes only next to other routes (or with a token).
    exporters.append(plugins.component("dumps")(config))
    return exporters


_IDLE, _RUNNING, _STOPPING, _STOPPED = "idle", "running", "stopping", "stopped"


# The registry, as the cycle reads it.
_ROUTE_NAMES = RouteNames(name_of, folded_routes, ROUTE_NONE, ROUTE_OTHER)


class Agent:
    """Runs the cycle in a daemon thread and feeds the exporters.

    Args:
        config: what to do; ``AgentConfig.from_env()`` by default.
        source: where snapshots come from (the C core by default).
        exporters: the components; by default the exporters named in
            ``config.exporters`` (``heapwatch.agent.plugins``), each built
            with its ``exporter_settings``, then the dump service.
        exporter_settings: per exporter name, the keywords its factory
            takes (``{"prometheus": {"registry": r}}``).
        clock: unix time, for the results' timestamps.
        timer: a monotonic clock, for the cycle's duration.
        router: the HTTP routes (``/metrics`` and whatever else is added).
        server: builds the server of the routes, once there are routes.
        memory: reads the process's resident set and its C heap, once a cycle.
        cgroup: finds the process's memory cgroup, at start.
        container: reads the cgroup's memory (limit, usage, working set,
            OOM kills, pressure), once a cycle.
    """

    @owned
    def __init__(
        self,
        config: AgentConfig | None = None,
        *,
        source: SnapshotSource | None = None,
        exporters: Sequence[Component] | None = None,
        exporter_settings: Mapping[str, Mapping[str, Any]] | None = None,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
        router: Routes | None = None,
        server: ServerFactory | None = None,
        memory: Callable[[], ProcessMemory] = read_process_memory,
        cgroup: Callable[[], MemoryCgroup | None] = find_memory_cgroup,
        container: Callable[[MemoryCgroup], ContainerMemory] = read_container_memory,
    ) -> None:
        self.config = config if config is not None else AgentConfig.from_env()
        self._source: SnapshotSource = source if source is not None else CoreSource()
        self._exporters: list[Component] = (
            list(exporters)
            if exporters is not None
            else _exporters_for(self.config, exporter_settings or {})
        )
        self._clock = clock
        self._timer = timer
        self._memory = memory
        self._find_cgroup = cgroup
        self._read_container = container
        self._cgroup: MemoryCgroup | None = None
        self._start_memory: ProcessMemory | None = None
        self._native_heap = NATIVE_HEAP_UNAVAILABLE
        self.router: Routes = (
            router if router is not None else plugins.component("router")(token=self.config.token)
        )
        self._server_factory = server
        self.retain_last_snapshot = False
        """Keep each cycle's snapshot until the next one, for ``last_snapshot()``
        (set by the ``/debug/`` routes, whose diff compares with it)."""
        self._mode = self.config.mode
        self._sample_interval = self.config.reported_sample_interval
        # What each cycle hands the next (heapwatch.agent.cycle), guarded by
        # _cycle_lock.  _init_state keeps of it only when the core's epoch
        # began: a forked child's core carries on in the parent's epoch.
        self._cycle_state = CycleState()
        self._init_state()
        self._owns_tracing = False
        # Whether this agent switched the core's route labels on (sample
        # mode only: docs/design/routes.md says why not in exact mode).
        self._labels_routes = False
        self._fork_hook_registered = False
        self._restart_hook_registered = False
        self._restart_pending = False
        self._atexit_hook: Callable[[], None] | None = None

    def _init_state(self) -> None:
        # Everything a forked child must not inherit (locks may have been held
        # by a thread that does not exist in the child).
        self._lock = threading.Lock()
        self._cycle_lock = threading.Lock()
        self._stopped = threading.Event()
        self._stop_event = threading.Event()
        self._state = _IDLE
        self._thread: OwnThread | None = None
        # Held from the before-fork hook that paused the threads to the
        # after-fork hook that resumes them, and by _stop while it ends them:
        # a fork and a stop never handle the same threads at once.
        self._fork_lock = threading.Lock()
        self._paused: list[Callable[[], None]] | None = None  # what resumes them
        self._resuming: list[Callable[[], None]] | None = None  # the same, asked of the main thread
        self._pausing = False  # the agent's thread ends for a fork: no last cycle
        self._next_cycle = 0.0  # monotonic; when the agent's thread cycles next
        self._lifeline: Lifeline | None = None
        self._server: Server | None = None
        self._cycle_state = self._cycle_state.in_forked_child()  # a baseline of its own
        self._leaks: LeakTracker[tuple[str, int]] = LeakTracker(self.config.leak_window)
        self._route_leaks: LeakTracker[str] = LeakTracker(self.config.leak_window)
        self._scores: Mapping[tuple[str, int], LeakScore] = {}
        self._last_snapshot: tuple[Any, float] | None = None
        self._result: CycleResult | None = None
        self._history: deque[CyclePoint] = deque(maxlen=HISTORY_CYCLES)
        self._stack_points: deque[StackPoint] = deque(maxlen=STACK_POINTS)
        self._last_cycle = True
        self._cycles = 0
        self._errors = 0
        self._failing = False
        # This process's: a forked child has written none and found none.
        self._black_boxes = 0
        self._previous_black_box: BlackBox | None = None

    # ---- public ------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._state == _RUNNING

    @property
    def exporters(self) -> tuple[Component, ...]:
        return tuple(self._exporters)

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) of this process's HTTP endpoint, or None."""
        server = self._server
        return server.address if server is not None else None

    @property
    def metrics_url(self) -> str | None:
        """This process's ``/metrics`` URL, or None when it is not served."""
        server = self._server
        if server is None or "/metrics" not in self.router.paths():
            return None
        url = server.url
        return url + "/metrics" if url is not None else None

    def readings(self) -> Readings:
        """The last successful cycle and the counters; never takes a snapshot."""
        with self._lock:
            return Readings(
                self._result,
                self._cycles,
                self._errors,
                self._mode,
                self._sample_interval,
                self._native_heap,
                self._black_boxes,
                self._previous_black_box,
            )

    def history(self) -> Sequence[CyclePoint]:
        """The last ``HISTORY_CYCLES`` successful cycles' totals, oldest first."""
        with self._lock:
            return tuple(self._history)

    def stack_points(self) -> Sequence[StackPoint]:
        """Memory by stack every ``STACK_POINT_SECONDS`` or so, the last
        ``STACK_POINTS`` of them, oldest first."""
        with self._lock:
            return tuple(self._stack_points)

    @property
    def cgroup(self) -> MemoryCgroup | None:
        """The process's memory cgroup, found at start; None outside one."""
        return self._cgroup

    def black_box_written(self, box: BlackBox) -> None:
        """Counts a black box this process wrote (the dump service's)."""
        with self._lock:
            self._black_boxes += 1

    def black_box_found(self, box: BlackBox) -> None:
        """Publishes the black box an earlier process left."""
        with self._lock:
            self._previous_black_box = box

    def leak_scores(self) -> Mapping[tuple[str, int], LeakScore]:
        """The last cycle's leak score of each site it watched, by (file, line)."""
        return self._scores

    def last_snapshot(self) -> tuple[Any, float] | None:
        """The last successful cycle's snapshot and its unix time, when
        ``retain_last_snapshot`` is set; else None.  Holding it keeps that
        cycle's tracebacks (and their code objects) alive one interval longer."""
        return self._last_snapshot

    @owned
    def start(self) -> bool:
        """Starts tracing, the exporters, the HTTP endpoint and the thread.

        Returns False, with a warning logged, when tracing cannot start (the
        stdlib tracemalloc is tracing, for instance).  An Agent runs once:
        starting it again after ``stop`` raises ``HeapwatchError``.
        """
        with self._lock:
            if self._state == _RUNNING:
                return True
            if self._state != _IDLE:
                raise HeapwatchError("a stopped heapwatch Agent cannot restart; create a new one")
            config = self.config
            try:
                self._owns_tracing = self._source.start(
                    config.effective_nframe, config.mode, config.sample_interval
                )
                mode, sample_interval = self._source.configuration()
            except Exception as exc:
                log.warning("heapwatch agent not started: %s", exc)
                return False
            if not self._owns_tracing and (mode, sample_interval) != (
                config.mode,
                config.sample_interval,
            ):
                log.info(
                    "heapwatch was already tracing (mode=%s, sample_interval=%d): "
                    "the agent keeps that configuration",
                    mode,
                    sample_interval,
                )
            self._mode = mode
            self._sample_interval = sample_interval if mode == "sample" else 0
            # Read here, where the service waits for us: the first cycle,
            # run at once in the agent's thread while the service starts,
            # takes it rather than open /proc/self/statm then (a descriptor
            # the service could see come and go: CPython's test_subprocess
            # lists a child's descriptors as it starts).
            self._start_memory = self._memory()
            if self._start_memory.native_in_use is not None:
                self._native_heap = NATIVE_HEAP_SOURCE
            # Found once: a process does not change its cgroup (a container
            # runtime that moves it is rare enough to cost a restart).
            self._cgroup = self._find_cgroup()
            self._state = _RUNNING
            if mode == "sample":
                route_labels.enable()
                self._labels_routes = True
        self._register_process_hooks()
        try:
            self._start_components()
        except Exception as exc:  # no thread can start, for one
            log.warning("heapwatch agent not started: %s", exc)
            self._stop(0.0, at_exit=False)
            return False
        self._register_restart_hook()
        return True

    def stop(self, timeout: float = 5.0) -> bool:
        """Stops the thread (after one last cycle), the exporters and the
        endpoint, within ``timeout`` seconds.  Idempotent; True if everything
        stopped in time."""
        return self._stop(timeout, at_exit=False)

    def run_cycle(self) -> CycleResult:
        """Runs one cycle now and publishes its result; raises what failed.
        What the cycle allocates is heapwatch's, untraced, whichever thread
        runs it."""
        with self._cycle_lock, own_work():
            result = self._cycle()
        with self._lock:
            self._cycles += 1
            self._result = result
            self._history.append(CyclePoint.of(result))
        return result

    # ---- the cycle -----------------------------------------------------------

    def _cycle(self) -> CycleResult:
        # Under _cycle_lock: one cycle at a time hands its state to the next.
        last_point = self._stack_points[-1] if self._stack_points else None
        since = self._clock() - last_point.timestamp if last_point is not None else None
        if self._labels_routes:
            route_labels.poll()  # the service may have set up OpenTelemetry since
        cycle = compose_cycle(
            self._source,
            self._cycle_state,
            self._leaks,
            CycleSettings(
                top=self.config.top,
                interval=self.config.interval,
                sample_interval=self._sample_interval,
                retain_snapshot=self.retain_last_snapshot,
                top_routes=self.config.top_routes,
                # A clock that went back takes one at once.
                stacks=since is None or not 0 <= since < STACK_POINT_SECONDS,
            ),
            CycleReaders(
                clock=self._clock,
                timer=self._timer,
                memory=self._read_memory,
                container=self._read_container_memory,
                routes=_ROUTE_NAMES,
            ),
            route_tracker=self._route_leaks,
        )
        self._cycle_state = cycle.state
        self._scores = cycle.scores
        # One assignment: a reader gets a snapshot and its own time.
        self._last_snapshot = cycle.last_snapshot
        if cycle.stacks is not None:
            folded = fold_stacks(cycle.stacks, last_point.stacks if last_point else None)
            with self._lock:
                self._stack_points.append(StackPoint(cycle.result.timestamp, folded))
        return cycle.result

    def _read_memory(self) -> ProcessMemory:
        # The first cycle's was read at start (see start()).
        memory, self._start_memory = self._start_memory or self._memory(), None
        return memory

    def _read_container_memory(self) -> ContainerMemory | None:
        cgroup = self._cgroup
        return self._read_container(cgroup) if cgroup is not None else None

    def _cycle_safely(self) -> None:
        try:
            self.run_cycle()
        except Exception:
            with self._lock:
                self._cycles += 1
                self._errors += 1
            if not self._failing:
                self._failing = True
                log.exception(
                    "heapwatch cycle failed; retrying every %gs (further failures logged at "
                    "DEBUG until one succeeds)",
                    self.config.interval,
                )
            else:
                log.debug("heapwatch cycle failed again", exc_info=True)
            return
        if self._failing:
            self._failing = False
            log.info("heapwatch cycle succeeded again")

    def _run(self, stop_event: threading.Event, first: bool) -> None:
        # The first cycle runs at once: it sets the baseline and gives the
        # exporters something to read.  A thread started again after a fork
        # keeps the schedule of the one that ended for it.
        # An interval from the end of one cycle to the next, as a plain
        # wait(interval) would: an epoch begins only when a whole interval
        # has passed since the last one began.
        if first:
            self._cycle_safely()
            self._next_cycle = time.monotonic() + self.config.interval
        while not stop_event.wait(max(0.0, self._next_cycle - time.monotonic())):
            self._cycle_safely()
            forget_dummy()  # a record logged in the cycle named this thread
            self._next_cycle = time.monotonic() + self.config.interval
        if self._last_cycle and not self._pausing:
            self._cycle_safely()  # one last cycle for the exporters' final export

    # ---- components ----------------------------------------------------------

    def _start_components(self) -> None:
        for exporter in list(self._exporters):
            if not self._start_exporter(exporter):
                self._exporters.remove(exporter)
        self._ensure_server()
        self._start_thread(first=True)

    def _start_thread(self, first: bool) -> None:
        stop_event = threading.Event()
        self._stop_event = stop_event
        self._thread = start_thread(self._run, "heapwatch-agent", (stop_event, first))

    def _start_exporter(self, exporter: Component) -> bool:
        try:
            # Threads an exporter's libraries start are born with the
            # service's signals blocked too (heapwatch.runtime.threads).
            with signals_blocked():
                exporter.start(self)
        except Exception as exc:
            log.warning(
                "heapwatch exporter %r failed to start; left out: %r",
                exporter.name,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            return False
        return True

    def _ensure_server(self) -> None:
        if self._server is not None or not self.router:
            return
        # Resolved only to serve: the server imports http.server and the
        # email package, which an agent that serves nothing never loads.
        factory = self._server_factory or plugins.component("server")
        server = factory(self.router, self.config.host, self.config.port, self.config.port_range)
        if server.start():
            self._server = server
            log.info("heapwatch agent (pid %d) serving %s", os.getpid(), server.url)

    @owned
    def serve(self) -> str | None:
        """Starts the HTTP endpoint now if the agent runs, the router has
        routes and nothing serves them yet (routes added after ``start``);
        returns the endpoint's base URL, or None."""
        if self.running:
            self._ensure_server()
        server = self._server
        return server.url if server is not None else None

    @owned
    def add_exporter(self, exporter: Component) -> bool:
        """Adds an exporter, started at once if the agent runs; False (logged)
        if it failed to start."""
        if self.running:
            if not self._start_exporter(exporter):
                return False
            self._ensure_server()
        self._exporters.append(exporter)
        return True

    def remove_exporter(self, exporter: Component, timeout: float = 5.0) -> None:
        """Removes an exporter and shuts it down if the agent runs."""
        if exporter not in self._exporters:
            return
        self._exporters.remove(exporter)
        if self.running:
            try:
                exporter.shutdown(timeout)
            except Exception as exc:
                _shutdown_failed(exporter, exc)

    @owned
    def _stop(self, timeout: float, at_exit: bool) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            state = self._state
            if state == _IDLE:
                self._state = _STOPPED
                self._stopped.set()
            elif state == _RUNNING:
                self._state = _STOPPING
        if state in (_IDLE, _STOPPED):
            return True
        if state == _STOPPING:  # another thread is stopping it
            return self._stopped.wait(max(0.0, deadline - time.monotonic()))
        # A fork under way resumes nothing once this holds the lock (its
        # after-fork hook sees the state); a fork that begins meanwhile
        # waits for the threads' end, within its own bound.
        fork_lock = self._fork_lock
        locked = fork_lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        try:
            return self._stop_running(deadline, timeout, at_exit)
        finally:
            if locked:
                fork_lock.release()

    def _stop_running(self, deadline: float, timeout: float, at_exit: bool) -> bool:
        if self._restart_pending:  # a forked child that did not restart yet
            self._restart_pending = False
            self._source.cancel_wake()
        self._resuming = None  # its threads ended for a fork: they stay so
        in_time = True
        if at_exit and not any(getattr(e, "pushes", False) for e in self._exporters):
            # Nobody reads a cycle run as the process exits but an exporter
            # that pushes it (OpenTelemetry's last export): skipped otherwise,
            # it would only delay the exit of every short-lived process.
            self._last_cycle = False
        self._stop_event.set()
        thread = self._thread
        if thread is not None and not thread.is_current():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                in_time = False
                log.warning("heapwatch agent thread did not stop within %gs", timeout)
        # The server first: quick, and an exporter that uses the deadline up
        # (a collector that does not answer) must not leave it serving.
        server = self._server
        self._server = None
        if server is not None:
            in_time = server.stop(max(0.0, deadline - time.monotonic())) and in_time
        for exporter in self._exporters:
            try:
                exporter.shutdown(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                _shutdown_failed(exporter, exc)
        # At exit the core's own atexit hook stops recording; freeing the
        # tables there would only cost time.
        if self._labels_routes:
            self._labels_routes = False
            route_labels.disable()
        if self._owns_tracing and not at_exit:
            try:
                self._source.stop()
            except Exception:
                log.exception("heapwatch could not stop tracing")
        if self._atexit_hook is not None and not at_exit:
            atexit.unregister(self._atexit_hook)
            self._atexit_hook = None
        with self._lock:
            self._state = _STOPPED
        self._stopped.set()
        return in_time

    # ---- exit and fork -----------------------------------------------------------

    def _register_process_hooks(self) -> None:
        ref = weakref.ref(self)

        def stop_at_exit() -> None:
            agent = ref()
            if agent is not None:
                agent._stop(AT_EXIT_TIMEOUT, at_exit=True)

        self._atexit_hook = stop_at_exit
        # Registered after heapwatch._core's own hook, so it runs before it
        # (atexit is last in, first out): the last cycle still sees recording on.
        atexit.register(stop_at_exit)
        if not self._fork_hook_registered:
            self._fork_hook_registered = True
            call_in_forked_child(self._after_fork_in_child)
            # Its before hook runs after those registered later (the dump
            # service's, which only looks at a signal handler).
            call_around_fork(self._pause_for_fork, self._resume_after_fork)

    def _register_restart_hook(self) -> None:
        # The restart runs in a hook of its own, registered after the
        # components started: after_in_child hooks run in the order they were
        # registered, and a module imported by them that holds a lock across
        # fork() frees it in its own hook (concurrent.futures.thread does:
        # the OpenTelemetry SDK builds its resource in a ThreadPoolExecutor,
        # which deadlocked a child restarting in the first hook).
        if not self._restart_hook_registered:
            self._restart_hook_registered = True
            call_in_forked_child(self._restart_in_child)

    @owned
    def _after_fork_in_child(self) -> None:
        # Drops what belongs to the parent; the restart is the next hook's.
        state = self._state
        server = self._server
        self._restart_pending = False
        self._init_state()
        if server is not None:
            server.close_in_child()
        if state != _RUNNING:
            if state != _IDLE:  # stopped or stopping in the parent: stopped here
                self._state = _STOPPED
                self._stopped.set()
            return
        try:
            for exporter in self._exporters:
                exporter.after_fork_in_child()
            self._source.reset_peak()
            self._state = _RUNNING
        except Exception:
            log.exception("heapwatch agent could not restart after fork in pid %d", os.getpid())
            return
        self._restart_pending = True

    @owned
    def _restart_in_child(self) -> None:
        # Not now: the child's first cycle is due an interval from now, and a
        # child that execs or exits before then never needs a thread (nor
        # sees one: threading.active_count(), sys._current_frames() and the
        # kernel count only its own).  The core's hooks notice the deadline
        # at an allocation and ask the main thread for the restart.
        if not self._restart_pending or self._state != _RUNNING:
            return
        try:
            if self._source.wake_after(self.config.interval, self._wake_in_child_detached):
                return
        except Exception:
            log.debug("heapwatch cannot wait for the child's first cycle", exc_info=True)
        self._wake_in_child()  # nothing would notice the deadline: at once

    def wake_in_child(self) -> None:
        """In a forked child whose agent has not restarted yet: restarts it
        now rather than at its first cycle's deadline.  For the dump
        signal's handler, which runs in the main thread between two
        bytecodes: it gives up rather than wait for a lock that thread may
        hold."""
        if self._restart_pending:
            self._wake_in_child(blocking=False)

    def _wake_in_child_detached(self) -> None:
        # The wake-up's pending call, in the main thread at whatever bytecode
        # the service was running, holding whatever locks it held: the
        # restart takes locks (ours, the stdlib's, OpenTelemetry's), so it
        # runs in a thread of its own (run_detached).  A gunicorn gthread
        # worker hung here, in ThreadPoolExecutor.submit's lock, when the
        # restart built OpenTelemetry's Resource in the same thread.
        run_detached(self._wake_in_child)

    @owned
    def _wake_in_child(self, blocking: bool = True) -> None:
        # In the main thread, between two bytecodes (a pending call, a
        # signal's handler), or in the last after-fork hook: never raises.
        if not self._lock.acquire(blocking):
            return
        try:
            if not self._restart_pending or self._state != _RUNNING:
                return
            self._restart_pending = False
        finally:
            self._lock.release()
        try:
            self._source.cancel_wake()
            self._start_memory = self._memory()  # (as in start(): nothing else runs yet)
            self._start_components()
            if not _main_thread_ends_process:
                # The child ends when its last thread does (no exit() at the
                # end of a main()): ours must not be the last.
                self._lifeline = outlive_nobody(lambda: self._stop(AT_EXIT_TIMEOUT, at_exit=True))
        except Exception:
            log.exception("heapwatch agent could not restart after fork in pid %d", os.getpid())

    # ---- around a fork, in the parent ---------------------------------------------

    @owned
    def _pause_for_fork(self) -> None:
        """Ends every thread of the agent's before the fork: the interpreter
        counts the process's threads once fork() returns, before the hooks
        that start them again (3.12+ warns then that the process is
        multi-threaded).  Each is woken, not waited out; the wait as a
        whole is bounded by FORK_PAUSE_TIMEOUT."""
        if self._state != _RUNNING or self._restart_pending or in_own_thread():
            # Not running, or nothing of it runs yet (a forked child before
            # its first cycle), or forked from a thread of ours, which
            # cannot end here.
            return
        deadline = time.monotonic() + FORK_PAUSE_TIMEOUT
        if not self._fork_lock.acquire(timeout=FORK_PAUSE_TIMEOUT):
            return  # the agent is stopping: its threads end on their own
        if self._state != _RUNNING:
            self._fork_lock.release()
            return
        self._resuming = None  # what this pause resumes includes it
        resume: list[Callable[[], None]] = []
        ended = True
        server = self._server
        if server is not None:  # first: no request starts a thread meanwhile
            ended = server.pause(deadline) and ended
            resume.append(server.resume)
        thread = self._thread
        if thread is not None:
            self._pausing = True
            self._stop_event.set()
            ended = join_thread(thread, deadline) and ended
            resume.append(self._resume_thread)
        for component in self._exporters:
            pause = getattr(component, "pause_for_fork", None)
            if pause is not None:
                ended = pause(deadline) and ended
                resume.append(component.resume_after_fork)  # type: ignore[attr-defined]
        lifeline = self._lifeline
        if lifeline is not None:
            ended = lifeline.pause(deadline) and ended
            resume.append(lifeline.resume)
        if not ended:
            log.debug("heapwatch threads still ran as the process forked")
        self._paused = resume

    def _resume_thread(self) -> None:
        self._pausing = False
        self._start_thread(first=False)

    @owned
    def _resume_after_fork(self) -> None:
        resume, self._paused = self._paused, None
        if resume is None:
            return
        try:
            # A fork from another thread is warned of anyway: the process
            # has two threads, the main one and the forking one.
            if (
                _COUNTS_AFTER_PARENT_HOOKS
                and threading.get_ident() == threading.main_thread().ident
            ):
                self._resuming = resume
                try:
                    # Pending calls run at the first safe point, which may be
                    # in another at-fork hook, before os.fork() counts the
                    # threads: this one waits for its caller's frame.
                    if self._source.call_soon(self._resume_soon, forking_frame()):
                        return
                except Exception:
                    log.debug("heapwatch cannot resume after os.fork() returns", exc_info=True)
                self._resuming = None
            self._resume(resume)
        finally:
            self._fork_lock.release()

    @owned
    def _resume_soon(self) -> None:
        # The main thread, right after os.fork() returned.
        if not self._fork_lock.acquire(timeout=FORK_PAUSE_TIMEOUT):
            return  # a stop, or another fork, which resumes (or ends) them all
        try:
            resume, self._resuming = self._resuming, None
            if resume is not None and self._state == _RUNNING:
                self._resume(resume)
        finally:
            self._fork_lock.release()

    def _resume(self, resume: list[Callable[[], None]]) -> None:
        try:
            for start in reversed(resume):
                start()
        except Exception:
            log.exception("heapwatch agent could not resume after fork")


# ---- the process's agent ---------------------------------------------------------

_agent: Agent | None = None
_agent_lock = threading.Lock()

# Whether the end of this process's main thread ends the process: true in the
# process Python started (its main() calls exit(), which ends daemon threads
# too), false in a child forked from any other thread, whose "main thread"
# (threading.main_thread()) is the forking one and ends with a plain thread
# exit: the process then lives as long as any thread does.
_main_thread_ends_process = True
_forking_from_main = True


def _before_fork() -> None:
    global _forking_from_main
    _forking_from_main = threading.get_ident() == threading.main_thread().ident


def _after_fork_in_child() -> None:
    # Registered before any agent's own hook, so it runs first in the child.
    global _agent_lock, _main_thread_ends_process
    _agent_lock = threading.Lock()
    _main_thread_ends_process = _main_thread_ends_process and _forking_from_main


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def get_agent() -> Agent | None:
    """The agent ``start_agent`` started, if it is running."""
    agent = _agent
    return agent if agent is not None and agent.running else None


@owned
def start_agent(
    config: AgentConfig | None = None,
    *,
    registry: Any = None,
    meter_provider: Any = None,
    **options: Any,
) -> Agent | None:
    """Starts the process's agent, or returns the one already running.

    Settings come from ``config`` (``AgentConfig.from_env()`` by default), then
    from ``options``, which take the same names as the ``HEAPWATCH_*``
    variables (``interval=5``, ``sample_interval="512KiB"``, ...) and raise
    ``ConfigError`` when invalid.  ``registry`` and ``meter_provider`` are
    settings of the exporters, passed on to them: the Prometheus registry to
    publish to (heapwatch's own by default), the OpenTelemetry provider (the
    application's, else one built from ``OTEL_*``).

    Returns None when heapwatch is disabled (``HEAPWATCH_ENABLED=false``) or
    tracing cannot start; the reason is logged.
    """
    global _agent
    if config is None:
        config = AgentConfig.from_env(**options)
    elif options:
        config = config.replace(**options)
    with _agent_lock:
        if _agent is not None and _agent.running:
            if config != _agent.config:
                log.info("heapwatch agent already running: its configuration stays")
            return _agent
        if not config.enabled:
            log.info("heapwatch agent disabled (HEAPWATCH_ENABLED is false)")
            return None
        settings = {
            "prometheus": {"registry": registry},
            "otlp": {"meter_provider": meter_provider},
        }
        agent = Agent(config, exporter_settings=settings)
        if not agent.start():
            return None
        _agent = agent
        return agent


def stop_agent(timeout: float = 5.0) -> bool:
    """Stops the process's agent within ``timeout`` seconds; idempotent."""
    global _agent
    with _agent_lock:
        agent, _agent = _agent, None
    if agent is None:
        return True
    return agent.stop(timeout)
