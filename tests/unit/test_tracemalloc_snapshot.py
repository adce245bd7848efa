"""Snapshot.statistics() and compare_to() on hand-built snapshots (the
pure-Python path), against both implementations and against the stdlib on
random traces."""

from __future__ import annotations

import pickle
import re
import tracemalloc as stdlib_tm
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heapwatch import HeapwatchError
from heapwatch import tracemalloc as hw_tm

A2_B4 = (("a.py", 2), ("b.py", 4))  # raw order: a.py:2 is the most recent frame
TRACES = [
    (0, 10, A2_B4, 2),
    (0, 10, A2_B4, 3),
    (0, 10, A2_B4, 2),
    (1, 2, (("a.py", 5), ("b.py", 4)), 2),
    (2, 66, (("b.py", 1),), 1),
    (3, 7, (("<unknown>", 0),), 1),
]


def rows(stats: list[Any]) -> list[tuple[Any, ...]]:
    """(frames as "file:line" from the oldest, size, count) per statistic."""
    return [(tuple(str(f) for f in s.traceback), s.size, s.count) for s in stats]


def diff_rows(diffs: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (tuple(str(f) for f in d.traceback), d.size, d.size_diff, d.count, d.count_diff)
        for d in diffs
    ]


def test_statistics_by_lineno_groups_on_the_most_recent_frame(tm: ModuleType) -> None:
    stats = tm.Snapshot(TRACES, 2).statistics("lineno")
    assert rows(stats) == [
        (("b.py:1",), 66, 1),
        (("a.py:2",), 30, 3),
        (("<unknown>:0",), 7, 1),
        (("a.py:5",), 2, 1),
    ]
    assert all(isinstance(s, tm.Statistic) for s in stats)
    assert all(s.traceback.total_nframe is None for s in stats)


def test_statistics_by_filename_groups_on_the_most_recent_file(tm: ModuleType) -> None:
    assert rows(tm.Snapshot(TRACES, 2).statistics("filename")) == [
        (("b.py:0",), 66, 1),
        (("a.py:0",), 32, 4),
        (("<unknown>:0",), 7, 1),
    ]


def test_statistics_by_traceback_groups_on_every_frame(tm: ModuleType) -> None:
    assert rows(tm.Snapshot(TRACES, 2).statistics("traceback")) == [
        (("b.py:1",), 66, 1),
        (("b.py:4", "a.py:2"), 30, 3),
        (("<unknown>:0",), 7, 1),
        (("b.py:4", "a.py:5"), 2, 1),
    ]


def test_cumulative_statistics_count_every_frame(tm: ModuleType) -> None:
    snapshot = tm.Snapshot(TRACES, 2)
    assert rows(snapshot.statistics("lineno", cumulative=True)) == [
        (("b.py:1",), 66, 1),
        (("b.py:4",), 32, 4),
        (("a.py:2",), 30, 3),
        (("<unknown>:0",), 7, 1),
        (("a.py:5",), 2, 1),
    ]
    assert rows(snapshot.statistics("filename", cumulative=True)) == [
        (("b.py:0",), 98, 5),
        (("a.py:0",), 32, 4),
        (("<unknown>:0",), 7, 1),
    ]


def test_cumulative_statistics_count_a_repeated_frame_each_time(tm: ModuleType) -> None:
    recursive = [(0, 100, (("r.py", 1), ("r.py", 1), ("r.py", 2)), 3)]
    assert rows(tm.Snapshot(recursive, 3).statistics("lineno", cumulative=True)) == [
        (("r.py:1",), 200, 2),
        (("r.py:2",), 100, 1),
    ]
    assert rows(tm.Snapshot(recursive, 3).statistics("filename", cumulative=True)) == [
        (("r.py:0",), 300, 3),
    ]


def test_statistics_ties_break_on_count_then_traceback(tm: ModuleType) -> None:
    traces = [
        (0, 10, (("a.py", 1),), 1),
        (0, 10, (("b.py", 1),), 1),
        (0, 5, (("c.py", 1),), 1),
        (0, 5, (("c.py", 1),), 1),
    ]
    assert rows(tm.Snapshot(traces, 1).statistics("lineno")) == [
        (("c.py:1",), 10, 2),
        (("b.py:1",), 10, 1),
        (("a.py:1",), 10, 1),
    ]


def test_statistics_of_an_empty_snapshot_are_empty(tm: ModuleType) -> None:
    assert tm.Snapshot([], 1).statistics("traceback") == []


