"""Dumps on demand: the dump files and the agent's dump signal.

``DumpService`` is started by the agent like an exporter (a ``Component``).
It handles ``HEAPWATCH_DUMP_SIGNAL
(SIGUSR2 by default): the handler only writes one byte to a pipe, and a
daemon thread named ``heapwatch-dump`` wakes up and writes the dump into
``HEAPWATCH_DUMP_DIR``, or, when that is not set, logs one line saying so
(the signal's default action would kill the service).  A dump is written to
a hidden temporary file in the same directory, synced and renamed
(``os.replace``), so a reader never sees half a file; then the oldest dumps
beyond ``HEAPWATCH_DUMP_KEEP`` or ``HEAPWATCH_DUMP_MAX_BYTES`` are deleted
(only files named as heapwatch names its dumps).  One dump is built at a
time: the endpoints refuse a second one (429), the signal waits for its turn.
A failure is one line in the log; nothing is raised into the application.
docs/design/dumps.md has the whole picture.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import operator
import os
import re
import signal
import stat
import threading
import time
import weakref
from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol, Union

from heapwatch import _core
from heapwatch._version import __version__
from heapwatch.runtime.forks import call_before_fork
from heapwatch.runtime.problems import ProblemLog
from heapwatch.runtime.procmem import ProcessMemory, compute_untraced, read_process_memory
from heapwatch.runtime.route_names import names_of
from heapwatch.runtime.source import CoreSource
from heapwatch.runtime.threads import OwnThread, forget_dummy, join_thread, start_thread

if TYPE_CHECKING:
    from types import FrameType

    from heapwatch.agent.config import AgentConfig
    from heapwatch.agent.interface import AgentView
    from heapwatch.formats.dump import AgeClock, AgedTrace, DumpHeader, RawTrace, RoutedTrace

__all__ = [
    "BLACK_BOX_KIND",
    "DUMP_SUFFIX",
    "DumpEntry",
    "DumpService",
    "DumpSource",
    "age_clock",
    "dump_dir_problem",
    "dump_header",
    "dump_name",
    "dump_routes",
    "iter_routed_traces",
    "iter_traces",
    "list_dump_entries",
    "list_dumps",
    "marker_path",
    "one_line",
    "prune_dumps",
    "remove_stale_temporaries",
    "tracer_memory",
    "write_dump_file",
    "write_marker",
]

log = logging.getLogger("heapwatch.dumps")
problems = ProblemLog(log)

DUMP_SUFFIX = ".hwdump"
# What a black box's name carries after its sequence number: the next process
# finds the evidence an OOM kill left without opening every dump.
BLACK_BOX_KIND = "blackbox"
# heapwatch-<UTC time>-<pid>-<sequence>[-blackbox].hwdump: sorting by name
# sorts by time.  Retention deletes only files whose whole name matches this.
_DUMP_NAME = re.compile(
    r"heapwatch-(\d{8}T\d{6}\.\d{6}Z)-(\d+)-(\d+)(?:-(" + BLACK_BOX_KIND + r"))?\.hwdump\Z"
)
# Traces built into Python tuples at a time while a dump is written.
_TRACE_BATCH = 1 << 16
_AGE = operator.itemgetter(4)


class DumpSource(Protocol):
    """Where the dumps' snapshots come from (``heapwatch.runtime.source.CoreSource``)."""

    def snapshot(self, traces: bool) -> _core.Snapshot:
        """A snapshot of the tracer now (with every trace if ``traces``);
        raises RuntimeError when nothing is being traced."""


def tracer_memory() -> int:
    """Bytes the tracer itself uses now."""
    return CoreSource().tracer_memory()


def _memory_extra(traced: int, tracer: int, memory: ProcessMemory) -> dict[str, str]:
    """The header's ``extra`` entries for the memory heapwatch cannot
    attribute, as the agent's metrics name it; those unknown are left out."""
    figures = {
        "tracer_memory": tracer,
        "resident": memory.resident,
        "untraced": compute_untraced(memory.resident, traced, tracer),
        "native_heap_in_use": memory.native_in_use,
        "native_heap_retained": memory.native_retained,
    }
    return {key: str(value) for key, value in figures.items() if value is not None}


