"""Filter, DomainFilter and Snapshot.filter_traces() on hand-built snapshots,
against both implementations, and against the stdlib on random inputs."""

from __future__ import annotations

import tracemalloc as stdlib_tm
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heapwatch import tracemalloc as hw_tm

TRACES = [
    (0, 10, (("pkg/a.py", 2), ("pkg/b.py", 4)), 2),  # 0
    (0, 20, (("pkg/a.py", 5),), 1),  # 1
    (1, 30, (("pkg/b.py", 4), ("pkg/a.py", 2)), 2),  # 2
    (2, 40, (("mod.pyc", 7), ("pkg/a.py", 9)), 2),  # 3
    (0, 50, (("<unknown>", 0),), 1),  # 4
]


def kept(tm: ModuleType, filters: list[Any]) -> list[int]:
    """Indexes in TRACES of the traces filter_traces() keeps."""
    snapshot = tm.Snapshot(list(TRACES), 2).filter_traces(filters)
    return sorted(TRACES.index(trace._trace) for trace in snapshot.traces)


def test_filter_keeps_its_arguments(tm: ModuleType) -> None:
    f = tm.Filter(False, "x.py", lineno=3, all_frames=True, domain=2)
    assert (f.inclusive, f.filename_pattern, f.lineno, f.all_frames, f.domain) == (
        False,
        "x.py",
        3,
        True,
        2,
    )
    defaults = tm.Filter(True, "y.py")
    assert (defaults.lineno, defaults.all_frames, defaults.domain) == (None, False, None)
    assert isinstance(defaults, tm.BaseFilter)


def test_filter_pattern_reads_pyc_as_py_and_is_read_only(tm: ModuleType) -> None:
    f = tm.Filter(True, "dir/mod.pyc")
    assert f.filename_pattern == "dir/mod.py"
    with pytest.raises(AttributeError):
        f.filename_pattern = "other.py"


def test_domain_filter_keeps_its_arguments_read_only_domain(tm: ModuleType) -> None:
    f = tm.DomainFilter(False, 3)
    assert (f.inclusive, f.domain) == (False, 3)
    assert isinstance(f, tm.BaseFilter)
    with pytest.raises(AttributeError):
        f.domain = 4


def test_inclusive_filter_matches_the_most_recent_frame_with_fnmatch(tm: ModuleType) -> None:
    assert kept(tm, [tm.Filter(True, "pkg/a.py")]) == [0, 1]
    assert kept(tm, [tm.Filter(True, "pkg/*")]) == [0, 1, 2]
    assert kept(tm, [tm.Filter(True, "*.py")]) == [0, 1, 2, 3]


def test_filter_reads_pyc_filenames_as_py(tm: ModuleType) -> None:
    assert kept(tm, [tm.Filter(True, "mod.py")]) == [3]
    assert kept(tm, [tm.Filter(True, "mod.pyc")]) == [3]


def test_exclusive_filter_drops_matching_traces(tm: ModuleType) -> None:
    assert kept(tm, [tm.Filter(False, "pkg/a.py")]) == [2, 3, 4]
    assert kept(tm, [tm.Filter(False, "<unknown>")]) == [0, 1, 2, 3]


def test_filter_lineno_narrows_to_one_line(tm: ModuleType) -> None:
    assert kept(tm, [tm.Filter(True, "pkg/a.py", lineno=5)]) == [1]
    assert kept(tm, [tm.Filter(False, "pkg/a.py", lineno=5)]) == [0, 2, 3, 4]


def test_filter_all_frames_checks_every_frame(tm: ModuleType) -> None:
    assert kept(tm, [tm.Filter(True, "pkg/a.py", all_frames=True)]) == [0, 1, 2, 3]
    assert kept(tm, [tm.Filter(True, "pkg/a.py", lineno=2, all_frames=True)]) == [0, 2]
    assert kept(tm, [tm.Filter(False, "pkg/a.py", all_frames=True)]) == [4]


def test_filter_domain_restricts_inclusive_and_exclusive_filters(tm: ModuleType) -> None:
    assert kept(tm, [tm.Filter(True, "pkg/*", domain=1)]) == [2]
    # Exclusive with a domain: only the traces of that domain are excluded.
    assert kept(tm, [tm.Filter(False, "pkg/*", domain=0)]) == [2, 3, 4]


