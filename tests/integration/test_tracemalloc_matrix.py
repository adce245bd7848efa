"""The tracemalloc API as a matrix: mode x nframe x snapshot taken or built
by hand x as taken or dumped and loaded x every statistics key type and
compare_to.  Every cell must agree with the snapshot it came from; where the
stdlib can run the same case (exact mode, the same raw traces), with the
stdlib too.  An exact-mode taken snapshot that could not be dumped went
unnoticed because no test dumped one: this file leaves no cell out."""

from __future__ import annotations

import itertools
import pickle
import tracemalloc as stdlib_tm
from pathlib import Path
from typing import Any

import _tm_workload as workload
import pytest

from heapwatch import tracemalloc as hw_tm

CONFIGS = [
    pytest.param({"mode": "exact"}, id="exact"),
    pytest.param({"mode": "sample", "sample_interval": 4096}, id="sample"),
]
NFRAMES = [1, 5]
KEYS = list(itertools.product(["lineno", "filename", "traceback"], [False, True]))


def _allocate() -> list[Any]:
    return [workload.bytearrays(50, 3000), workload.nested(40, 4), workload.dicts(100)]


def _taken(config: dict[str, Any], nframe: int) -> hw_tm.Snapshot:
    hw_tm.start(nframe, **config)
    try:
        kept = _allocate()
        snapshot = hw_tm.take_snapshot()
        del kept
    finally:
        hw_tm.stop()
    return snapshot


def _dumped(snapshot: hw_tm.Snapshot, path: Path) -> hw_tm.Snapshot:
    snapshot.dump(path)
    return hw_tm.Snapshot.load(path)


def _pickled(snapshot: hw_tm.Snapshot, _path: Path) -> hw_tm.Snapshot:
    loaded: hw_tm.Snapshot = pickle.loads(pickle.dumps(snapshot))
    return loaded


def _stats(snapshot: Any, key_type: str, cumulative: bool) -> list[tuple[Any, ...]]:
    return sorted(
        (str(s.traceback), s.size, s.count) for s in snapshot.statistics(key_type, cumulative)
    )


def _raw(snapshot: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (d, size, tuple(map(tuple, frames)), total)
        for d, size, frames, total in snapshot.traces._traces
    )


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("nframe", NFRAMES)
@pytest.mark.parametrize("source", ["taken", "hand-built"])
@pytest.mark.parametrize("copy", [_dumped, _pickled], ids=["dump-load", "pickle"])
def test_every_cell_agrees_with_the_snapshot_it_came_from(
    tmp_path: Path, config: dict[str, Any], nframe: int, source: str, copy: Any
) -> None:
    taken = _taken(config, nframe)
    snapshot = taken if source == "taken" else workload.hand_built_twin(taken)
    assert snapshot.mode == config["mode"]
    assert snapshot.sample_interval == config.get("sample_interval", 0)
    copied = copy(snapshot, tmp_path / "snap.hwdump")
    assert (copied.mode, copied.sample_interval, copied.traceback_limit) == (
        snapshot.mode,
        snapshot.sample_interval,
        snapshot.traceback_limit,
    )
    assert _raw(copied) == _raw(snapshot)
    for key_type, cumulative in KEYS:
        if cumulative and key_type == "traceback":
            continue  # refused by the stdlib too (tested in test_tracemalloc_api)
        assert _stats(copied, key_type, cumulative) == _stats(snapshot, key_type, cumulative)
        diffs = copied.compare_to(snapshot, key_type, cumulative)
        assert all(d.size_diff == 0 and d.count_diff == 0 for d in diffs)
        assert sum(d.size for d in diffs) == sum(
            s.size for s in snapshot.statistics(key_type, cumulative)
        )


@pytest.mark.parametrize("nframe", NFRAMES)
@pytest.mark.parametrize("dump", [False, True], ids=["as-taken", "dump-load"])
def test_exact_statistics_equal_the_stdlibs_over_the_same_traces(
    tmp_path: Path, nframe: int, dump: bool
) -> None:
    snapshot: hw_tm.Snapshot = _taken({"mode": "exact"}, nframe)
    if dump:
        snapshot = _dumped(snapshot, tmp_path / "snap.hwdump")
    stdlib_snapshot = stdlib_tm.Snapshot(list(snapshot.traces._traces), snapshot.traceback_limit)
    for key_type, cumulative in KEYS:
        if cumulative and key_type == "traceback":
            continue
        ours = [str(s) for s in snapshot.statistics(key_type, cumulative)]
        theirs = [str(s) for s in stdlib_snapshot.statistics(key_type, cumulative)]
        assert sorted(ours) == sorted(theirs), (key_type, cumulative)
        ours_diff = [str(d) for d in snapshot.compare_to(snapshot, key_type, cumulative)]
        theirs_diff = [
            str(d) for d in stdlib_snapshot.compare_to(stdlib_snapshot, key_type, cumulative)
        ]
        assert sorted(ours_diff) == sorted(theirs_diff), (key_type, cumulative)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_taken_snapshot_keeps_its_own_attributes_through_dump_and_pickle(
    tmp_path: Path, config: dict[str, Any]
) -> None:
    snapshot = _taken(config, 1)
    snapshot.owner = {"service": "api", "pid": 42}  # type: ignore[attr-defined]
    loaded = _dumped(snapshot, tmp_path / "snap.hwdump")
    assert loaded.owner == {"service": "api", "pid": 42}  # type: ignore[attr-defined]
    assert _pickled(snapshot, tmp_path).owner == snapshot.owner  # type: ignore[attr-defined]


def test_an_attribute_the_format_cannot_hold_is_refused_by_name(tmp_path: Path) -> None:
    snapshot = _taken({"mode": "exact"}, 1)
    snapshot.handle = object()  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="'handle'"):
        snapshot.dump(tmp_path / "snap.hwdump")