def dump_header(
    snap: _core.Snapshot,
    *,
    trigger: str,
    clock: Callable[[], float] = time.time,
    memory: Callable[[], ProcessMemory] = read_process_memory,
    tracer_memory: Callable[[], int] = tracer_memory,
    ages: AgeClock | None = None,
    leak_window: float | None = None,
    extra: Mapping[str, str] | None = None,
) -> DumpHeader:
    """The dump header of a snapshot of this process, taken now, with the
    process's memory read now (``_memory_extra``) and, when its traces are
    written with their ages, what turns them into durations."""
    # Here, not at the top: an agent that never dumps never imports the
    # format (its start-up is every HEAPWATCH_ENABLED process's).
    import socket  # noqa: PLC0415

    from heapwatch.formats.dump import process_header  # noqa: PLC0415

    mode = snap.mode
    return process_header(
        clock=clock,
        ages=ages,
        mode=mode,
        sample_interval=snap.sample_interval if mode == "sample" else 0,
        traceback_limit=snap.traceback_limit,
        extra={
            "hostname": socket.gethostname(),
            "heapwatch_version": __version__,
            "trigger": trigger,
            "traced": str(snap.traced),
            "peak": str(snap.peak),
            "blocks": str(snap.blocks),
            **_memory_extra(snap.traced, tracer_memory(), memory()),
            # The agent's, for ``heapwatch leaks`` to score as it did.
            **({} if leak_window is None else {"leak_window": f"{leak_window!r}s"}),
            **(extra or {}),
        },
    )


def dump_routes(snap: _core.Snapshot) -> dict[int, str] | None:
    """The names of the routes ``snap``'s tracebacks carry (what the
    dump's writer is given), or None when none carries one."""
    names = names_of(snap.routes())
    return names or None


def iter_routed_traces(
    snap: _core.Snapshot, batch: int = _TRACE_BATCH
) -> Generator[RoutedTrace, None, None]:
    """``iter_traces`` with each trace's route id: ((trace, age), route).
    Each batch selects the tracebacks of one route (a trace does not say
    its traceback, so its mask's route says its route)."""
    by_route: dict[int, list[int]] = {}
    for index, rid in enumerate(snap.routes()):
        by_route.setdefault(rid, []).append(index)
    for rid, indices in by_route.items():
        for trace in iter_traces(snap, batch, indices):
            yield trace, rid


def iter_traces(
    snap: _core.Snapshot, batch: int = _TRACE_BATCH, indices: list[int] | None = None
) -> Generator[AgedTrace, None, None]:
    """Every trace of ``snap`` (taken with traces) with its age, as the
    writer takes them (``(trace, age)``), about ``batch`` at a time, each
    batch by age.

    ``Snapshot.traces()`` builds one Python tuple per trace; asking for the
    tracebacks a mask selects, a few at a time, bounds the tuples alive to
    about ``batch`` (plus the traces of one traceback), for one pass over
    the C array per batch.  Batches are planned from each traceback's count:
    exact in exact mode; in sample mode a block is sampled about once per
    interval of its estimated bytes, or once when larger.

    A caller that stops early closes it (``close()``): a suspended one holds
    the snapshot and a batch of traces.  ``indices`` (tracebacks' indices)
    keeps the traces of those only.
    """
    if indices is None and snap.ntraces <= batch:
        yield from _paired(snap.traces(ages=True))
        return
    rows = snap.tracebacks()
    picked = range(len(rows)) if indices is None else indices
    exact = snap.mode == "exact"
    interval = max(1, snap.sample_interval)
    mask = bytearray(len(rows))
    selected: list[int] = []
    planned = 0
    for index in picked:
        count, size = rows[index][4], rows[index][3]
        mask[index] = 1
        selected.append(index)
        planned += count if exact else size // interval + 1
        if planned >= batch:
            yield from _paired(snap.traces(bytes(mask), ages=True))
            for chosen in selected:
                mask[chosen] = 0
            selected.clear()
            planned = 0
    if selected:
        yield from _paired(snap.traces(bytes(mask), ages=True))


def _paired(traces: list[_core.RawAgedTrace]) -> Iterator[AgedTrace]:
    # By age: the writer adds a record each time the age changes, and the
    # core's order (its hash table's) changes it at nearly every trace.
    traces.sort(key=_AGE)
    for domain, size, frames, total_nframe, age in traces:
        yield (domain, size, frames, total_nframe), age


