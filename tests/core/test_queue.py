"""Changes to a big trace table are queued (agent/csrc/tracer.h).

Past 64K slots the hooks queue their inserts and removals, each applied 64
changes later once its slot is in cache.  Whoever reads the table applies the
queue first: every reader must see exactly what it would see without it.
"""

from __future__ import annotations

import gc
import threading
from types import ModuleType

import pytest

# Enough live blocks for a table past 64K slots (it doubles at 3/4 full).
BIG = 120_000


def _one() -> object:
    return object()  # ALLOC: one block each, and no free list to keep it


def _objects(n: int) -> list[object]:
    return [_one() for _ in range(n)]


ALLOC_LINE = _one.__code__.co_firstlineno + 1


def _site(core: ModuleType) -> tuple[int, int]:
    """(bytes, blocks) traced at _one's line, from a fresh snapshot."""
    for frames, size, count in core.take_snapshot().group("lineno").statistics():
        if frames[0] == (__file__, ALLOC_LINE):
            return size, count
    return 0, 0


def test_readers_see_the_queued_changes(core: ModuleType) -> None:
    core.start(1)
    big = _objects(BIG)
    object_size = _site(core)[0] // BIG
    assert _site(core)[1] == BIG
    # The last changes are still queued when each reader asks.
    recent = _objects(10)
    assert core.get_object_traceback(recent[-1]) == ((__file__, ALLOC_LINE),)
    assert _site(core) == ((BIG + 10) * object_size, BIG + 10)
    current, peak = core.get_traced_memory()
    del recent  # ten objects, their list and its items
    assert current - core.get_traced_memory()[0] > 10 * object_size
    assert _site(core) == (BIG * object_size, BIG)
    core._check_invariants()
    del big[: BIG // 2]
    assert _site(core) == ((BIG - BIG // 2) * object_size, BIG - BIG // 2)
    assert core.get_traced_memory()[1] >= peak
    core.reset_peak()
    current, new_peak = core.get_traced_memory()
    # The call itself may allocate and free between the reset and the read.
    assert current <= new_peak < peak
    core._check_invariants()
    del big
    gc.collect()
    assert _site(core) == (0, 0)


def test_a_block_freed_while_its_insert_is_queued(core: ModuleType) -> None:
    core.start(1)
    big = _objects(BIG)
    for _ in range(1000):
        short = _objects(3)  # allocated and freed within the queue's reach
        del short
    core._check_invariants()
    assert _site(core)[1] == BIG
    del big


def test_clear_and_stop_drop_the_queue(core: ModuleType) -> None:
    core.start(1)
    big = _objects(BIG)
    more = _objects(5)
    core.clear_traces()
    assert core.get_stats()["live_traces"] == 0
    core._check_invariants()
    del more  # frees of blocks whose inserts were dropped: nothing to remove
    core._check_invariants()
    again = _objects(BIG)
    assert _site(core)[1] == BIG
    core.stop()
    core.start(1)
    assert core.get_stats()["live_traces"] == 0
    del big, again


@pytest.mark.parametrize("interval", [1, 8])
def test_sampled_blocks_through_the_queue(core: ModuleType, interval: int) -> None:
    """Sample mode with most blocks sampled (a 16-byte object at interval 8
    is sampled with probability 1 - exp(-2), 86%): a big table, queued
    changes, and the filter that frees consult before any lookup."""
    core.start(1, "sample", interval)
    big = _objects(BIG)
    live = core.get_stats()["live_traces"]
    assert live > BIG // 2
    del big
    gc.collect()
    assert core.get_stats()["live_traces"] < live // 100
    core._check_invariants()


def test_threads_share_the_queue(core: ModuleType) -> None:
    core.start(1)
    kept: list[list[object]] = []

    def worker() -> None:
        for _ in range(5):
            block = _objects(BIG // 8)
            kept.append(block)
            del block[::2]

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = sum(len(block) for block in kept)
    assert _site(core)[1] == expected
    core._check_invariants()
