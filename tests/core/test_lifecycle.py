"""start / stop / clear / reset_peak and their argument checks."""

from __future__ import annotations

from types import ModuleType

import pytest


def test_start_stop_and_is_tracing(core: ModuleType) -> None:
    assert not core.is_tracing()
    core.start()
    assert core.is_tracing()
    assert core.hooks_installed()
    core.stop()
    assert not core.is_tracing()
    assert not core.hooks_installed()
    assert core.get_traced_memory() == (0, 0)


def test_start_while_tracing_keeps_the_running_configuration(core: ModuleType) -> None:
    core.start(3, "exact")
    core.start(7, "sample", 4096)
    assert core.get_config() == {
        "tracing": True,
        "mode": "exact",
        "sample_interval": core.DEFAULT_SAMPLE_INTERVAL,
        "nframe": 3,
        "profile": "tracemalloc",
    }


def test_mode_and_interval_read_back(core: ModuleType) -> None:
    core.start(2, "sample", 65536)
    config = core.get_config()
    assert (config["mode"], config["sample_interval"], config["nframe"]) == ("sample", 65536, 2)
    assert core.get_traceback_limit() == 2
    assert core.take_snapshot().mode == "sample"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0,), r"the number of frames must be in range \[1; 65535\]"),
        ((65536,), r"the number of frames must be in range \[1; 65535\]"),
        ((1, "fast"), r"mode must be 'exact' or 'sample', got 'fast'"),
        ((1, "sample", 0), r"sample_interval must be in range \[1; \d+\] bytes, got 0"),
        ((1, "exact", 1, "agents"), r"profile must be 'tracemalloc' or 'agent', got 'agents'"),
    ],
)
def test_bad_arguments_name_the_value_and_what_is_allowed(
    core: ModuleType, args: tuple[object, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        core.start(*args[:3], **({"profile": args[3]} if len(args) > 3 else {}))
    assert not core.is_tracing()


def test_the_profile_is_a_keyword_and_a_str(core: ModuleType) -> None:
    with pytest.raises(TypeError):
        core.start(1, "exact", 1, "agent")
    with pytest.raises(TypeError):
        core.start(1, profile=1)
    assert not core.is_tracing()


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_the_profile_reads_back_and_a_restart_takes_a_new_one(core: ModuleType, mode: str) -> None:
    core.start(1, mode, profile="agent")
    assert core.get_config()["profile"] == "agent"
    core.stop()
    core.start(1, mode)
    assert core.get_config()["profile"] == "tracemalloc"


def test_a_start_while_tracing_raises_the_agents_profile_never_lowers_it(
    core: ModuleType,
) -> None:
    """The drop-in's start() over the agent's tracing gets the stdlib's
    semantics from then on; the agent's start() over the drop-in's tracing
    changes nothing."""
    core.start(3, "exact", profile="agent")
    core.start(7, "sample", 4096)
    assert core.get_config() == {
        "tracing": True,
        "mode": "exact",
        "sample_interval": core.DEFAULT_SAMPLE_INTERVAL,
        "nframe": 3,
        "profile": "tracemalloc",
    }
    core.start(3, "exact", profile="agent")
    assert core.get_config()["profile"] == "tracemalloc"


def test_clear_traces_keeps_tracing_and_forgets_everything(core: ModuleType) -> None:
    core.start()
    keep = [bytearray(1000) for _ in range(100)]
    assert core.get_traced_memory()[0] > 100_000
    core.clear_traces()
    assert core.is_tracing()
    assert core.get_traced_memory() == (0, 0)
    assert core.get_object_traceback(keep[0]) is None
    more = [bytearray(1000) for _ in range(10)]
    assert core.get_object_traceback(more[0]) is not None
    del keep


def test_reset_peak_sets_peak_to_current(core: ModuleType) -> None:
    core.start()
    big = bytearray(10_000_000)
    del big
    current, peak = core.get_traced_memory()
    assert peak >= current + 10_000_000
    core.reset_peak()
    current2, peak2 = core.get_traced_memory()
    assert peak2 >= current2
    assert peak2 < peak - 9_000_000


def test_snapshot_reset_peak_returns_the_old_peak_and_resets(core: ModuleType) -> None:
    core.start()
    big = bytearray(5_000_000)
    del big
    snapshot = core.take_snapshot(traces=False, reset_peak=True)
    assert snapshot.peak >= 5_000_000
    assert core.get_traced_memory()[1] < 5_000_000


def test_snapshot_requires_tracing(core: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="must be tracing"):
        core.take_snapshot()


def test_snapshot_outlives_clear_and_stop(core: ModuleType) -> None:
    core.start(3)
    data = [bytearray(500) for _ in range(50)]
    snapshot = core.take_snapshot()
    core.clear_traces()
    core.stop()
    stats = snapshot.group("traceback").statistics()
    assert any(size >= 25_000 for _frames, size, _count in stats)
    assert len(snapshot.traces()) == snapshot.ntraces
    del data


def test_traceback_limit_reads_back_when_not_tracing(core: ModuleType) -> None:
    core.start(9)
    core.stop()
    # As the stdlib: the last limit stays readable.
    assert core.get_traceback_limit() == 9
