"""The process's memory beyond what heapwatch traces.

When RSS grows and the traced bytes do not, the memory is native: a C
library's blocks, or heap the C allocator keeps after they were freed (for
glibc's arenas the fix is ``MALLOC_ARENA_MAX``, not a code change).  The
agent reads, once a cycle: the resident set (``/proc/self/statm``) and glibc's
own split of its heap (``mallinfo2()``: bytes in use, bytes free but
retained), and publishes what is left of RSS once the traced bytes and the
tracer's own are taken out.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple, Optional

__all__ = [
    "NATIVE_HEAP_SOURCE",
    "NATIVE_HEAP_UNAVAILABLE",
    "STATM",
    "ProcessMemory",
    "compute_untraced",
    "process_start",
    "read_process_memory",
]

STATM = "/proc/self/statm"
# heapwatch_info{native_heap=...}: where the C heap's split comes from.
NATIVE_HEAP_SOURCE = "mallinfo2"
NATIVE_HEAP_UNAVAILABLE = "unavailable"

NativeHeap = Callable[[], Optional[tuple[int, int]]]


class ProcessMemory(NamedTuple):
    """What the kernel and the C library say of the process's memory; None
    where they cannot say."""

    resident: int | None
    """Resident set size in bytes."""
    native_in_use: int | None
    """Bytes the C allocator handed out and has not had back."""
    native_retained: int | None
    """Bytes free in the C allocator's heap, kept rather than given back."""


def _core_native_heap() -> tuple[int, int] | None:
    from heapwatch import _core  # noqa: PLC0415 (the C core: only when used)

    return _core.native_heap()


def _resident(statm: str) -> int | None:
    from heapwatch import _core  # noqa: PLC0415 (as above)

    try:
        # Read by the core (csrc/descriptors.h): open() here could take a
        # number the service closed for a moment to dup2() onto it again.
        fields = _core.read_small_file(statm).split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def read_process_memory(statm: str = STATM, native_heap: NativeHeap | None = None) -> ProcessMemory:
    """The resident set from ``statm`` and the C heap's split, now."""
    heap = (native_heap if native_heap is not None else _core_native_heap)()
    in_use, retained = heap if heap is not None else (None, None)
    return ProcessMemory(_resident(statm), in_use, retained)


def compute_untraced(resident: int | None, traced: int, tracer: int) -> int | None:
    """Resident bytes neither traced nor the tracer's own; never below 0.

    Traced bytes are allocated, not necessarily resident (pages of a large
    block nobody touched yet, ``numpy.zeros``), so the difference may be
    smaller than the native memory; it is never reported negative."""
    if resident is None:
        return None
    return max(0, resident - traced - tracer)


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def process_start(pid: int | str = "self") -> str | None:
    """Which process ``pid`` is, over time: the boot's id and the process's
    start time in clock ticks since boot (``/proc/PID/stat``'s 22nd field).
    A pid is reused (the service is pid 1 in each container the kubelet
    starts); this pair is not.  None when the process does not exist."""
    from heapwatch import _core  # noqa: PLC0415 (as above)

    try:
        boot = _core.read_small_file(BOOT_ID).decode("ascii").strip()
        stat = _core.read_small_file(f"/proc/{pid}/stat")
        # The command name, in parentheses, may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        return f"{boot}:{int(fields[19])}"
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
