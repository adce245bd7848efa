"""Dump files: names, atomic writes, retention, batching, and the dump signal in-process."""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import heapwatch.formats.dump as dump_format
from heapwatch.agent.agent import Agent
from heapwatch.agent.config import DEFAULTS, AgentConfig
from heapwatch.formats.dump import DumpHeader, read_dump
from heapwatch.runtime.procmem import ProcessMemory
from heapwatch.runtime.threads import own_threads
from heapwatch.server.dumps import (
    DumpService,
    dump_header,
    dump_name,
    iter_traces,
    list_dumps,
    prune_dumps,
    write_dump_file,
)
from support.agent_model import ModelSource
from support.waiting import wait_for

HEADER = DumpHeader("3.11.7", 42, 1_700_000_000.5, "exact", 0, 1, {})
TRACES = [(0, 100, (("app.py", 3),), 1), (0, 50, (("app.py", 4),), 1)]


class FakeSnapshot:
    """What DumpService reads of a core snapshot, from raw traces."""

    def __init__(
        self,
        traces: list[Any],
        mode: str = "exact",
        sample_interval: int = 0,
        ages: list[int] | None = None,
        epoch: int = 0,
    ) -> None:
        self._traces = traces
        self._ages = [0] * len(traces) if ages is None else ages
        self.epoch = epoch
        self.mode = mode
        self.sample_interval = sample_interval
        self.traceback_limit = 1
        self.traced = sum(t[1] for t in traces)
        self.peak = self.traced
        self.blocks = len(traces)
        self.ntraces = len(traces)
        keys = list(dict.fromkeys((t[0], t[2], t[3]) for t in traces))
        self._index = {key: i for i, key in enumerate(keys)}
        self.passes = 0

    def routes(self) -> list[int]:
        """As the core: the route of each traceback (none here: 0)."""
        return [0] * len(self._index)

    def tracebacks(self) -> list[tuple[Any, ...]]:
        rows = []
        for domain, frames, total in self._index:
            mine = [t for t in self._traces if (t[0], t[2], t[3]) == (domain, frames, total)]
            rows.append((domain, frames, total, sum(t[1] for t in mine), len(mine)))
        return rows

    def traces(self, mask: bytes | None = None, ages: bool = False) -> list[Any]:
        self.passes += 1
        return [
            (*t, age) if ages else t
            for t, age in zip(self._traces, self._ages)
            if mask is None or mask[self._index[t[0], t[2], t[3]]]
        ]


class FakeSource:
    def __init__(self, traces: list[Any] = TRACES) -> None:
        self.traces = traces
        self.fail: Exception | None = None

    def snapshot(self, traces: bool) -> FakeSnapshot:
        if self.fail is not None:
            raise self.fail
        return FakeSnapshot(self.traces)


def test_dump_names_sort_by_time_and_say_which_process() -> None:
    name = dump_name(1_700_000_000.123456, 4242, 7)
    assert name == "heapwatch-20231114T221320.123456Z-4242-7.hwdump"
    assert dump_name(1_700_000_000.999999, 1, 1) < dump_name(1_700_000_001.0, 1, 1)


def test_a_dump_header_carries_the_memory_heapwatch_cannot_attribute() -> None:
    # given a process of 1 MB resident, 150 traced bytes, a 4 KiB tracer
    snap = FakeSnapshot(TRACES)
    memory = ProcessMemory(resident=1_000_000, native_in_use=600_000, native_retained=300_000)
    # when a dump header is made
    header = dump_header(
        snap,  # type: ignore[arg-type]
        trigger="test",
        clock=lambda: 1.0,
        memory=lambda: memory,
        tracer_memory=lambda: 4096,
    )
    # then it carries them, untraced being what the rest leaves of resident
    assert {key: header.extra[key] for key in list(header.extra)[-5:]} == {
        "tracer_memory": "4096",
        "resident": "1000000",
        "untraced": str(1_000_000 - 150 - 4096),
        "native_heap_in_use": "600000",
        "native_heap_retained": "300000",
    }
    # and leaves out what the process cannot read
    unknown = ProcessMemory(resident=None, native_in_use=None, native_retained=None)
    header = dump_header(
        snap,  # type: ignore[arg-type]
        trigger="test",
        memory=lambda: unknown,
        tracer_memory=lambda: 4096,
    )
    assert not {"resident", "untraced", "native_heap_in_use"} & set(header.extra)
    assert header.extra["tracer_memory"] == "4096"


def test_a_dump_file_appears_whole_with_private_permissions(tmp_path: Path) -> None:
    directory = tmp_path / "new" / "dumps"
    path = write_dump_file(str(directory), "heapwatch-x.hwdump", HEADER, iter(TRACES))
    assert path == str(directory / "heapwatch-x.hwdump")
    assert read_dump(path).traces == TRACES
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(directory).st_mode & 0o777 == 0o700
    assert os.listdir(directory) == ["heapwatch-x.hwdump"]


