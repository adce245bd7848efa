"""heapwatch's dump file format, defined: its records, limits and header.

A dump is a versioned, streamed binary file (docs/design/dump-format.md has
the byte layout).  Strings and tracebacks are defined once, the first time a
trace uses them, and every trace refers to its traceback by number.  The
writer (``writer.py``) and the reader (``reader.py``) share these
definitions, as memray's ``records.h`` sits under its record writer and reader.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Union

from heapwatch._errors import HeapwatchError

__all__ = [
    "COMPRESSION_NONE",
    "COMPRESSION_ZLIB",
    "F64",
    "FORMAT_MINOR",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_DOMAIN",
    "MAX_EXTENSION_BYTES",
    "MAX_FRAMES",
    "MAX_HEADER_BYTES",
    "MAX_LINENO",
    "MAX_ROUTE",
    "MAX_STRING_BYTES",
    "MAX_TOTAL_NFRAME",
    "MAX_U64",
    "MAX_VARINT_BYTES",
    "MODES",
    "PREAMBLE",
    "PREAMBLE_SIZE",
    "RECORD_NAMES",
    "REC_AGE",
    "REC_END",
    "REC_EXTENSION_MIN",
    "REC_HEADER",
    "REC_ROUTE",
    "REC_STRING",
    "REC_TRACE",
    "REC_TRACEBACK",
    "REC_TRACEBACK_ROUTE",
    "REC_TRACE_DOMAIN",
    "U32",
    "AgeClock",
    "AgedTrace",
    "Dump",
    "DumpError",
    "DumpHeader",
    "Frames",
    "PathArg",
    "RawTrace",
    "RoutedTrace",
    "encode_str",
    "header_problem",
    "is_int",
]

#: A trace as the stdlib's tracemalloc holds it:
#: ``(domain, size, ((filename, lineno), ...), total_nframe)``, most recent frame first.
RawTrace = tuple[int, int, tuple[tuple[str, int], ...], int]

Frames = tuple[tuple[str, int], ...]
#: A trace with its age: how many epochs (the agent's cycles) before the
#: snapshot it was recorded, as ``heapwatch._core.Snapshot.traces(ages=True)``
#: gives it; None for a trace of a dump that carries no ages.
AgedTrace = tuple[RawTrace, Union[int, None]]
#: A trace (aged or not) with its route id (format 1.2; 0: no route), as
#: ``write_dump(routes=...)`` takes them.
RoutedTrace = tuple[Union[RawTrace, AgedTrace], int]
PathArg = Union[str, "os.PathLike[str]"]

#: The format's major version: a reader refuses files of a newer major version.
FORMAT_VERSION = 1
#: The minor version this module writes; readers accept every minor version of
#: their major version (minor versions only add what older readers may skip).
FORMAT_MINOR = 2

# PNG-style magic: the high-bit first byte catches 7-bit transports, the name
# makes `head -c 16` readable, CR LF and LF catch newline translation, ^Z stops
# `type` on Windows.
MAGIC = b"\x89HEAPWATCH\r\n\x1a\n"
# magic, major version, minor version, compression, reserved (0)
PREAMBLE = struct.Struct(f"<{len(MAGIC)}sBBBB")
PREAMBLE_SIZE = PREAMBLE.size

COMPRESSION_NONE = 0
COMPRESSION_ZLIB = 1

# Record types.  0x01-0x7F are core records that a reader must understand;
# 0x80-0xFF are length-prefixed extension records that a reader of the same
# major version skips when it does not know them.
REC_HEADER = 0x01
REC_STRING = 0x02
REC_TRACEBACK = 0x03
REC_TRACE = 0x04
REC_TRACE_DOMAIN = 0x05
REC_END = 0x7F
REC_EXTENSION_MIN = 0x80
# Format 1.1: the traces that follow are this many epochs old.  An extension
# record, so that 1.0 readers skip it and read the traces without their ages.
REC_AGE = 0x80
# Format 1.2 (issue 26): a route's name, and the route of the traceback
# defined just before.  Extension records too: 1.0 and 1.1 readers skip
# them and read the traces of every route as one (the same frames under
# two routes are two tracebacks, which they sum as any grouping does).
REC_ROUTE = 0x81
REC_TRACEBACK_ROUTE = 0x82
RECORD_NAMES = {
    REC_HEADER: "header",
    REC_STRING: "string",
    REC_TRACEBACK: "traceback",
    REC_TRACE: "trace",
    REC_TRACE_DOMAIN: "trace",
    REC_END: "end",
    REC_AGE: "age",
    REC_ROUTE: "route",
    REC_TRACEBACK_ROUTE: "traceback route",
}

MODES = ("exact", "sample")

# Limits: every length read from a file is checked against one of these.
MAX_STRING_BYTES = 1 << 20
MAX_HEADER_BYTES = 16 << 20
MAX_EXTENSION_BYTES = 16 << 20
MAX_FRAMES = 0xFFFF
MAX_TOTAL_NFRAME = 0xFFFF
MAX_LINENO = 0xFFFFFFFF
MAX_DOMAIN = 0xFFFFFFFF
MAX_ROUTE = 0xFFFF
MAX_U64 = (1 << 64) - 1
MAX_VARINT_BYTES = 10

F64 = struct.Struct("<d")
U32 = struct.Struct("<I")


class DumpError(HeapwatchError, ValueError):
    """A dump cannot be read (truncated, corrupted, hostile, newer, a pickle)
    or written (a header or trace out of the format's range).  The message says
    what is wrong and, when reading, where (offset and record number)."""


@dataclass(frozen=True)
class AgeClock:
    """What turns a trace's age, in epochs, into seconds.

    ``epoch`` is the snapshot's epoch (its traces of age 0 were recorded in
    it); ``started`` a unix time no earlier than that epoch began; each
    earlier epoch lasted at least ``interval`` seconds (the agent's
    ``HEAPWATCH_INTERVAL``: its cycle begins an epoch only once that long
    has passed since the current one began, however early it runs; 0 when
    unknown).  So a trace of age ``a >= 1`` was recorded before the
    epoch ``a - 1`` after its own began: at least ``at - started + (a - 1) *
    interval`` seconds before ``at``, which ``min_seconds`` gives.
    """

    epoch: int
    started: float
    interval: float

    def min_seconds(self, age: int, at: float) -> float:
        """How long before ``at`` a trace of ``age`` epochs was at least recorded."""
        if age <= 0:
            return 0.0
        return max(0.0, at - self.started) + (age - 1) * self.interval

    def youngest_age(self, seconds: float, at: float) -> int | None:
        """The fewest epochs of age that make a trace surely ``seconds`` old
        at ``at`` (0 when ``seconds`` is 0), or None when no age does (epochs
        of unknown length)."""
        if seconds <= 0:
            return 0
        since_start = max(0.0, at - self.started)
        if since_start >= seconds:
            return 1
        if self.interval <= 0:
            return None
        age = 1 + max(0, math.ceil((seconds - since_start) / self.interval))
        # ceil() of a quotient rounded down by one ulp: one epoch more.
        while self.min_seconds(age, at) < seconds:
            age += 1
        return age


@dataclass(frozen=True)
class DumpHeader:
    """How a snapshot was taken: everything a dump says besides its traces."""

    python_version: str
    pid: int
    timestamp: float
    mode: str
    sample_interval: int
    traceback_limit: int
    extra: Mapping[str, str] = field(default_factory=dict)
    ages: AgeClock | None = None
    """Set when every trace carries its age (format 1.1 on)."""


@dataclass(frozen=True)
class Dump:
    """A whole dump: its header and every trace, in the order written; with
    ``header.ages``, ``ages`` holds each trace's age in epochs, in the same
    order (else it is None); ``routes`` the route each was allocated for."""

    header: DumpHeader
    traces: list[RawTrace]
    ages: list[int] | None = None
    routes: list[int] | None = None
    """Each trace's route id (0: none), in the same order, when the dump
    names any route (format 1.2 on); else None."""
    route_names: Mapping[int, str] = field(default_factory=dict)
    """The name of each route id the dump uses."""


# --------------------------------------------------------------------------
# validation shared by the writer and the reader


def header_problem(header: DumpHeader) -> str | None:
    """Why header cannot be stored, or None."""
    checks: list[tuple[bool, str]] = [
        (isinstance(header.python_version, str), "python_version must be a str"),
        (is_int(header.pid) and 0 <= header.pid <= MAX_U64, "pid must be an int in 0..2**64-1"),
        (
            isinstance(header.timestamp, (int, float))
            and not isinstance(header.timestamp, bool)
            and math.isfinite(header.timestamp),
            "timestamp must be a finite float",
        ),
        (header.mode in MODES, f"mode must be 'exact' or 'sample', not {header.mode!r}"),
        (
            is_int(header.sample_interval) and 0 <= header.sample_interval <= MAX_U64,
            "sample_interval must be an int in 0..2**64-1",
        ),
        (
            is_int(header.traceback_limit) and 1 <= header.traceback_limit <= MAX_FRAMES,
            f"traceback_limit must be an int in 1..{MAX_FRAMES}",
        ),
        (isinstance(header.extra, Mapping), "extra must be a mapping of str to str"),
        (header.ages is None or isinstance(header.ages, AgeClock), "ages must be an AgeClock"),
    ]
    for ok, problem in checks:
        if not ok:
            return problem
    if header.mode == "exact" and header.sample_interval != 0:
        return f"sample_interval must be 0 in exact mode, not {header.sample_interval}"
    if header.mode == "sample" and header.sample_interval == 0:
        return "sample_interval must be at least 1 in sample mode"
    for key, value in header.extra.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return f"extra must map str to str; {key!r}: {value!r} does not"
    return None if header.ages is None else _clock_problem(header.ages)


def _clock_problem(clock: AgeClock) -> str | None:
    if not (is_int(clock.epoch) and 0 <= clock.epoch <= MAX_U64):
        return f"the ages' epoch must be an int in 0..2**64-1, not {clock.epoch!r}"
    if not _is_finite(clock.started):
        return f"the ages' started must be a finite float, not {clock.started!r}"
    if not (_is_finite(clock.interval) and clock.interval >= 0):
        return f"the ages' interval must be a finite float >= 0, not {clock.interval!r}"
    return None


def _is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def encode_str(text: str, what: str) -> bytes:
    """UTF-8 with lone surrogates kept (surrogatepass), so that filenames
    decoded with surrogateescape round-trip exactly."""
    if not isinstance(text, str):
        raise DumpError(f"cannot write {what}: expected a str, got {type(text).__name__}")
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > MAX_STRING_BYTES:
        raise DumpError(
            f"cannot write {what}: {len(data)} bytes of UTF-8, the format's limit is "
            f"{MAX_STRING_BYTES}"
        )
    return data
