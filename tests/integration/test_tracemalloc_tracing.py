"""Tracing through heapwatch.tracemalloc: start, stop, clear_traces,
reset_peak, traced memory, object tracebacks and snapshots, against both
implementations where the behaviour is shared; heapwatch's sampling
extensions after."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc as stdlib_tm
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from heapwatch import _core
from heapwatch import tracemalloc as hw_tm

MIB = 1024 * 1024
HERE = __file__


def lineno_of(marker: str) -> int:
    """The line of this file that ends with the comment ``# <marker>``."""
    for number, line in enumerate(Path(HERE).read_text().splitlines(), 1):
        if line.rstrip().endswith("# " + marker):
            return number
    raise LookupError(marker)


def test_start_and_stop_switch_tracing(tm: ModuleType) -> None:
    assert not tm.is_tracing()
    tm.start()
    assert tm.is_tracing()
    tm.stop()
    assert not tm.is_tracing()
    tm.stop()  # stopping twice is harmless
    assert not tm.is_tracing()


def test_start_sets_the_traceback_limit_and_restarting_keeps_it(tm: ModuleType) -> None:
    tm.start(7)
    assert tm.get_traceback_limit() == 7
    tm.start(3)  # already tracing: the running configuration stays
    assert tm.get_traceback_limit() == 7
    tm.stop()
    tm.start()
    assert tm.get_traceback_limit() == 1


@pytest.mark.parametrize("nframe", [0, -1, 65536])
def test_start_refuses_a_frame_count_out_of_range(tm: ModuleType, nframe: int) -> None:
    with pytest.raises(ValueError, match=r"^the number of frames must be in range \[1; 65535\]$"):
        tm.start(nframe)
    assert not tm.is_tracing()


@pytest.mark.parametrize("nframe", ["2", 1.5, None])
def test_start_refuses_a_frame_count_that_is_no_integer(tm: ModuleType, nframe: object) -> None:
    message = "cannot be interpreted as an integer"
    if tm is stdlib_tm and sys.version_info < (3, 10):
        # 3.9's stdlib converts with _PyLong_AsInt, whose messages 3.10 replaced;
        # heapwatch gives the newer message on every version.
        message = r"an integer is required \(got type|integer argument expected, got float"
    with pytest.raises(TypeError, match=message):
        tm.start(nframe)


def test_traced_memory_is_zero_when_not_tracing(tm: ModuleType) -> None:
    assert tm.get_traced_memory() == (0, 0)
    tm.reset_peak()  # does nothing
    assert tm.get_traced_memory() == (0, 0)


def test_traced_memory_follows_allocations_and_the_peak_stays(tm: ModuleType) -> None:
    tm.start()
    before, _ = tm.get_traced_memory()
    block = bytearray(4 * MIB)
    during, peak_during = tm.get_traced_memory()
    del block
    after, peak_after = tm.get_traced_memory()
    assert during - before >= 4 * MIB
    assert peak_during >= during
    assert after < during - 3 * MIB
    assert peak_after >= during


def test_record_current_and_peak_as_in_the_spec_example(tm: ModuleType) -> None:
    tm.start()
    large_sum = sum(list(range(100000)))
    first_size, first_peak = tm.get_traced_memory()
    tm.reset_peak()
    small_sum = sum(list(range(1000)))
    second_size, second_peak = tm.get_traced_memory()
    assert (large_sum, small_sum) == (4999950000, 499500)
    assert first_peak > 100000 * 8  # the temporary list's array of pointers, at least
    assert first_size < first_peak / 10
    assert second_size <= second_peak < first_peak / 10


def test_reset_peak_sets_the_peak_to_the_current_size(tm: ModuleType) -> None:
    tm.start()
    block = bytearray(2 * MIB)
    del block
    current, peak = tm.get_traced_memory()
    assert peak >= current + 2 * MIB
    tm.reset_peak()
    current, peak = tm.get_traced_memory()
    assert current <= peak < current + MIB


