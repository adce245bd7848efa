"""The public surface of heapwatch.tracemalloc: every name of the stdlib module
(and of the spec), heapwatch's extensions, and nothing private."""

from __future__ import annotations

import inspect
import tracemalloc as stdlib_tm

from heapwatch import tracemalloc as hw_tm

SPEC_FUNCTIONS = [
    "clear_traces",
    "get_object_traceback",
    "get_traceback_limit",
    "get_traced_memory",
    "get_tracemalloc_memory",
    "is_tracing",
    "reset_peak",
    "start",
    "stop",
    "take_snapshot",
]
SPEC_CLASSES = [
    "BaseFilter",
    "DomainFilter",
    "Filter",
    "Frame",
    "Snapshot",
    "Statistic",
    "StatisticDiff",
    "Trace",
    "Traceback",
]
EXTENSIONS = ["get_mode", "get_sample_interval", "PickleRefusedError"]


def test_all_lists_the_spec_names_and_the_extensions() -> None:
    assert sorted(hw_tm.__all__) == sorted(SPEC_FUNCTIONS + SPEC_CLASSES + EXTENSIONS)
    for name in hw_tm.__all__:
        assert hasattr(hw_tm, name), name


def test_every_public_name_of_the_stdlib_module_exists() -> None:
    public = {name for name in dir(stdlib_tm) if not name.startswith("_")}
    modules = {"Iterable", "Sequence", "fnmatch", "linecache", "os", "pickle", "total_ordering"}
    assert sorted(public - modules - set(dir(hw_tm))) == []


def test_public_classes_belong_to_the_public_module() -> None:
    for name in [*SPEC_CLASSES, "PickleRefusedError"]:
        assert getattr(hw_tm, name).__module__ == "heapwatch.tracemalloc", name


def test_signatures_accept_the_stdlib_arguments() -> None:
    same = {
        "Filter": ["inclusive", "filename_pattern", "lineno", "all_frames", "domain"],
        "DomainFilter": ["inclusive", "domain"],
        "Traceback": ["frames", "total_nframe"],
        "Statistic": ["traceback", "size", "count"],
        "StatisticDiff": ["traceback", "size", "size_diff", "count", "count_diff"],
    }
    for name, params in same.items():
        assert list(inspect.signature(getattr(hw_tm, name)).parameters) == params, name
    snapshot = inspect.signature(hw_tm.Snapshot).parameters
    assert list(snapshot)[:2] == ["traces", "traceback_limit"]
    assert snapshot["mode"].kind is inspect.Parameter.KEYWORD_ONLY
    assert snapshot["sample_interval"].kind is inspect.Parameter.KEYWORD_ONLY
    start = inspect.signature(hw_tm.start).parameters
    assert start["nframe"].default == 1
    assert start["mode"].kind is inspect.Parameter.KEYWORD_ONLY
    assert start["sample_interval"].default is None
    statistics = inspect.signature(hw_tm.Snapshot.statistics).parameters
    assert list(statistics) == ["self", "key_type", "cumulative"]
    compare_to = inspect.signature(hw_tm.Snapshot.compare_to).parameters
    assert list(compare_to) == ["self", "old_snapshot", "key_type", "cumulative"]
    load = inspect.signature(hw_tm.Snapshot.load).parameters
    assert load["allow_pickle"].default is False
    assert load["allow_pickle"].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_public_api_is_documented() -> None:
    for name in [*SPEC_FUNCTIONS, "get_mode", "get_sample_interval"]:
        assert getattr(hw_tm, name).__doc__, name
    for method in ["statistics", "compare_to", "filter_traces", "dump", "load"]:
        assert getattr(hw_tm.Snapshot, method).__doc__, method
