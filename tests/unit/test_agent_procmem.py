"""Reading the process's memory: /proc/self/statm and the C heap's split."""

from __future__ import annotations

import os
from pathlib import Path

from heapwatch.runtime.procmem import (
    ProcessMemory,
    compute_untraced,
    read_process_memory,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "procmem"
PAGE = os.sysconf("SC_PAGE_SIZE")


def test_resident_is_statms_second_field_in_pages() -> None:
    memory = read_process_memory(str(DATA / "statm"), native_heap=lambda: (700, 300))
    assert memory == ProcessMemory(resident=2520 * PAGE, native_in_use=700, native_retained=300)


def test_what_cannot_be_read_is_none() -> None:
    for statm in (DATA / "statm-garbled", DATA / "missing"):
        memory = read_process_memory(str(statm), native_heap=lambda: None)
        assert memory == ProcessMemory(None, None, None)


def test_this_process_reads_its_own_resident_set() -> None:
    resident = read_process_memory().resident
    assert resident is not None and 1 << 20 < resident < 1 << 40


def test_untraced_is_resident_less_traced_and_tracer_never_below_zero() -> None:
    assert compute_untraced(1000, 300, 200) == 500
    assert compute_untraced(1000, 900, 200) == 0
    assert compute_untraced(None, 300, 200) is None
