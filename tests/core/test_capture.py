"""total_nframe through the per-thread stack memo (agent/csrc/capture.c).

The memo verifies the chain it saw last instead of walking it, so every way a
stack can change between two allocations must still give the real depth:
deeper, shallower, the same depth through other frames, generators resumed
from elsewhere, frames of other sizes at the same addresses, calls through C
(an entry frame on the C stack, which does not count) and through a class's
``__init__`` (3.12+: a trampoline frame in the data stack), other threads.
The agent's profile counts no depth: its total_nframe is the frames kept,
plus one when a frame that counts lies below them.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from support.sizes import bytearray_block

# The expected depth of each allocation, keyed by its size: unique among the
# allocations made on Recorder.alloc's line (the bytearray objects themselves
# take 56 bytes there: sizes start above that).
Expected = dict[int, int]


def _depth(frame: object) -> int:
    depth = 0
    while frame is not None:
        depth += 1
        frame = frame.f_back  # type: ignore[attr-defined]
    return depth


class Recorder:
    """Allocates bytearrays of unique sizes and notes the depth of each."""

    def __init__(self, start: int) -> None:
        self.size = start
        self.expected: Expected = {}
        self.kept: list[bytearray] = []

    def alloc(self) -> None:
        self.size += 1
        self.expected[bytearray_block(self.size)] = _depth(sys._getframe())
        block = bytearray(self.size)  # ALLOC
        self.kept.append(block)


ALLOC_LINE = Recorder.alloc.__code__.co_firstlineno + 3


# Step functions of different frame sizes, so that frames of one chain land
# at addresses where another chain had other frames.
def _small(rec: Recorder, path: list[int], i: int) -> None:
    _step(rec, path, i + 1)


def _medium(rec: Recorder, path: list[int], i: int) -> None:
    a = b = c = d = i
    _step(rec, path, a + b + c + d - 3 * i + 1)


def _large(rec: Recorder, path: list[int], i: int) -> None:
    a = b = c = d = e = f = g = h = j = k = l = m = i  # noqa: E741
    _step(rec, path, a + b + c + d + e + f + g + h + j + k + l + m - 11 * i + 1)


def _generator(rec: Recorder) -> Iterator[None]:
    while True:
        rec.alloc()
        yield


def _through_c(rec: Recorder, path: list[int], i: int) -> None:
    # map() calls the lambda from C: the interpreter enters again, through an
    # entry frame that is no Python frame.
    for _ in map(lambda j: _step(rec, path, j), (i + 1,)):
        pass


class _Init:
    def __init__(self, rec: Recorder, path: list[int], i: int) -> None:
        _step(rec, path, i + 1)


def _through_init(rec: Recorder, path: list[int], i: int) -> None:
    _Init(rec, path, i)


# By path entry; 3 (a generator resumed) and 4 (an allocation on the way
# down) are handled in _step.
STEPS: dict[int, Callable[[Recorder, list[int], int], None]] = {
    0: _small,
    1: _medium,
    2: _large,
    5: _through_c,
    6: _through_init,
}


def _step(rec: Recorder, path: list[int], i: int) -> None:
    if i == len(path):
        rec.alloc()
        return
    if path[i] == 3:
        gen = _GENERATORS[rec]
        next(gen)  # resumed here, at this depth; allocates inside the generator
        _step(rec, path, i + 1)
        return
    if path[i] == 4:
        rec.alloc()  # allocations on the way down too
        _step(rec, path, i + 1)
        return
    STEPS[path[i]](rec, path, i)


_GENERATORS: dict[Recorder, Generator[None, None, None]] = {}


def _run_paths(rec: Recorder, seed: int, count: int, max_depth: int) -> None:
    rng = random.Random(seed)
    _GENERATORS[rec] = _generator(rec)
    try:
        for _ in range(count):
            depth = rng.choice((0, 1, 5, 11, 12, 13, 30, 64, 65, rng.randrange(max_depth)))
            path = [rng.choice((0, 0, 1, 2, 3, 4, 5, 6)) for _ in range(depth)]
            _step(rec, path, 0)
    finally:
        del _GENERATORS[rec]


def _check(core: ModuleType, expected: Expected) -> None:
    snapshot = core.take_snapshot()
    site = (__file__, ALLOC_LINE)
    totals = {
        size: total
        for _d, size, frames, total in snapshot.traces()
        if frames[0] == site and size in expected
    }
    assert totals.keys() == expected.keys()
    wrong = {
        size: (totals[size], depth) for size, depth in expected.items() if totals[size] != depth
    }
    assert not wrong, f"(traced, real) depths differ for {len(wrong)} allocations: {wrong}"


def _agent_total(depth: int, nframe: int) -> int:
    """total_nframe in the agent's profile."""
    return min(depth, nframe) + (depth > nframe)


@pytest.mark.parametrize("mode", ["exact", "sample"])
@pytest.mark.parametrize("nframe", [1, 5, 30])
def test_the_agent_profile_keeps_nframe_frames_and_says_whether_more_count(
    core: ModuleType, mode: str, nframe: int
) -> None:
    """The same stacks as above (calls through C, through __init__'s
    trampoline, generators), whose frames that do not count must neither be
    kept nor make a traceback look truncated."""
    core.start(nframe, mode, 1, profile="agent")  # sample interval 1: every block
    rec = Recorder(100)
    _run_paths(rec, seed=3, count=300, max_depth=120)
    site = (__file__, ALLOC_LINE)
    got = {
        size: (len(frames), total)
        for _d, size, frames, total in core.take_snapshot().traces()
        if frames[0] == site and size in rec.expected
    }
    expected = {
        size: (min(depth, nframe), _agent_total(depth, nframe))
        for size, depth in rec.expected.items()
    }
    assert got.keys() == expected.keys()
    wrong = {size: (got[size], want) for size, want in expected.items() if got[size] != want}
    assert not wrong, f"(traced, expected) (frames, total) differ for {len(wrong)}: {wrong}"


