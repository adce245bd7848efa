"""The trace table against a model, through the track()/untrack() API.

Addresses are made up and live in a private domain, so real allocations never
collide with them.  Properties: live bytes equal the sum of the traces, and
untracking everything gives zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DOMAIN = 4242

sizes = st.one_of(
    st.integers(0, 4096),
    st.integers(2**32 - 2, 2**32 + 2),  # around the 32-bit slot boundary
    st.integers(2**40, 2**50),
)
ops = st.lists(
    st.tuples(st.sampled_from(["track", "untrack"]), st.integers(1, 300), sizes),
    max_size=400,
)


@pytest.fixture
def tracing(core: ModuleType) -> Iterator[ModuleType]:
    core.start(1)
    yield core


def _domain_traces(core: ModuleType) -> list[tuple[int, int]]:
    return sorted(
        (size, 1) for domain, size, _f, _t in core.take_snapshot().traces() if domain == DOMAIN
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops)
def test_tracked_bytes_equal_the_sum_of_the_model(
    tracing: ModuleType, ops: list[tuple[str, int, int]]
) -> None:
    core = tracing
    core.clear_traces()
    model: dict[int, int] = {}
    base = core.get_traced_memory()[0]
    for op, slot, size in ops:
        ptr = slot * 64
        if op == "track":
            assert core._track(DOMAIN, ptr, size) == 0
            model[ptr] = size
        else:
            core._untrack(DOMAIN, ptr)
            model.pop(ptr, None)
    core._check_invariants()
    assert _domain_traces(core) == sorted((size, 1) for size in model.values())
    for ptr in list(model):
        core._untrack(DOMAIN, ptr)
    assert _domain_traces(core) == []
    core._check_invariants()
    # Real allocations of the test itself come and go; the domain's are gone.
    assert core.get_traced_memory()[0] < base + 2**20


def test_untracking_an_unknown_block_is_harmless(tracing: ModuleType) -> None:
    assert tracing._untrack(DOMAIN, 12345) == 0
    tracing._check_invariants()


def test_track_without_tracing_reports_it(core: ModuleType) -> None:
    assert core._track(DOMAIN, 64, 10) == -2


def test_table_grows_and_shrinks_with_live_traces(tracing: ModuleType) -> None:
    core = tracing
    before = core.get_tracemalloc_memory()
    for i in range(1, 200_001):
        core._track(DOMAIN, i * 16, 8)
    grown = core.get_tracemalloc_memory()
    assert grown - before >= 200_000 * 16  # at least a slot per trace
    for i in range(1, 200_001):
        core._untrack(DOMAIN, i * 16)
    core._check_invariants()
    assert core.get_tracemalloc_memory() < before + (grown - before) // 4


def test_a_swinging_live_set_keeps_the_table_until_a_drain_compacts_it(
    tracing: ModuleType,
) -> None:
    # Frees shrink the table only far below its peak, so that a live set that
    # swings up and down does not rehash on every swing; drain() (every agent
    # cycle) and snapshots bring it back toward the live traces.
    core = tracing
    before = core.get_tracemalloc_memory()
    for i in range(1, 200_001):
        core._track(DOMAIN, i * 16, 8)
    grown = core.get_tracemalloc_memory()
    for i in range(1, 190_001):
        core._untrack(DOMAIN, i * 16)
    core._check_invariants()
    assert core.get_tracemalloc_memory() > before + (grown - before) // 2
    core.drain()
    core._check_invariants()
    assert core.get_tracemalloc_memory() < before + (grown - before) // 4
    kept = [t for t in core.take_snapshot().traces() if t[0] == DOMAIN]
    assert len(kept) == 10_000
