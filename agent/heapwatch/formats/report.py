"""Top statistics and their differences, as text or JSON.

One layout for the agent's ``/debug/heapwatch/top`` and ``/diff`` endpoints
and the ``heapwatch top``/``diff`` commands: the "Pretty top" of the stdlib's
tracemalloc documentation (``#1: file:line: 12.3 KiB``, the source line, then
``N other: X KiB`` and ``Total allocated size: X KiB``), with a ``#`` note
line first when the figures are estimates (sample mode).  A ``Report`` is
built from the core's raw tuples, most recent frame first (``_core.pyi``);
statistics objects of ``heapwatch.tracemalloc`` convert to them
(``heapwatch.tracemalloc.raw``).

Totals are the traces' real totals: in cumulative mode a block counts under
every frame of its traceback, so row sizes (and ``other``) overlap and may
add up to more than the total, as in the stdlib.
"""

from __future__ import annotations

import linecache
import os
import stat
import tokenize
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from heapwatch._core import Frames, RawDiff, RawStatistic
    from heapwatch.formats.dump import AgeClock

__all__ = [
    "KEY_TYPES",
    "ROUTE_KEY",
    "TOP_KEY_TYPES",
    "Report",
    "Row",
    "diff_report",
    "format_text",
    "readable_source",
    "sample_note",
    "source_line",
    "to_json",
    "top_report",
]

KEY_TYPES = ("lineno", "filename", "traceback")
ROUTE_KEY = "route"
TOP_KEY_TYPES = (*KEY_TYPES, ROUTE_KEY)
"""What a top may group by: the core's key types, and the route of the
request the memory was allocated for (issue 26)."""
_NOUNS = {"lineno": "lines", "filename": "files", "traceback": "tracebacks", "route": "routes"}

# A source file is read whole: a name in a dump (from another machine, or
# hostile) must not make us read a device or a huge file.
_MAX_SOURCE_BYTES = 16 << 20


class Row(NamedTuple):
    """One group: its key (most recent frame first), size and count of
    blocks, and for a difference their change."""

    frames: Frames
    size: int
    blocks: int
    size_diff: int = 0
    blocks_diff: int = 0


class Report(NamedTuple):
    """What a top or diff shows; ``format_text`` and ``to_json`` render it."""

    kind: str
    """``"top"`` or ``"diff"``."""
    key_type: str
    cumulative: bool
    limit: int
    mode: str
    sample_interval: int
    """Mean bytes between samples in sample mode; 0 in exact mode."""
    rows: tuple[Row, ...]
    """The first ``limit`` groups, in the stdlib's order."""
    other_groups: int
    other: Row
    """The sums over the groups after the first ``limit``."""
    total: Row
    """The traces' totals (and their change, for a diff)."""
    notes: tuple[str, ...] = ()
    """Lines shown before the title, after the sample-mode note."""
    meta: Mapping[str, Any] = {}
    """Where the figures come from (pid, hostname, timestamp...), for JSON."""


def _sum(rows: Iterable[Row]) -> Row:
    size = blocks = size_diff = blocks_diff = 0
    for row in rows:
        size += row.size
        blocks += row.blocks
        size_diff += row.size_diff
        blocks_diff += row.blocks_diff
    return Row((), size, blocks, size_diff, blocks_diff)


