"""The black box in-process: its decisions (Watch), the poll on a hand-built
cgroup, the dump and its header, the earlier process's black box, retention."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heapwatch import _core
from heapwatch.agent.config import AgentConfig, Threshold, parse_dump_at
from heapwatch.agent.interface import BlackBox
from heapwatch.formats.dump import DumpHeader, iter_dump, read_dump
from heapwatch.runtime.container import MemoryCgroup
from heapwatch.server import black_box as black_box_module
from heapwatch.server.black_box import (
    MIN_SPACING_SECONDS,
    REARM_MARGIN,
    TRIGGER,
    BlackBoxWatcher,
    Watch,
    black_box_note,
    find_previous_black_box,
)
from heapwatch.server.dumps import (
    BLACK_BOX_KIND,
    DumpService,
    dump_name,
    list_dump_entries,
    marker_path,
    prune_dumps,
    remove_stale_temporaries,
    write_dump_file,
)

MIB = 1 << 20
LIMIT = 100 * MIB
PERCENTS = parse_dump_at("90%,97%")


def test_the_highest_threshold_crossed_fires_once_per_rising_episode() -> None:
    watch = Watch(PERCENTS, LIMIT)
    assert watch.observe(0.0, 80 * MIB) is None
    # Both crossed at one look: one dump, for the highest
    assert watch.observe(1.0, 98 * MIB) == Threshold(percent=97.0)
    assert watch.observe(2.0, 99 * MIB) is None
    # Down, but not by the margin below either threshold: still disarmed
    assert watch.observe(3.0, 88 * MIB) is None
    assert watch.observe(4.0, 98 * MIB) is None
    # Below 90% less the margin: both armed again, and far enough apart in time
    assert watch.observe(5.0, (90 - REARM_MARGIN * 100 - 1) * MIB) is None
    assert watch.observe(5.0 + MIN_SPACING_SECONDS, 91 * MIB) == Threshold(percent=90.0)
    assert watch.observe(6.0 + MIN_SPACING_SECONDS, 97 * MIB) == Threshold(percent=97.0)


def test_a_threshold_rearmed_too_soon_waits_for_its_spacing() -> None:
    watch = Watch(parse_dump_at("50%"), LIMIT)
    assert watch.observe(0.0, 60 * MIB) == Threshold(percent=50.0)
    assert watch.observe(1.0, 10 * MIB) is None  # re-armed
    assert watch.observe(2.0, 60 * MIB) is None  # but fired 2 s ago
    assert watch.observe(3.0, 10 * MIB) is None
    assert watch.observe(MIN_SPACING_SECONDS + 1, 60 * MIB) == Threshold(percent=50.0)


def test_the_working_set_is_needed_only_from_the_lowest_armed_point() -> None:
    watch = Watch(parse_dump_at("90%,1GiB"), 2 << 30)
    # 90% of 2 GiB is above 1 GiB: 1 GiB is the lowest
    assert watch.needs_working_set_from() == 1 << 30
    watch.observe(0.0, int(1.5 * (1 << 30)))
    # 1 GiB fired: its re-arming point is now the lowest
    assert watch.needs_working_set_from() == (1 << 30) - int((2 << 30) * REARM_MARGIN)


def _v1_cgroup(root: Path, usage: int, inactive: int, limit: int = LIMIT) -> MemoryCgroup:
    root.mkdir(exist_ok=True)
    (root / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (root / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (root / "memory.stat").write_text(
        f"cache 0\nrss {usage}\ninactive_file {inactive}\ntotal_inactive_file {inactive}\n"
        f"hierarchical_memory_limit {limit}\n"
    )
    (root / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    return MemoryCgroup(1, str(root), (str(root),), None)


@pytest.fixture
def tracing() -> Iterator[None]:
    if _core.is_tracing():
        pytest.skip("something else is tracing")
    _core.start(1, "exact")
    try:
        yield
    finally:
        _core.stop()


class _Agent:
    """What the black box tells the agent."""

    def __init__(self) -> None:
        self.written: list[BlackBox] = []
        self.found: list[BlackBox] = []

    def black_box_written(self, box: BlackBox) -> None:
        self.written.append(box)

    def black_box_found(self, box: BlackBox) -> None:
        self.found.append(box)


def _watcher(
    tmp_path: Path, cgroup: MemoryCgroup, dump_at: str = "90%,97%", **config: Any
) -> tuple[BlackBoxWatcher, _Agent]:
    settings = AgentConfig().replace(dump_dir=str(tmp_path / "dumps"), dump_at=dump_at, **config)
    service = DumpService(settings)
    agent = _Agent()
    watcher = BlackBoxWatcher(
        service,
        cgroup,
        settings.dump_at,
        LIMIT,
        termination_log=settings.termination_log,
        agent=agent,  # type: ignore[arg-type]
    )
    return watcher, agent


HELD: list[bytes] = []


def test_a_crossing_writes_the_summary_then_a_black_box_that_says_why(
    tmp_path: Path, tracing: None
) -> None:
    HELD.append(b"x" * (3 * MIB))  # the line the box must blame
    line = _this_line() - 1
    summary = tmp_path / "termination-log"
    cgroup = _v1_cgroup(tmp_path / "cg", usage=95 * MIB, inactive=2 * MIB)
    watcher, agent = _watcher(tmp_path, cgroup, termination_log=str(summary))
    try:
        path = watcher.poll()
    finally:
        HELD.clear()
    assert path is not None and path.endswith(f"-{BLACK_BOX_KIND}.hwdump")
    header, traces = iter_dump(path)
    traces.close()  # type: ignore[attr-defined]
    extra = header.extra
    assert extra["trigger"] == TRIGGER
    assert (extra["threshold"], extra["working_set"], extra["limit"], extra["usage"]) == (
        "90%",
        str(93 * MIB),
        str(LIMIT),
        str(95 * MIB),
    )
    assert (extra["top_site_file"], extra["top_site_line"]) == (__file__, str(line))
    assert extra["process_start"]
    assert black_box_note(extra) == (
        "black box: written as the container's working set (93.0 MiB) crossed 90% of the "
        "memory limit (100.0 MiB)"
    )
    message = summary.read_text()
    assert f"{__file__}:{line}" in message
    assert f"dump: {path}" in message
    assert "crossed 90% of the memory limit (100.0 MiB)" in message
    assert [box.site for box in agent.written] == [(__file__, line)]
    # A second look at the same working set writes nothing more
    assert watcher.poll() is None
    assert len(list_dump_entries(str(tmp_path / "dumps"))) == 1


def _this_line() -> int:
    import inspect

    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def test_the_working_set_is_read_only_when_the_usage_could_cross(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tracing: None
) -> None:
    reads: list[int] = []
    real = black_box_module.read_working_set

    def counted(cgroup: MemoryCgroup, usage: int) -> int | None:
        reads.append(usage)
        return real(cgroup, usage)

    monkeypatch.setattr(black_box_module, "read_working_set", counted)
    root = tmp_path / "cg"
    cgroup = _v1_cgroup(root, usage=50 * MIB, inactive=0)
    watcher, _agent = _watcher(tmp_path, cgroup, termination_log=None)
    assert watcher.poll() is None
    assert reads == []
    # Usage over 90%, but most of it inactive file pages: no crossing
    _v1_cgroup(root, usage=95 * MIB, inactive=20 * MIB)
    assert watcher.poll() is None
    assert reads == [95 * MIB]
    dumps = tmp_path / "dumps"
    assert not dumps.exists() or list_dump_entries(str(dumps)) == []


def test_a_full_dump_directory_gets_one_line_and_no_partial_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tracing: None
) -> None:
    with _small_filesystem(tmp_path / "dumps", "size=64k") as directory:
        (directory / "filler").write_bytes(b"\0" * (60 << 10))
        HELD.extend(bytes(1000 + n) for n in range(5000))  # a dump of some size
        cgroup = _v1_cgroup(tmp_path / "cg", usage=99 * MIB, inactive=0)
        watcher, agent = _watcher(tmp_path, cgroup, dump_at="50%,90%", termination_log=None)
        caplog.set_level(logging.DEBUG, "heapwatch")
        try:
            with caplog.at_level(logging.WARNING, "heapwatch"):
                assert watcher.poll() is None
                assert watcher.write(Threshold(percent=50.0), 99 * MIB, None) is None
        finally:
            HELD.clear()
        assert sorted(p.name for p in directory.iterdir()) == ["filler"]
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(lines) == 1, lines
        assert "could not write the black box" in lines[0] and "No space left" in lines[0]
        assert agent.written == []


@contextlib.contextmanager
def _small_filesystem(path: Path, options: str) -> Iterator[Path]:
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        message = f"cannot mount a tmpfs here: {done.stderr.strip()}"
        if os.environ.get("HEAPWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(message + "; HEAPWATCH_REQUIRE_TOOLS=1 forbids skipping")
        pytest.skip(message)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_an_unwritable_dump_directory_is_reported_once_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _small_filesystem(tmp_path / "ro", "ro,size=64k") as directory:
        config = AgentConfig().replace(dump_dir=str(directory / "dumps"), dump_signal=None)
        with caplog.at_level(logging.WARNING, "heapwatch"):
            service = DumpService(config)
            service.start(_Agent())  # type: ignore[arg-type]
            service.shutdown(1.0)
            service = DumpService(config)
            service.start(_Agent())  # type: ignore[arg-type]
            service.shutdown(1.0)
    lines = [r.getMessage() for r in caplog.records if "HEAPWATCH_DUMP_DIR" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"{directory}, where it would be created, is not writable" in lines[0]


def _black_box_file(
    directory: Path, timestamp: float, pid: int, started: str, site: str = "app.py"
) -> str:
    extra = {
        "trigger": TRIGGER,
        "threshold": "97%",
        "working_set": str(97 * MIB),
        "limit": str(LIMIT),
        "process_start": started,
        "top_site_file": site,
        "top_site_line": "7",
        "top_site_bytes": str(60 * MIB),
    }
    header = DumpHeader("3.11.7", pid, timestamp, "sample", 524288, 64, extra)
    name = dump_name(timestamp, pid, 1, BLACK_BOX_KIND)
    return write_dump_file(str(directory), name, header, iter([(0, 60 * MIB, ((site, 7),), 1)]))


def test_the_newest_black_box_of_a_gone_process_is_found_once(tmp_path: Path) -> None:
    from heapwatch.runtime.procmem import process_start

    gone = "00000000-0000-0000-0000-000000000000:1"
    older = _black_box_file(tmp_path, 1_700_000_000.0, 4242, gone, "old.py")
    newest = _black_box_file(tmp_path, 1_700_000_100.0, 4243, gone, "new.py")
    # One of a process that lives (this one): not evidence of a kill
    _black_box_file(tmp_path, 1_700_000_200.0, os.getpid(), process_start() or "?", "mine.py")
    # One whose process exited cleanly
    clean = _black_box_file(tmp_path, 1_700_000_300.0, 4244, gone, "clean.py")
    Path(marker_path(str(tmp_path), Path(clean).name, "exited")).touch()
    box = find_previous_black_box(str(tmp_path))
    assert box is not None
    assert (box.path, box.pid, box.site, box.threshold) == (newest, 4243, ("new.py", 7), "97%")
    assert box.timestamp == 1_700_000_100.0
    for reported in (older, newest):
        assert os.path.exists(marker_path(str(tmp_path), Path(reported).name, "reported"))
    # The next restart does not report them again
    assert find_previous_black_box(str(tmp_path)) is None


def test_retention_keeps_the_newest_black_box_and_deletes_markers(tmp_path: Path) -> None:
    gone = "x:1"
    box = _black_box_file(tmp_path, 1_700_000_000.0, 7, gone)
    Path(marker_path(str(tmp_path), Path(box).name, "reported")).touch()
    older_box = _black_box_file(tmp_path, 1_699_999_000.0, 7, gone)
    Path(marker_path(str(tmp_path), Path(older_box).name, "reported")).touch()
    header = DumpHeader("3.11.7", 7, 0.0, "exact", 0, 1, {})
    names = [
        Path(
            write_dump_file(str(tmp_path), dump_name(1_700_000_100.0 + n, 7, n), header, iter([]))
        ).name
        for n in range(3)
    ]
    removed = prune_dumps(str(tmp_path), keep=2, max_bytes=0, protect=names[-1])
    kept = [entry.name for entry in list_dump_entries(str(tmp_path))]
    # The newest black box stays though it is among the oldest dumps
    assert Path(box).name in kept and names[-1] in kept
    assert Path(older_box).name in removed
    assert not os.path.exists(marker_path(str(tmp_path), Path(older_box).name, "reported"))
    assert os.path.exists(marker_path(str(tmp_path), Path(box).name, "reported"))
    assert read_dump(box).header.extra["trigger"] == TRIGGER


def test_temporaries_a_killed_process_left_go_once_stale(tmp_path: Path) -> None:
    stale = tmp_path / ".heapwatch-20261128T120000.000000Z-1-3-blackbox.hwdump.tmp"
    fresh = tmp_path / ".heapwatch-20261128T120100.000000Z-1-4.hwdump.tmp"
    other = tmp_path / ".mine.tmp"
    for path in (stale, fresh, other):
        path.write_bytes(b"partial")
    now = 1_800_000_000.0
    os.utime(stale, (now - 601, now - 601))
    os.utime(fresh, (now - 5, now - 5))
    os.utime(other, (now - 6000, now - 6000))
    assert remove_stale_temporaries(str(tmp_path), now) == [stale.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, other.name])


class _ViewOf(_Agent):
    """An agent as the dump service sees it, in a cgroup of the test's."""

    def __init__(self, cgroup: MemoryCgroup | None) -> None:
        super().__init__()
        from heapwatch.server.router import Router

        self.router = Router()
        self.cgroup = cgroup
        self.retain_last_snapshot = False

    def readings(self) -> None:
        return None


