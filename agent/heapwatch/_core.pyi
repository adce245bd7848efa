"""heapwatch._core: allocator hooks, trace tables and aggregation, in C.

The C/Python boundary is plain tuples of documented shapes:

    Frame      = (filename, lineno)
    Frames     = tuple of Frame, most recent first (the stdlib's raw order)
    RawTrace   = (domain, size, frames, total_nframe)
    Statistic  = (frames, size, count)
    Diff       = (frames, size, size_diff, count, count_diff)
    Peak       = (frames, size, count, peak)
    AgedTrace  = (domain, size, frames, total_nframe, age)
    Ages       = (frames, size, count, histogram)

A peak is bytes in the state where the traced total reached its peak (since
the last reset_peak() or take_snapshot(reset_peak=True)): per-site peaks sum
to ``Snapshot.peak``.  Sites whose traces are all gone since still have one.

An age is a number of epochs (``set_epoch()``, which the agent moves on at
a cycle, an interval or more apart) since the trace was recorded, at most
``MAX_AGE``; a histogram has ``AGE_BUCKETS`` byte counts: bucket 0 for age
0, bucket b for ages in [2**(b-1), 2**b).

In sample mode every size and count is an unbiased estimate; a trace's own
size (in ``Snapshot.traces()``) is the sampled block's real size.
"""

import contextvars
import os
from types import FrameType
from typing import Any, Callable, Literal, Protocol, TypedDict, overload

from typing_extensions import Self

FrameTuple = tuple[str, int]
Frames = tuple[FrameTuple, ...]
RawTrace = tuple[int, int, Frames, int]
RawStatistic = tuple[Frames, int, int]
RawDiff = tuple[Frames, int, int, int, int]
RawPeak = tuple[Frames, int, int, int]
RawAgedTrace = tuple[int, int, Frames, int, int]
RawAges = tuple[Frames, int, int, tuple[int, ...]]
RawTracebackInfo = tuple[int, tuple[tuple[object, ...], ...], int, int, int]
RawTracebackPeakInfo = tuple[int, tuple[tuple[object, ...], ...], int, int, int, int]
# (domain, frames, total_nframe, size, count, peak, alloc_size, alloc_count)
RawTracebackAllocInfo = tuple[int, tuple[tuple[object, ...], ...], int, int, int, int, int, int]
KeyType = Literal["traceback", "filename", "lineno"]
Mode = Literal["exact", "sample"]
Profile = Literal["tracemalloc", "agent"]

MAX_NFRAME: int
MAX_SAMPLE_INTERVAL: int
DEFAULT_SAMPLE_INTERVAL: int
MAX_AGE: int
ALLOC_KEEP: int
MAX_ROUTE: int
SPAN_ROUTES: int
AGE_BUCKETS: int
SMALL_FILE_MAX: int

class Config(TypedDict):
    tracing: bool
    mode: Mode
    sample_interval: int
    nframe: int
    profile: Profile

class Stats(TypedDict):
    traced: int
    peak: int
    blocks: int
    dropped: int
    recorded: int
    live_traces: int
    tracebacks: int
    graveyard: int
    snapshot_memory: int
    span_routes: int
    span_routes_dropped: int

class Groups:
    """Statistics grouped in C; ordered exactly as the stdlib orders them."""

    @property
    def total(self) -> tuple[int, int]: ...
    @property
    def peak(self) -> int:
        """The sum of the groups' peaks (Snapshot.peak when nothing is masked)."""
    def __len__(self) -> int: ...
    def statistics(self, limit: int | None = None) -> list[RawStatistic]: ...
    def compare(self, old: Groups, limit: int | None = None) -> list[RawDiff]: ...
    def growth(self, old: Groups | None, limit: int | None = None) -> list[RawDiff]: ...
    def peaks(self, limit: int | None = None) -> list[RawPeak]:
        """Every group by peak (then size, count, key) descending, those with
        no live trace left (size and count 0) included; statistics(),
        compare(), growth() and len() leave those out."""
    def ages(self, limit: int | None = None) -> list[RawAges]:
        """statistics() with each group's bytes by age; needs group(ages=True)."""

