"""heapwatch._core: allocator hooks, trace tables and aggregation, in C.

The C/Python boundary is plain tuples of documented shapes:

    Frame      = (filename, lineno)
    Frames     = tuple of Frame, most recent first (the stdlib's raw order)
    RawTrace   = (domain, size, frames, total_nframe)
    Statistic  = (frames, size, count)
    Diff       = (frames, size, size_diff, count, count_diff)

In sample mode every size and count is an unbiased estimate; a trace's own
size (in ``Snapshot.traces()``) is the sampled block's real size.
"""

from typing import Literal, TypedDict

FrameTuple = tuple[str, int]
Frames = tuple[FrameTuple, ...]
RawTrace = tuple[int, int, Frames, int]
RawStatistic = tuple[Frames, int, int]
RawDiff = tuple[Frames, int, int, int, int]
RawTracebackInfo = tuple[int, tuple[tuple[object, ...], ...], int, int, int]
KeyType = Literal["traceback", "filename", "lineno"]
Mode = Literal["exact", "sample"]

MAX_NFRAME: int
DEFAULT_SAMPLE_INTERVAL: int

class Config(TypedDict):
    tracing: bool
    mode: Mode
    sample_interval: int
    nframe: int

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

class Groups:
    """Statistics grouped in C; ordered exactly as the stdlib orders them."""

    @property
    def total(self) -> tuple[int, int]: ...
    def __len__(self) -> int: ...
    def statistics(self, limit: int | None = None) -> list[RawStatistic]: ...
    def compare(self, old: Groups, limit: int | None = None) -> list[RawDiff]: ...
    def growth(self, old: Groups | None, limit: int | None = None) -> list[RawDiff]: ...

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
    def traces(self, mask: bytes | None = None) -> list[RawTrace]:
        """Every trace (of the tracebacks the mask keeps); needs traces=True."""
    def tracebacks(self, names: bool = False) -> list[RawTracebackInfo]:
        """One (domain, frames, total_nframe, size, count) per traceback, in the
        index order that masks use (one byte per traceback, non-zero keeps it).
        size and count are the traceback's totals (estimates in sample mode).
        With names=True a frame is (filename, lineno, function qualname)."""
    def group(
        self, key_type: KeyType, cumulative: bool = False, mask: bytes | None = None
    ) -> Groups: ...

def start(nframe: int = 1, mode: Mode = "exact", sample_interval: int = ...) -> None: ...
def stop() -> None: ...
def is_tracing() -> bool: ...
def clear_traces() -> None: ...
def reset_peak() -> None: ...
def get_traceback_limit() -> int: ...
def get_traced_memory() -> tuple[int, int]: ...
def get_tracemalloc_memory() -> int: ...
def get_object_traceback(obj: object) -> Frames | None: ...
def take_snapshot(traces: bool = True, reset_peak: bool = False) -> Snapshot:
    """With reset_peak, the peak is reset to the current size atomically with
    the snapshot; the snapshot's ``peak`` is the peak since the last reset."""

def get_config() -> Config: ...
def get_stats() -> Stats: ...
def drain() -> None: ...
def hooks_installed() -> bool: ...
def _track(domain: int, ptr: int, size: int) -> int: ...
def _untrack(domain: int, ptr: int) -> int: ...
def _at_exit() -> None: ...
def _check_invariants() -> None: ...