@pytest.mark.parametrize(
    ("settings", "cgroup_limit", "said"),
    [
        ({"dump_dir": None}, LIMIT, None),
        ({"dump_at": "none"}, LIMIT, None),
        ({}, None, "heapwatch's black box is off: no memory cgroup"),
        ({}, 0, "heapwatch's black box is off: the container has no memory limit"),
    ],
)
def test_the_black_box_is_off_without_a_directory_thresholds_or_a_limit(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    settings: dict[str, Any],
    cgroup_limit: int | None,
    said: str | None,
) -> None:
    from heapwatch.server.served_dumps import black_box_for

    cgroup = None
    if cgroup_limit is not None:
        cgroup = _v1_cgroup(tmp_path / "cg", 0, 0, limit=cgroup_limit or (1 << 63) - 4096)
    config = AgentConfig().replace(**{"dump_dir": str(tmp_path / "d"), **settings})
    with caplog.at_level(logging.INFO, "heapwatch"):
        assert black_box_for(DumpService(config), _ViewOf(cgroup)) is None  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records] == ([said] if said else [])


def test_a_size_beyond_the_limit_is_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from heapwatch.server.served_dumps import black_box_for

    cgroup = _v1_cgroup(tmp_path / "cg", 0, 0)
    config = AgentConfig().replace(dump_dir=str(tmp_path / "d"), dump_at="90%,1GiB")
    with caplog.at_level(logging.WARNING, "heapwatch"):
        watcher = black_box_for(DumpService(config), _ViewOf(cgroup))  # type: ignore[arg-type]
    assert watcher is not None and watcher.limit == LIMIT
    assert caplog.records[0].getMessage() == (
        f"HEAPWATCH_DUMP_AT=90%,1073741824B: 1073741824B is above the container's memory "
        f"limit ({LIMIT} bytes) and is never reached"
    )


