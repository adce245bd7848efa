"""``heapwatch diff OLD NEW``: what changed between two dumps, biggest change first."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from heapwatch.cli.dump_input import (
    add_report_options,
    format_when,
    group,
    open_input,
    print_report,
    run_guarded,
)
from heapwatch.formats.report import diff_report
from heapwatch.formats.rows import compare_rows

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_parser"]


def _diff(options: argparse.Namespace) -> int:
    old = open_input(options, options.old)
    old_grouped = group(old, options.key_type, options.cumulative)
    new = open_input(options, options.new)
    new_grouped = group(new, options.key_type, options.cumulative)
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
    add_report_options(parser)
    parser.set_defaults(func=run_guarded, command=_diff)