def test_domain_filter_includes_or_excludes_one_domain(tm: ModuleType) -> None:
    assert kept(tm, [tm.DomainFilter(True, 0)]) == [0, 1, 4]
    assert kept(tm, [tm.DomainFilter(False, 0)]) == [2, 3]


def test_inclusive_filters_are_or_ed_and_exclusive_ones_and_ed(tm: ModuleType) -> None:
    assert kept(tm, [tm.Filter(True, "mod.py"), tm.Filter(True, "<unknown>")]) == [3, 4]
    assert kept(tm, [tm.Filter(False, "mod.py"), tm.DomainFilter(False, 0)]) == [2]
    assert kept(tm, [tm.Filter(True, "pkg/*"), tm.Filter(False, "pkg/b.py")]) == [0, 1]


def test_no_filters_gives_a_copy(tm: ModuleType) -> None:
    snapshot = tm.Snapshot(list(TRACES), 7)
    copy = snapshot.filter_traces([])
    assert copy is not snapshot
    assert copy.traces == snapshot.traces
    assert copy.traces._traces is not snapshot.traces._traces
    assert copy.traceback_limit == 7


def test_filtered_snapshot_keeps_the_traceback_limit(tm: ModuleType) -> None:
    filtered = tm.Snapshot(list(TRACES), 7).filter_traces([tm.DomainFilter(True, 0)])
    assert filtered.traceback_limit == 7


def test_filter_traces_accepts_any_iterable(tm: ModuleType) -> None:
    snapshot = tm.Snapshot(list(TRACES), 2)
    filtered = snapshot.filter_traces(f for f in [tm.DomainFilter(True, 2)])
    assert [t._trace for t in filtered.traces] == [TRACES[3]]


def test_filter_traces_refuses_a_non_iterable(tm: ModuleType) -> None:
    with pytest.raises(TypeError, match=r"^filters must be a list of filters, not int$"):
        tm.Snapshot(list(TRACES), 2).filter_traces(3)


# ---- against the stdlib on random traces and filters -------------------------

FILENAMES = ["a.py", "b.pyc", "dir/c.py", "<unknown>"]
frames_st = st.lists(
    st.tuples(st.sampled_from(FILENAMES), st.integers(0, 3)), min_size=1, max_size=4
).map(tuple)
traces_st = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 10**6), frames_st, st.integers(1, 6)),
    max_size=25,
)
filter_args_st = st.one_of(
    st.tuples(
        st.just("filter"),
        st.booleans(),
        st.sampled_from(["a.py", "b.py", "*.py", "dir/*", "<unknown>", "?.pyc"]),
        st.one_of(st.none(), st.integers(0, 3)),
        st.booleans(),
        st.one_of(st.none(), st.integers(0, 2)),
    ),
    st.tuples(st.just("domain"), st.booleans(), st.integers(0, 2)),
)


def build_filter(tm: ModuleType, args: tuple[Any, ...]) -> Any:
    if args[0] == "domain":
        return tm.DomainFilter(args[1], args[2])
    _, inclusive, pattern, lineno, all_frames, domain = args
    return tm.Filter(inclusive, pattern, lineno, all_frames, domain)


@given(traces=traces_st, filter_args=st.lists(filter_args_st, max_size=4))
def test_filter_traces_keeps_what_the_stdlib_keeps(
    traces: list[Any], filter_args: list[tuple[Any, ...]]
) -> None:
    results = []
    for tm in (stdlib_tm, hw_tm):
        filters = [build_filter(tm, args) for args in filter_args]
        snapshot = tm.Snapshot(list(traces), 4).filter_traces(filters)
        results.append(list(snapshot.traces._traces))
    assert results[0] == results[1]


def test_the_drop_ins_file_stands_for_all_its_modules() -> None:
    import os

    from heapwatch import tracemalloc as hw_tm

    sibling = os.path.join(os.path.dirname(hw_tm.__file__), "snapshot.py")
    trace = (0, 10, ((sibling, 1),), 1)
    assert not hw_tm.Filter(False, hw_tm.__file__)._match(trace)
    assert hw_tm.Filter(True, hw_tm.__file__)._match(trace)
    # Only that very pattern: another one named tracemalloc.py is a plain pattern.
    assert hw_tm.Filter(False, "/elsewhere/tracemalloc.py")._match(trace)
    assert hw_tm.Filter(False, hw_tm.__file__)._match((0, 10, (("/app/x.py", 1),), 1))
