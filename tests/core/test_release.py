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
    namespace: dict[str, Any] = {}
    source = f"def f{i}(n):\n    return [bytearray(n) for _ in range(3)]\n"
    exec(compile(source, f"<generated-{i}>", "exec"), namespace)
    return namespace[f"f{i}"]


def _churn_distinct_tracebacks(start: int, count: int) -> None:
    for i in range(start, start + count):
        data = _one_shot_function(i)(100)
        del data


def test_code_objects_are_released_once_no_trace_needs_them(core: ModuleType) -> None:
    core.start(1)
    func = _one_shot_function(0)
    code: CodeType = func.__code__
    ref = weakref.ref(code)
    data = func(64)
    del func, code
    gc.collect()
    assert ref() is not None  # a live trace's traceback holds the code object
    del data
    core.drain()
    gc.collect()
    assert ref() is None


@pytest.mark.slow
def test_tracer_memory_stays_flat_while_tracebacks_churn(core: ModuleType) -> None:
    core.start(5)
    _churn_distinct_tracebacks(0, 2000)
    gc.collect()  # exec'd namespaces are cycles: their blocks live until a collection
    core.drain()
    baseline = core.get_tracemalloc_memory()
    tracebacks = core.get_stats()["tracebacks"]
    for round_ in range(10):
        _churn_distinct_tracebacks(10_000 * (round_ + 1), 5000)
        core.take_snapshot(traces=False)  # the agent's cycle drains too
    gc.collect()
    core.drain()
    # 50,000 distinct tracebacks came and went; the stdlib would hold them all.
    assert core.get_stats()["tracebacks"] <= tracebacks + 50
    assert core.get_tracemalloc_memory() <= baseline * 1.5 + 256 * 1024
    core._check_invariants()


def test_snapshots_sweep_idle_tracebacks_and_drain_the_graveyard(core: ModuleType) -> None:
    core.start(1)
    before = core.get_stats()["tracebacks"]
    _churn_distinct_tracebacks(0, 300)
    gc.collect()
    # Dead tracebacks stay interned, idle, until a sweep ...
    assert core.get_stats()["tracebacks"] >= before + 300
    core.take_snapshot(traces=False)
    stats = core.get_stats()
    # ... which every snapshot runs, releasing their code objects too.
    assert stats["tracebacks"] < before + 50
    assert stats["graveyard"] < 10  # what died since the drain
