"""heapwatch's dump file format under the name it was first published as.

The format lives in ``heapwatch.formats.dump`` (definition, writer, reader);
this module keeps ``from heapwatch import dumpfile`` working.
"""

from heapwatch.formats.dump import (
    FORMAT_VERSION,
    Dump,
    DumpError,
    DumpHeader,
    RawTrace,
    iter_dump,
    read_dump,
    sniff,
    write_dump,
)

__all__ = [
    "FORMAT_VERSION",
    "Dump",
    "DumpError",
    "DumpHeader",
    "RawTrace",
    "iter_dump",
    "read_dump",
    "sniff",
    "write_dump",
]