def test_a_failed_write_leaves_no_file_at_all(tmp_path: Path) -> None:
    def failing() -> Iterator[Any]:
        yield TRACES[0]
        # the temporary file exists now, hidden, under another name
        (hidden,) = os.listdir(tmp_path)
        assert hidden.startswith(".") and hidden.endswith(".tmp")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_dump_file(str(tmp_path), "heapwatch-x.hwdump", HEADER, failing())
    assert os.listdir(tmp_path) == []


def test_a_failed_dump_keeps_neither_its_snapshot_nor_its_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a dump directory whose disk fills up once the first traces are written
    snaps: list[weakref.ref[FakeSnapshot]] = []

    class Source:
        def snapshot(self, traces: bool) -> FakeSnapshot:
            snap = FakeSnapshot(TRACES)
            snaps.append(weakref.ref(snap))
            return snap

    def full_disk(fp: Any, header: DumpHeader, traces: Iterator[Any], **_: object) -> None:
        next(iter(traces))
        raise OSError(errno.ENOSPC, "No space left on device")

    # (the dump service imports the writer when it dumps, from its package)
    monkeypatch.setattr(dump_format, "write_dump", full_disk)
    service = DumpService(DEFAULTS.replace(dump_dir=str(tmp_path)), source=Source())
    # When a dump fails
    with pytest.raises(OSError, match="No space") as failure:
        service.dump_to_directory()
    # Then, while its exception lives on (a handler, a log record's exc_info),
    # its frames keep neither the snapshot nor a suspended batch of traces
    assert failure.value.__traceback__ is not None
    assert snaps[0]() is None
    assert os.listdir(tmp_path) == []


def make_dumps(directory: Path, count: int, size: int = 10) -> list[str]:
    names = [dump_name(1_700_000_000 + i, 100 + i % 2, i) for i in range(count)]
    for name in reversed(names):  # creation order must not matter: the name's time does
        (directory / name).write_bytes(b"x" * size)
    return names


def test_retention_keeps_the_newest_dumps_and_touches_nothing_else(tmp_path: Path) -> None:
    names = make_dumps(tmp_path, 5)
    others = [
        "notes.txt",
        "heapwatch-latest.hwdump",
        ".heapwatch-20231114T221320.000000Z-1-1.hwdump.tmp",
        names[0] + ".bak",
    ]
    for other in others:
        (tmp_path / other).write_text("mine")
    os.symlink(tmp_path / "notes.txt", tmp_path / dump_name(1_600_000_000, 1, 1))
    removed = prune_dumps(str(tmp_path), keep=2, max_bytes=0, protect=names[-1])
    assert removed == names[:3]
    assert [name for name, _ in list_dumps(str(tmp_path))] == names[3:]
    for other in others:
        assert (tmp_path / other).read_text() == "mine"
    assert (tmp_path / dump_name(1_600_000_000, 1, 1)).is_symlink()


def test_retention_by_bytes_never_deletes_the_dump_just_written(tmp_path: Path) -> None:
    names = make_dumps(tmp_path, 4, size=100)
    assert prune_dumps(str(tmp_path), keep=0, max_bytes=250, protect=names[-1]) == names[:2]
    # one dump bigger than the limit: it stays, it is the one just written
    assert prune_dumps(str(tmp_path), keep=0, max_bytes=50, protect=names[-1]) == [names[2]]
    assert [name for name, _ in list_dumps(str(tmp_path))] == [names[3]]
    assert prune_dumps(str(tmp_path), keep=0, max_bytes=0) == []


def test_traces_are_built_a_batch_of_tracebacks_at_a_time() -> None:
    traces = [(0, i, ((f"f{i % 7}.py", i % 3),), 1) for i in range(100)]
    ages = [i % 5 for i in range(100)]
    snap = FakeSnapshot(traces, ages=ages, epoch=9)
    aged = list(zip(traces, ages))
    assert sorted(iter_traces(snap, batch=10)) == sorted(aged)  # type: ignore[arg-type]
    assert snap.passes > 1
    small = FakeSnapshot(traces, ages=ages, epoch=9)
    # in one batch: by age, else in the core's order
    by_age = sorted(aged, key=lambda pair: pair[1])
    assert list(iter_traces(small, batch=1000)) == by_age  # type: ignore[arg-type]
    assert small.passes == 1


@pytest.fixture
def restore_usr2() -> Iterator[None]:
    before = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, before)


def agent_with(service: DumpService, config: AgentConfig) -> Agent:
    agent = Agent(config, source=ModelSource(), exporters=[service])
    assert agent.start()
    return agent


def wait_for_dumps(directory: Path, count: int) -> list[str]:
    def names() -> list[str]:
        found = [name for name, _ in list_dumps(str(directory))] if directory.exists() else []
        return found if len(found) >= count else []

    return wait_for(names, 20, 0.02, what=f"{count} dumps in {directory}")


