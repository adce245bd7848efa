"""The C aggregation of core-backed snapshots against the pure-Python path on
the same traces, in exact and in sample mode: statistics, compare_to and
filter_traces must agree exactly."""

from __future__ import annotations

import tracemalloc as stdlib_tm
from collections.abc import Iterator
from typing import Any

import _tm_workload as workload
import pytest

from heapwatch import tracemalloc as hw_tm
from heapwatch.tracemalloc import snapshot as _tm_snapshot

twin = workload.hand_built_twin

GROUPINGS = [
    ("traceback", False),
    ("filename", False),
    ("lineno", False),
    ("filename", True),
    ("lineno", True),
]
MODES = [("exact", None), ("sample", 256), ("sample", 4096)]


def reprs(items: list[Any]) -> list[str]:
    return [repr(item) for item in items]


@pytest.fixture(params=MODES, ids=[f"{mode}-{interval}" for mode, interval in MODES])
def two_snapshots(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """(old, new) core-backed snapshots of a run of every workload, 5 frames deep."""
    mode, interval = request.param
    hw_tm.start(5, mode=mode, sample_interval=interval)
    try:
        kept: list[object] = [workload.bytearrays(200, 700), workload.dicts(100)]
        old = hw_tm.take_snapshot()
        kept += [workload.nested(40, 3), workload.growing_list(2000), workload.strings(300)]
        del kept[0]
        new = hw_tm.take_snapshot()
    finally:
        hw_tm.stop()
    assert (new.mode, old.mode) == (mode, mode)
    yield old, new


@pytest.fixture(autouse=True)
def stopped() -> Iterator[None]:
    yield
    if hw_tm.is_tracing():
        hw_tm.stop()


@pytest.mark.parametrize(("key_type", "cumulative"), GROUPINGS)
def test_c_statistics_equal_the_python_ones(
    two_snapshots: tuple[Any, Any], key_type: str, cumulative: bool
) -> None:
    _, snapshot = two_snapshots
    ours = snapshot.statistics(key_type, cumulative)
    assert ours, "the snapshot holds no traces"
    assert reprs(ours) == reprs(twin(snapshot).statistics(key_type, cumulative))


@pytest.mark.parametrize(("key_type", "cumulative"), GROUPINGS)
def test_c_compare_to_equals_the_python_and_mixed_ones(
    two_snapshots: tuple[Any, Any], key_type: str, cumulative: bool
) -> None:
    old, new = two_snapshots
    in_c = reprs(new.compare_to(old, key_type, cumulative))
    assert in_c
    assert in_c == reprs(twin(new).compare_to(twin(old), key_type, cumulative))
    assert in_c == reprs(twin(new).compare_to(old, key_type, cumulative))
    assert in_c == reprs(new.compare_to(twin(old), key_type, cumulative))


def test_sampled_statistics_are_weighed_estimates(two_snapshots: tuple[Any, Any]) -> None:
    _, snapshot = two_snapshots
    real = sum(trace.size for trace in snapshot.traces)
    estimated = sum(stat.size for stat in snapshot.statistics("filename"))
    if snapshot.mode == "exact":
        assert estimated == real
        assert sum(s.count for s in snapshot.statistics("traceback")) == len(snapshot.traces)
    else:
        assert estimated > real  # small sampled blocks stand for many more bytes


def filters_to_try() -> list[list[Any]]:
    here = workload.__file__
    return [
        [],
        [hw_tm.Filter(True, here)],
        [hw_tm.Filter(False, here)],
        [hw_tm.Filter(True, here, all_frames=True), hw_tm.Filter(False, "*pytest*")],
        [hw_tm.Filter(True, here, lineno=17)],
        [hw_tm.Filter(True, "*", domain=0), hw_tm.DomainFilter(False, 1)],
        [hw_tm.DomainFilter(True, 4242)],
        [hw_tm.Filter(False, "*")],
    ]


@pytest.mark.parametrize("index", range(len(filters_to_try())))
def test_filtered_core_snapshots_equal_filtered_python_ones(
    two_snapshots: tuple[Any, Any], index: int
) -> None:
    old, new = two_snapshots
    filters = filters_to_try()[index]
    filtered_new, filtered_old = new.filter_traces(filters), old.filter_traces(filters)
    twin_new = twin(new).filter_traces(filters)
    twin_old = twin(old).filter_traces(filters)
    assert filtered_new._source is new._source  # still core-backed, sharing the C snapshot
    for key_type, cumulative in GROUPINGS:
        assert reprs(filtered_new.statistics(key_type, cumulative)) == reprs(
            twin_new.statistics(key_type, cumulative)
        )
        assert reprs(filtered_new.compare_to(filtered_old, key_type, cumulative)) == reprs(
            twin_new.compare_to(twin_old, key_type, cumulative)
        )
    assert sorted(filtered_new.traces._traces) == sorted(twin_new.traces._traces)


def test_successive_filters_and_together(two_snapshots: tuple[Any, Any]) -> None:
    _, snapshot = two_snapshots
    first = [hw_tm.Filter(True, workload.__file__, all_frames=True)]
    second = [hw_tm.Filter(False, workload.__file__, lineno=17)]
    in_c = snapshot.filter_traces(first).filter_traces(second)
    in_python = twin(snapshot).filter_traces(first).filter_traces(second)
    assert reprs(in_c.statistics("lineno")) == reprs(in_python.statistics("lineno"))
    assert "_tm_workload.py:17" not in "".join(str(s) for s in in_c.statistics("lineno"))


class BigBlocks(hw_tm.BaseFilter):
    """A filter on the size of each trace: cannot be evaluated per traceback."""

    def _match(self, trace: Any) -> bool:
        return bool(trace[1] >= 700)


def test_other_filters_are_evaluated_per_trace(two_snapshots: tuple[Any, Any]) -> None:
    _, snapshot = two_snapshots
    filtered = snapshot.filter_traces([BigBlocks(True)])
    assert all(trace.size >= 700 for trace in filtered.traces)
    assert sorted(filtered.traces._traces) == sorted(
        twin(snapshot).filter_traces([BigBlocks(True)]).traces._traces
    )


def test_stdlib_filters_work_on_core_backed_snapshots(two_snapshots: tuple[Any, Any]) -> None:
    _, snapshot = two_snapshots
    filters = [stdlib_tm.Filter(True, workload.__file__)]
    ours = [hw_tm.Filter(True, workload.__file__)]
    assert reprs(snapshot.filter_traces(filters).statistics("lineno")) == reprs(
        snapshot.filter_traces(ours).statistics("lineno")
    )


def test_core_backed_snapshots_aggregate_in_c_without_building_traces(
    two_snapshots: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_python_grouping(*args: object) -> None:
        raise AssertionError("a core-backed snapshot grouped its traces in Python")

    monkeypatch.setattr(_tm_snapshot, "group_traces", no_python_grouping)
    old, new = two_snapshots
    filtered = new.filter_traces([hw_tm.Filter(True, workload.__file__)])
    for key_type, cumulative in GROUPINGS:
        assert filtered.statistics(key_type, cumulative)
        new.compare_to(old, key_type, cumulative)
    assert (new._traces, old._traces, filtered._traces) == (None, None, None)
