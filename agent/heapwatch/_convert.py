"""Snapshot traces converted for other tools: the stdlib's tracemalloc and pprof.

The only module of ``heapwatch`` that imports the stdlib ``tracemalloc``
(``heapwatch.tracemalloc`` must not depend on it); ``heapwatch convert``
imports this one when it runs.

Sample mode: a trace holds the size of the block that was sampled, and
heapwatch weighs it to estimate the bytes and blocks it stands for
(``heapwatch._tm_grouping``).  The stdlib cannot weigh, so its traces carry
the estimated bytes instead of the sampled size: the stdlib's statistics then
show heapwatch's size estimates, while its counts are the numbers of samples.
pprof takes estimates of both.
"""

from __future__ import annotations

import pickle
import tracemalloc
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, BinaryIO, cast

from heapwatch._tm_grouping import round_count, weigher

if TYPE_CHECKING:
    from heapwatch._core import Frames, Mode, RawTrace
    from heapwatch_exporters.pprof import HeapSample

__all__ = [
    "estimated_traces",
    "heap_samples",
    "stdlib_snapshot",
    "write_pprof",
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


def heap_samples(traces: Iterable[RawTrace], mode: str, sample_interval: int) -> list[HeapSample]:
    """One pprof sample per distinct (domain, traceback), with estimated bytes
    and blocks.  Dumps keep no function names: a frame's function is named
    after its ``file:line``, so that pprof's default (by function) views
    still tell the lines apart."""
    from heapwatch_exporters.pprof import HeapSample  # noqa: PLC0415 (imported on first use)

    weigh = weigher(cast("Mode", mode), sample_interval)
    sums: dict[tuple[int, Frames, int], list[int]] = {}
    for domain, size, frames, total_nframe in traces:
        est_size, count_fp = weigh(size)
        acc = sums.get((domain, frames, total_nframe))
        if acc is None:
            sums[(domain, frames, total_nframe)] = [est_size, count_fp]
        else:
            acc[0] += est_size
            acc[1] += count_fp
    samples = []
    for (domain, frames, total_nframe), (size, count_fp) in sums.items():
        named = tuple((filename, lineno, f"{filename}:{lineno}") for filename, lineno in frames)
        samples.append(HeapSample(named, round_count(count_fp), size, domain, total_nframe))
    return samples


def write_pprof(
    fp: BinaryIO,
    traces: Iterable[RawTrace],
    mode: str,
    sample_interval: int,
    *,
    time_nanos: int | None = None,
    comments: Sequence[str] = (),
) -> None:
    """Writes the traces as a gzip pprof heap profile (``inuse_objects``,
    ``inuse_space``; the sampling period in sample mode)."""
    from heapwatch_exporters.pprof import encode_heap_profile  # noqa: PLC0415 (first use)

    fp.write(
        encode_heap_profile(
            heap_samples(traces, mode, sample_interval),
            mode=mode,
            sample_interval=sample_interval,
            time_nanos=time_nanos,
            comments=comments,
        )
    )