def top_report(
    stats: Sequence[RawStatistic],
    total: tuple[int, int],
    *,
    key_type: str,
    cumulative: bool,
    limit: int,
    mode: str,
    sample_interval: int,
    notes: Sequence[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> Report:
    """The report of ``stats`` (every group, sorted biggest first) whose
    traces total ``total`` = (size, count)."""
    rows = [Row(frames, size, count) for frames, size, count in stats]
    return Report(
        "top",
        key_type,
        cumulative,
        limit,
        mode,
        sample_interval if mode == "sample" else 0,
        tuple(rows[:limit]),
        max(0, len(rows) - limit),
        _sum(rows[limit:]),
        Row((), total[0], total[1]),
        tuple(notes),
        dict(meta or {}),
    )


def diff_report(
    diffs: Sequence[RawDiff],
    total: tuple[int, int],
    old_total: tuple[int, int],
    *,
    key_type: str,
    cumulative: bool,
    limit: int,
    mode: str,
    sample_interval: int,
    notes: Sequence[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> Report:
    """The report of ``diffs`` (every group of either side, sorted by the
    biggest change first) between traces totalling ``old_total`` and ``total``
    = (size, count)."""
    rows = [
        Row(frames, size, count, size_diff, count_diff)
        for frames, size, size_diff, count, count_diff in diffs
    ]
    return Report(
        "diff",
        key_type,
        cumulative,
        limit,
        mode,
        sample_interval if mode == "sample" else 0,
        tuple(rows[:limit]),
        max(0, len(rows) - limit),
        _sum(rows[limit:]),
        Row((), total[0], total[1], total[0] - old_total[0], total[1] - old_total[1]),
        tuple(notes),
        dict(meta or {}),
    )


class _Sources:
    """Source lines for one report, read without linecache.

    linecache keeps every file it reads for the life of the process: a
    ``/top`` served from the agent would leave whole source files in the
    service, and the next ``/diff`` would show them as the service's growth.
    A file the service has in linecache already is read from there (and left
    as it is); any other is read here, once per report, and dropped with it.
    """

    def __init__(self) -> None:
        self._files: dict[str, list[str]] = {}

    def line(self, filename: str, lineno: int) -> str:
        """The stripped source line, or "" when the file is not a readable
        regular file of reasonable size on this machine."""
        if lineno <= 0 or not _readable(filename):
            return ""
        lines = self._files.get(filename)
        if lines is None:
            lines = self._files[filename] = _read_lines(filename)
        return lines[lineno - 1].strip() if lineno <= len(lines) else ""


def _readable(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    try:
        info = os.stat(filename)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size <= _MAX_SOURCE_BYTES


def readable_source(filename: str) -> str:
    """The whole source file, read as ``source_line`` reads it, or "" when
    it is not a readable regular file of reasonable size on this machine."""
    return "".join(_read_lines(filename)) if _readable(filename) else ""


def _read_lines(filename: str) -> list[str]:
    cached = linecache.cache.get(filename)
    if cached is not None and len(cached) == 4:  # read by the service: (size, mtime, lines, name)
        return list(cached[2])
    try:
        # The file's own encoding, as linecache reads it; not through
        # tokenize.open(), whose TextIOWrapper keeps a small block per file
        # for the life of the process.
        with open(filename, "rb") as source:
            encoding, _ = tokenize.detect_encoding(source.readline)
            source.seek(0)
            return source.read().decode(encoding).splitlines(keepends=True)
    except Exception:  # a decoding error, a file that changed under us
        return []


def source_line(filename: str, lineno: int) -> str:
    """The stripped source line, or "" when the file is not a readable regular
    file of reasonable size on this machine; linecache is left as it was."""
    return _Sources().line(filename, lineno)


# ---- text -------------------------------------------------------------------


def _kib(size: int) -> str:
    return f"{size / 1024:.1f} KiB"


def _kib_diff(size: int) -> str:
    return f"{size / 1024:+.1f} KiB"


def _figure(report: Report, row: Row) -> str:
    if report.kind == "diff":
        return f"{_kib(row.size)} ({_kib_diff(row.size_diff)})"
    return _kib(row.size)


def min_age_note(seconds: float, clock: AgeClock, youngest: int | None) -> str:
    """What a selection of live memory at least ``seconds`` old holds, in
    the epochs of ``clock`` (``AgeClock.youngest_age``)."""
    if youngest is None:
        return (
            f"live memory at least {seconds:g}s old: none can be told so old "
            "(epochs of unknown length: no agent cycled them)"
        )
    return (
        f"live memory at least {seconds:g}s old: traces {youngest} or more epochs old "
        f"(epoch {clock.epoch}, epochs of at least {clock.interval:g}s)"
    )


def sample_note(sample_interval: int) -> str:
    return (
        "# sample mode: sizes and counts are estimates "
        f"(one sample per {_kib(sample_interval)} allocated on average)"
    )


def format_text(report: Report, *, sources: bool = True) -> str:
    """The report in the "Pretty top" layout, one line per item, ending in a
    newline; ``sources`` adds each site's source line."""
    lines: list[str] = []
    read = _Sources().line
    if report.mode == "sample":
        lines.append(sample_note(report.sample_interval))
    lines.extend(f"# {note}" for note in report.notes)
    noun = _NOUNS.get(report.key_type, report.key_type)
    title = f"Top {report.limit} {noun}"
    if report.kind == "diff":
        title = f"Top {report.limit} differences ({noun})"
    if report.cumulative:
        title += " (cumulative)"
    lines.append(title)
    for index, row in enumerate(report.rows, 1):
        filename, lineno = row.frames[0] if row.frames else ("<unknown>", 0)
        if report.key_type in ("filename", ROUTE_KEY):
            lines.append(f"#{index}: {filename}: {_figure(report, row)}")
            continue
        lines.append(f"#{index}: {filename}:{lineno}: {_figure(report, row)}")
        line = read(filename, lineno) if sources else ""
        if line:
            lines.append(f"    {line}")
        if report.key_type == "traceback":
            for caller, caller_lineno in row.frames[1:]:
                lines.append(f"    from {caller}:{caller_lineno}")
                line = read(caller, caller_lineno) if sources else ""
                if line:
                    lines.append(f"        {line}")
    if report.other_groups:
        lines.append(f"{report.other_groups} other: {_figure(report, report.other)}")
    lines.append(f"Total allocated size: {_figure(report, report.total)}")
    return "\n".join(lines) + "\n"


# ---- JSON -------------------------------------------------------------------


def _figures(report: Report, row: Row) -> dict[str, int]:
    out = {"size": row.size, "count": row.blocks}
    if report.kind == "diff":
        out["size_diff"] = row.size_diff
        out["count_diff"] = row.blocks_diff
    return out


def to_json(report: Report, *, sources: bool = True) -> dict[str, Any]:
    """The report as JSON-ready data: every figure in bytes and blocks,
    tracebacks most recent frame first."""
    stats = []
    read = _Sources().line
    for index, row in enumerate(report.rows, 1):
        filename, lineno = row.frames[0] if row.frames else ("<unknown>", 0)
        if report.key_type == ROUTE_KEY:
            stats.append({"rank": index, "route": filename, **_figures(report, row)})
            continue
        by_file = report.key_type == "filename"
        line = read(filename, lineno) if sources and not by_file else ""
        stats.append(
            {
                "rank": index,
                "filename": filename,
                "lineno": None if by_file else lineno,
                **_figures(report, row),
                "traceback": [[f, n] for f, n in row.frames],
                "source": line or None,
            }
        )
    return {
        "kind": report.kind,
        "key_type": report.key_type,
        "cumulative": report.cumulative,
        "limit": report.limit,
        "mode": report.mode,
        "sample_interval": report.sample_interval,
        "estimates": report.mode == "sample",
        "notes": list(report.notes),
        "meta": dict(report.meta),
        "stats": stats,
        "other": {"groups": report.other_groups, **_figures(report, report.other)},
        "total": _figures(report, report.total),
    }
