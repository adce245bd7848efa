"""Allocation totals per traceback (Snapshot.tracebacks(allocs=True)): the
bytes and blocks allocated at each site since tracing started, Go's
alloc_space and alloc_objects, bounded by ALLOC_KEEP idle tracebacks with
the rest folded into Snapshot.allocs_folded."""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import pytest

SIZE = 10_000
CHURN = 2_000
LEAK = 100
MODES = [("exact", 1), ("sample", 64 * 1024)]


def _churn() -> None:
    for _ in range(CHURN):
        block = bytes(SIZE)  # churn site
        del block


def _leak(keep: list[bytes | None]) -> None:
    for i in range(LEAK):
        keep[i] = bytes(SIZE)  # leak site


CHURN_LINE = _churn.__code__.co_firstlineno + 2
LEAK_LINE = _leak.__code__.co_firstlineno + 2


def _site(rows: list[Any], line: int) -> tuple[int, ...]:
    """(size, count, peak, alloc_size, alloc_count) summed over the rows whose
    innermost frame is this file's line."""
    sums = [0, 0, 0, 0, 0]
    for row in rows:
        filename, lineno, _ = row[1][0]
        if filename == __file__ and lineno == line:
            for k in range(5):
                sums[k] += row[3 + k]
    return tuple(sums)


def _tolerance(mode: str, interval: int, blocks: int) -> float:
    """Six standard deviations of a sampled estimate of `blocks` blocks."""
    if mode == "exact":
        return 0
    p = -math.expm1(-SIZE / interval)
    return 6 * math.sqrt(blocks * SIZE * SIZE * (1 - p) / p)


@pytest.mark.parametrize(("mode", "interval"), MODES)
def test_a_site_that_allocates_and_frees_keeps_its_totals(
    core: ModuleType, mode: str, interval: int
) -> None:
    # Given a site that allocated and freed 2,000 blocks, then a peak reset
    # (so that it holds neither live bytes nor a peak), and a site that leaks
    core.start(1, mode, interval)
    _churn()
    core.reset_peak()
    keep: list[bytes | None] = [None] * LEAK
    _leak(keep)
    core.drain()  # a sweep: idle tracebacks go unless something holds them

    # When the totals are read
    snap = core.take_snapshot(traces=False)
    rows = snap.tracebacks(names=True, allocs=True)

    # Then the churn site shows what it allocated and nothing live
    size, count, peak, alloc_size, alloc_count = _site(rows, CHURN_LINE)
    assert (size, count, peak) == (0, 0, 0)
    expected = CHURN * (SIZE + 33)  # bytes' header
    assert abs(alloc_size - expected) <= _tolerance(mode, interval, CHURN) + 1
    if mode == "exact":
        assert alloc_count == CHURN
    # And the leaking site's totals are its live bytes
    size, count, _, alloc_size, alloc_count = _site(rows, LEAK_LINE)
    assert alloc_size == size and alloc_count == count
    if mode == "exact":
        assert count == LEAK
    # And the rows without live traces are not in the stdlib's view
    assert len(snap.tracebacks()) == snap.ntracebacks < len(rows)


def test_a_replaced_trace_counts_both_allocations(core: ModuleType) -> None:
    # Given a block tracked twice at the same address in another domain
    # (the stdlib replaces the trace)
    core.start(1)
    core._track(7, 0x1000, 100)
    core._track(7, 0x1000, 300)
    snap = core.take_snapshot(traces=False)
    rows = [row for row in snap.tracebacks(allocs=True) if row[0] == 7]
    # Then both calls allocated, the second replacing the first's live bytes
    assert sum(row[3] for row in rows) == 300
    assert sum(row[6] for row in rows) == 400
    assert sum(row[7] for row in rows) == 2


def _many_sites(n: int) -> None:
    """n distinct one-frame tracebacks, each allocating and freeing a block."""
    source = "\n".join("b = bytes(1000); del b" for _ in range(n))
    exec(compile(source, "<many sites>", "exec"), {})


def test_idle_totals_are_capped_and_the_rest_folded(core: ModuleType) -> None:
    # Given more idle sites holding only totals than ALLOC_KEEP
    keep = core.ALLOC_KEEP
    extra = 3_000
    core.start(1)
    _many_sites(keep + extra)
    core.reset_peak()
    core.drain()

    # When a snapshot reads them
    snap = core.take_snapshot(traces=False)
    rows = [r for r in snap.tracebacks(names=True, allocs=True) if r[1][0][0] == "<many sites>"]
    folded_size, folded_blocks, folded_tracebacks = snap.allocs_folded

    # Then at most ALLOC_KEEP idle tracebacks keep their own totals (a few
    # of the test's own sites among them), and the others are folded
    idle = [r for r in snap.tracebacks(allocs=True) if r[3] == 0 and r[5] == 0]
    assert keep - 64 <= len(rows) <= len(idle) <= keep
    assert folded_tracebacks >= keep + extra - len(rows)
    # And nothing was lost: kept plus folded covers every allocation
    assert sum(r[7] for r in rows) + folded_blocks >= keep + extra
    assert sum(r[6] for r in rows) + folded_size >= (keep + extra) * (1000 + 33)
    assert all(r[7] == 1 for r in rows)


def test_clear_traces_starts_the_totals_again(core: ModuleType) -> None:
    core.start(1)
    _churn()
    _many_sites(core.ALLOC_KEEP + 10)
    core.reset_peak()
    core.drain()
    core.clear_traces()
    snap = core.take_snapshot(traces=False)
    assert _site(snap.tracebacks(names=True, allocs=True), CHURN_LINE)[3] == 0
    assert snap.allocs_folded == (0, 0, 0)
