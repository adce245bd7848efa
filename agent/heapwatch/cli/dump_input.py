"""What ``heapwatch top``, ``diff`` and ``convert`` share: opening their
input, grouping it, their options, output and one-line errors.

Each reads a heapwatch dump (from the agent's endpoint or signal, or
``Snapshot.dump()``), or with ``--allow-pickle`` a stdlib tracemalloc pickle.
Dumps are read as a stream and aggregated on the way: memory follows the
distinct groups, not the traces.  Errors are one line on stderr: exit status
1 for bad input, 2 for bad usage (argparse's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, cast

from heapwatch._errors import HeapwatchError
from heapwatch.agent.config import parse_age
from heapwatch.formats.dump import read_dump
from heapwatch.formats.report import KEY_TYPES, Report, format_text, to_json
from heapwatch.formats.rows import GroupedRows, group_route_rows, group_rows
from heapwatch.formats.snapshot_file import SnapshotFile, open_snapshot

if TYPE_CHECKING:
    from heapwatch._core import KeyType, Mode, RawTrace

__all__ = [
    "MAX_LIMIT",
    "GroupedRows",
    "InputError",
    "SnapshotFile",
    "add_age_option",
    "add_inflate_option",
    "add_pickle_option",
    "add_report_options",
    "format_when",
    "group",
    "group_by_route",
    "open_input",
    "open_snapshot_file",
    "parsed_by",
    "print_report",
    "print_text",
    "read_routed",
    "run_guarded",
    "timestamp",
    "write_output",
]

MAX_LIMIT = 1_000_000


class InputError(HeapwatchError):
    """An input file cannot be used; the message names it."""


def _checked(traces: Iterable[object], path: str) -> Iterator[RawTrace]:
    # Unpickled traces may be anything: each is checked before use.
    for index, trace in enumerate(traces):
        if not (
            isinstance(trace, tuple)
            and len(trace) == 4
            and all(type(v) is int for v in (trace[0], trace[1], trace[3]))
            and trace[1] >= 0
            and isinstance(trace[2], tuple)
            and trace[2]
            and all(
                isinstance(f, tuple) and len(f) == 2 and type(f[0]) is str and type(f[1]) is int
                for f in trace[2]
            )
        ):
            shown = repr(trace)
            shown = shown if len(shown) <= 100 else shown[:100] + "..."
            raise InputError(
                f"{path}: trace #{index} is not (domain, size, frames, total_nframe): {shown}"
            )
        yield cast("RawTrace", trace)


def open_snapshot_file(
    path: str,
    allow_pickle: bool,
    max_inflate_ratio: float | None = None,
    min_age: float | None = None,
) -> SnapshotFile:
    """The traces of a heapwatch dump or (with ``allow_pickle``) of a pickled
    tracemalloc Snapshot (``heapwatch.formats.snapshot_file.open_snapshot``),
    a pickle's traces and mode checked: unpickled values may be anything.

    Raises InputError, DumpError, PickleRefusedError or OSError naming the file."""
    file = open_snapshot(
        path,
        allow_pickle,
        allow_with="--allow-pickle",
        max_inflate_ratio=max_inflate_ratio,
        min_age=min_age,
    )
    if file.meta["format"] != "pickle":
        return file
    mode = file.mode if file.mode in ("exact", "sample") else "exact"
    interval = file.sample_interval if mode == "sample" else 0
    if mode == "sample" and not (type(interval) is int and interval > 0):
        raise InputError(f"{path}: sample mode with sample_interval {interval!r}")
    return file._replace(traces=_checked(file.traces, path), mode=mode, sample_interval=interval)


def group(source: SnapshotFile, key_type: str, cumulative: bool) -> GroupedRows:
    """The rows of a file's traces (``heapwatch.formats.rows``)."""
    return group_rows(
        source.traces,
        cast("KeyType", key_type),
        cumulative,
        cast("Mode", source.mode),
        source.sample_interval,
    )


# Timestamps a header may carry that mean a time (any finite float is valid
# in the format; a hostile one must not overflow the conversions).
_LATEST = 2.0**33


def timestamp(meta: dict[str, Any]) -> float | None:
    stamp = meta.get("timestamp")
    if isinstance(stamp, (int, float)) and 0 <= stamp < _LATEST:
        return float(stamp)
    return None


def format_when(meta: dict[str, Any]) -> str:
    stamp = timestamp(meta)
    if stamp is None:
        return "time unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def print_report(report: Report, as_json: bool) -> None:
    """A command's report on stdout: JSON (one line) or text."""
    print_text(json.dumps(to_json(report)) + "\n" if as_json else format_text(report))


def print_text(text: str) -> None:
    # Filenames that were not valid UTF-8 hold lone surrogates: escaped, not an error.
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    data = text.encode(encoding, "backslashreplace")
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(data.decode(encoding))
        sys.stdout.flush()
        return
    sys.stdout.flush()
    buffer.write(data)
    buffer.flush()


def open_input(options: argparse.Namespace, path: str) -> SnapshotFile:
    return open_snapshot_file(
        path, options.allow_pickle, options.max_inflate_ratio, getattr(options, "min_age", None)
    )