def age_clock(snap: _core.Snapshot, at: float, agent: AgentView | None) -> AgeClock:
    """What turns the ages of ``snap`` (taken at ``at``) into durations.

    Its epoch began no later than the agent's last result says
    (``CycleResult.epoch_started``), and in any case before ``at``; each
    earlier epoch lasted at least the agent's interval (the agent begins none
    sooner: ``heapwatch.agent.cycle``), or an unknown time without an agent.
    """
    started = at
    interval = 0.0
    if agent is not None:
        interval = agent.config.interval
        result = agent.readings().result
        if result is not None and result.epoch == snap.epoch:
            began = result.epoch_started
            started = min(at, result.timestamp if began is None else began)
    from heapwatch.formats.dump import AgeClock  # noqa: PLC0415 (only to dump, as in dump_header)

    return AgeClock(snap.epoch, started, interval)


def dump_name(timestamp: float, pid: int, sequence: int, kind: str = "") -> str:
    """The file name of a dump: ``heapwatch-<UTC time>-<pid>-<n>.hwdump``,
    ``-<kind>`` before the suffix for a black box."""
    whole = int(timestamp)
    micros = min(999_999, round((timestamp - whole) * 1e6))
    when = time.strftime("%Y%m%dT%H%M%S", time.gmtime(whole))
    tail = f"-{kind}" if kind else ""
    return f"heapwatch-{when}.{micros:06d}Z-{pid}-{sequence}{tail}{DUMP_SUFFIX}"


def marker_path(directory: str, name: str, what: str) -> str:
    """The hidden, empty file that says ``what`` of the dump ``name``
    (``exited``: its process exited cleanly; ``reported``: a later process
    reported it).  Retention deletes a dump's markers with it."""
    return os.path.join(directory, f".{name}.{what}")


def write_marker(directory: str, name: str, what: str) -> None:
    """Creates the marker ``what`` of the dump ``name``; raises OSError."""
    flags = os.O_WRONLY | os.O_CREAT
    os.close(_core.open_file(marker_path(directory, name, what), flags, 0o600))


