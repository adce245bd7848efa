"""Traceback capture, interning, line resolution and object lookup."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from support.sizes import bytearray_block


def _recurse(depth: int) -> Any:
    if depth == 0:
        return bytearray(777)  # ALLOC
    return _recurse(depth - 1)


ALLOC_LINE = _recurse.__code__.co_firstlineno + 2
CALL_LINE = _recurse.__code__.co_firstlineno + 3


def _traceback_of(core: ModuleType, obj: object) -> tuple[tuple[str, int], ...]:
    frames = core.get_object_traceback(obj)
    assert frames is not None
    return frames  # type: ignore[no-any-return]


def _trace_of(core: ModuleType, size: int) -> tuple[int, int, tuple[tuple[str, int], ...], int]:
    matches = [t for t in core.take_snapshot().traces() if t[1] == bytearray_block(size)]
    assert len(matches) == 1, matches
    return matches[0]  # type: ignore[no-any-return]


def test_frames_are_most_recent_first_with_real_lines(core: ModuleType) -> None:
    core.start(4)
    obj = _recurse(5)
    frames = _traceback_of(core, obj)
    assert frames == ((__file__, ALLOC_LINE),) + ((__file__, CALL_LINE),) * 3


def test_total_nframe_is_the_real_depth(core: ModuleType) -> None:
    core.start(1)
    shallow = _recurse(0)
    _d, _s, frames_a, total_a = _trace_of(core, 777)
    del shallow
    deep = _recurse(40)
    _d, _s, frames_b, total_b = _trace_of(core, 777)
    assert len(frames_a) == len(frames_b) == 1
    assert total_b - total_a == 40
    del deep


def test_more_frames_than_the_capture_buffer(core: ModuleType) -> None:
    core.start(100)
    obj = _recurse(150)
    _d, _s, frames, total = _trace_of(core, 777)
    assert len(frames) == 100
    assert total > 150
    assert frames[0] == (__file__, ALLOC_LINE)
    assert set(frames[1:]) == {(__file__, CALL_LINE)}
    del obj


def test_identical_tracebacks_are_interned_once(core: ModuleType) -> None:
    core.start(2)
    keep = [bytearray(100) for _ in range(5000)]
    stats = core.get_stats()
    assert stats["live_traces"] >= 5000
    assert stats["tracebacks"] < 50
    del keep


def test_lines_of_a_multiline_statement(core: ModuleType) -> None:
    core.start(1)
    value = [
        bytearray(3333),
    ]
    assert _traceback_of(core, value[0])[0] == (__file__, sys._getframe().f_lineno - 2)


def test_object_traceback_of_gc_and_non_gc_objects(core: ModuleType) -> None:
    class WithDict:
        pass

    class WithSlots:
        __slots__ = ("a",)

    # Lists, dicts and tuples may come from free lists, untraced as in the
    # stdlib; these types always allocate.  (On 3.11 the stdlib misses the
    # managed-dict pre-header of WithDict instances; we do not.)
    n = 100
    core.start(1)
    line = sys._getframe().f_lineno + 1
    objects = [{1, 2}, frozenset("abc"), b"x" * n, WithDict(), WithSlots(), 10**n]
    for obj in objects:
        assert _traceback_of(core, obj)[0] == (__file__, line), obj


def test_objects_from_before_start_have_no_traceback(core: ModuleType) -> None:
    old = bytearray(100)
    core.start(1)
    assert core.get_object_traceback(old) is None
    assert core.get_object_traceback(42) is None  # a static small int


def test_exec_code_and_generators(core: ModuleType) -> None:
    core.start(3)
    namespace: dict[str, Any] = {}
    exec(compile("def make():\n    return bytearray(4444)\n", "<made-up>", "exec"), namespace)
    obj = namespace["make"]()
    assert _traceback_of(core, obj)[0] == ("<made-up>", 2)

    def gen() -> Any:
        yield bytearray(5555)

    line = gen.__code__.co_firstlineno + 1
    item = next(gen())
    frames = _traceback_of(core, item)
    assert frames[0] == (__file__, line)
    assert frames[1] == (__file__, sys._getframe().f_lineno - 3)


def test_function_names_for_pprof(core: ModuleType) -> None:
    core.start(2)
    obj = _recurse(1)
    snapshot = core.take_snapshot()
    named = [
        frames
        for _d, frames, _t, size, _c in snapshot.tracebacks(names=True)
        if frames[0][:2] == (__file__, ALLOC_LINE)
    ]
    assert named and named[0][0][2] == "_recurse"
    del obj
