"""``heapwatch convert FILE --to FORMAT -o OUT``: a dump for the stdlib's
tracemalloc, for pprof, or (from a pickle) as a heapwatch dump."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, BinaryIO

from heapwatch.cli.dump_input import (
    add_pickle_option,
    open_input,
    read_routed,
    run_guarded,
    timestamp,
    write_output,
)
from heapwatch.formats import dump, pprof
from heapwatch.formats import stdlib as convert

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_parser"]

CONVERT_FORMATS = ("tracemalloc", "pprof", "heapwatch")


def _convert(options: argparse.Namespace) -> int:
    source = open_input(options, options.file)
    # The input is read (and checked, to its checksum) before OUTPUT is touched.
    route_labels: list[str] | None = None
    if options.to == "pprof":
        # As the live profile: each sample labelled with its request's route.
        traces, routes, names = read_routed(source, options)
        route_labels = [names.get(route, "") if route else "" for route in routes]
    else:
        traces = list(source.traces)
    if options.to == "tracemalloc":

        def write(fp: BinaryIO) -> None:
            convert.write_tracemalloc(
                fp, traces, source.traceback_limit, source.mode, source.sample_interval
            )

    elif options.to == "pprof":
        stamp = timestamp(source.meta)

        def write(fp: BinaryIO) -> None:
            pprof.write_pprof(
                fp,
                traces,
                source.mode,
                source.sample_interval,
                time_nanos=int(stamp * 1e9) if stamp is not None else None,
                comments=[f"converted by heapwatch from {os.path.basename(source.path)}"],
                routes=route_labels,
            )

    else:
        header = dump.DumpHeader(
            python_version=str(source.meta.get("python_version", "")),
            pid=int(source.meta.get("pid", 0)),
            timestamp=float(source.meta.get("timestamp", os.path.getmtime(source.path))),
            mode=source.mode,
            sample_interval=source.sample_interval,
            traceback_limit=max(1, min(source.traceback_limit, 65535)),
            extra={k: v for k, v in source.meta.items() if type(v) is str and k != "format"},
        )

        def write(fp: BinaryIO) -> None:
            dump.write_dump(fp, header, traces)

    write_output(options.output, write)
    if source.mode == "sample" and options.to == "tracemalloc":
        print(
            "heapwatch convert: sample-mode dump: sizes are heapwatch's estimates, "
            "counts are numbers of samples",
            file=sys.stderr,
        )
    return 0


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a dump for the stdlib's tracemalloc or pprof",
        description="Converts FILE: --to tracemalloc writes what the stdlib's "
        "tracemalloc.Snapshot.load() reads (a pickle); --to pprof a gzip profile.proto "
        "(go tool pprof, Pyroscope); --to heapwatch a heapwatch dump (from a pickle).",
    )
    parser.add_argument("file", metavar="FILE", help="a heapwatch dump")
    parser.add_argument("--to", required=True, choices=CONVERT_FORMATS, help="output format")
    parser.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="output file ('-': stdout)"
    )
    add_pickle_option(parser)
    parser.set_defaults(func=run_guarded, command=_convert)