def write_dump_file(
    directory: str,
    name: str,
    header: DumpHeader,
    traces: Union[Iterator[RawTrace], Iterator[AgedTrace], Iterator[RoutedTrace]],
    routes: Mapping[int, str] | None = None,
) -> str:
    """Writes a dump as ``directory/name`` and returns its path.

    The bytes go to a hidden temporary file in the same directory (created
    exclusively, mode 0600), are synced, and the file is renamed: the dump
    appears whole or not at all.  The directory is created (0700) if missing.
    On failure the temporary file is removed and the error raised.
    """
    from heapwatch.formats.dump import write_dump  # noqa: PLC0415 (only to dump, as in dump_header)

    problem = dump_dir_problem(directory)
    if problem:
        raise NotADirectoryError(errno.ENOTDIR, problem, directory)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    final = os.path.join(directory, name)
    temporary = os.path.join(directory, _temporary_name(name))
    # Through the core (csrc/descriptors.h): a black box is written unasked,
    # and os.open() could take a number the service closed for a moment.
    fd = _core.open_file(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fp:
            write_dump(fp, header, traces, routes=routes)
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    # The rename itself survives a crash once the directory is synced.
    with contextlib.suppress(OSError):
        dir_fd = _core.open_file(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return final


def dump_dir_problem(directory: str) -> str:
    """Why ``directory`` cannot hold dumps as it is, or "" (missing is fine:
    it is created)."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        return "exists and is not a directory (HEAPWATCH_DUMP_DIR names a directory)"
    return ""


def _handler_name(handler: object) -> str:
    """A signal handler as a reader knows it: ``Arbiter.signal``, ``SIG_IGN``."""
    if isinstance(handler, signal.Handlers):
        return handler.name
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    module = getattr(handler, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def _unwritable(directory: str) -> str:
    """Why this process cannot write into ``directory`` (or create it), or ""."""
    existing = directory
    while not os.path.lexists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.access(existing, os.W_OK | os.X_OK):
        if existing == directory:
            return f"is not writable by this process (uid {os.getuid()})"
        return f"does not exist and {existing}, where it would be created, is not writable"
    return ""


def one_line(exc: BaseException) -> str:
    """An error in one line: ``path: what`` for the OS's errors."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


class DumpEntry(NamedTuple):
    """One of heapwatch's dumps in a directory."""

    name: str
    size: int
    black_box: bool


def _temporary_name(name: str) -> str:
    """The hidden name the dump ``name`` is written under, then renamed from."""
    return f".{name}.tmp"


def _regular_files(directory: str) -> Iterator[tuple[str, os.stat_result]]:
    """(name, status) of the regular files in ``directory``, symbolic links
    left out.  Listed by the core: os.scandir() would open the directory with
    the GIL released (csrc/descriptors.h), and the black box lists it
    unasked."""
    for name in _core.list_dir(directory):
        try:
            status = os.lstat(os.path.join(directory, name))
        except OSError:  # deleted meanwhile (another process's retention)
            continue
        if stat.S_ISREG(status.st_mode):
            yield name, status


def list_dump_entries(directory: str) -> list[DumpEntry]:
    """heapwatch's dumps in ``directory``, oldest first.

    Only regular files named as heapwatch names its dumps count; temporary
    files, markers, other files and symbolic links are never listed."""
    found: list[tuple[tuple[str, int, int], DumpEntry]] = []
    for name, status in _regular_files(directory):
        match = _DUMP_NAME.match(name)
        if match is not None:
            key = (match.group(1), int(match.group(2)), int(match.group(3)))
            found.append((key, DumpEntry(name, status.st_size, match.group(4) is not None)))
    found.sort()
    return [dump for _key, dump in found]


def list_dumps(directory: str) -> list[tuple[str, int]]:
    """(name, size) of heapwatch's dumps in ``directory``, oldest first."""
    return [(dump.name, dump.size) for dump in list_dump_entries(directory)]


# A temporary file untouched this long is no dump in progress (a writer
# touches it at every chunk) but one a killed process left.
STALE_TEMPORARY_SECONDS = 600.0


def remove_stale_temporaries(
    directory: str, now: float, older_than: float = STALE_TEMPORARY_SECONDS
) -> list[str]:
    """Deletes the hidden temporary files of dumps that processes killed
    mid-write left in ``directory`` (an OOM kill during a black box), once
    untouched for ``older_than`` seconds; returns their names."""
    removed: list[str] = []
    try:
        for name, status in _regular_files(directory):
            dump = name[1:].removesuffix(".tmp")
            if name != _temporary_name(dump) or _DUMP_NAME.match(dump) is None:
                continue
            if now - status.st_mtime > older_than:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
                    removed.append(name)
    except OSError:  # the directory itself
        pass
    return removed


# The markers a dump may have (``marker_path``): deleted with it.
MARKERS = ("exited", "reported")


def prune_dumps(directory: str, keep: int, max_bytes: int, protect: str | None = None) -> list[str]:
    """Deletes the oldest dumps until at most ``keep`` dumps (0: any number)
    of at most ``max_bytes`` bytes together (0: any size) remain; never
    ``protect`` (the dump just written, kept even when it alone is too big),
    nor the newest black box (the evidence of the last crossing of a memory
    threshold outlives the dumps asked for since).  Returns the names
    deleted.  A dump another process deleted first counts as deleted;
    another failure is logged and that dump skipped."""
    if keep <= 0 and max_bytes <= 0:
        return []
    dumps = list_dump_entries(directory)
    count = len(dumps)
    total = sum(dump.size for dump in dumps)
    boxes = [dump.name for dump in dumps if dump.black_box]
    kept = {protect, boxes[-1] if boxes else None}
    removed: list[str] = []
    for dump in dumps:
        if not ((keep > 0 and count > keep) or (max_bytes > 0 and total > max_bytes)):
            break
        if dump.name in kept:
            continue
        try:
            os.unlink(os.path.join(directory, dump.name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("heapwatch could not delete the old dump %s: %s", dump.name, exc)
            continue
        for what in MARKERS:
            with contextlib.suppress(OSError):
                os.unlink(marker_path(directory, dump.name, what))
        count -= 1
        total -= dump.size
        removed.append(dump.name)
    return removed


# What the worker's pipe carries: "d" asks for a dump, "q" ends the worker
# for good, _PAUSE for a fork (resume_after_fork starts it again).
_PAUSE = b"p"


class DumpService:
    """The agent's on-demand dumps: into ``dump_dir``, on the dump signal.

    A component of the agent (``start``, ``shutdown``, ``after_fork_in_child``);
    ``heapwatch.server.served_dumps.ServedDumpService`` adds its ``/debug/``
    routes.  ``dump_lock`` is held while a dump, profile or top is built: the routes
    answer 429 when they cannot take it at once, the signal's dump waits.

    Args:
        config: ``token`` (the routes' bearer token, read by the agent's
            router), ``dump_signal``, ``dump_dir``, ``dump_keep`` and
            ``dump_max_bytes``.
        source: where snapshots come from (the C core by default).
        clock: unix time, for dump headers and file names.
    """

    name = "dumps"

    def __init__(
        self,
        config: AgentConfig,
        *,
        source: DumpSource | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.source: DumpSource = source if source is not None else CoreSource()
        self.clock = clock
        # One object, so that signal.getsignal() can recognise it.
        self._handler = self._on_signal
        self._signum: int | None = None
        self._previous_handler: Any = None
        self._armed_pid = 0
        self._sequence = 0
        self._agent: weakref.ref[AgentView] | None = None
        # Whether the line saying the application took the signal was said,
        # here or in the parent: gunicorn's workers each re-arm, and each
        # would say it again.
        self._said_taken = False
        self._fork_hook = False
        self._init_state()

    def _init_state(self) -> None:
        # What a forked child must not inherit: a lock another thread held,
        # the parent's worker and pipe.
        self.dump_lock = threading.Lock()
        self.last_duration = 0.0
        self._wake: tuple[int, int] | None = None
        self._worker: OwnThread | None = None

    @property
    def agent(self) -> AgentView | None:
        """The agent this service was started by, if it is still alive."""
        ref = self._agent
        return ref() if ref is not None else None

    @property
    def signal_armed(self) -> bool:
        """Whether this process's dump signal is handled by this service."""
        return self._signum is not None and self._armed_pid == os.getpid()

    # ---- the exporter protocol ---------------------------------------------

    def start(self, agent: AgentView) -> None:
        """Arms the dump signal when ``dump_dir`` is set (the ``/debug/``
        routes are ``heapwatch.server.debug_routes``'s)."""
        self._agent = weakref.ref(agent)
        config = self.config
        if config.dump_dir is not None:
            # Said now, once, not first when a dump is needed (a black box
            # is needed when it is too late to fix the directory).
            problem = dump_dir_problem(config.dump_dir) or _unwritable(config.dump_dir)
            if problem:
                problems.report(
                    "dump-dir",
                    "HEAPWATCH_DUMP_DIR=%s %s: dumps will fail until it does",
                    config.dump_dir,
                    problem,
                )
        if config.dump_signal is not None:
            if config.dump_dir is not None:
                self._start_worker()
            self._arm(config.dump_signal)

    def shutdown(self, timeout: float) -> None:
        """Restores the signal's previous handler (from the main thread: from
        another one the handler stays, doing nothing) and stops the worker."""
        deadline = time.monotonic() + max(0.0, timeout)
        disarmed = self._disarm()
        wake, worker = self._wake, self._worker
        self._wake = self._worker = None
        if wake is not None:
            with contextlib.suppress(OSError):
                os.write(wake[1], b"q")
            if worker is not None and not worker.is_current():
                worker.join(max(0.0, deadline - time.monotonic()))
            # The write end stays open while our handler may still run
            # (another thread stopped us): its number must not be reused
            # by a file the handler would then write to.
            for fd in wake if disarmed else wake[:1]:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def pause_for_fork(self, deadline: float) -> bool:
        """Ends the worker for a fork, by the monotonic ``deadline`` (a dump
        being written is waited for until then); the pipe stays, and a dump
        asked for meanwhile is written after ``resume_after_fork``."""
        wake, worker = self._wake, self._worker
        if wake is None or worker is None:
            return True
        if worker.is_current():
            return False
        self._worker = None
        with contextlib.suppress(OSError):
            os.write(wake[1], _PAUSE)
        return join_thread(worker, deadline)

    def resume_after_fork(self) -> None:
        """Starts the worker again after ``pause_for_fork``."""
        wake = self._wake
        if wake is not None and self._worker is None:
            self._worker = start_thread(self._work, "heapwatch-dump", (wake[0],))

    def after_fork_in_child(self) -> None:
        """Drops the parent's pipe, worker and lock (the handler stays
        installed and is armed again by ``start``)."""
        wake = self._wake
        self._init_state()
        self._armed_pid = 0
        for fd in wake or ():
            with contextlib.suppress(OSError):
                os.close(fd)

    # ---- the signal --------------------------------------------------------

    def _arm(self, name: str) -> None:
        # Without a dump directory the signal is taken only from its default
        # action, which would kill the service; nobody asked for dumps, so
        # what stops us is not worth a warning.
        asked = self.config.dump_dir is not None
        level = logging.WARNING if asked else logging.DEBUG
        signum = int(getattr(signal, name))
        current = signal.getsignal(signum)
        if current is self._handler:  # still ours: a restart after fork
            self._signum = signum
            self._armed_pid = os.getpid()
            return
        stale = getattr(current, "__self__", None)
        if isinstance(stale, DumpService):
            # Left by a service stopped outside the main thread: heapwatch's
            # own, not the application's.
            current = stale._previous_handler
        elif current not in ((signal.SIG_DFL, signal.SIG_IGN) if asked else (signal.SIG_DFL,)):
            self._say_taken(level, name, current)
            return
        try:
            signal.signal(signum, self._handler)
        except ValueError:  # only the main thread may install a handler
            log.log(
                level,
                "heapwatch does not handle %s: the agent was started outside the main "
                "thread (use GET /debug/heapwatch/snapshot instead)",
                name,
            )
            return
        self._signum = signum
        self._previous_handler = current
        self._armed_pid = os.getpid()
        if not self._fork_hook:
            self._fork_hook = True
            call_before_fork(self._before_fork)
        if asked:
            log.info(
                "heapwatch writes a dump into %s on %s (kill -%s %d)",
                self.config.dump_dir,
                name,
                name[3:],
                os.getpid(),
            )
        else:
            log.info(
                "heapwatch handles %s: it writes no dump until HEAPWATCH_DUMP_DIR is set",
                name,
            )

    def _say_taken(self, level: int, name: str, current: object) -> None:
        """Says once, in this process and the children it forks after, that
        the application handles the signal (naming its handler, not its
        repr: an address says nothing and differs in every process)."""
        if self._said_taken:
            level = logging.DEBUG
        self._said_taken = True
        log.log(
            level,
            "heapwatch does not handle %s: the application handles it already (%s); "
            "choose a free signal with HEAPWATCH_DUMP_SIGNAL, or none",
            name,
            _handler_name(current),
        )

    def _before_fork(self) -> None:
        # A handler installed after ours took the signal (gunicorn's master
        # installs its own once the agent has started): said here, once,
        # rather than by every worker as it re-arms.
        signum = self._signum
        if signum is None or self._armed_pid != os.getpid() or self._said_taken:
            return
        current = signal.getsignal(signum)
        if current is not self._handler:
            level = logging.WARNING if self.config.dump_dir is not None else logging.DEBUG
            self._say_taken(level, signal.Signals(signum).name, current)

    def _disarm(self) -> bool:
        """Puts the previous handler back; False when ours may still run."""
        signum = self._signum
        if signum is None:
            return True
        try:
            if signal.getsignal(signum) is self._handler:
                signal.signal(signum, self._previous_handler)
        except ValueError:  # not the main thread
            return False
        self._signum = None
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes, possibly while that
        # thread holds any lock (heapwatch's included): to ask for a dump it
        # takes none and only writes one byte to a non-blocking pipe.  The
        # pid check ignores a signal caught in a forked child before it
        # armed its own pipe: in a child whose agent has not restarted yet
        # (its first cycle is not due), the signal restarts it first.
        if self._armed_pid != os.getpid():
            agent = self.agent
            if agent is not None:
                agent.wake_in_child()
            if self._armed_pid != os.getpid():
                return
        if self.config.dump_dir is None:
            # No dump to ask for, so no pipe nor thread (nor descriptors) in
            # every process: the line is logged from here, through logging's
            # and ProblemLog's reentrant locks, as services log in handlers.
            problems.report(
                "no-dump-dir",
                "heapwatch got %s and writes no dump: HEAPWATCH_DUMP_DIR is not set (set it "
                "to a directory, or use GET /debug/heapwatch/snapshot)",
                self.config.dump_signal,
            )
            return
        wake = self._wake
        if wake is None:
            return
        with contextlib.suppress(OSError):  # full: a dump is pending already
            os.write(wake[1], b"d")

    def _start_worker(self) -> None:
        if self._worker is not None:
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        self._wake = (read_end, write_end)
        self._worker = start_thread(self._work, "heapwatch-dump", (read_end,))

    def _work(self, read_end: int) -> None:
        while True:
            try:
                data = os.read(read_end, 64)
            except OSError:
                return
            if not data or b"q" in data:
                return
            if _PAUSE in data:
                wake = self._wake
                if b"d" in data and wake is not None:  # asked for with the pause: after it
                    with contextlib.suppress(OSError):
                        os.write(wake[1], b"d")
                return
            directory = self.config.dump_dir
            # Signals that arrived during the last dump give one more dump.
            try:
                self.dump_to_directory(trigger="signal")
            except Exception as exc:
                problems.report(
                    f"dump-failed:{type(exc).__name__}:{getattr(exc, 'errno', '')}",
                    "heapwatch could not write a dump into %s: %s",
                    directory,
                    one_line(exc),
                    level=logging.ERROR,
                    exc_info=exc,
                )
            forget_dummy()

    # ---- dumps ---------------------------------------------------------------

    def header_of(
        self,
        snap: _core.Snapshot,
        trigger: str,
        now: float | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> DumpHeader:
        """The header of a dump of ``snap`` (taken with its traces) at ``now``
        (the clock's time by default): what turns its ages into durations,
        the agent's leak window, and ``extra`` entries."""
        when = self.clock() if now is None else now
        return dump_header(
            snap,
            trigger=trigger,
            clock=lambda: when,
            ages=age_clock(snap, when, self.agent),
            leak_window=self.config.leak_window,
            extra=extra,
        )

    def dump_to_directory(
        self,
        trigger: str = "signal",
        *,
        kind: str = "",
        prepare: Callable[[_core.Snapshot, str], Mapping[str, str]] | None = None,
        batch: int = _TRACE_BATCH,
    ) -> str:
        """Writes a dump of every live trace into ``dump_dir`` now (waiting
        for a dump in progress), applies the retention limits and returns the
        dump's path.  ``kind`` goes into its name (``dump_name``);
        ``prepare(snapshot, path)``, called before anything is written,
        returns entries for its header; its traces are turned into Python
        tuples ``batch`` at a time.  Raises what failed; the service itself
        never does."""
        directory = self.config.dump_dir
        if directory is None:
            raise RuntimeError("no dump directory: set HEAPWATCH_DUMP_DIR")
        started = time.monotonic()
        with self.dump_lock:
            snap = self.source.snapshot(traces=True)
            ntraces = snap.ntraces
            routes = dump_routes(snap)
            traces: Generator[Any, None, None] = (
                iter_traces(snap, batch) if routes is None else iter_routed_traces(snap, batch)
            )
            try:
                now = self.clock()
                self._sequence += 1
                name = dump_name(now, os.getpid(), self._sequence, kind)
                extra = prepare(snap, os.path.join(directory, name)) if prepare else None
                header = self.header_of(snap, trigger, now, extra)
                path = write_dump_file(directory, name, header, traces, routes)
            finally:
                # A dump that fails (a full disk, a read-only one) raises
                # from deep in the writer: the frames its exception carries
                # (kept by whatever keeps the exception) must not keep the
                # snapshot, its tracebacks and a batch of traces alive.
                traces.close()
                del traces, snap
            self.last_duration = time.monotonic() - started
        try:
            size = os.path.getsize(path)
        except OSError:  # another process's retention was quicker
            size = 0
        removed = prune_dumps(
            directory, self.config.dump_keep, self.config.dump_max_bytes, protect=name
        )
        log.info(
            "heapwatch wrote %s (%d traces, %d bytes, %.2fs)%s",
            path,
            ntraces,
            size,
            self.last_duration,
            f"; deleted {len(removed)} older dumps" if removed else "",
        )
        return path