@pytest.mark.parametrize("method", ["statistics", "compare_to"])
@pytest.mark.parametrize("key_type", ["line", "", None, 3])
def test_unknown_key_types_raise_the_stdlib_error(
    tm: ModuleType, method: str, key_type: object
) -> None:
    snapshot = tm.Snapshot(TRACES, 2)
    args = (snapshot, key_type) if method == "compare_to" else (key_type,)
    with pytest.raises(ValueError, match=rf"^unknown key_type: {re.escape(repr(key_type))}$"):
        getattr(snapshot, method)(*args)


@pytest.mark.parametrize("method", ["statistics", "compare_to"])
def test_cumulative_traceback_raises_the_stdlib_error_with_its_typo(
    tm: ModuleType, method: str
) -> None:
    snapshot = tm.Snapshot(TRACES, 2)
    args = (snapshot, "traceback") if method == "compare_to" else ("traceback",)
    with pytest.raises(
        ValueError, match=r"^cumulative mode cannot by used with key type 'traceback'$"
    ):
        getattr(snapshot, method)(*args, cumulative=True)


OLD = [(0, 10, (("a.py", 2),), 1)] * 2 + [(0, 50, (("gone.py", 1),), 1)]
NEW = [(0, 10, (("a.py", 2),), 1)] * 3 + [(0, 5, (("new.py", 3),), 1)]


def test_compare_to_reports_grown_new_and_released_groups(tm: ModuleType) -> None:
    diffs = tm.Snapshot(NEW, 1).compare_to(tm.Snapshot(OLD, 1), "lineno")
    assert diff_rows(diffs) == [
        (("gone.py:1",), 0, -50, 0, -1),
        (("a.py:2",), 30, 10, 3, 1),
        (("new.py:3",), 5, 5, 1, 1),
    ]
    assert all(isinstance(d, tm.StatisticDiff) for d in diffs)


def test_compare_to_ties_break_on_size_count_diff_count_traceback(tm: ModuleType) -> None:
    old = [(0, 10, (("b.py", 1),), 1), (0, 10, (("c.py", 1),), 1)]
    new = [
        (0, 20, (("b.py", 1),), 1),  # +10 bytes, size 20
        (0, 10, (("c.py", 1),), 1),
        (0, 10, (("c.py", 1),), 1),  # +10 bytes, size 20, +1 block
        (0, 10, (("a.py", 1),), 1),
        (0, 10, (("d.py", 1),), 1),  # new: +10 bytes, size 10
    ]
    diffs = tm.Snapshot(new, 1).compare_to(tm.Snapshot(old, 1), "lineno")
    assert [str(d.traceback) for d in diffs] == ["c.py:1", "b.py:1", "d.py:1", "a.py:1"]


def test_compare_to_with_itself_gives_zero_differences(tm: ModuleType) -> None:
    snapshot = tm.Snapshot(TRACES, 2)
    diffs = snapshot.compare_to(snapshot, "traceback")
    assert {(d.size_diff, d.count_diff) for d in diffs} == {(0, 0)}
    assert len(diffs) == 4


def test_compare_to_cumulative(tm: ModuleType) -> None:
    old = [(0, 10, (("a.py", 2), ("b.py", 4)), 2)]
    new = [*old, (0, 6, (("c.py", 9), ("b.py", 4)), 2)]
    diffs = tm.Snapshot(new, 2).compare_to(tm.Snapshot(old, 2), "lineno", cumulative=True)
    assert diff_rows(diffs) == [
        (("b.py:4",), 16, 6, 2, 1),
        (("c.py:9",), 6, 6, 1, 1),
        (("a.py:2",), 10, 0, 1, 0),
    ]


def test_snapshot_keeps_traceback_limit_as_an_attribute(tm: ModuleType) -> None:
    snapshot = tm.Snapshot(TRACES, 9)
    assert snapshot.traceback_limit == 9


# ---- heapwatch's extensions ---------------------------------------------------


