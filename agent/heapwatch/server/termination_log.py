"""What Kubernetes shows after an OOM kill: the black box's summary.

The kubelet reads a container's termination message file (its
``terminationMessagePath``, ``/dev/termination-log`` by default) when the
container ends, keeps at most 4096 bytes of it, and ``kubectl describe pod``
shows it as the last state's message: the one place a killed container can
leave words that outlive it without a volume.  At each crossing of a memory
threshold the black box writes there, before the dump itself (a few hundred
bytes land in a moment; the dump takes longer, and the kill may come first):
the working set against the limit, the top sites as FILE:LINE with their
sizes, traced against untraced, and the dump's file name.

Every process of a container sees the crossing (gunicorn's workers share the
master's cgroup); the message names one process, the one that traced the
most: a process does not replace a summary written less than
``FRESH_SECONDS`` ago by another one that traced more.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Sequence
from typing import NamedTuple

from heapwatch import _core
from heapwatch.agent.config import (
    TERMINATION_LOG_AUTO,
    TERMINATION_LOG_DEFAULT,
    parse_dump_at,
)

__all__ = [
    "FRESH_SECONDS",
    "MAX_MESSAGE_BYTES",
    "Summary",
    "crossing",
    "format_summary",
    "termination_log_path",
    "write_summary",
]

# The kubelet keeps this much of the file (and of all containers' messages
# together, 12 KiB); what is longer is cut.
MAX_MESSAGE_BYTES = 4096
# How long another process's summary stands against a smaller one.
FRESH_SECONDS = 60.0
# The last line: which process wrote the message and how much it traced, for
# the processes of one container to agree on whose message stays.
_STAMP = re.compile(rb"\(heapwatch pid=(\d+) traced=(\d+) at=(\d+(?:\.\d+)?)\)\s*\Z")
_ELLIPSIS = "..."


class Summary(NamedTuple):
    """What the message says of one crossing."""

    threshold: str
    working_set: int
    limit: int
    usage: int | None
    timestamp: float
    pid: int
    mode: str
    traced: int
    untraced: int | None
    tracer: int
    sites: Sequence[tuple[str, int, int]]
    """(file, line, live bytes), biggest first."""
    dump: str
    """The dump's path (written right after the message)."""


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def crossing(threshold: str, limit: int) -> str:
    """What was crossed, in words: ``97% of the memory limit (200.0 MiB)``,
    or for a size ``1024.0 MiB (the memory limit is 2048.0 MiB)``.
    ``threshold`` is as a dump's header holds it: ``str(Threshold)``, read
    back by the parser that wrote it."""
    try:
        (parsed,) = parse_dump_at(threshold)
    except ValueError:  # a header heapwatch did not write
        parsed = None
    if parsed is not None and parsed.size is not None:
        return f"{_mib(parsed.size)} (the memory limit is {_mib(limit)})"
    return f"{threshold} of the memory limit ({_mib(limit)})"


def _shortened(text: str, room: int) -> str:
    """``text`` within ``room`` characters, its start cut: a path's end names
    the file."""
    if len(text) <= room:
        return text
    return _ELLIPSIS + text[len(text) - max(0, room - len(_ELLIPSIS)) :]


def format_summary(summary: Summary, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    """The message, at most ``limit`` bytes of UTF-8: the sites that do not
    fit are left out, and a path too long for a line is cut at its start."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(summary.timestamp))
    usage = "" if summary.usage is None else f", usage {_mib(summary.usage)}"
    untraced = "unknown" if summary.untraced is None else _mib(summary.untraced)
    estimate = " (estimates: sample mode)" if summary.mode == "sample" else ""
    head = [
        f"heapwatch: working set {_mib(summary.working_set)}{usage} crossed "
        f"{crossing(summary.threshold, summary.limit)} at {when} in pid {summary.pid}",
        f"traced {_mib(summary.traced)}, untraced {untraced}, heapwatch {_mib(summary.tracer)}"
        f"{estimate}",
        "top sites:",
    ]
    dump = f"dump: {summary.dump}"
    stamp = f"(heapwatch pid={summary.pid} traced={summary.traced} at={summary.timestamp:.3f})"
    fixed = "\n".join([*head, dump, stamp]) + "\n"
    room = limit - len(fixed.encode("utf-8", "backslashreplace"))
    if room < 0:  # a dump path of kilobytes: cut it, keep the rest
        dump = _shortened(dump, len(dump) + room)
        room = 0
    lines: list[str] = []
    for file, line, size in summary.sites:
        figure = f"  {_mib(size):>12}  "
        entry = figure + _shortened(f"{file}:{line}", 200)
        cost = len(entry.encode("utf-8", "backslashreplace")) + 1
        if cost > room:
            break
        room -= cost
        lines.append(entry)
    text = "\n".join([*head, *lines, dump, stamp]) + "\n"
    return text.encode("utf-8", "backslashreplace")[:limit]


def termination_log_path(setting: str | None) -> str | None:
    """The file ``HEAPWATCH_TERMINATION_LOG`` names: ``auto`` is
    ``/dev/termination-log`` when it exists and is writable (in a Kubernetes
    container), else nothing; None is nothing."""
    if setting != TERMINATION_LOG_AUTO:
        return setting
    if os.path.isfile(TERMINATION_LOG_DEFAULT) and os.access(TERMINATION_LOG_DEFAULT, os.W_OK):
        return TERMINATION_LOG_DEFAULT
    return None


def _stands(path: str, summary: Summary, now: float) -> bool:
    """Whether the message at ``path`` is another process's, recent, and
    traced more than ``summary``: then it stays."""
    try:
        existing = _core.read_small_file(path, MAX_MESSAGE_BYTES)
    except OSError:
        return False
    match = _STAMP.search(existing)
    if match is None:
        return False
    pid, traced, at = int(match.group(1)), int(match.group(2)), float(match.group(3))
    return pid != summary.pid and now - at < FRESH_SECONDS and traced > summary.traced


def write_summary(path: str, summary: Summary) -> bool:
    """Writes the message to ``path`` (replacing what it held) unless another
    process's fresher and bigger one stands there; True if written.  Raises
    OSError."""
    if _stands(path, summary, summary.timestamp):
        return False
    data = format_summary(summary)
    # Through the core (csrc/descriptors.h): written unasked, while the
    # service may have a standard descriptor closed for a moment.
    fd = _core.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return True
