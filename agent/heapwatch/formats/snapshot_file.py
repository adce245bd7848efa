"""Opening a snapshot file: a heapwatch dump, or a pickle when allowed.

The one place that decides what a file is and whether to read it: a
heapwatch dump is read with ``heapwatch.formats.dump``; a pickle (what the
stdlib's ``Snapshot.dump()`` writes) is unpickled only when the caller says
the file is trusted, since unpickling runs arbitrary code from the file.
``Snapshot.load()`` and the ``heapwatch`` commands both open files here, and
refuse a pickle with the same message.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, Union

from heapwatch._errors import HeapwatchError
from heapwatch.formats.dump import AgeClock, DumpError, RawTrace, iter_dump, sniff

__all__ = [
    "ATTRIBUTES_KEY",
    "PathArg",
    "PickleRefusedError",
    "SnapshotFile",
    "decode_attributes",
    "encode_attributes",
    "open_snapshot",
]

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

# The header's extra key that holds a snapshot's own attributes, as JSON.
ATTRIBUTES_KEY = "tracemalloc.snapshot.attributes"


class PickleRefusedError(HeapwatchError, ValueError):
    """Snapshot.load() met a pickle (the stdlib's dump format) and was not
    allowed to unpickle it: unpickling runs arbitrary code from the file."""


class SnapshotFile(NamedTuple):
    """An opened snapshot file: its traces and how they were taken.

    A dump's traces are read as they are iterated (once), and raise
    DumpError there if the file is damaged; a pickle's are in memory."""

    path: str
    traces: Iterable[RawTrace]
    traceback_limit: int
    mode: str
    sample_interval: int
    meta: dict[str, Any]
    """``format`` ("heapwatch" or "pickle"); for a dump, the header's
    ``pid``, ``timestamp``, ``python_version`` and its extra entries."""
    attributes: dict[str, object]
    """What a user set on a pickled snapshot (its ``__dict__``); a dump keeps
    them in its header (``decode_attributes``)."""
    ages: AgeClock | None = None
    """A dump's ages (format 1.1 on), when its traces carry them."""
    youngest: int | None = None
    """With ``min_age``: the fewest epochs of age a trace kept has (None:
    none is kept, the epochs' length being unknown)."""


def open_snapshot(
    filename: PathArg,
    allow_pickle: bool,
    *,
    allow_with: str = "allow_pickle=True",
    max_inflate_ratio: float | None = None,
    min_age: float | None = None,
) -> SnapshotFile:
    """Opens a heapwatch dump or, with ``allow_pickle``, a pickled stdlib (or
    heapwatch) ``Snapshot``.

    Raises PickleRefusedError for a pickle without ``allow_pickle`` (its
    message says to pass ``allow_with``), DumpError for anything else that is
    not a snapshot, OSError when the file cannot be read.
    ``max_inflate_ratio`` replaces the reader's default bound on decompression.
    ``min_age`` (seconds) keeps only the traces surely that old when the
    dump was taken (``AgeClock``); a file whose traces carry no ages then
    raises DumpError.
    """
    path = os.fsdecode(filename)
    if sniff(path) == "pickle":
        if min_age is not None:
            raise DumpError(_no_ages(path, "a pickle"))
        if not allow_pickle:
            raise PickleRefusedError(
                f"{path!r} is a pickle (the stdlib tracemalloc's dump format); unpickling "
                f"runs code from the file: pass {allow_with} only for a file you trust"
            )
        return _open_pickle(path)
    ratio = {} if max_inflate_ratio is None else {"max_inflate_ratio": max_inflate_ratio}
    header, aged = iter_dump(path, ages=True, **ratio)
    traces: Iterable[RawTrace] = (trace for trace, _age in aged)
    youngest = None
    if min_age is not None:
        if header.ages is None:
            aged.close()  # type: ignore[attr-defined]
            raise DumpError(_no_ages(path, "a dump written before format 1.1 or without ages"))
        youngest = header.ages.youngest_age(min_age, header.timestamp)
        traces = _older(aged, youngest)
    meta: dict[str, Any] = {
        "format": "heapwatch",
        "pid": header.pid,
        "timestamp": header.timestamp,
        "python_version": header.python_version,
        **header.extra,
    }
    return SnapshotFile(
        path,
        traces,
        header.traceback_limit,
        header.mode,
        header.sample_interval,
        meta,
        {},
        header.ages,
        youngest,
    )


def _no_ages(path: str, what: str) -> str:
    return (
        f"{path!r} is {what}: its traces carry no ages, so it cannot select memory by age "
        "(the agent's dumps carry them from dump format 1.1 on)"
    )


def _older(aged: Iterable[tuple[RawTrace, int | None]], youngest: int | None) -> Iterator[RawTrace]:
    for trace, age in aged:
        if youngest is not None and age is not None and age >= youngest:
            yield trace


def _open_pickle(path: str) -> SnapshotFile:
    with open(path, "rb") as fp:
        try:
            obj = pickle.load(fp)
        except Exception as exc:  # a truncated or corrupted pickle raises anything
            raise DumpError(f"{path!r}: cannot unpickle it ({type(exc).__name__}: {exc})") from exc
    # Duck-typed: pickle imports the stdlib module by itself, we do not.
    traces = getattr(getattr(obj, "traces", None), "_traces", None)
    limit = getattr(obj, "traceback_limit", None)
    if traces is None or not isinstance(limit, int):
        raise DumpError(
            f"{path!r} holds a pickled {type(obj).__module__}.{type(obj).__qualname__}, "
            "not a tracemalloc Snapshot"
        )
    state = getattr(obj, "__dict__", {})
    attributes = {k: v for k, v in state.items() if k not in ("traces", "traceback_limit")}
    return SnapshotFile(
        path,
        list(traces),
        limit,
        getattr(obj, "mode", "exact"),
        getattr(obj, "sample_interval", 0),
        {"format": "pickle"},
        attributes,
    )


def encode_attributes(attributes: dict[str, object]) -> dict[str, str]:
    """A snapshot's attributes as the header's extra entry (JSON values only:
    TypeError names any other)."""
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


def decode_attributes(file: SnapshotFile) -> dict[str, object]:
    """The attributes a user set on the snapshot in ``file``."""
    if file.meta.get("format") == "pickle":
        return file.attributes
    text = file.meta.get(ATTRIBUTES_KEY)
    if text is None:
        return {}
    try:
        attributes = json.loads(text)
    except ValueError as exc:
        raise DumpError(f"{file.path!r}: the snapshot's attributes are not JSON") from exc
    if not isinstance(attributes, dict):
        raise DumpError(f"{file.path!r}: the snapshot's attributes are not a JSON object")
    return attributes
