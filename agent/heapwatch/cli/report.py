"""``heapwatch report DUMP [OLDER_DUMP] -o report.html``: the memory page of
a dump as one HTML file that opens from disk, with no server and no network.

The same views as the agent's ``/debug/heapwatch/`` (``heapwatch.server.page``):
memory by stack, the top sites, and with an older dump the growth of each
site and the stacks coloured by their change.  Dumps keep files and lines,
not function names: a frame is named after the function around its line
when its source file is readable here.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, BinaryIO, cast

from heapwatch.cli.dump_input import (
    InputError,
    add_pickle_option,
    format_when,
    open_input,
    run_guarded,
    timestamp,
    write_output,
)
from heapwatch.cli.leaks import AgedDump, read_aged, score_dumps
from heapwatch.formats.leaks import SUSPECT, LeakScore, rank_scores
from heapwatch.formats.rows import GroupedRows, group_rows
from heapwatch.formats.view import (
    SiteRow,
    SuspectRow,
    function_names,
    median_age,
    stacks_of_rows,
    view_data,
)
from heapwatch.server.page import TOP_SITES, TOP_SUSPECTS
from heapwatch.server.report_html import standalone_html

if TYPE_CHECKING:
    from heapwatch._core import Mode
    from heapwatch.formats.snapshot_file import SnapshotFile

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_parser"]

Site = tuple[str, int]


def _grouped(source: SnapshotFile) -> tuple[GroupedRows, GroupedRows]:
    """(by traceback, by line) of a file's traces, read once."""
    traces = list(source.traces)
    mode = cast("Mode", source.mode)
    return (
        group_rows(traces, "traceback", False, mode, source.sample_interval),
        group_rows(traces, "lineno", False, mode, source.sample_interval),
    )


def _aged(options: argparse.Namespace, path: str, notes: list[str]) -> AgedDump | None:
    """The dump's memory by site with its ages (``heapwatch leaks``'s
    reader); None, with a note, for a file without them."""
    try:
        return read_aged(path, options.max_inflate_ratio)
    except InputError as exc:
        notes.append(f"no ages: {exc}")
        return None


def _ages_and_scores(
    options: argparse.Namespace, notes: list[str]
) -> tuple[dict[Site, float], dict[Site, LeakScore]]:
    """Each site's age in seconds (the least at least half its bytes have)
    in DUMP, and with OLDER_DUMP the leak scores of ``heapwatch leaks``."""
    new = _aged(options, options.dump, notes)
    if new is None:
        return {}, {}
    at = new.header.timestamp
    ages: dict[Site, float] = {}
    for site, (histogram, _blocks) in new.ages.items():
        age = median_age(histogram)
        if age is not None:
            ages[site] = new.clock.min_seconds(age, at)
    if options.older is None:
        notes.append("leak scores need a series: give an older dump of the same process")
        return ages, {}
    old = _aged(options, options.older, notes)
    if old is None:
        return ages, {}
    try:
        scored = score_dumps([old, new])
    except InputError as exc:
        notes.append(f"no leak scores: {exc}")
        return ages, {}
    notes.extend(f"leak scores: {note}" for note in scored.notes)
    return ages, scored.scores


def _report(options: argparse.Namespace) -> int:
    new = open_input(options, options.dump)
    stacks, lines = _grouped(new)
    old = old_stacks = old_lines = None
    if options.older is not None:
        old = open_input(options, options.older)
        old_stacks, old_lines = _grouped(old)
    names = function_names(stacks.rows + (old_stacks.rows if old_stacks else []))
    before = {} if old_lines is None else {f[0]: size for f, size, _count in old_lines.rows}
    notes = [f"{new.path}: taken {format_when(new.meta)}"]
    ages, scores = _ages_and_scores(options, notes)
    sizes = {frames[0]: size for frames, size, _count in lines.rows}
    sites = []
    for frames, size, count in lines.rows[:TOP_SITES]:
        score = scores.get(frames[0])
        sites.append(
            SiteRow(
                frames[0][0],
                frames[0][1],
                size,
                count,
                size - before.get(frames[0], 0) if old else None,
                None,
                None if score is None else score.score,
                ages.get(frames[0]),
            )
        )
    suspects = [
        SuspectRow(where[0], where[1], score.score, score.rate, sizes.get(where, 0))
        for where, score in rank_scores(scores.items(), SUSPECT)[:TOP_SUSPECTS]
    ]
    timeline = []
    if old is not None:
        notes.append(f"compared with {old.path}: taken {format_when(old.meta)}")
        if old.mode != new.mode:
            notes.append(f"{old.path} was taken in {old.mode} mode, {new.path} in {new.mode} mode")
        when = timestamp(old.meta)
        if when is not None and old_stacks is not None:
            timeline.append((when, old_stacks.total[0], None, None, None))
    when = timestamp(new.meta)
    if when is not None:
        timeline.append((when, stacks.total[0], None, None, None))
    data = view_data(
        kind="dumps",
        stacks=stacks_of_rows(stacks.rows, names),
        base=None if old_stacks is None else stacks_of_rows(old_stacks.rows, names),
        base_label="" if old is None else f"{old.path} ({format_when(old.meta)})",
        sites=sites,
        suspects=suspects,
        timeline=timeline,
        mode=new.mode,
        sample_interval=new.sample_interval,
        total=stacks.total,
        notes=notes,
        meta={"file": new.path, **new.meta},
    )
    page = standalone_html(data, f"heapwatch report: {new.path}").encode("utf-8", "surrogateescape")

    def write(out: BinaryIO) -> None:
        out.write(page)

    write_output(options.output, write)
    return 0


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="a dump's memory as one HTML file: flame graph, top sites, differences",
        description="Writes the memory page of DUMP (a heapwatch dump) as one self-contained "
        "HTML file: memory by stack (zoom, search), the top sites and, with OLDER_DUMP, what "
        "grew since it. The file opens from disk and loads nothing from the network.",
    )
    parser.add_argument("dump", metavar="DUMP", help="a heapwatch dump")
    parser.add_argument(
        "older", metavar="OLDER_DUMP", nargs="?", help="an earlier dump to compare with"
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the HTML file to write"
    )
    add_pickle_option(parser)
    parser.set_defaults(func=run_guarded, command=_report)
