"""The ``heapwatch`` command (also ``python -m heapwatch``): one module per
subcommand, as memray's ``commands/``.

Each command module has ``add_parser(subparsers)``, which adds its parser
and sets ``func`` (called with the parsed namespace, returning the exit
status): ``run`` starts a command with the agent on; ``top``, ``diff``,
``convert``, ``leaks`` and ``report`` read dumps (``dump_input`` holds what they share).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Callable

from heapwatch._version import __version__
from heapwatch.cli import convert, diff, leaks, report, run, top

if TYPE_CHECKING:
    from collections.abc import Sequence

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: list[Callable[[SubParsers], None]] = [
    run.add_parser,
    top.add_parser,
    diff.add_parser,
    convert.add_parser,
    leaks.add_parser,
    report.add_parser,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heapwatch", description="heapwatch: an always-on memory monitor for Python."
    )
    parser.add_argument("--version", action="version", version=f"heapwatch {__version__}")
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    subparsers.required = True
    for add in COMMANDS:
        add(subparsers)
    for choice in subparsers.choices.values():
        choice.set_defaults(parser=choice)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    options = parser.parse_args(argv)
    status: int = options.func(options)
    return status
