"""``heapwatch diff OLD NEW``: what changed between two dumps, biggest change first."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from heapwatch.cli.dump_input import (
    GroupedRows,
    SnapshotFile,
    add_report_options,
    format_when,
    group,
    group_by_route,
    open_input,
    print_report,
    run_guarded,
)
from heapwatch.formats.report import ROUTE_KEY, TOP_KEY_TYPES, diff_report
from heapwatch.formats.rows import compare_rows

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_parser"]


def _grouped(source: SnapshotFile, options: argparse.Namespace) -> GroupedRows:
    if options.key_type == ROUTE_KEY:
        return group_by_route(source, options)
    return group(source, options.key_type, options.cumulative)


def _diff(options: argparse.Namespace) -> int:
    old = open_input(options, options.old)
    old_grouped = _grouped(old, options)
    new = open_input(options, options.new)
    new_grouped = _grouped(new, options)
    diffs = compare_rows(old_grouped.rows, new_grouped.rows)
    notes = [
        f"from {old.path} ({format_when(old.meta)})",
        f"to {new.path} ({format_when(new.meta)})",
    ]
    if old.mode != new.mode:
        notes.append(f"{old.path} was taken in {old.mode} mode, {new.path} in {new.mode} mode")
    report = diff_report(
        diffs,
        new_grouped.total,
        old_grouped.total,
        key_type=options.key_type,
        cumulative=options.cumulative,
        limit=options.limit,
        mode=new.mode,
        sample_interval=new.sample_interval,
        notes=notes,
        meta={"old": {"file": old.path, **old.meta}, "new": {"file": new.path, **new.meta}},
    )
    print_report(report, options.json)
    return 0


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="what changed between two dumps",
        description="Shows the top differences from OLD to NEW (heapwatch dumps), biggest "
        "change first.",
    )
    parser.add_argument("old", metavar="OLD", help="the earlier dump")
    parser.add_argument("new", metavar="NEW", help="the later dump")
    add_report_options(parser, TOP_KEY_TYPES)
    parser.set_defaults(func=run_guarded, command=_diff)
