"""Snapshot traces converted for the stdlib's tracemalloc.

What the stdlib's ``Snapshot.dump()`` writes, written without importing the
stdlib's ``tracemalloc`` (heapwatch runs on its own core): a pickle that
names the stdlib's classes, which its ``Snapshot.load()`` reads
(``heapwatch convert``; pprof's conversion is ``formats.pprof``'s).

Sample mode: a trace holds the size of the block that was sampled, and
heapwatch weighs it to estimate the bytes and blocks it stands for
(``heapwatch.formats.estimates``).  The stdlib cannot weigh, so its traces carry
the estimated bytes instead of the sampled size: the stdlib's statistics then
show heapwatch's size estimates, while its counts are the numbers of samples.
pprof takes estimates of both.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, BinaryIO, Sequence

from heapwatch.formats.estimates import weigher

if TYPE_CHECKING:
    from heapwatch._core import RawTrace

__all__ = [
    "estimated_traces",
    "write_tracemalloc",
]


def estimated_traces(
    traces: Iterable[RawTrace], mode: str, sample_interval: int
) -> Iterator[RawTrace]:
    """The traces, each sampled one's size replaced by its estimated bytes."""
    if mode != "sample":
        yield from traces
        return
    weigh = weigher("sample", sample_interval)
    for domain, size, frames, total_nframe in traces:
        yield (domain, weigh(size)[0], frames, total_nframe)


# Protocol 2: the first with NEWOBJ, read by every Python; no framing, so
# that the pieces below, each pickled on its own, concatenate.
_PROTOCOL = 2


def _value(obj: object) -> bytes:
    """obj's pickle without its protocol header and its STOP.  (Its memo
    indices may reuse another piece's: each piece gets only what it put.)"""
    return pickle.dumps(obj, _PROTOCOL)[2:-1]


def _instance(name: str, state: Sequence[tuple[str, object | bytes]]) -> bytes:
    """An instance of the stdlib's ``tracemalloc.<name>``, as ``copyreg``
    pickles it (``cls.__new__(cls)``, then its ``__dict__``); a value given
    as bytes is a piece pickled already."""
    out = [pickle.GLOBAL, b"tracemalloc\n", name.encode(), b"\n", pickle.EMPTY_TUPLE]
    out += [pickle.NEWOBJ, pickle.EMPTY_DICT, pickle.MARK]
    for key, value in state:
        out += [_value(key), value if isinstance(value, bytes) else _value(value)]
    out += [pickle.SETITEMS, pickle.BUILD]
    return b"".join(out)


def write_tracemalloc(
    fp: BinaryIO,
    traces: Iterable[RawTrace],
    traceback_limit: int,
    mode: str = "exact",
    sample_interval: int = 0,
) -> None:
    """Writes what the stdlib's ``Snapshot.dump()`` writes: a ``Snapshot``
    whose ``traces`` is a ``_Traces`` of the raw traces."""
    raw = list(estimated_traces(traces, mode, sample_interval))
    fp.write(pickle.PROTO + bytes([_PROTOCOL]))
    fp.write(
        _instance(
            "Snapshot",
            [
                ("traces", _instance("_Traces", [("_traces", raw)])),
                ("traceback_limit", traceback_limit),
            ],
        )
    )
    fp.write(pickle.STOP)
