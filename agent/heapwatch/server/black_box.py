"""The black box: a dump written before the kernel's OOM killer acts.

A container that passes its memory limit is killed with SIGKILL, and what the
agent knew dies with it.  So a thread of ours, ``heapwatch-black-box``, reads
the cgroup's memory usage every ``POLL_SECONDS`` (one small file read by the
core, ~10 µs), and the working set (usage less inactive file pages, the
kubelet's figure) only once the usage could be over a threshold.  When the
working set crosses a threshold of ``HEAPWATCH_DUMP_AT`` (90% and 97% of the
limit by default), it writes at once, whatever ``HEAPWATCH_INTERVAL`` is:

1. a short summary to the termination log (``heapwatch.server.termination_log``),
   which Kubernetes shows after the kill;
2. a dump into ``HEAPWATCH_DUMP_DIR``, named ``...-blackbox.hwdump``, its
   header saying why (``trigger=memory-threshold``, the threshold, the
   working set, the limit, the top site), written aside and renamed like
   every dump, its traces streamed in small batches so that the dump's own
   memory stays small next to the headroom left.

One dump per threshold per rising episode: a threshold crossed is re-armed
only once the working set falls ``REARM_MARGIN`` of the limit below it, and
fires again no sooner than ``MIN_SPACING_SECONDS`` after it last did.
Several thresholds crossed at one look give one dump, for the highest.

At start the thread also looks for the black box an earlier process left in
the directory without exiting cleanly: one whose process is gone (a pid is
reused, so the header records the process's start, ``process_start``) and
did not mark it ``exited`` (a process that exits cleanly does).  It logs one
line, and the agent exports it
(``heapwatch_previous_black_box_timestamp_seconds``).  A black box reported
is marked ``reported``, so that the next restart does not report it again.
The dump service looks once, at its first start (a forked child does not:
its parent did), whether or not this process has a limit.

Why a poll and not the kernel's notifications (cgroup v1's
``cgroup.event_control``, v2's PSI triggers): a poll is one code path for
both versions, needs no descriptor kept open across the service's
``close()`` and ``dup2()`` calls, and at 10 looks a second costs ~0.01% of a
core (docs/design/dumps.md, "The black box", has the measurements).
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable

from heapwatch.agent.interface import BlackBox
from heapwatch.runtime.container import (
    MemoryCgroup,
    read_limit,
    read_usage,
    read_working_set,
)
from heapwatch.runtime.problems import ProblemLog
from heapwatch.runtime.procmem import compute_untraced, process_start, read_process_memory
from heapwatch.runtime.threads import OwnThread, forget_dummy, join_thread, start_thread
from heapwatch.server.dumps import (
    BLACK_BOX_KIND,
    MARKERS,
    list_dump_entries,
    marker_path,
    one_line,
    remove_stale_temporaries,
    tracer_memory,
    write_marker,
)
from heapwatch.server.termination_log import (
    Summary,
    crossing,
    termination_log_path,
    write_summary,
)

if TYPE_CHECKING:
    from heapwatch import _core
    from heapwatch.agent.config import Threshold
    from heapwatch.agent.interface import AgentView
    from heapwatch.server.dumps import DumpService

__all__ = [
    "MIN_SPACING_SECONDS",
    "POLL_SECONDS",
    "REARM_MARGIN",
    "TRIGGER",
    "BlackBoxWatcher",
    "Watch",
    "black_box_note",
    "black_box_of",
    "find_previous_black_box",
    "report_previous_black_box",
]

log = logging.getLogger("heapwatch.black_box")
problems = ProblemLog(log)

POLL_SECONDS = 0.1
# The limit is read again this often: Kubernetes can resize a running
# container's memory in place.
LIMIT_REFRESH_SECONDS = 10.0
# Share of the limit the working set must fall below a threshold before it
# fires again: a working set hovering at the threshold gives one dump.
REARM_MARGIN = 0.05
MIN_SPACING_SECONDS = 60.0
TRIGGER = "memory-threshold"
# Sites the summary and the header name.
SUMMARY_SITES = 10
# Traces turned into Python tuples at a time: a black box is written when
# memory is short, so its batches are smaller than an asked-for dump's.
TRACE_BATCH = 1 << 13


class Watch:
    """Which threshold a working set crosses, and when one is armed again:
    the black box's decisions, apart from its thread and its clock."""

    def __init__(self, thresholds: Sequence[Threshold], limit: int) -> None:
        self._thresholds = tuple(thresholds)
        self._armed = [True] * len(self._thresholds)
        self._fired: list[float | None] = [None] * len(self._thresholds)
        self.limit = limit

    def _bytes(self, index: int) -> int:
        return self._thresholds[index].bytes_of(self.limit)

    def _rearm_below(self, index: int) -> int:
        return self._bytes(index) - int(self.limit * REARM_MARGIN)

    def needs_working_set_from(self) -> int | None:
        """The usage from which the working set must be read: the lowest
        armed threshold, or re-arming point (the working set is never above
        the usage); None when nothing could change."""
        points = [
            self._bytes(i) if armed else self._rearm_below(i) for i, armed in enumerate(self._armed)
        ]
        return min(points) if points else None

    def observe(self, now: float, working_set: int) -> Threshold | None:
        """The threshold to write a black box for now, if any: the highest of
        those armed that ``working_set`` reaches (all of them disarmed), unless
        it fired less than MIN_SPACING_SECONDS ago."""
        crossed: list[int] = []
        for index, armed in enumerate(self._armed):
            if not armed:
                if working_set < self._rearm_below(index):
                    self._armed[index] = True
                continue
            if working_set >= self._bytes(index):
                crossed.append(index)
        if not crossed:
            return None
        for index in crossed:
            self._armed[index] = False
        highest = max(crossed, key=self._bytes)
        fired = self._fired[highest]
        if fired is not None and now - fired < MIN_SPACING_SECONDS:
            return None
        self._fired[highest] = now
        return self._thresholds[highest]