def test_hand_built_snapshots_are_exact_unless_told() -> None:
    snapshot = hw_tm.Snapshot(TRACES, 2)
    assert (snapshot.mode, snapshot.sample_interval) == ("exact", 0)
    sampled = hw_tm.Snapshot(TRACES, 2, mode="sample", sample_interval=4096)
    assert (sampled.mode, sampled.sample_interval) == ("sample", 4096)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "fast"}, r"^mode must be 'exact' or 'sample', got 'fast'$"),
        (
            {"mode": "sample"},
            r"^sample_interval must be in range \[1; 1099511627776\] bytes, got 0$",
        ),
        (
            {"mode": "sample", "sample_interval": 2**40 + 1},
            r"^sample_interval must be in range \[1; 1099511627776\] bytes, got 1099511627777$",
        ),
        ({"sample_interval": -1}, r"^sample_interval must be in range \[0; 1099511627776\]"),
    ],
)
def test_snapshot_refuses_bad_sampling_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        hw_tm.Snapshot(TRACES, 2, **kwargs)


def test_snapshot_refuses_a_non_integer_sample_interval() -> None:
    with pytest.raises(TypeError):
        hw_tm.Snapshot(TRACES, 2, mode="sample", sample_interval=1.5)  # type: ignore[arg-type]


def test_compare_to_refuses_a_non_snapshot() -> None:
    with pytest.raises(TypeError, match=r"old_snapshot must be a heapwatch\.tracemalloc\.Snapshot"):
        hw_tm.Snapshot(TRACES, 2).compare_to(stdlib_tm.Snapshot(TRACES, 2), "lineno")  # type: ignore[arg-type]


def test_snapshot_pickles_with_its_traces_and_sampling() -> None:
    snapshot = hw_tm.Snapshot(TRACES, 2, mode="sample", sample_interval=512)
    restored = pickle.loads(pickle.dumps(snapshot))
    assert restored.traces == snapshot.traces
    assert (restored.traceback_limit, restored.mode, restored.sample_interval) == (2, "sample", 512)
    assert rows(restored.statistics("lineno")) == rows(snapshot.statistics("lineno"))


def test_heapwatch_errors_share_one_base() -> None:
    assert issubclass(hw_tm.PickleRefusedError, HeapwatchError)
    assert issubclass(hw_tm.PickleRefusedError, ValueError)


# ---- against the stdlib on random traces ------------------------------------

frames_st = st.lists(
    st.tuples(st.sampled_from(["a.py", "b.py", "c/d.py", "<unknown>"]), st.integers(0, 4)),
    min_size=1,
    max_size=5,
).map(tuple)
traces_st = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 5000), frames_st, st.integers(1, 9)),
    max_size=30,
)
GROUPINGS = [
    ("traceback", False),
    ("filename", False),
    ("lineno", False),
    ("filename", True),
    ("lineno", True),
]


@given(traces=traces_st)
def test_statistics_match_the_stdlib_on_random_traces(traces: list[Any]) -> None:
    for key_type, cumulative in GROUPINGS:
        ours = hw_tm.Snapshot(traces, 5).statistics(key_type, cumulative)
        theirs = stdlib_tm.Snapshot(traces, 5).statistics(key_type, cumulative)
        assert [repr(s) for s in ours] == [repr(s) for s in theirs]
        assert [str(s) for s in ours] == [str(s) for s in theirs]


@given(old=traces_st, new=traces_st)
def test_compare_to_matches_the_stdlib_on_random_traces(old: list[Any], new: list[Any]) -> None:
    for key_type, cumulative in GROUPINGS:
        ours = hw_tm.Snapshot(new, 5).compare_to(hw_tm.Snapshot(old, 5), key_type, cumulative)
        theirs = stdlib_tm.Snapshot(new, 5).compare_to(
            stdlib_tm.Snapshot(old, 5), key_type, cumulative
        )
        assert [repr(d) for d in ours] == [repr(d) for d in theirs]
        assert [str(d) for d in ours] == [str(d) for d in theirs]


def test_a_snapshot_pickled_before_the_drop_in_became_a_package_still_loads() -> None:
    # Given a pickle written by heapwatch 0.1.0 before the layers (220ba36~1),
    # which names its reconstructor heapwatch._tm_snapshot._restore,
    raw = (Path(__file__).parent.parent / "data" / "snapshot-before-layers.pickle").read_bytes()
    assert b"heapwatch._tm_snapshot" in raw
    # when it is loaded today,
    snapshot = pickle.loads(raw)
    # then it is today's Snapshot with its traces and its attributes.
    assert type(snapshot) is hw_tm.Snapshot
    assert len(snapshot.traces) == 8
    [stat] = snapshot.statistics("lineno")
    assert (stat.traceback[0].filename, stat.traceback[0].lineno) == ("<string>", 6)
    assert (stat.size, stat.count) == (3603, 8)
    assert snapshot.note == "from before the layers"
