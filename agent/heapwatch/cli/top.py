"""``heapwatch top FILE``: the top allocation sites of a dump, as the agent's
``/debug/heapwatch/top`` shows them."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from heapwatch.cli.dump_input import (
    add_age_option,
    add_report_options,
    group,
    group_by_route,
    open_input,
    print_report,
    run_guarded,
)
from heapwatch.formats.report import ROUTE_KEY, TOP_KEY_TYPES, min_age_note, top_report
from heapwatch.server.black_box import black_box_note

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_parser"]


def _top(options: argparse.Namespace) -> int:
    source = open_input(options, options.file)
    if options.key_type == ROUTE_KEY:
        grouped = group_by_route(source, options)
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