def black_box_of(path: str, extra: Mapping[str, str], pid: int, timestamp: float) -> BlackBox:
    """The ``BlackBox`` a dump's header describes."""
    site = None
    line = extra.get("top_site_line", "")
    if "top_site_file" in extra and line.isdigit():
        site = (extra["top_site_file"], int(line))
    return BlackBox(
        path=path,
        timestamp=timestamp,
        pid=pid,
        threshold=extra.get("threshold", "?"),
        working_set=_int(extra.get("working_set")),
        limit=_int(extra.get("limit")),
        site=site,
        site_size=_int(extra.get("top_site_bytes")),
    )


def black_box_note(extra: Mapping[str, object]) -> str | None:
    """Why a dump was written, in a line, when its header says it is a black
    box (``heapwatch top`` shows it); None for another dump."""
    if extra.get("trigger") != TRIGGER:
        return None
    box = black_box_of("", {key: str(value) for key, value in extra.items()}, 0, 0.0)
    return (
        f"black box: written as the container's working set "
        f"({box.working_set / (1 << 20):.1f} MiB) crossed {crossing(box.threshold, box.limit)}"
    )


def _int(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 0


# The header is in the first bytes of the (compressed) stream.
_HEADER_READ = 1 << 16


def _read_header(path: str) -> tuple[BlackBox, str] | None:
    from heapwatch import _core  # noqa: PLC0415 (as the dumps are: only when read)
    from heapwatch.formats.dump import DumpError, iter_dump  # noqa: PLC0415

    try:
        # Read by the core, not open(): this runs unasked (csrc/descriptors.h).
        data = _core.read_small_file(path, _HEADER_READ)
        header, traces = iter_dump(io.BytesIO(data))
    except (OSError, DumpError) as exc:
        log.debug("heapwatch could not read the black box %s: %s", path, exc)
        return None
    traces.close()  # type: ignore[attr-defined]
    if header.extra.get("trigger") != TRIGGER:
        return None
    box = black_box_of(path, header.extra, header.pid, header.timestamp)
    return box, header.extra.get("process_start", "")


def find_previous_black_box(directory: str) -> BlackBox | None:
    """The newest black box in ``directory`` whose process is gone and
    neither marked it ``exited`` (it exited cleanly) nor had a later process
    mark it ``reported``; the older such ones are marked reported too (the
    newest tells the story).  None when there is none."""
    try:
        entries = list_dump_entries(directory)
    except OSError:
        return None
    found: BlackBox | None = None
    for entry in reversed(entries):
        if not entry.black_box or any(
            os.path.lexists(marker_path(directory, entry.name, what)) for what in MARKERS
        ):
            continue
        read = _read_header(os.path.join(directory, entry.name))
        if read is None:
            continue
        box, started = read
        if started and process_start(box.pid) == started:
            continue  # its process lives (this one, or another of the service's)
        if found is None:
            found = box
        try:
            write_marker(directory, entry.name, "reported")
        except OSError as exc:
            problems.report(
                "mark-reported", "heapwatch could not mark %s reported: %s", entry.name, exc
            )
    return found


def report_previous_black_box(directory: str, agent: AgentView | None) -> BlackBox | None:
    """Looks for the black box an earlier process left in ``directory``, logs
    it in one line and tells ``agent``; returns it.  Also deletes what
    processes killed mid-dump left."""
    remove_stale_temporaries(directory, time.time())
    box = find_previous_black_box(directory)
    if box is None:
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(box.timestamp))
    site = f"{box.site[0]}:{box.site[1]}" if box.site is not None else "no traced site"
    log.warning(
        "heapwatch found the black box of pid %d, which did not exit cleanly (an OOM kill?): "
        "at %s its working set crossed %s; top site %s; %s",
        box.pid,
        when,
        crossing(box.threshold, box.limit),
        site,
        box.path,
    )
    if agent is not None:
        agent.black_box_found(box)
    return box


