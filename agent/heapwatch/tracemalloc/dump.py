"""Snapshot.dump() and Snapshot.load(): a snapshot's parts in heapwatch's
dump format, and the stdlib's pickles only when the caller says the file is
trusted (``heapwatch.formats.snapshot_file`` decides which is which)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from heapwatch.formats.dump import process_header, write_dump
from heapwatch.formats.snapshot_file import (
    PathArg,
    decode_attributes,
    encode_attributes,
    open_snapshot,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from heapwatch._core import RawTrace

__all__ = ["SnapshotParts", "read_parts", "write_parts"]


class SnapshotParts:
    """What a dump holds: the raw traces, how they were taken, and the
    attributes a user set on the snapshot (the stdlib's pickle keeps them)."""

    __slots__ = ("attributes", "mode", "sample_interval", "traceback_limit", "traces")

    def __init__(
        self,
        traces: Sequence[RawTrace],
        traceback_limit: int,
        mode: str,
        sample_interval: int,
        attributes: dict[str, object] | None = None,
    ) -> None:
        self.traces = traces
        self.traceback_limit = traceback_limit
        self.mode = mode  # checked by the Snapshot built from the parts
        self.sample_interval = sample_interval
        self.attributes = {} if attributes is None else attributes


def write_parts(filename: PathArg, parts: SnapshotParts) -> None:
    """Writes the parts to filename in heapwatch's dump format."""
    header = process_header(
        mode=parts.mode,
        sample_interval=parts.sample_interval,
        traceback_limit=parts.traceback_limit,
        extra=encode_attributes(parts.attributes),
    )
    write_dump(os.fsdecode(filename), header, parts.traces)


def read_parts(filename: PathArg, allow_pickle: bool) -> SnapshotParts:
    """The parts of a heapwatch dump or, with allow_pickle, of a pickled
    stdlib (or heapwatch) Snapshot.

    Raises PickleRefusedError for a pickle without allow_pickle, and
    heapwatch.formats.dump.DumpError for anything else that is not a snapshot.
    """
    file = open_snapshot(filename, allow_pickle)
    traces = list(file.traces)
    return SnapshotParts(
        traces, file.traceback_limit, file.mode, file.sample_interval, decode_attributes(file)
    )