@pytest.mark.usefixtures("restore_usr2")
def test_the_signal_writes_a_dump_from_a_worker_thread(tmp_path: Path) -> None:
    # Given a service with a dump directory
    config = DEFAULTS.replace(port=0, interval=3600, exporters=(), dump_dir=str(tmp_path))
    service = DumpService(config, source=FakeSource())
    agent = agent_with(service, config)
    try:
        assert signal.getsignal(signal.SIGUSR2) == service._handler
        assert [t for t in own_threads() if t.name == "heapwatch-dump"]
        # When the process gets SIGUSR2
        os.kill(os.getpid(), signal.SIGUSR2)
        # Then a dump of the traces appears
        (name,) = wait_for_dumps(tmp_path, 1)
        dump = read_dump(tmp_path / name)
        assert dump.traces == TRACES
        assert dump.header.pid == os.getpid()
        assert dump.header.extra["trigger"] == "signal"
    finally:
        agent.stop()
    # and stopping puts the default disposition back
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    assert not [t for t in own_threads() if t.name == "heapwatch-dump"]


@pytest.mark.usefixtures("restore_usr2")
def test_a_failing_dump_is_logged_and_the_next_one_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = DEFAULTS.replace(exporters=(), dump_dir=str(tmp_path), interval=3600)
    source = FakeSource()
    source.fail = RuntimeError("the tracemalloc module must be tracing")
    service = DumpService(config, source=source)
    agent = agent_with(service, config)
    try:
        with caplog.at_level(logging.ERROR, logger="heapwatch.dumps"):
            os.kill(os.getpid(), signal.SIGUSR2)
            deadline = time.monotonic() + 20
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.02)
        assert "could not write a dump" in caplog.records[0].getMessage()
        source.fail = None
        os.kill(os.getpid(), signal.SIGUSR2)
        wait_for_dumps(tmp_path, 1)
    finally:
        agent.stop()


@pytest.mark.usefixtures("restore_usr2")
def test_an_application_handler_is_left_alone_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def mine(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGUSR2, mine)
    config = DEFAULTS.replace(exporters=(), dump_dir=str(tmp_path), interval=3600)
    with caplog.at_level(logging.WARNING, logger="heapwatch.dumps"):
        agent = agent_with(DumpService(config, source=FakeSource()), config)
    try:
        assert signal.getsignal(signal.SIGUSR2) is mine
        message = caplog.records[0].getMessage()
        assert "does not handle SIGUSR2: the application handles it already" in message
        assert "HEAPWATCH_DUMP_SIGNAL" in message
    finally:
        agent.stop()
    assert signal.getsignal(signal.SIGUSR2) is mine


@pytest.mark.usefixtures("restore_usr2")
def test_without_a_dump_dir_the_signal_no_longer_kills_and_says_what_to_set() -> None:
    # Its default action would end the service: heapwatch takes it, to log a line.
    config = DEFAULTS.replace(exporters=(), interval=3600)
    service = DumpService(config, source=FakeSource())
    agent = agent_with(service, config)
    try:
        assert signal.getsignal(signal.SIGUSR2) == service._on_signal
        # and adds no thread, no pipe: nothing to wake up
        assert not [t for t in own_threads() if t.name == "heapwatch-dump"]
        assert service._wake is None
        # and with neither a token nor another route, no port is opened for /debug/
        assert agent.address is None
    finally:
        agent.stop()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_without_a_dump_dir_a_signal_handled_or_ignored_is_left_alone() -> None:
    config = DEFAULTS.replace(exporters=(), interval=3600)
    for disposition in (signal.SIG_IGN, lambda signum, frame: None):
        previous = signal.signal(signal.SIGUSR2, disposition)
        try:
            agent = agent_with(DumpService(config, source=FakeSource()), config)
            try:
                assert signal.getsignal(signal.SIGUSR2) is disposition
            finally:
                agent.stop()
        finally:
            signal.signal(signal.SIGUSR2, previous)


def test_dump_to_directory_without_a_directory_says_what_to_set() -> None:
    with pytest.raises(RuntimeError, match="HEAPWATCH_DUMP_DIR"):
        DumpService(DEFAULTS, source=FakeSource()).dump_to_directory()


def test_dump_to_directory_applies_the_retention(tmp_path: Path) -> None:
    config = DEFAULTS.replace(dump_dir=str(tmp_path), dump_keep=2)
    clock = iter(1_700_000_000.0 + i for i in range(10))
    service = DumpService(config, source=FakeSource(), clock=lambda: next(clock))
    paths = [service.dump_to_directory("test") for _ in range(4)]
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(p) for p in paths[2:]]
    assert all(read_dump(p).header.extra["trigger"] == "test" for p in paths[2:])