class BlackBoxWatcher:
    """Watches the container's working set and writes the black box.

    Started by the dump service when ``dump_dir`` is set, ``dump_at`` names
    thresholds and the process's cgroup has a memory limit.

    Args:
        service: writes the dumps (its lock, names, retention).
        cgroup: the process's memory cgroup.
        thresholds: ``HEAPWATCH_DUMP_AT``.
        termination_log: ``HEAPWATCH_TERMINATION_LOG`` (``"auto"``, a path, None).
        agent: told of each black box written and of the previous one found.
        timer: a monotonic clock; clock: unix time.
    """

    def __init__(
        self,
        service: DumpService,
        cgroup: MemoryCgroup,
        thresholds: Sequence[Threshold],
        limit: int,
        *,
        termination_log: str | None,
        agent: AgentView | None,
        timer: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._service = service
        self._cgroup = cgroup
        self._watch = Watch(thresholds, limit)
        self._termination_log = termination_log_path(termination_log)
        self._agent = agent
        self._timer = timer
        self._clock = clock
        self._next_limit_read = timer() + LIMIT_REFRESH_SECONDS
        self._stop = threading.Event()
        self._thread: OwnThread | None = None
        self._paused = False  # by pause(), for a fork
        self.written: list[str] = []
        """The black boxes this process wrote, oldest first."""

    @property
    def limit(self) -> int:
        return self._watch.limit

    def start(self) -> None:
        self._stop = threading.Event()
        self._thread = start_thread(self._run, "heapwatch-black-box", (self._stop,))

    def stop(self, timeout: float) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and not thread.is_current():
            thread.join(max(0.0, timeout))

    def pause(self, deadline: float) -> bool:
        """Ends the thread for a fork, by the monotonic ``deadline``; whether it ended."""
        thread = self._thread
        if thread is None:
            return True
        if thread.is_current():
            return False
        self._stop.set()
        self._thread = None
        self._paused = True
        return join_thread(thread, deadline)

    def resume(self) -> None:
        """Watches again after ``pause``."""
        if self._paused:
            self._paused = False
            self.start()

    def after_fork_in_child(self) -> None:
        """The parent's thread does not exist here, nor its black boxes."""
        self._paused = False
        self._thread = None
        self._stop = threading.Event()
        self.written = []

    def mark_exited(self) -> None:
        """Marks this process's black boxes ``exited``: it exits cleanly, so
        the next process need not report them."""
        directory = self._service.config.dump_dir
        if directory is None:
            return
        for path in self.written:
            try:
                write_marker(directory, os.path.basename(path), "exited")
            except OSError as exc:
                log.debug("heapwatch could not mark %s exited: %s", path, exc)

    # ---- the thread -----------------------------------------------------------

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(POLL_SECONDS):
            self.poll()
            forget_dummy()

    def poll(self) -> str | None:
        """One look at the cgroup; writes a black box if a threshold was
        crossed and returns its path."""
        now = self._timer()
        cgroup = self._cgroup
        if now >= self._next_limit_read:
            self._next_limit_read = now + LIMIT_REFRESH_SECONDS
            limit = read_limit(cgroup)
            if limit is not None:
                self._watch.limit = limit
        usage = read_usage(cgroup)
        if usage is None:
            return None
        start = self._watch.needs_working_set_from()
        if start is None:
            return None
        working_set = usage
        if usage >= start:
            read = read_working_set(cgroup, usage)
            if read is None:
                return None
            working_set = read
        threshold = self._watch.observe(now, working_set)
        if threshold is None:
            return None
        return self.write(threshold, working_set, usage)

    def write(self, threshold: Threshold, working_set: int, usage: int | None) -> str | None:
        """Writes the summary and the black box for ``threshold`` now;
        returns the dump's path (None when it failed: logged once)."""
        limit = self._watch.limit
        started = self._timer()
        written: dict[str, Any] = {}

        def prepare(snap: _core.Snapshot, path: str) -> dict[str, str]:
            sites = [
                (frames[0][0], frames[0][1], size) if frames else ("<unknown>", 0, size)
                for frames, size, _count in snap.group("lineno").statistics(SUMMARY_SITES)
            ]
            extra = {
                # Read now: a forked child is another process than its parent.
                "process_start": process_start() or "",
                "threshold": str(threshold),
                "working_set": str(working_set),
                "limit": str(limit),
                **({} if usage is None else {"usage": str(usage)}),
            }
            if sites:
                extra["top_site_file"] = sites[0][0]
                extra["top_site_line"] = str(sites[0][1])
                extra["top_site_bytes"] = str(sites[0][2])
            written["extra"] = extra
            written["summary"] = self._summarize(
                snap,
                path,
                threshold=threshold,
                working_set=working_set,
                usage=usage,
                sites=sites,
            )
            return extra

        try:
            path = self._service.dump_to_directory(
                trigger=TRIGGER, kind=BLACK_BOX_KIND, prepare=prepare, batch=TRACE_BATCH
            )
        except Exception as exc:
            problems.report(
                f"black-box:{type(exc).__name__}:{getattr(exc, 'errno', '')}",
                "heapwatch could not write the black box into %s: %s",
                self._service.config.dump_dir,
                one_line(exc),
                level=logging.ERROR,
                exc_info=exc,
            )
            return None
        self.written.append(path)
        took = self._timer() - started
        log.warning(
            "heapwatch: the working set (%.1f MiB) crossed %s: black box written to %s in %.2fs%s",
            working_set / (1 << 20),
            crossing(str(threshold), limit),
            path,
            took,
            f", summary in {self._termination_log}" if written["summary"] else "",
        )
        if self._agent is not None:
            box = black_box_of(path, written["extra"], os.getpid(), self._clock())
            self._agent.black_box_written(box)
        return path

    def _summarize(
        self,
        snap: _core.Snapshot,
        path: str,
        *,
        threshold: Threshold,
        working_set: int,
        usage: int | None,
        sites: Sequence[tuple[str, int, int]],
    ) -> bool:
        target = self._termination_log
        if target is None:
            return False
        tracer = tracer_memory()
        resident = read_process_memory().resident
        summary = Summary(
            threshold=str(threshold),
            working_set=working_set,
            limit=self._watch.limit,
            usage=usage,
            timestamp=self._clock(),
            pid=os.getpid(),
            mode=snap.mode,
            traced=snap.traced,
            untraced=compute_untraced(resident, snap.traced, tracer),
            tracer=tracer,
            sites=sites,
            dump=path,
        )
        try:
            return write_summary(target, summary)
        except OSError as exc:
            problems.report(
                f"termination-log:{exc.errno}",
                "heapwatch could not write its summary to %s: %s",
                target,
                one_line(exc),
            )
            return False
