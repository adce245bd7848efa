"""Snapshot.dump() and Snapshot.load(): heapwatch's dump format, and the
stdlib's pickles only when the caller says the file is trusted.

The format itself belongs to heapwatch.dumpfile; this module maps a
snapshot's parts onto it.  dumpfile is imported when first needed, so that
importing heapwatch.tracemalloc stays cheap.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from typing import TYPE_CHECKING, Union

from heapwatch._errors import HeapwatchError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from heapwatch._core import RawTrace

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


class PickleRefusedError(HeapwatchError, ValueError):
    """Snapshot.load() met a pickle (the stdlib's dump format) and was not
    allowed to unpickle it: unpickling runs arbitrary code from the file."""


# The header's extra key that holds a snapshot's own attributes, as JSON.
ATTRIBUTES_KEY = "tracemalloc.snapshot.attributes"


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


def _encode_attributes(attributes: dict[str, object]) -> dict[str, str]:
    if not attributes:
        return {}
    for name, value in attributes.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"cannot dump the snapshot's attribute {name!r} = {value!r}: heapwatch's dump "
                "format holds attributes that are JSON values (str, int, float, bool, None, "
                "and lists and dicts of them), not arbitrary objects"
            ) from exc
    return {ATTRIBUTES_KEY: json.dumps(attributes, allow_nan=False, sort_keys=True)}


def _decode_attributes(path: str, extra: dict[str, str]) -> dict[str, object]:
    from heapwatch import dumpfile  # noqa: PLC0415 (imported on first use: see the docstring)

    text = extra.get(ATTRIBUTES_KEY)
    if text is None:
        return {}
    try:
        attributes = json.loads(text)
    except ValueError as exc:
        raise dumpfile.DumpError(f"{path!r}: the snapshot's attributes are not JSON") from exc
    if not isinstance(attributes, dict):
        raise dumpfile.DumpError(f"{path!r}: the snapshot's attributes are not a JSON object")
    return attributes


def write(filename: PathArg, parts: SnapshotParts) -> None:
    """Writes the parts to filename in heapwatch's dump format."""
    from heapwatch import dumpfile  # noqa: PLC0415 (imported on first use: see the docstring)

    header = dumpfile.DumpHeader(
        python_version=sys.version.split()[0],  # as platform.python_version()
        pid=os.getpid(),
        timestamp=time.time(),
        mode=parts.mode,
        sample_interval=parts.sample_interval,
        traceback_limit=parts.traceback_limit,
        extra=_encode_attributes(parts.attributes),
    )
    dumpfile.write_dump(os.fsdecode(filename), header, parts.traces)


def read(filename: PathArg, allow_pickle: bool) -> SnapshotParts:
    """The parts of a heapwatch dump or, with allow_pickle, of a pickled
    stdlib (or heapwatch) Snapshot.

    Raises PickleRefusedError for a pickle without allow_pickle, and
    heapwatch.dumpfile.DumpError for anything else that is not a snapshot.
    """
    from heapwatch import dumpfile  # noqa: PLC0415 (imported on first use: see the docstring)

    path = os.fsdecode(filename)
    if dumpfile.sniff(path) == "pickle":
        if not allow_pickle:
            raise PickleRefusedError(
                f"{path!r} is a pickle (the stdlib tracemalloc dump format); unpickling runs "
                "arbitrary code from the file, so Snapshot.load() refuses it unless called "
                "with allow_pickle=True for a file you trust"
            )
        with open(path, "rb") as fp:
            try:
                obj = pickle.load(fp)
            except Exception as exc:  # a truncated or corrupted pickle raises anything
                raise dumpfile.DumpError(
                    f"{path!r}: cannot unpickle it ({type(exc).__name__}: {exc})"
                ) from exc
        parts = _parts_of_unpickled(obj)
        if parts is None:
            raise dumpfile.DumpError(
                f"{path!r} holds a pickled {type(obj).__module__}.{type(obj).__qualname__}, "
                "not a tracemalloc Snapshot"
            )
        return parts
    dump = dumpfile.read_dump(path)
    header = dump.header
    return SnapshotParts(
        dump.traces,
        header.traceback_limit,
        header.mode,
        header.sample_interval,
        _decode_attributes(path, dict(header.extra)),
    )


def _parts_of_unpickled(obj: object) -> SnapshotParts | None:
    """The parts of an unpickled Snapshot, stdlib's or ours, or None if obj is
    not one (duck-typed: pickle imports the stdlib module by itself, we do not)."""
    traces = getattr(getattr(obj, "traces", None), "_traces", None)
    limit = getattr(obj, "traceback_limit", None)
    if traces is None or not isinstance(limit, int):
        return None
    mode = getattr(obj, "mode", "exact")
    sample_interval = getattr(obj, "sample_interval", 0)
    state = getattr(obj, "__dict__", {})
    attributes = {k: v for k, v in state.items() if k not in ("traces", "traceback_limit")}
    return SnapshotParts(list(traces), limit, mode, sample_interval, attributes)
