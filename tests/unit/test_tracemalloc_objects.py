"""Frame, Traceback, Trace, Statistic, StatisticDiff and the traces sequence:
str(), repr(), format(), ordering, hashing and equality byte-identical to the
stdlib's on the same raw tuples."""

from __future__ import annotations

import pickle
import tracemalloc as stdlib_tm
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heapwatch import tracemalloc as hw_tm
from heapwatch.tracemalloc import objects as _tm_objects

RAW_FRAMES = (("b.py", 2), ("a.py", 1), ("a.py", 7))  # most recent first


def both(build: Callable[[ModuleType], Any]) -> tuple[Any, Any]:
    return build(stdlib_tm), build(hw_tm)


# ---- _format_size -----------------------------------------------------------


@pytest.mark.parametrize("sign", [False, True])
@pytest.mark.parametrize(
    "size",
    [0, 1, 99, 100, 10239, 10240, 102399, 102400, 10 * 1024**2 - 1, 1024**4, 2**60, -1, -10240],
)
def test_format_size_matches_the_stdlib_at_unit_boundaries(size: int, sign: bool) -> None:
    assert _tm_objects._format_size(size, sign) == stdlib_tm._format_size(size, sign)  # type: ignore[attr-defined]


@given(
    size=st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(min_value=-1e22, max_value=1e22, allow_nan=False),
    ),
    sign=st.booleans(),
)
def test_format_size_matches_the_stdlib_everywhere(size: float, sign: bool) -> None:
    assert _tm_objects._format_size(size, sign) == stdlib_tm._format_size(size, sign)  # type: ignore[attr-defined]


def test_format_size_uses_the_documented_units() -> None:
    assert _tm_objects._format_size(512, False) == "512 B"
    assert _tm_objects._format_size(12 * 1024 + 512, False) == "12.5 KiB"
    assert _tm_objects._format_size(4855 * 1024, False) == "4855 KiB"
    assert _tm_objects._format_size(-2048 * 1024, True) == "-2048 KiB"
    assert _tm_objects._format_size(3 * 1024**5, False) == "3072 TiB"


# ---- Frame ------------------------------------------------------------------


def test_frame_exposes_filename_and_lineno(tm: ModuleType) -> None:
    frame = tm.Frame(("a.py", 12))
    assert (frame.filename, frame.lineno) == ("a.py", 12)
    assert str(frame) == "a.py:12"
    assert repr(frame) == "<Frame filename='a.py' lineno=12>"


def test_frame_str_repr_hash_match_the_stdlib() -> None:
    ours, theirs = hw_tm.Frame(("dir/x.py", 3)), stdlib_tm.Frame(("dir/x.py", 3))
    assert (str(ours), repr(ours), hash(ours)) == (str(theirs), repr(theirs), hash(theirs))


def test_frames_order_by_filename_then_lineno(tm: ModuleType) -> None:
    frames = [tm.Frame(raw) for raw in [("b.py", 1), ("a.py", 9), ("a.py", 2)]]
    assert [str(f) for f in sorted(frames)] == ["a.py:2", "a.py:9", "b.py:1"]
    assert tm.Frame(("a.py", 2)) <= tm.Frame(("a.py", 2)) < tm.Frame(("a.py", 3))
    assert tm.Frame(("b.py", 1)) > tm.Frame(("a.py", 9))


def test_frame_equality_is_by_value_and_not_with_other_types(tm: ModuleType) -> None:
    assert tm.Frame(("a.py", 1)) == tm.Frame(("a.py", 1))
    assert tm.Frame(("a.py", 1)) != tm.Frame(("a.py", 2))
    assert tm.Frame(("a.py", 1)) != ("a.py", 1)
    with pytest.raises(TypeError):
        _ = tm.Frame(("a.py", 1)) < ("a.py", 2)


# ---- Traceback --------------------------------------------------------------


def test_traceback_reverses_raw_frames_to_oldest_first(tm: ModuleType) -> None:
    traceback = tm.Traceback(RAW_FRAMES)
    assert [str(f) for f in traceback] == ["a.py:7", "a.py:1", "b.py:2"]
    assert len(traceback) == 3
    assert str(traceback[0]) == "a.py:7"
    assert str(traceback[-1]) == "b.py:2"
    assert [str(f) for f in traceback[1:]] == ["a.py:1", "b.py:2"]
    assert isinstance(traceback[1:], tuple)
    assert tm.Frame(("a.py", 1)) in traceback
    assert tm.Frame(("a.py", 2)) not in traceback


def test_traceback_str_is_its_first_frame_as_in_the_stdlib(tm: ModuleType) -> None:
    assert str(tm.Traceback(RAW_FRAMES)) == "a.py:7"


