"""Snapshot.dump() and Snapshot.load() of hand-built snapshots: heapwatch's
dump format, and the stdlib's pickles only on request."""

from __future__ import annotations

import pickle
import tracemalloc as stdlib_tm
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from heapwatch import HeapwatchError
from heapwatch import tracemalloc as hw_tm

TRACES = [
    (0, 10, (("a.py", 2), ("b.py", 4)), 2),
    (0, 3000, (("a.py", 5),), 1),
    (5, 66, (("b.py", 1), ("<unknown>", 0)), 7),
]


@pytest.fixture
def dumpfile() -> ModuleType:
    # heapwatch.dumpfile is written in parallel; until it lands these tests skip.
    module: ModuleType = pytest.importorskip("heapwatch.formats.dump")
    return module


def raw(snapshot: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (domain, size, tuple(tuple(f) for f in frames), total_nframe)
        for domain, size, frames, total_nframe in snapshot.traces._traces
    )


def stats(snapshot: Any, key_type: str = "traceback") -> list[str]:
    return [repr(s) for s in snapshot.statistics(key_type)]


def test_dump_then_load_gives_the_same_traces(dumpfile: ModuleType, tmp_path: Path) -> None:
    snapshot = hw_tm.Snapshot(TRACES, 3)
    snapshot.dump(tmp_path / "snap.hw")
    loaded = hw_tm.Snapshot.load(tmp_path / "snap.hw")
    assert isinstance(loaded, hw_tm.Snapshot)
    assert raw(loaded) == raw(snapshot)
    assert (loaded.traceback_limit, loaded.mode, loaded.sample_interval) == (3, "exact", 0)
    assert stats(loaded) == stats(snapshot)


def test_dump_writes_heapwatch_format_not_a_pickle(dumpfile: ModuleType, tmp_path: Path) -> None:
    path = str(tmp_path / "snap.hw")
    hw_tm.Snapshot(TRACES, 3).dump(path)
    assert dumpfile.sniff(path) == "heapwatch"
    assert dumpfile.read_dump(path).header.traceback_limit == 3


def test_a_sampled_snapshot_keeps_its_mode_and_interval(
    dumpfile: ModuleType, tmp_path: Path
) -> None:
    snapshot = hw_tm.Snapshot(TRACES, 3, mode="sample", sample_interval=4096)
    snapshot.dump(str(tmp_path / "sampled.hw"))
    loaded = hw_tm.Snapshot.load(str(tmp_path / "sampled.hw"))
    assert (loaded.mode, loaded.sample_interval) == ("sample", 4096)
    assert stats(loaded, "lineno") == stats(snapshot, "lineno")


def test_load_refuses_a_stdlib_pickle_by_default(dumpfile: ModuleType, tmp_path: Path) -> None:
    path = str(tmp_path / "stdlib.pickle")
    stdlib_tm.Snapshot(TRACES, 3).dump(path)
    with pytest.raises(hw_tm.PickleRefusedError, match="allow_pickle=True") as raised:
        hw_tm.Snapshot.load(path)
    assert isinstance(raised.value, HeapwatchError)
    assert path in str(raised.value)


def test_load_converts_a_stdlib_pickle_when_allowed(dumpfile: ModuleType, tmp_path: Path) -> None:
    path = str(tmp_path / "stdlib.pickle")
    stdlib_snapshot = stdlib_tm.Snapshot(TRACES, 3)
    stdlib_snapshot.dump(path)
    loaded = hw_tm.Snapshot.load(path, allow_pickle=True)
    assert isinstance(loaded, hw_tm.Snapshot)
    assert raw(loaded) == raw(stdlib_snapshot)
    assert (loaded.traceback_limit, loaded.mode) == (3, "exact")
    assert stats(loaded) == stats(stdlib_snapshot)


def test_load_refuses_a_pickle_of_something_else(dumpfile: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "other.pickle"
    path.write_bytes(pickle.dumps({"not": "a snapshot"}, protocol=pickle.HIGHEST_PROTOCOL))
    with pytest.raises(dumpfile.DumpError, match="not a tracemalloc Snapshot"):
        hw_tm.Snapshot.load(path, allow_pickle=True)


def test_load_reports_a_file_that_is_no_dump(dumpfile: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "junk"
    path.write_bytes(b"certainly not a dump\n" * 10)
    with pytest.raises(dumpfile.DumpError):
        hw_tm.Snapshot.load(path)


def test_load_of_a_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    pytest.importorskip("heapwatch.formats.dump")
    with pytest.raises(FileNotFoundError):
        hw_tm.Snapshot.load(tmp_path / "missing")