def read_routed(
    source: SnapshotFile, options: argparse.Namespace
) -> tuple[list[RawTrace], list[int], Mapping[int, str]]:
    """The file's traces with each one's route id (0: none) and the routes'
    names.  A dump of format 1.2 on names them per traceback, so it is read
    whole (``source``'s stream is closed); with ``--min-age`` only the traces
    that old are kept, as ``source`` keeps them.  Any other file's traces
    are all of no route."""
    if source.meta["format"] != "heapwatch":
        traces = list(source.traces)
        return traces, [0] * len(traces), {}
    close = getattr(source.traces, "close", None)
    if close is not None:
        close()  # read again below, whole
    ratio = getattr(options, "max_inflate_ratio", None)
    dump = read_dump(source.path, **({} if ratio is None else {"max_inflate_ratio": ratio}))
    traces = dump.traces
    routes = dump.routes if dump.routes is not None else [0] * len(traces)
    if getattr(options, "min_age", None) is not None and dump.ages is not None:
        youngest = source.youngest
        kept = [
            (trace, route)
            for trace, route, age in zip(traces, routes, dump.ages)
            if youngest is not None and age >= youngest
        ]
        traces, routes = [t for t, _ in kept], [r for _, r in kept]
    return traces, routes, dump.route_names


def group_by_route(source: SnapshotFile, options: argparse.Namespace) -> GroupedRows:
    """The file's memory by route (``read_routed``), a row per route."""
    traces, routes, names = read_routed(source, options)
    return group_route_rows(
        traces, routes, names, cast("Mode", source.mode), source.sample_interval
    )


def write_output(output: str, write: Callable[[BinaryIO], None]) -> None:
    """Runs write on OUTPUT: "-" is stdout; a file appears whole (written
    beside it under a temporary name, then renamed) or not at all."""
    if output == "-":
        if sys.stdout.isatty():
            raise InputError("-o -: refusing to write binary data to a terminal")
        write(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return
    if os.path.isdir(output):
        raise InputError(f"{output}: is a directory; -o names the file to write")
    directory = os.path.dirname(os.path.abspath(output))
    # Errors name OUTPUT, never the temporary file the user did not ask for.
    try:
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".heapwatch-", suffix=".tmp")
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, output) from None
    try:
        with os.fdopen(fd, "wb") as fp:
            write(fp)
        os.chmod(temporary, 0o644 & ~_umask())
        os.replace(temporary, output)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError) and exc.filename == temporary:
            raise OSError(exc.errno, exc.strerror, output) from None
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- parsers -------------------------------------------------------------------


def limit_type(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {MAX_LIMIT}, got {text!r}")
    return value


limit_type.__name__ = "limit"


def add_report_options(
    parser: argparse.ArgumentParser, key_types: Sequence[str] = KEY_TYPES
) -> None:
    parser.add_argument(
        "--key-type",
        choices=key_types,
        default="lineno",
        help="group by line (default), file or whole traceback"
        + (
            ", or by the route of the request the memory was allocated for"
            if "route" in key_types
            else ""
        ),
    )
    parser.add_argument(
        "--limit", type=limit_type, default=10, metavar="N", help="groups shown (default 10)"
    )
    parser.add_argument(
        "--cumulative",
        action="store_true",
        help="count each block under every frame of its traceback (lineno, filename)",
    )
    parser.add_argument("--json", action="store_true", help="JSON instead of text")
    add_pickle_option(parser)


def add_pickle_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also read stdlib tracemalloc pickles: unpickling runs code from the file, "
        "so only for files you trust",
    )
    add_inflate_option(parser)


def add_inflate_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-inflate-ratio",
        type=ratio_type,
        metavar="R",
        help="decompressed bytes a dump may hold per compressed byte (the bound against "
        "decompression bombs; the reader's default applies without it): raise it only for a "
        "file you trust",
    )


def ratio_type(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 1 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {text!r}")
    return value


ratio_type.__name__ = "ratio"


def parsed_by(parse: Callable[[str], float], name: str) -> Callable[[str], float]:
    """An argparse type that reads its value with ``parse`` (the agent's
    configuration's parser, the one home of that syntax); ``name`` is what
    argparse calls the value in its error."""

    def read(text: str) -> float:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected {exc}, got {text!r}") from None

    read.__name__ = name
    return read


age_type = parsed_by(parse_age, "duration")


def add_age_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--min-age",
        type=age_type,
        metavar="DURATION",
        help="only live memory at least DURATION old when the dump was taken (90s, 30m, 2h): "
        "the traces of dumps that carry their ages (the agent's, dump format 1.1 on)",
    )


def _usage_checks(options: argparse.Namespace) -> None:
    if getattr(options, "cumulative", False) and options.key_type in ("traceback", "route"):
        options.parser.error("--cumulative needs --key-type lineno or filename")


def run_guarded(options: argparse.Namespace) -> int:
    """Runs a dump command; its input errors become one line on stderr and status 1."""
    _usage_checks(options)
    name = f"heapwatch {options.subcommand}"
    try:
        status: int = options.command(options)
    except HeapwatchError as exc:  # DumpError and PickleRefusedError included
        text = str(exc)
        if "max_inflate_ratio" in text:  # the reader's advice, in the command line's words
            text += " (here: --max-inflate-ratio R)"
        print(f"{name}: {text}", file=sys.stderr)
        return 1
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            # The reader (head, less) left: not an error worth a message.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{name}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return status