def test_clear_traces_forgets_traces_and_keeps_tracing(tm: ModuleType) -> None:
    tm.start()
    block = bytearray(2 * MIB)
    assert tm.get_object_traceback(block) is not None
    tm.clear_traces()
    assert tm.is_tracing()
    assert tm.get_object_traceback(block) is None
    _current, peak = tm.get_traced_memory()
    assert peak < MIB
    del block


def test_take_snapshot_needs_tracing(tm: ModuleType) -> None:
    with pytest.raises(
        RuntimeError,
        match=r"^the tracemalloc module must be tracing memory allocations to take a snapshot$",
    ):
        tm.take_snapshot()


def test_get_object_traceback_names_the_allocating_line(tm: ModuleType) -> None:
    before = bytearray(100)
    tm.start(4)
    obj = bytearray(1000)  # malloc'd here: no free list
    traceback = tm.get_object_traceback(obj)
    assert isinstance(traceback, tm.Traceback)
    assert (traceback[-1].filename, traceback[-1].lineno) == (
        HERE,
        lineno_of("malloc'd here: no free list"),
    )
    assert 1 < len(traceback) <= 4
    assert traceback.total_nframe is None
    assert tm.get_object_traceback(before) is None
    tm.stop()
    assert tm.get_object_traceback(obj) is None


def test_get_tracemalloc_memory_measures_the_tracer(tm: ModuleType) -> None:
    tm.start()
    kept = [bytearray(10) for _ in range(1000)]
    assert tm.get_tracemalloc_memory() > 0
    assert isinstance(tm.get_tracemalloc_memory(), int)
    del kept


def test_a_snapshot_holds_the_traces_taken_and_outlives_stop(tm: ModuleType) -> None:
    tm.start(3)
    kept = [bytearray(5000) for _ in range(20)]  # twenty blocks
    snapshot = tm.take_snapshot()
    tm.stop()
    assert snapshot.traceback_limit == 3
    assert all(1 <= len(trace.traceback) <= 3 for trace in snapshot.traces)
    assert all(trace.traceback.total_nframe >= len(trace.traceback) for trace in snapshot.traces)
    line = snapshot.filter_traces([tm.Filter(True, HERE, lineno_of("twenty blocks"))])
    (stat,) = line.statistics("lineno")
    assert stat.count >= 20
    assert stat.size >= 20 * 5000
    assert str(stat).startswith(f"{HERE}:{lineno_of('twenty blocks')}: size=")
    del kept


def test_statistics_group_the_snapshot_traces(tm: ModuleType) -> None:
    tm.start(2)
    kept = [bytearray(3000) for _ in range(10)]
    snapshot = tm.take_snapshot()
    tm.stop()
    for key_type in ("filename", "lineno", "traceback"):
        stats = snapshot.statistics(key_type)
        assert sum(s.size for s in stats) == sum(t.size for t in snapshot.traces)
        assert sum(s.count for s in stats) == len(snapshot.traces)
        assert [s.size for s in stats] == sorted((s.size for s in stats), reverse=True)
    del kept


def test_compare_to_sees_what_was_allocated_between_snapshots(tm: ModuleType) -> None:
    tm.start()
    first = tm.take_snapshot()
    kept = [bytearray(7000) for _ in range(30)]  # between the snapshots
    second = tm.take_snapshot()
    tm.stop()
    diffs = second.filter_traces([tm.Filter(True, HERE)]).compare_to(
        first.filter_traces([tm.Filter(True, HERE)]), "lineno"
    )
    top = diffs[0]
    assert top.traceback[0].lineno == lineno_of("between the snapshots")
    assert top.size_diff >= 30 * 7000
    assert top.count_diff >= 30
    del kept


# ---- heapwatch only ------------------------------------------------------------


