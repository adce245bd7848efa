"""heapwatch's dump file format: snapshots of live memory traces, safely.

A dump is a versioned, streamed binary file (docs/design/dump-format.md has
the byte layout).  ``format`` defines it, ``writer`` writes it, ``reader``
reads it without ever unpickling or trusting a length from the file.
"""

from heapwatch.formats.dump.format import (
    FORMAT_VERSION,
    AgeClock,
    AgedTrace,
    Dump,
    DumpError,
    DumpHeader,
    RawTrace,
    RoutedTrace,
)
from heapwatch.formats.dump.reader import iter_dump, read_dump, sniff
from heapwatch.formats.dump.writer import process_header, write_dump

__all__ = [
    "FORMAT_VERSION",
    "AgeClock",
    "AgedTrace",
    "Dump",
    "DumpError",
    "DumpHeader",
    "RawTrace",
    "RoutedTrace",
    "iter_dump",
    "process_header",
    "read_dump",
    "sniff",
    "write_dump",
]
