"""Tracer memory is bounded by live traces: dead tracebacks, raw names and
code objects are released (the stdlib keeps every traceback until
clear_traces())."""

from __future__ import annotations

import gc
import weakref
from types import CodeType, ModuleType
from typing import Any

import pytest


def _one_shot_function(i: int) -> Any:
    # Distinct by filename only: a distinct name would be interned, and on
    # 3.12+ interned strings are immortal, a live block per function forever.
    namespace: dict[str, Any] = {}
    source = "def f(n):\n    return [bytearray(n) for _ in range(3)]\n"
    exec(compile(source, f"<generated-{i}>", "exec"), namespace)
    return namespace["f"]


def _churn_distinct_tracebacks(start: int, count: int) -> None:
    for i in range(start, start + count):
        data = _one_shot_function(i)(100)
        del data


def _compiled(source: str, filename: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["f"]


def test_code_objects_are_released_once_no_trace_needs_them(core: ModuleType) -> None:
    core.start(1)
    func = _one_shot_function(0)
    code: CodeType = func.__code__
    ref = weakref.ref(code)
    data = func(64)
    del func, code
    gc.collect()
    assert ref() is not None  # nothing released it yet: no drain, no snapshot
    del data
    core.drain()
    gc.collect()
    assert ref() is None


# A nested function's frame, allocated while its encloser runs, is cached in
# the nested code object (3.9 and 3.10: co_zombieframe), which the encloser's
# code owns: the block is owned by the very code object its traceback names.
NESTED = "def f(n):\n    g = lambda: bytearray(n)\n    return [g() for _ in range(3)]\n"


def test_a_code_object_that_owns_its_own_traced_blocks_is_released(core: ModuleType) -> None:
    core.start(5)
    func = _compiled(NESTED, "<nested>")
    ref = weakref.ref(func.__code__)
    for _ in range(2000):  # 3.9 and 3.10 give a hot code object an opcache
        data = func(32)
    del func, data
    gc.collect()
    core.drain()
    gc.collect()
    assert ref() is None
    core._check_invariants()


def test_a_live_block_keeps_its_site_after_its_code_object_is_gone(core: ModuleType) -> None:
    core.start(1)
    func = _compiled("def f(n):\n    return bytearray(n)\n", "<gone>")
    ref = weakref.ref(func.__code__)
    block = func(100_000)

    def gone_site(snapshot: Any) -> list[Any]:
        return [row for row in snapshot.group("lineno").statistics() if row[0] == (("<gone>", 2),)]

    expected = gone_site(core.take_snapshot())
    assert len(expected) == 1 and expected[0][1] >= 100_000
    del func
    gc.collect()
    core.drain()
    assert ref() is None  # released although the block is alive ...
    snapshot = core.take_snapshot()
    # ... at the same site.  (From 3.13 an object the function took from a
    # free list is stamped there too, and dies with the function.)
    [(_, size, count)] = gone_site(snapshot)
    assert size >= len(block) and 2 <= count <= expected[0][2]
    traces = [t for t in snapshot.traces() if t[2] == (("<gone>", 2),)]
    assert len(traces) == count and max(t[1] for t in traces) >= len(block)
    del block


def _twice_rows(core: ModuleType) -> list[Any]:
    """The <twice>:2 rows of a fresh snapshot, once dead code is released."""
    gc.collect()
    core.drain()
    core._check_invariants()
    stats = core.take_snapshot().group("lineno").statistics()
    return [row for row in stats if row[0] == (("<twice>", 2),)]


def test_the_same_site_compiled_twice_merges_once_both_are_gone(core: ModuleType) -> None:
    core.start(1)
    source = "def f(n):\n    return bytearray(n)\n"
    first, second = _compiled(source, "<twice>"), _compiled(source, "<twice>")
    blocks = [first(50_000), second(70_000)]
    del first, second
    twice = _twice_rows(core)
    # A bytearray is two blocks: the object and its buffer.
    assert len(twice) == 1 and twice[0][2] == 4 and twice[0][1] >= 120_000
    third = _compiled(source, "<twice>")  # a new code object: its own traceback
    blocks.append(third(10_000))
    del third
    twice = _twice_rows(core)
    assert len(twice) == 1 and twice[0][2] == 6 and twice[0][1] >= 130_000
    before = core.get_traced_memory()[0]
    del blocks
    assert not _twice_rows(core)
    assert core.get_traced_memory()[0] <= before - 130_000


@pytest.mark.slow
def test_tracer_memory_stays_flat_while_tracebacks_churn(core: ModuleType) -> None:
    core.start(5)
    # Past the ALLOC_KEEP idle tracebacks kept for their allocation totals
    # (docs/design/core.md): from there on, sweeps fold what comes and goes.
    _churn_distinct_tracebacks(0, core.ALLOC_KEEP + 2000)
    gc.collect()  # exec'd namespaces are cycles: their blocks live until a collection
    core.drain()
    baseline = core.get_tracemalloc_memory()
    tracebacks = core.get_stats()["tracebacks"]
    for round_ in range(10):
        _churn_distinct_tracebacks(10_000 * (round_ + 1), 5000)
        core.take_snapshot(traces=False, reset_peak=True)  # the agent's cycle drains too
    gc.collect()
    core.drain()
    core.reset_peak()  # the tracebacks that made the peak are kept until then
    core.drain()
    # 50,000 distinct tracebacks came and went; the stdlib would hold them all.
    assert core.get_stats()["tracebacks"] <= tracebacks + 50
    assert core.get_tracemalloc_memory() <= baseline * 1.5 + 256 * 1024
    core._check_invariants()


def test_snapshots_sweep_idle_tracebacks_and_drain_the_graveyard(core: ModuleType) -> None:
    core.start(1)
    before = core.get_stats()["tracebacks"]
    # (past the ALLOC_KEEP idle tracebacks a sweep keeps for their
    # allocation totals: docs/design/core.md, "Allocation totals")
    _churn_distinct_tracebacks(0, core.ALLOC_KEEP + 300)
    gc.collect()
    # Dead tracebacks stay interned, idle, until a sweep ...
    assert core.get_stats()["tracebacks"] >= before + core.ALLOC_KEEP + 300
    # Those that made the peak are kept until a peak reset (test_site_peaks.py);
    # on 3.9 and 3.10 the blocks of dead code go with the drain's orphans.
    core.drain()
    core.reset_peak()
    core.take_snapshot(traces=False)
    stats = core.get_stats()
    # ... which every snapshot runs, releasing their code objects too; it
    # keeps at most ALLOC_KEEP of them for their totals, folding the rest.
    assert stats["tracebacks"] < before + core.ALLOC_KEEP + 50
    assert core.take_snapshot(traces=False).allocs_folded[2] >= 250
    assert stats["graveyard"] < 10  # what died since the drain


@pytest.mark.parametrize("nframe", [1, 25])
def test_a_thread_never_reuses_a_released_traceback(core: ModuleType, nframe: int) -> None:
    """Each thread caches its recent tracebacks (agent/csrc/thread.h); one
    freed since (its code object released, then a sweep) must not come back,
    even for a new function whose code lands where the old one was."""
    core.start(nframe)
    for i in range(200):
        func = _compiled("def f(n):\n    return bytearray(n)\n", f"<reused-{i}>")
        data = func(333)  # cached for this thread
        frames = core.get_object_traceback(data)
        assert frames is not None and frames[0] == (f"<reused-{i}>", 2), frames
        del func, data
        core.drain()  # releases the code object and frees the idle traceback
    core._check_invariants()