def test_traceback_total_nframe_defaults_to_none(tm: ModuleType) -> None:
    assert tm.Traceback(RAW_FRAMES).total_nframe is None
    assert tm.Traceback(RAW_FRAMES, 40).total_nframe == 40


@pytest.mark.parametrize("total_nframe", [None, 3, 99])
def test_traceback_repr_and_hash_match_the_stdlib(total_nframe: int | None) -> None:
    ours, theirs = both(lambda m: m.Traceback(RAW_FRAMES, total_nframe))
    assert repr(ours) == repr(theirs)
    assert str(ours) == str(theirs)
    assert hash(ours) == hash(theirs)


def test_traceback_equality_ignores_total_nframe(tm: ModuleType) -> None:
    assert tm.Traceback(RAW_FRAMES, 3) == tm.Traceback(RAW_FRAMES, 50)
    assert hash(tm.Traceback(RAW_FRAMES, 3)) == hash(tm.Traceback(RAW_FRAMES))
    assert tm.Traceback(RAW_FRAMES) != tm.Traceback(RAW_FRAMES[1:])
    assert tm.Traceback(RAW_FRAMES) != RAW_FRAMES


def test_tracebacks_order_from_the_oldest_frame(tm: ModuleType) -> None:
    raws = [(("z.py", 1), ("a.py", 2)), (("a.py", 1), ("b.py", 1)), (("a.py", 1),)]
    ordered = sorted(tm.Traceback(raw) for raw in raws)
    assert [tuple(str(f) for f in tb) for tb in ordered] == [
        ("a.py:1",),
        ("a.py:2", "z.py:1"),
        ("b.py:1", "a.py:1"),
    ]


@pytest.fixture
def source_file(tmp_path: Path) -> str:
    path = tmp_path / "src.py"
    path.write_text("first = 1\n    second = 2  \n\nfourth = 4\n")
    return str(path)


@pytest.mark.parametrize("limit", [None, 1, 2, 3, 10, 0, -1, -2, -10])
@pytest.mark.parametrize("most_recent_first", [False, True])
def test_traceback_format_matches_the_stdlib(
    source_file: str, limit: int | None, most_recent_first: bool
) -> None:
    raw = ((source_file, 4), (source_file, 3), (source_file, 2), ("<unknown>", 0))
    ours, theirs = both(lambda m: m.Traceback(raw).format(limit, most_recent_first))
    assert ours == theirs


def test_traceback_format_shows_source_lines_stripped(tm: ModuleType, source_file: str) -> None:
    traceback = tm.Traceback(((source_file, 2), (source_file, 1)))
    assert traceback.format() == [
        f'  File "{source_file}", line 1',
        "    first = 1",
        f'  File "{source_file}", line 2',
        "    second = 2",
    ]
    assert traceback.format(limit=1) == [f'  File "{source_file}", line 2', "    second = 2"]
    assert traceback.format(limit=-1) == [f'  File "{source_file}", line 1', "    first = 1"]
    assert traceback.format(most_recent_first=True)[0] == f'  File "{source_file}", line 2'


def test_traceback_format_skips_blank_and_missing_lines(tm: ModuleType, source_file: str) -> None:
    traceback = tm.Traceback(((source_file, 3), ("<unknown>", 0)))
    assert traceback.format() == ['  File "<unknown>", line 0', f'  File "{source_file}", line 3']


# ---- Trace and the traces sequence ------------------------------------------


RAW_TRACE = (3, 2048, RAW_FRAMES, 12)


def test_trace_exposes_domain_size_and_traceback(tm: ModuleType) -> None:
    trace = tm.Trace(RAW_TRACE)
    assert (trace.domain, trace.size) == (3, 2048)
    assert trace.traceback == tm.Traceback(RAW_FRAMES)
    assert trace.traceback.total_nframe == 12


def test_trace_str_repr_hash_match_the_stdlib() -> None:
    ours, theirs = both(lambda m: m.Trace(RAW_TRACE))
    assert str(ours) == str(theirs) == "a.py:7: 2048 B"
    assert repr(ours) == repr(theirs)
    assert hash(ours) == hash(theirs)


def test_trace_accepts_raw_traces_without_total_nframe(tm: ModuleType) -> None:
    trace = tm.Trace((0, 10, RAW_FRAMES))
    assert trace.traceback.total_nframe is None


def test_trace_equality_is_by_raw_tuple(tm: ModuleType) -> None:
    assert tm.Trace(RAW_TRACE) == tm.Trace(RAW_TRACE)
    assert tm.Trace(RAW_TRACE) != tm.Trace((3, 2049, RAW_FRAMES, 12))
    assert tm.Trace(RAW_TRACE) != RAW_TRACE


