"""Rows, the one shape of grouped memory: the same groups, sums and order as
the drop-in's statistics and differences (which the stdlib's tests pin)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from heapwatch import tracemalloc as hw_tm
from heapwatch.formats.rows import compare_rows, group_rows
from heapwatch.tracemalloc.raw import raw_diffs, raw_statistics

# Few files and lines: ties in size and count, decided by the traceback.
frame = st.tuples(st.sampled_from(["a.py", "b.py", "c.py"]), st.integers(0, 3))
trace = st.builds(
    lambda size, frames: (0, size, tuple(frames), len(frames)),
    st.sampled_from([0, 1, 8, 8, 100, 4096]),
    st.lists(frame, min_size=1, max_size=3),
)
traces = st.lists(trace, max_size=25)
key = st.sampled_from(
    [
        ("lineno", False),
        ("filename", False),
        ("traceback", False),
        ("lineno", True),
        ("filename", True),
    ]
)
mode = st.sampled_from([("exact", 0), ("sample", 512)])


@settings(max_examples=300, deadline=None)
@given(traces, key, mode)
def test_group_rows_equal_the_drop_in_statistics(t, key_type, sampling) -> None:  # type: ignore[no-untyped-def]
    kind, cumulative = key_type
    snap = hw_tm.Snapshot(t, 3, mode=sampling[0], sample_interval=sampling[1])
    grouped = group_rows(t, kind, cumulative, sampling[0], sampling[1])
    assert grouped.rows == raw_statistics(snap.statistics(kind, cumulative))


@settings(max_examples=300, deadline=None)
@given(traces, traces, key)
def test_compare_rows_equal_the_drop_in_differences(old, new, key_type) -> None:  # type: ignore[no-untyped-def]
    kind, cumulative = key_type
    before = group_rows(old, kind, cumulative, "exact", 0).rows
    after = group_rows(new, kind, cumulative, "exact", 0).rows
    expected = hw_tm.Snapshot(new, 3).compare_to(hw_tm.Snapshot(old, 3), kind, cumulative)
    assert compare_rows(before, after) == raw_diffs(expected)