class GroupsLike(Protocol):
    """What the agent's cycle reads of a ``Groups``: the C core's, or the
    model that stands in for it in tests (tests/support/agent_model.py).
    A name for type checkers only: the module has no such attribute."""

    def statistics(self, limit: int | None = None) -> list[RawStatistic]: ...
    def growth(self, old: Self | None, limit: int | None = None) -> list[RawDiff]: ...
    def peaks(self, limit: int | None = None) -> list[RawPeak]: ...
    def ages(self, limit: int | None = None) -> list[RawAges]: ...

class Snapshot:
    """The tracer's state at one moment; tracebacks pinned, lines resolved lazily."""

    @property
    def traceback_limit(self) -> int: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def sample_interval(self) -> int: ...
    @property
    def traced(self) -> int: ...
    @property
    def peak(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    @property
    def has_traces(self) -> bool: ...
    @property
    def ntraces(self) -> int: ...
    @property
    def ntracebacks(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def allocs_folded(self) -> tuple[int, int, int]:
        """(bytes, blocks, tracebacks): the allocation totals that sweeps
        folded when more than ALLOC_KEEP idle tracebacks held some."""
    @overload
    def traces(self, mask: bytes | None = None, ages: Literal[False] = False) -> list[RawTrace]:
        """Every trace (of the tracebacks the mask keeps); needs traces=True."""
    @overload
    def traces(self, mask: bytes | None = None, *, ages: Literal[True]) -> list[RawAgedTrace]: ...
    def routes(self, peaks: bool = False, allocs: bool = False) -> list[int]:
        """The route id of each row of tracebacks(names, peaks, allocs), in
        the same order (0: no route)."""
    @overload
    def tracebacks(
        self, names: bool = False, peaks: Literal[False] = False, allocs: Literal[False] = False
    ) -> list[RawTracebackInfo]: ...
    @overload
    def tracebacks(
        self, names: bool = False, peaks: bool = False, *, allocs: Literal[True]
    ) -> list[RawTracebackAllocInfo]: ...
    @overload
    def tracebacks(
        self, names: bool = False, *, peaks: Literal[True], allocs: Literal[False] = False
    ) -> list[RawTracebackPeakInfo]:
        """One (domain, frames, total_nframe, size, count) per traceback, in the
        index order that masks use (one byte per traceback, non-zero keeps it).
        size and count are the traceback's totals (estimates in sample mode).
        With names=True a frame is (filename, lineno, function qualname).
        With peaks=True each row ends with the traceback's peak, and the
        tracebacks with no live trace left that hold a peak follow; a mask
        may then have one byte per row (a mask of one byte per live
        traceback keeps those).  With allocs=True each row ends with the
        peak, then the bytes and blocks allocated at the traceback since
        tracing started (sampled and scaled in sample mode), and the
        tracebacks holding only those totals follow the peak ones; masks
        never cover those."""
    def group(
        self,
        key_type: KeyType,
        cumulative: bool = False,
        mask: bytes | None = None,
        ages: bool = False,
    ) -> Groups:
        """ages=True histograms the traces by age (a snapshot with traces, not
        cumulative): Groups.ages()."""

def start(
    nframe: int = 1, mode: Mode = "exact", sample_interval: int = ..., *, profile: Profile = ...
) -> None:
    """profile "tracemalloc" (the default) keeps the stdlib's semantics;
    "agent" records what the agent exports: total_nframe is the frames kept,
    plus one when the stack goes deeper, and blocks a free list hands back
    keep the traceback of their allocation (docs/design/core.md, "Profiles").
    Tracing already, a "tracemalloc" start raises an "agent" profile."""

def stop() -> None: ...
def is_tracing() -> bool: ...
def clear_traces() -> None: ...
def reset_peak() -> None: ...
def set_epoch(epoch: int) -> None:
    """Traces recorded from now on are of this epoch; it never moves back
    (ValueError) and is 0 again after stop()."""

def get_epoch() -> int: ...
def wake_after(delay: float, callback: Callable[[], object]) -> None:
    """``callback()`` once, from the main thread at a safe point, after the
    first allocation made ``delay`` seconds or more from now; replaces the
    wake-up armed before.  A process that allocates nothing is not woken."""

def call_soon(callback: Callable[[], object], frame: FrameType | None = None) -> None:
    """``callback()`` once, from the main thread at its next safe point
    (right after the builtin it is calling returns), or at the next one of
    ``frame`` when given (once the code that called ``os.fork()`` runs
    again, past the at-fork hooks)."""

def wake_cancel() -> bool:
    """Forgets the armed wake-up; whether there was one."""

def set_route_var(var: contextvars.ContextVar[int] | None) -> None:
    """The ContextVar whose int value (1 to MAX_ROUTE; anything else is no
    route) labels each allocation recorded with the GIL held, read from the
    allocating thread's current context.  None: no such variable."""

def set_span_routes(var: contextvars.ContextVar[Any] | None, key: str | None) -> None:
    """OpenTelemetry's context variable and the key of the current span in
    its Context (a dict): when set_route_var's variable gives no route, the
    current span's route (span_route) labels the allocation.  (None, None)
    turns it off and forgets every span."""

def span_route(span: object, route: int) -> None:
    """The route of a span object, kept by its address (no reference) in a
    table of SPAN_ROUTES entries; route 0 forgets it.  Past the bound, new
    spans are refused and counted (get_stats()['span_routes_dropped'])."""

def set_thread_traced(traced: bool) -> bool:
    """Whether the blocks the calling thread allocates from now on are
    recorded (True by default; False on heapwatch's own threads, whose work
    is not the service's memory).  Blocks it frees are always untracked.
    Returns the previous setting."""

def get_traceback_limit() -> int: ...
def get_traced_memory() -> tuple[int, int]: ...
def get_tracemalloc_memory() -> int: ...
def get_object_traceback(obj: object) -> Frames | None: ...
def _reftracer_on_top() -> bool: ...
def take_snapshot(traces: bool = True, reset_peak: bool = False) -> Snapshot:
    """With reset_peak, the peak is reset to the current size atomically with
    the snapshot; the snapshot's ``peak`` is the peak since the last reset."""

def get_config() -> Config: ...
def get_stats() -> Stats: ...
def drain() -> None: ...
def hooks_installed() -> bool: ...
def native_heap() -> tuple[int, int] | None: ...
def read_small_file(path: str | bytes | os.PathLike[str], limit: int = ...) -> bytes:
    """The first ``limit`` bytes (at most ``SMALL_FILE_MAX``) of a regular
    file, opened, read and closed with the GIL held: the service never sees
    the descriptor (descriptors.h)."""

def count_dir_entries(path: str | bytes | os.PathLike[str]) -> int:
    """The entries of a directory but ``.`` and ``..``, read with the GIL held."""

def list_dir(path: str | bytes | os.PathLike[str]) -> list[str]:
    """The names in a directory but ``.`` and ``..``, in no order, listed
    with the GIL held (descriptors.h)."""

def open_file(path: str | bytes | os.PathLike[str], flags: int, mode: int = 0o600) -> int:
    """``os.open(path, flags, mode)`` with the GIL held, while 0, 1 and 2 are
    open, the descriptor close-on-exec and numbered above the standard three:
    for files heapwatch writes unasked (descriptors.h)."""

def accept(fd: int) -> int:
    """A connection on the non-blocking listening socket ``fd``, accepted
    with the GIL held and numbered above the standard three; BlockingIOError
    when none waits."""

def _track(domain: int, ptr: int, size: int) -> int: ...
def _untrack(domain: int, ptr: int) -> int: ...
def _interposed() -> int: ...
def _at_exit() -> None: ...
def _check_invariants() -> None: ...
