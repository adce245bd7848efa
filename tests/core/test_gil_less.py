"""RAW allocations from threads that do not hold the GIL."""

from __future__ import annotations

import lzma
import sys
import threading
from types import ModuleType

import pytest


def _sites(snapshot: object) -> dict[tuple[str, int], int]:
    sizes: dict[tuple[str, int], int] = {}
    for frames, size, _count in snapshot.group("lineno").statistics():  # type: ignore[attr-defined]
        sizes[frames[0]] = size
    return sizes


def test_thread_without_thread_state_allocates_while_gil_is_held(
    core: ModuleType, hwtest: ModuleType
) -> None:
    # Given tracing, when a pthread unknown to the interpreter allocates through
    # PyMem_RawMalloc while this thread holds the GIL and waits for it,
    core.start(1)
    address = hwtest.foreign_thread_alloc_while_holding_gil(4321, 5000)
    # then the allocation finished without the GIL (a hook that takes the GIL
    # would have blocked until the timeout),
    assert address is not None
    # and it is traced, with the "<unknown>" traceback of a frameless thread.
    snapshot = core.take_snapshot()
    traces = [t for t in snapshot.traces() if t[1] == 4321]
    assert [t[2] for t in traces] == [(("<unknown>", 0),)]
    hwtest.raw_free_nogil([address])
    assert not [t for t in core.take_snapshot().traces() if t[1] == 4321]


def test_python_thread_that_released_the_gil_gets_its_own_traceback(
    core: ModuleType, hwtest: ModuleType
) -> None:
    core.start(5)
    result: list[list[int]] = []

    def worker() -> None:
        result.append(hwtest.raw_alloc_nogil(3, 12345))  # line under test

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    line = worker.__code__.co_firstlineno + 1
    traces = [t for t in core.take_snapshot().traces() if t[1] == 12345]
    assert len(traces) == 3
    for _domain, _size, frames, total in traces:
        assert frames[0] == (__file__, line)
        assert total >= 2
    hwtest.raw_free_nogil(result[0])
    core._check_invariants()


def test_lzma_dictionary_allocated_without_the_gil_is_attributed_to_the_caller(
    core: ModuleType,
) -> None:
    # lzma allocates its dictionary (8 MiB at the default preset) inside
    # lzma_code(), which CPython runs with the GIL released.
    data = lzma.compress(b"heapwatch" * 1000)
    core.start(1)
    decompressor = lzma.LZMADecompressor()
    decompressor.decompress(data[: len(data) // 2])
    line = sys._getframe().f_lineno - 1
    sizes = _sites(core.take_snapshot())
    assert sizes.get((__file__, line), 0) >= 8 * 1024 * 1024
    del decompressor


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_concurrent_gil_less_churn_keeps_the_tables_consistent(
    core: ModuleType, hwtest: ModuleType, mode: str
) -> None:
    core.start(3, mode, 4096)
    threads = [threading.Thread(target=hwtest.churn_nogil, args=(200_000, 5000)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(50):
        core.take_snapshot(reset_peak=True)
        core._check_invariants()
    for thread in threads:
        thread.join()
    core._check_invariants()
