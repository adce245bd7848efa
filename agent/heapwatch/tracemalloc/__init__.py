"""A drop-in replacement for the stdlib ``tracemalloc``, backed by heapwatch._core.

Same functions, classes, semantics and output formats as the stdlib module
(``from heapwatch import tracemalloc``), with heapwatch's allocator hooks
underneath instead of the stdlib tracer.  Extensions:

* ``start(nframe, mode="sample", sample_interval=...)`` samples allocations
  by bytes (a Poisson process; 512 KiB apart on average by default) instead of
  tracing every one; sizes and counts are then unbiased estimates.
  ``get_mode()`` and ``get_sample_interval()`` read the configuration back.
* ``Snapshot.dump()`` writes heapwatch's own dump format, not a pickle, and
  ``Snapshot.load()`` refuses pickles unless ``allow_pickle=True``.
* Statistics and comparisons of snapshots from take_snapshot() are computed
  in C, at a cost that grows with the number of distinct tracebacks rather
  than the number of live blocks.
"""

from __future__ import annotations

# The stdlib module formats source lines through its ``linecache`` attribute,
# which tests and tools patch (``tracemalloc.linecache.getline``).
import linecache  # noqa: F401  (an attribute of the module, as in the stdlib)
from typing import TYPE_CHECKING, SupportsIndex

from heapwatch import _core
from heapwatch.formats.snapshot_file import PickleRefusedError
from heapwatch.tracemalloc.checks import check_mode, check_nframe, check_sample_interval
from heapwatch.tracemalloc.filters import BaseFilter, DomainFilter, Filter
from heapwatch.tracemalloc.objects import Frame, Statistic, StatisticDiff, Trace, Traceback
from heapwatch.tracemalloc.snapshot import Snapshot, _restore, snapshot_of_core

if TYPE_CHECKING:
    from heapwatch._core import Frames, Mode, RawTrace

__all__ = [
    "BaseFilter",
    "DomainFilter",
    "Filter",
    "Frame",
    "PickleRefusedError",
    "Snapshot",
    "Statistic",
    "StatisticDiff",
    "Trace",
    "Traceback",
    "clear_traces",
    "get_mode",
    "get_object_traceback",
    "get_sample_interval",
    "get_traceback_limit",
    "get_traced_memory",
    "get_tracemalloc_memory",
    "is_tracing",
    "reset_peak",
    "start",
    "stop",
    "take_snapshot",
]

# The classes live in the package's modules; pickles and reprs name the
# module users import (a pickled Snapshot is rebuilt by _restore, named here
# too, so that pickles do not depend on where the code lives inside).
for _cls in (
    BaseFilter,
    DomainFilter,
    Filter,
    Frame,
    PickleRefusedError,
    Snapshot,
    Statistic,
    StatisticDiff,
    Trace,
    Traceback,
    _restore,
):
    _cls.__module__ = __name__
del _cls


def start(
    nframe: SupportsIndex = 1, *, mode: str = "exact", sample_interval: int | None = None
) -> None:
    """Starts tracing allocations, keeping up to nframe frames per traceback.

    mode="sample" records a sample of the allocations, one every
    sample_interval bytes on average (default _core.DEFAULT_SAMPLE_INTERVAL).
    If tracing already, does nothing (as the stdlib: the running
    configuration stays).  Raises RuntimeError if the stdlib tracer is tracing.
    """
    checked_nframe = check_nframe(nframe)
    checked_mode = check_mode(mode)
    interval = check_sample_interval(
        _core.DEFAULT_SAMPLE_INTERVAL if sample_interval is None else sample_interval
    )
    _core.start(checked_nframe, checked_mode, interval)


def stop() -> None:
    """Stops tracing and clears every trace; does nothing if not tracing."""
    _core.stop()


def is_tracing() -> bool:
    """Whether allocations are being traced."""
    return _core.is_tracing()


def clear_traces() -> None:
    """Forgets every trace and resets the traced and peak sizes, tracing on."""
    _core.clear_traces()


def reset_peak() -> None:
    """Sets the peak traced size to the current traced size."""
    _core.reset_peak()


def get_traceback_limit() -> int:
    """The most frames a traceback keeps: start()'s nframe."""
    return _core.get_traceback_limit()


def get_traced_memory() -> tuple[int, int]:
    """(current, peak) size in bytes of the traced blocks; (0, 0) if not
    tracing.  Estimates in sample mode."""
    return _core.get_traced_memory()


def get_tracemalloc_memory() -> int:
    """Bytes the tracer itself uses to store traces and tracebacks."""
    return _core.get_tracemalloc_memory()


def _get_object_traceback(obj: object) -> Frames | None:
    """The raw frames ((filename, lineno), most recent first) of obj's
    allocation, or None: the stdlib's private function of the same name."""
    return _core.get_object_traceback(obj)


def get_object_traceback(obj: object) -> Traceback | None:
    """Where obj was allocated, or None if that allocation was not traced
    (not tracing, allocated before start(), or not sampled)."""
    frames = _get_object_traceback(obj)
    return None if frames is None else Traceback(frames)


def _get_traces() -> list[RawTrace]:
    """Every trace as a raw tuple (domain, size, frames, total_nframe), equal
    tracebacks sharing one frames tuple; [] if not tracing.  The stdlib's
    private function of the same name."""
    if not _core.is_tracing():
        return []
    return _core.take_snapshot(traces=True).traces()


_OWN_SNAPSHOT_PARTS = (is_tracing, _get_traces, get_traceback_limit)


def take_snapshot() -> Snapshot:
    """A Snapshot of the traces now; RuntimeError if not tracing."""
    if not is_tracing():
        raise RuntimeError(
            "the tracemalloc module must be tracing memory allocations to take a snapshot"
        )
    # Compared one by one: a tuple built here would go to the tuple free list
    # with its trace, and show as this line in the next snapshot.
    if (
        is_tracing is not _OWN_SNAPSHOT_PARTS[0]
        or _get_traces is not _OWN_SNAPSHOT_PARTS[1]
        or get_traceback_limit is not _OWN_SNAPSHOT_PARTS[2]
    ):
        # The stdlib builds the snapshot from these module functions, looked up
        # at call time; someone replaced one of them (a test double, say):
        # build it from theirs, as the stdlib would.
        return Snapshot(_get_traces(), get_traceback_limit())
    # The call's own objects (its keyword arguments) would be alive, traced,
    # as the traces are copied: the stdlib's snapshot holds nothing of its own.
    previous = _core.set_thread_traced(False)
    try:
        snap = _core.take_snapshot(traces=True)
    finally:
        _core.set_thread_traced(previous)
    return snapshot_of_core(snap)


def get_mode() -> Mode:
    """'exact' or 'sample': the mode start() set (the last one, once stopped)."""
    return _core.get_config()["mode"]


def get_sample_interval() -> int:
    """Mean bytes between samples, as start() set it."""
    return _core.get_config()["sample_interval"]
