"""Snapshot traces converted for the stdlib's tracemalloc.

The only module of ``heapwatch`` that imports the stdlib ``tracemalloc``
(``heapwatch.tracemalloc`` must not depend on it); ``heapwatch convert``
imports this one when it runs (pprof's conversion is ``formats.pprof``'s).

Sample mode: a trace holds the size of the block that was sampled, and
heapwatch weighs it to estimate the bytes and blocks it stands for
(``heapwatch.formats.estimates``).  The stdlib cannot weigh, so its traces carry
the estimated bytes instead of the sampled size: the stdlib's statistics then
show heapwatch's size estimates, while its counts are the numbers of samples.
pprof takes estimates of both.
"""

from __future__ import annotations

import pickle
import tracemalloc
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, BinaryIO

from heapwatch.formats.estimates import weigher

if TYPE_CHECKING:
    from heapwatch._core import RawTrace

__all__ = [
    "estimated_traces",
    "stdlib_snapshot",
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


def stdlib_snapshot(
    traces: Iterable[RawTrace], traceback_limit: int, mode: str = "exact", sample_interval: int = 0
) -> tracemalloc.Snapshot:
    """A stdlib ``tracemalloc.Snapshot`` of the traces (estimated sizes in sample mode)."""
    return tracemalloc.Snapshot(
        list(estimated_traces(traces, mode, sample_interval)), traceback_limit
    )


def write_tracemalloc(
    fp: BinaryIO,
    traces: Iterable[RawTrace],
    traceback_limit: int,
    mode: str = "exact",
    sample_interval: int = 0,
) -> None:
    """Writes what the stdlib's ``Snapshot.dump()`` writes (a pickle, at its
    protocol), which its ``Snapshot.load()`` reads."""
    snapshot = stdlib_snapshot(traces, traceback_limit, mode, sample_interval)
    pickle.dump(snapshot, fp, pickle.HIGHEST_PROTOCOL)
