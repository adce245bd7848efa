"""``heapwatch top FILE``: the top allocation sites of a dump, as the agent's
``/debug/heapwatch/top`` shows them."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from heapwatch.cli.dump_input import (
    add_age_option,
    add_report_options,
    group,
    open_input,
    print_report,
    run_guarded,
)
from heapwatch.formats.dump import read_dump
from heapwatch.formats.report import ROUTE_KEY, TOP_KEY_TYPES, min_age_note, top_report
from heapwatch.formats.rows import GroupedRows, group_route_rows
from heapwatch.server.black_box import black_box_note

if TYPE_CHECKING:
    from heapwatch._core import Mode
    from heapwatch.formats.dump import RawTrace
    from heapwatch.formats.snapshot_file import SnapshotFile

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_parser"]


def _by_route(source: SnapshotFile, options: argparse.Namespace) -> GroupedRows:
    """The file's memory by route: a dump of format 1.2 on names them, read
    whole (its routes are per traceback); any other file's is all <none>."""
    mode = cast("Mode", source.mode)
    if source.meta["format"] != "heapwatch":
        return group_route_rows(
            source.traces, itertools.repeat(0), {}, mode, source.sample_interval
        )
    close = getattr(source.traces, "close", None)
    if close is not None:
        close()  # read again below, whole
    ratio = options.max_inflate_ratio
    dump = read_dump(source.path, **({} if ratio is None else {"max_inflate_ratio": ratio}))
    traces: Iterable[RawTrace] = dump.traces
    routes: Iterable[int] = dump.routes if dump.routes is not None else itertools.repeat(0)
    if options.min_age is not None and dump.ages is not None:
        youngest = source.youngest
        kept = [
            (trace, route)
            for trace, route, age in zip(traces, routes, dump.ages)
            if youngest is not None and age >= youngest
        ]
        traces, routes = [t for t, _ in kept], [r for _, r in kept]
    return group_route_rows(traces, routes, dump.route_names, mode, source.sample_interval)


def _top(options: argparse.Namespace) -> int:
    source = open_input(options, options.file)
    if options.key_type == ROUTE_KEY:
        grouped = _by_route(source, options)
    else:
        grouped = group(source, options.key_type, options.cumulative)
    notes = []
    why = black_box_note(source.meta)
    if why is not None:
        notes.append(why)
    if options.min_age is not None and source.ages is not None:
        notes.append(min_age_note(options.min_age, source.ages, source.youngest))
    report = top_report(
        grouped.rows,
        grouped.total,
        key_type=options.key_type,
        cumulative=options.cumulative,
        limit=options.limit,
        mode=source.mode,
        sample_interval=source.sample_interval,
        notes=notes,
        meta={
            "file": source.path,
            **source.meta,
            **({} if options.min_age is None else {"min_age": options.min_age}),
        },
    )
    print_report(report, options.json)
    return 0


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "top",
        help="the top allocation sites of a dump",
        description="Shows the top statistics of FILE (a heapwatch dump) like the agent's "
        '/debug/heapwatch/top: the tracemalloc documentation\'s "Pretty top".',
    )
    parser.add_argument("file", metavar="FILE", help="a heapwatch dump")
    add_report_options(parser, TOP_KEY_TYPES)
    add_age_option(parser)
    parser.set_defaults(func=run_guarded, command=_top)
