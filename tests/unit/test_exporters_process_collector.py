"""heapwatch's ``process_*`` collector publishes what prometheus-client's
does, read through the core (no descriptor the service could see)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import ProcessCollector as ClientProcessCollector
from prometheus_client.metrics_core import Metric

from heapwatch_exporters.process_collector import ProcessCollector

NAMES = [
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_cpu_seconds",
    "process_open_fds",
    "process_max_fds",
]


def families(collector: object) -> dict[str, Metric]:
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    return {family.name: family for family in registry.collect()}


def value(family: Metric) -> float:
    (sample,) = family.samples
    return sample.value


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc")
def test_the_series_are_prometheus_clients() -> None:
    theirs = families(ClientProcessCollector(registry=None))
    ours = families(ProcessCollector())
    assert list(ours) == list(theirs) == NAMES
    for name in NAMES:
        assert (ours[name].type, ours[name].documentation, ours[name].unit) == (
            theirs[name].type,
            theirs[name].documentation,
            theirs[name].unit,
        ), name
        assert [s.name for s in ours[name].samples] == [s.name for s in theirs[name].samples]
    for name in ("process_start_time_seconds", "process_max_fds", "process_open_fds"):
        assert value(ours[name]) == value(theirs[name]), name
    assert value(ours["process_cpu_seconds"]) >= value(theirs["process_cpu_seconds"])
    for name in ("process_virtual_memory_bytes", "process_resident_memory_bytes"):
        assert abs(value(ours[name]) - value(theirs[name])) < 64 << 20, name


def fake_proc(root: Path, command: str = "my) service", fds: int = 5) -> Path:
    """A /proc of one process: boot at 1000 s, started 250 ticks after boot,
    1 + 5 ticks of CPU, 7 pages resident, 8192 bytes of address space."""
    me = root / "self"
    (me / "fd").mkdir(parents=True)
    (root / "stat").write_text("cpu  1 2 3 4\nintr 5\nbtime 1000\nprocesses 9\n")
    for fd in range(fds):
        (me / "fd" / str(fd)).write_text("")
    # proc(5)'s fields from the state on, 0-based: utime 11, stime 12,
    # starttime 19, vsize 20, rss 21
    after = ["S"] + ["0"] * 23
    after[11], after[12], after[19], after[20], after[21] = "1", "5", "250", "8192", "7"
    (me / "stat").write_text(f"42 ({command}) " + " ".join(after) + "\n")
    (me / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max open files            1024                 524288               files     \n"
    )
    return root


def test_a_hand_built_proc_gives_exact_values(tmp_path: Path) -> None:
    collected = families(ProcessCollector(proc=str(fake_proc(tmp_path))))
    ticks = os.sysconf("SC_CLK_TCK")
    assert {name: value(family) for name, family in collected.items()} == {
        "process_virtual_memory_bytes": 8192.0,
        "process_resident_memory_bytes": 7.0 * os.sysconf("SC_PAGE_SIZE"),
        "process_start_time_seconds": 1000 + 250 / ticks,
        # as prometheus-client sums them (6 / ticks differs in the last bit)
        "process_cpu_seconds": 1 / ticks + 5 / ticks,
        "process_open_fds": 5.0,
        "process_max_fds": 1024.0,
    }


def test_without_a_boot_time_nothing_is_published(tmp_path: Path) -> None:
    root = fake_proc(tmp_path)
    (root / "stat").write_text("cpu  1 2 3 4\n")
    assert families(ProcessCollector(proc=str(root))) == {}


def test_an_unreadable_part_leaves_out_only_its_series(tmp_path: Path) -> None:
    root = fake_proc(tmp_path)
    (root / "self" / "limits").unlink()
    assert list(families(ProcessCollector(proc=str(root)))) == NAMES[:4]
    root = fake_proc(tmp_path / "other")
    (root / "self" / "stat").unlink()
    assert list(families(ProcessCollector(proc=str(root)))) == NAMES[4:]