@pytest.fixture
def stopped() -> Iterator[None]:
    yield
    for module in (hw_tm, stdlib_tm):
        if module.is_tracing():
            module.stop()


def test_start_defaults_to_exact_mode(stopped: None) -> None:
    hw_tm.start()
    assert hw_tm.get_mode() == "exact"
    assert hw_tm.get_sample_interval() == _core.DEFAULT_SAMPLE_INTERVAL == 512 * 1024
    snapshot = hw_tm.take_snapshot()
    assert snapshot.mode == "exact"


def test_start_in_sample_mode_reads_back(stopped: None) -> None:
    hw_tm.start(2, mode="sample", sample_interval=4096)
    assert (hw_tm.get_mode(), hw_tm.get_sample_interval()) == ("sample", 4096)
    assert hw_tm.get_traceback_limit() == 2
    snapshot = hw_tm.take_snapshot()
    assert (snapshot.mode, snapshot.sample_interval, snapshot.traceback_limit) == (
        "sample",
        4096,
        2,
    )


def test_sample_mode_keeps_the_stdlibs_default_of_one_frame(stopped: None) -> None:
    # The agent's sample-mode default is deeper; the drop-in follows the
    # stdlib's start(nframe=1), whatever the mode.
    hw_tm.start(mode="sample")
    assert hw_tm.get_traceback_limit() == 1


def test_sample_mode_always_samples_blocks_far_above_the_interval(stopped: None) -> None:
    hw_tm.start(mode="sample", sample_interval=4096)
    block = bytes(4 * MIB)  # one block, sampled for sure
    traceback = hw_tm.get_object_traceback(block)
    assert traceback is not None
    assert traceback[-1].lineno == lineno_of("one block, sampled for sure")
    assert hw_tm.get_traced_memory()[0] >= 4 * MIB


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"mode": "fast"}, ValueError, r"^mode must be 'exact' or 'sample', got 'fast'$"),
        (
            {"mode": "sample", "sample_interval": 0},
            ValueError,
            r"^sample_interval must be in range \[1; 1099511627776\] bytes, got 0$",
        ),
        (
            {"mode": "sample", "sample_interval": 2**40 + 1},
            ValueError,
            r"^sample_interval must be in range \[1; 1099511627776\] bytes, got 1099511627777$",
        ),
        ({"mode": "sample", "sample_interval": 512.0}, TypeError, "cannot be interpreted"),
    ],
)
def test_start_refuses_bad_sampling_arguments(
    stopped: None, kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        hw_tm.start(**kwargs)  # type: ignore[arg-type]
    assert not hw_tm.is_tracing()


def test_start_refuses_to_run_under_the_stdlib_tracer(stopped: None) -> None:
    stdlib_tm.start()
    with pytest.raises(RuntimeError, match="stdlib tracemalloc module is tracing"):
        hw_tm.start()
    assert not hw_tm.is_tracing()


def test_dump_and_load_a_taken_snapshot(stopped: None, tmp_path: Path) -> None:
    pytest.importorskip("heapwatch.formats.dump")
    hw_tm.start(4, mode="sample", sample_interval=1024)
    kept = [bytearray(900) for _ in range(300)]
    snapshot = hw_tm.take_snapshot()
    hw_tm.stop()
    snapshot.dump(tmp_path / "taken.hw")
    loaded = hw_tm.Snapshot.load(tmp_path / "taken.hw")
    assert (loaded.mode, loaded.sample_interval, loaded.traceback_limit) == ("sample", 1024, 4)
    for key_type in ("traceback", "lineno"):
        assert [repr(s) for s in loaded.statistics(key_type)] == [
            repr(s) for s in snapshot.statistics(key_type)
        ]
    del kept


def test_importing_it_leaves_the_stdlib_tracemalloc_unimported() -> None:
    code = "import sys; from heapwatch import tracemalloc; print('tracemalloc' in sys.modules)"
    agent = str(Path(hw_tm.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": agent}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "False"