def test_snapshot_traces_is_a_lazy_sequence_of_trace(tm: ModuleType) -> None:
    raw = [RAW_TRACE, (0, 5, (("c.py", 1),), 1)]
    traces = tm.Snapshot(raw, 3).traces
    assert len(traces) == 2
    assert traces[1] == tm.Trace(raw[1])
    assert traces[-1] == tm.Trace(raw[1])
    assert traces[:1] == (tm.Trace(raw[0]),)
    assert tm.Trace(raw[0]) in traces
    assert tm.Trace((0, 6, (("c.py", 1),), 1)) not in traces
    assert list(traces) == [tm.Trace(t) for t in raw]
    assert repr(traces) == "<Traces len=2>"
    assert traces == tm.Snapshot(list(raw), 3).traces
    with pytest.raises(TypeError):
        hash(traces)


# ---- Statistic and StatisticDiff --------------------------------------------


@pytest.mark.parametrize(
    ("size", "count"), [(0, 0), (1000, 0), (10, 3), (5 * 1024**2, 7), (10.5, 2.7), (True, 1)]
)
def test_statistic_str_repr_hash_match_the_stdlib(size: int, count: int) -> None:
    ours, theirs = both(lambda m: m.Statistic(m.Traceback(RAW_FRAMES, 4), size, count))
    assert str(ours) == str(theirs)
    assert repr(ours) == repr(theirs)
    assert hash(ours) == hash(theirs)


def test_statistic_str_has_an_average_only_with_blocks(tm: ModuleType) -> None:
    traceback = tm.Traceback((("a.py", 1),))
    assert str(tm.Statistic(traceback, 3000, 2)) == "a.py:1: size=3000 B, count=2, average=1500 B"
    assert str(tm.Statistic(traceback, 0, 0)) == "a.py:1: size=0 B, count=0"


@pytest.mark.parametrize(
    ("size", "size_diff", "count", "count_diff"),
    [
        (0, -100, 0, -1),
        (2048, 2048, 2, 2),
        (10**7, -(10**6), 10, 0),
        (5, 0, 1, -4),
        (7.5, -2.5, 3.9, -1.9),  # floats print as the stdlib's %i prints them: truncated
    ],
)
def test_statistic_diff_str_repr_hash_match_the_stdlib(
    size: int, size_diff: int, count: int, count_diff: int
) -> None:
    ours, theirs = both(
        lambda m: m.StatisticDiff(m.Traceback(RAW_FRAMES), size, size_diff, count, count_diff)
    )
    assert str(ours) == str(theirs)
    assert repr(ours) == repr(theirs)
    assert hash(ours) == hash(theirs)


def test_statistic_diff_str_signs_the_differences(tm: ModuleType) -> None:
    diff = tm.StatisticDiff(tm.Traceback((("a.py", 1),)), 8192, 4096, 2, 1)
    assert str(diff) == "a.py:1: size=8192 B (+4096 B), count=2 (+1), average=4096 B"
    assert repr(diff) == (
        "<StatisticDiff traceback=<Traceback (<Frame filename='a.py' lineno=1>,)> "
        "size=8192 (+4096) count=2 (+1)>"
    )


def test_statistics_compare_by_value(tm: ModuleType) -> None:
    traceback = tm.Traceback(RAW_FRAMES)
    assert tm.Statistic(traceback, 1, 2) == tm.Statistic(tm.Traceback(RAW_FRAMES), 1, 2)
    assert tm.Statistic(traceback, 1, 2) != tm.Statistic(traceback, 1, 3)
    assert tm.StatisticDiff(traceback, 1, 2, 3, 4) == tm.StatisticDiff(traceback, 1, 2, 3, 4)
    assert tm.StatisticDiff(traceback, 1, 2, 3, 4) != tm.StatisticDiff(traceback, 1, 2, 3, 5)
    assert tm.Statistic(traceback, 1, 2) != (traceback, 1, 2)


# ---- pickling ---------------------------------------------------------------


def test_value_objects_pickle_under_the_public_module() -> None:
    traceback = hw_tm.Traceback(RAW_FRAMES, 5)
    objects = [
        hw_tm.Frame(("a.py", 1)),
        traceback,
        hw_tm.Trace(RAW_TRACE),
        hw_tm.Statistic(traceback, 1, 2),
        hw_tm.StatisticDiff(traceback, 1, 2, 3, 4),
    ]
    for obj in objects:
        data = pickle.dumps(obj)
        assert b"heapwatch.tracemalloc" in data
        assert b"tracemalloc.objects" not in data
        assert pickle.loads(data) == obj
    assert pickle.loads(pickle.dumps(traceback)).total_nframe == 5