def test_total_nframe_is_exact_however_the_stack_changes(core: ModuleType) -> None:
    core.start(1)
    rec = Recorder(100)
    _run_paths(rec, seed=1, count=300, max_depth=300)
    _check(core, rec.expected)


def test_total_nframe_is_exact_with_many_captured_frames(core: ModuleType) -> None:
    core.start(30)
    rec = Recorder(100)
    _run_paths(rec, seed=2, count=300, max_depth=120)
    _check(core, rec.expected)


def test_total_nframe_is_exact_past_the_memo_growth(core: ModuleType) -> None:
    """Stacks deeper than any memo held so far, then shallow, then deep again."""
    core.start(1)
    rec = Recorder(100)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 3000))
    try:
        for depth in (20, 600, 3, 600, 300, 1200, 70, 1200):
            _step(rec, [0] * depth, 0)
    finally:
        sys.setrecursionlimit(limit)
    _check(core, rec.expected)


# Allocations made in the innermost frame itself, over an __init__
# trampoline (3.12+: a frame of its own, which does not count) and over a
# plain frame in the trampoline's place: the same addresses and the same
# links, another count.
_TRAMPOLINE_EXPECTED: Expected = {}
_TRAMPOLINE_KEPT: list[bytearray] = []


class _InitAllocates:
    def __init__(self, size: int) -> None:
        _TRAMPOLINE_EXPECTED[bytearray_block(size)] = _depth(sys._getframe())
        _TRAMPOLINE_KEPT.append(bytearray(size))  # INIT ALLOC


def _allocates(size: int) -> None:
    _TRAMPOLINE_EXPECTED[bytearray_block(size)] = _depth(sys._getframe())
    _TRAMPOLINE_KEPT.append(bytearray(size))  # PLAIN ALLOC


def _plain_frame(nlocals: int) -> Callable[[int], None]:
    """A function whose frame has nlocals more slots: one of them is as
    large as the trampoline's, so that _allocates' frame lands where
    __init__'s was."""
    names = "".join(f"v{i} = " for i in range(nlocals))
    namespace: dict[str, object] = {"_allocates": _allocates}
    exec(f"def plain(size):\n    {names}None\n    _allocates(size)\n", namespace)
    return namespace["plain"]  # type: ignore[return-value]


_PLAIN_FRAMES = [_plain_frame(n) for n in range(16)]


def _alloc_lines() -> set[tuple[str, int]]:
    lines = Path(__file__).read_text().splitlines()
    return {(__file__, i + 1) for i, line in enumerate(lines) if line.endswith("ALLOC")}


def test_total_nframe_is_exact_where_the_init_trampoline_was(core: ModuleType) -> None:
    _TRAMPOLINE_EXPECTED.clear()
    # Made beforehand: between the two calls, nothing is allocated (3.14
    # re-stamps an int taken from its free list), so that the capture in
    # _allocates comes right after the last one in __init__.
    calls = [(plain, 50_000 + 2 * i, 50_001 + 2 * i) for i, plain in enumerate(_PLAIN_FRAMES * 3)]
    core.start(1)
    try:
        for plain, init_size, plain_size in calls:
            _InitAllocates(init_size)
            plain(plain_size)
        sites = _alloc_lines()
        totals = {
            size: total
            for _d, size, frames, total in core.take_snapshot().traces()
            if frames[0] in sites and size in _TRAMPOLINE_EXPECTED
        }
    finally:
        _TRAMPOLINE_KEPT.clear()
    assert totals.keys() == _TRAMPOLINE_EXPECTED.keys()
    wrong = {
        size: (totals[size], depth)
        for size, depth in _TRAMPOLINE_EXPECTED.items()
        if totals[size] != depth
    }
    assert not wrong, f"(traced, real) depths differ for {len(wrong)} allocations: {wrong}"


def test_each_thread_has_its_own_memo(core: ModuleType) -> None:
    core.start(1)
    recorders = [Recorder(100 + 10_000 * i) for i in range(4)]
    threads = [
        threading.Thread(target=_run_paths, args=(rec, 10 + i, 100, 150))
        for i, rec in enumerate(recorders)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected: Expected = {}
    for rec in recorders:
        expected.update(rec.expected)
    _check(core, expected)


def test_short_lived_threads_leave_no_memo_behind(core: ModuleType) -> None:
    """A thread's memo is freed when the thread exits."""
    core.start(1)

    def deep_alloc() -> None:
        _step(Recorder(100), [0] * 40, 0)

    def run_threads() -> None:
        for _ in range(20):
            thread = threading.Thread(target=deep_alloc)
            thread.start()
            thread.join()

    run_threads()  # the first round creates what stays (interned code, tables)
    core.clear_traces()
    core.drain()
    before = core.get_tracemalloc_memory()
    run_threads()
    core.clear_traces()
    core.drain()
    # Twenty memos left behind would hold 40 KiB and more (a memo's arrays
    # alone take 1.5 KiB); the last thread's state may still be on its way
    # out, since join() returns before the thread's destructors have run.
    assert core.get_tracemalloc_memory() - before < 16 * 1024
