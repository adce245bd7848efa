"""set_thread_traced(): a thread whose new blocks are not recorded.

heapwatch's own threads call it (heapwatch.runtime.threads), so that their
work is never shown as the service's memory.  Only recording stops: the
blocks such a thread frees or resizes lose their traces as any thread's do,
and the other threads are traced as before.  Both modes; in sample mode at
16 bytes nearly every block is a sample.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any, Callable

import pytest

MODES = [("exact", 1), ("sample", 16)]


def blocks() -> list[bytearray]:
    return [bytearray(50_000) for _ in range(40)]  # BLOCKS


BLOCKS = (__file__, blocks.__code__.co_firstlineno + 1)


def at_blocks(core: ModuleType) -> int:
    """Bytes traced at the line of blocks()."""
    return sum(
        size
        for _d, frames, _t, size, _c in core.take_snapshot(traces=False).tracebacks()
        if frames[0] == BLOCKS
    )


def in_thread(work: Callable[[], Any]) -> Any:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join(60)
    return result[0]


@pytest.fixture(params=MODES, ids=[mode for mode, _ in MODES])
def tracing(request: pytest.FixtureRequest, core: ModuleType) -> ModuleType:
    core.start(1, *request.param)
    return core


def test_a_thread_not_traced_records_nothing_and_the_others_still_do(tracing: ModuleType) -> None:
    core = tracing
    # Given this thread not traced (every thread is, by default)
    assert core.set_thread_traced(False) is True
    try:
        # When it and another thread allocate 2 MB each
        mine = blocks()
        theirs = in_thread(blocks)
        # Then only the other thread's are traced
        assert 2_000_000 * 0.9 <= at_blocks(core) <= 2_000_000 * 1.1
        del theirs
        assert at_blocks(core) == 0
    finally:
        assert core.set_thread_traced(True) is False
    # and once traced again, its blocks are
    again = blocks()
    assert at_blocks(core) >= 2_000_000 * 0.9
    assert mine and again
    core._check_invariants()


def test_what_a_thread_not_traced_frees_or_resizes_loses_its_trace(tracing: ModuleType) -> None:
    core = tracing
    # Given 2 MB of another thread's blocks, traced
    theirs = blocks()
    assert at_blocks(core) >= 2_000_000 * 0.9

    def resize_and_free() -> None:
        core.set_thread_traced(False)
        for block in theirs[:20]:
            block.extend(bytes(50_000))  # a realloc
        del theirs[20:]

    # When a thread not traced resizes half of them and frees the others
    in_thread(resize_and_free)
    # Then no buffer keeps a trace: nothing stale, nothing recorded anew
    # (the bytearray objects themselves, untouched, keep theirs)
    first = resize_and_free.__code__.co_firstlineno
    lines = {(__file__, line) for line in range(first + 1, first + 5)}
    buffers = [
        (frames[0], size)
        for _d, size, frames, _t in core.take_snapshot().traces()
        if (frames[0] == BLOCKS and size >= 50_000) or frames[0] in lines
    ]
    assert buffers == []
    assert sum(len(block) for block in theirs) == 2_000_000
    core._check_invariants()


def test_the_setting_belongs_to_the_thread(core: ModuleType) -> None:
    assert in_thread(lambda: core.set_thread_traced(False)) is True
    # another thread's setting did not change this one's
    assert core.set_thread_traced(True) is True
    with pytest.raises(TypeError):
        core.set_thread_traced()