def test_the_service_looks_back_once_and_a_forked_child_does_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from heapwatch.server.served_dumps import ServedDumpService

    gone = "00000000-0000-0000-0000-000000000000:1"
    first = _black_box_file(tmp_path, 1_700_000_000.0, 1, gone, "first.py")
    config = AgentConfig().replace(dump_dir=str(tmp_path), dump_signal=None)
    service = ServedDumpService(config)
    agent = _ViewOf(None)
    with caplog.at_level(logging.WARNING, "heapwatch"):
        service.start(agent)  # type: ignore[arg-type]
    assert [box.path for box in agent.found] == [first]
    said = [r.getMessage() for r in caplog.records if "found the black box" in r.getMessage()]
    assert said == [
        "heapwatch found the black box of pid 1, which did not exit cleanly (an OOM kill?): "
        "at 2023-11-14 22:13:20 UTC its working set crossed 97% of the memory limit "
        "(100.0 MiB); "
        f"top site first.py:7; {first}"
    ]
    # A box that appears later is not looked for by a forked child's start
    _black_box_file(tmp_path, 1_700_000_100.0, 2, gone, "second.py")
    service.after_fork_in_child()
    service.start(agent)  # type: ignore[arg-type]
    service.shutdown(1.0)
    assert [box.path for box in agent.found] == [first]
