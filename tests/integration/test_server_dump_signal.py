"""The dump signal in a real service process: os.kill, atomic files, retention, fork."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from heapwatch import tracemalloc as hw_tm
from heapwatch.formats.dump import DumpError, read_dump
from heapwatch.server.dumps import list_dumps
from support.agent_process import clean_env, python_path
from support.waiting import wait_for

SERVICE = textwrap.dedent(
    """\
    import os, signal, sys, time


    def say(*words):
        # One write(2) of a line: atomic on a pipe, so the lines of a parent
        # and its forked child never interleave (print() may write a line in
        # pieces: "READYCHILD 13408" was seen on 3.13).
        os.write(1, (" ".join(map(str, words)) + "\\n").encode())


    if os.environ.get("APP_HANDLER"):
        signal.signal(signal.SIGUSR2, lambda *_: say("APP"))
    if os.environ.get("APP_IGNORES"):
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    import heapwatch

    assert heapwatch.start_agent() is not None
    leak = []


    # 5 MB: well above the code objects that imports load once tracing runs
    # (about 1 MB on 3.9, the first to outgrow a 1 MB leak).
    def grow():
        leak.append(bytearray(100_000))  # LEAK


    for _ in range(50):
        grow()
    if os.environ.get("FORK") and os.fork() == 0:
        say("CHILD", os.getpid())
    else:
        say("READY", os.getpid())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.01)
    """
)
LEAK_LINE = next(i for i, line in enumerate(SERVICE.splitlines(), 1) if "# LEAK" in line)


class Service:
    def __init__(self, proc: subprocess.Popen[bytes], dump_dir: Path, stderr: Path) -> None:
        self.proc = proc
        self.dump_dir = dump_dir
        self.stderr_path = stderr
        self.pids: list[int] = []
        self._lines: list[str] = []
        self._pending = b""

    def line(self, prefix: str, timeout: float = 60) -> str:
        """The first line of stdout starting with prefix (parent and child share it)."""
        assert self.proc.stdout is not None
        # The pipe's descriptor is read directly: a buffered readline() may
        # take the parent's and the child's lines in one read, and select()
        # then waits on an empty pipe for a line already in the buffer.
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for text in self._lines:
                if text.startswith(prefix):
                    self._lines.remove(text)
                    return text
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                self._pending += chunk
                *lines, self._pending = self._pending.split(b"\n")
                self._lines.extend(line.decode().strip() for line in lines)
        raise AssertionError(f"no {prefix!r} line; stderr: {self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def dumps(self) -> list[str]:
        if not self.dump_dir.is_dir():
            return []
        return [name for name, _ in list_dumps(str(self.dump_dir))]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    running: list[Service] = []

    def start(dump_dir: Path | None = None, **env: str) -> Service:
        script = tmp_path / "service.py"
        script.write_text(SERVICE)
        directory = dump_dir if dump_dir is not None else tmp_path / "dumps"
        variables = {
            "PYTHONPATH": python_path(),
            "HEAPWATCH_EXPORTERS": "none",
            "HEAPWATCH_MODE": "exact",
            "HEAPWATCH_INTERVAL": "3600",
            "HEAPWATCH_DUMP_DIR": str(directory),
            **env,
        }
        stderr = tmp_path / f"stderr-{len(running)}.txt"
        with stderr.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, str(script)],
                env=clean_env(**variables),
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        started = Service(proc, directory, stderr)
        running.append(started)
        return started

    yield start
    for started in running:
        for pid in started.pids:  # forked children the test was told about
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if started.proc.poll() is None:
            started.proc.kill()
        started.proc.wait(30)
        if started.proc.stdout is not None:
            started.proc.stdout.close()


def test_each_signal_writes_a_whole_dump_and_old_ones_are_deleted(
    service: Callable[..., Service],
) -> None:
    # Given a service keeping 2 dumps, and files of its own in the dump directory
    svc = service(HEAPWATCH_DUMP_KEEP="2")
    pid = int(svc.line("READY").split()[1])
    mine = ["notes.txt", "heapwatch-keep.hwdump"]
    svc.dump_dir.mkdir(exist_ok=True)
    for name in mine:
        (svc.dump_dir / name).write_text("not a dump")
    # and a reader that reads every dump as soon as it is listed
    seen: set[str] = set()
    problems: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for name in os.listdir(svc.dump_dir):
                if name in mine or name.startswith("."):
                    continue
                try:
                    read_dump(svc.dump_dir / name)
                except FileNotFoundError:
                    continue  # deleted by the retention meanwhile
                except DumpError as exc:
                    problems.append(f"{name}: {exc}")
                seen.add(name)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # When it gets SIGUSR2 four times
        for count in range(1, 5):
            os.kill(pid, signal.SIGUSR2)
            wait_for(lambda count=count: len(seen) >= count, 60, 0.02)
    finally:
        stop.set()
        watcher.join()
    # Then no reader ever saw a partial dump, the two newest remain, the rest is untouched
    assert problems == []
    assert len(seen) == 4
    assert svc.dumps() == sorted(seen)[2:]
    for name in mine:
        assert (svc.dump_dir / name).read_text() == "not a dump"
    assert not [n for n in os.listdir(svc.dump_dir) if n.endswith(".tmp")]
    # and the dump is this process's, with its leak
    newest = svc.dump_dir / svc.dumps()[-1]
    dump = read_dump(newest)
    assert (dump.header.pid, dump.header.extra["trigger"]) == (pid, "signal")
    assert svc.dumps()[-1].startswith("heapwatch-") and f"-{pid}-4.hwdump" in svc.dumps()[-1]
    top = hw_tm.Snapshot.load(newest).statistics("lineno")[0]
    assert top.traceback[0].lineno == LEAK_LINE
    assert top.size >= 50 * 100_000
    assert svc.proc.poll() is None


def test_the_byte_limit_keeps_only_what_fits(service: Callable[..., Service]) -> None:
    svc = service(HEAPWATCH_DUMP_KEEP="0", HEAPWATCH_DUMP_MAX_BYTES="1")
    pid = int(svc.line("READY").split()[1])
    os.kill(pid, signal.SIGUSR2)
    wait_for(lambda: len(svc.dumps()) == 1, 60, 0.02)
    first = svc.dumps()
    os.kill(pid, signal.SIGUSR2)
    # the newest dump is kept even alone over the limit; the older one goes
    wait_for(lambda: len(svc.dumps()) == 1 and svc.dumps() != first, 60, 0.02)


def test_a_forked_child_dumps_itself_on_its_own_signal(service: Callable[..., Service]) -> None:
    svc = service(FORK="1")
    parent = int(svc.line("READY").split()[1])
    child = int(svc.line("CHILD").split()[1])
    svc.pids.append(child)
    os.kill(child, signal.SIGUSR2)
    wait_for(lambda: len(svc.dumps()) == 1, 60, 0.02)
    (name,) = svc.dumps()
    assert f"-{child}-" in name
    assert read_dump(svc.dump_dir / name).header.pid == child
    os.kill(parent, signal.SIGUSR2)
    wait_for(lambda: len(svc.dumps()) == 2, 60, 0.02)
    assert any(f"-{parent}-" in n for n in svc.dumps())


def test_an_application_handler_keeps_the_signal(service: Callable[..., Service]) -> None:
    svc = service(APP_HANDLER="1")
    pid = int(svc.line("READY").split()[1])
    os.kill(pid, signal.SIGUSR2)
    assert svc.line("APP") == "APP"
    assert "does not handle SIGUSR2: the application handles it already" in svc.stderr()
    assert svc.dumps() == []
    assert svc.proc.poll() is None


def test_a_failing_dump_is_one_line_and_the_service_runs_on(
    service: Callable[..., Service], tmp_path: Path
) -> None:
    # Given a dump directory that cannot be made (a file is in the way)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    svc = service(dump_dir=blocker / "dumps")
    pid = int(svc.line("READY").split()[1])
    # When the signal comes, twice
    os.kill(pid, signal.SIGUSR2)
    wait_for(lambda: "heapwatch could not write a dump into" in svc.stderr(), 60, 0.02)
    os.kill(pid, signal.SIGUSR2)
    time.sleep(0.5)
    # Then one line says why, once (the same problem is not repeated), no traceback
    assert svc.stderr().count("heapwatch could not write a dump into") == 1, svc.stderr()
    assert f"{blocker / 'dumps'}: Not a directory" in svc.stderr()
    assert "Traceback" not in svc.stderr()
    assert svc.proc.poll() is None
    # and the next signal tries again: with the file gone, it writes the dump
    blocker.unlink()
    os.kill(pid, signal.SIGUSR2)
    wait_for(lambda: len(svc.dumps()) == 1, 60, 0.02)
    assert svc.proc.poll() is None


def test_a_dump_directory_that_is_a_file_is_named_as_such(
    service: Callable[..., Service], tmp_path: Path
) -> None:
    not_a_dir = tmp_path / "dumps.txt"
    not_a_dir.write_text("")
    svc = service(dump_dir=not_a_dir)
    pid = int(svc.line("READY").split()[1])
    os.kill(pid, signal.SIGUSR2)
    wait_for(lambda: "heapwatch could not write a dump into" in svc.stderr(), 60, 0.02)
    stderr = svc.stderr()
    # said at start, and on the signal, in words, not as FileExistsError
    assert f"HEAPWATCH_DUMP_DIR={not_a_dir} exists and is not a directory" in stderr
    assert f"{not_a_dir}: exists and is not a directory" in stderr
    assert "Errno" not in stderr and "Traceback" not in stderr
    assert svc.proc.poll() is None


def test_without_a_dump_directory_the_signal_is_one_line_never_a_death(
    service: Callable[..., Service],
) -> None:
    # Given a service with the agent on and no HEAPWATCH_DUMP_DIR
    svc = service(HEAPWATCH_DUMP_DIR="")
    pid = int(svc.line("READY").split()[1])
    # When it gets SIGUSR2, three times
    for _ in range(3):
        os.kill(pid, signal.SIGUSR2)
        time.sleep(0.2)
    wait_for(lambda: "HEAPWATCH_DUMP_DIR is not set" in svc.stderr(), 60, 0.02)
    time.sleep(0.3)
    # Then it runs on, and one line (not three) says what to set
    assert svc.proc.poll() is None
    lines = svc.stderr().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == (
        "heapwatch got SIGUSR2 and writes no dump: HEAPWATCH_DUMP_DIR is not set (set it to "
        "a directory, or use GET /debug/heapwatch/snapshot)"
    )
    assert svc.dumps() == []


def test_without_a_dump_directory_an_ignored_signal_stays_ignored(
    service: Callable[..., Service],
) -> None:
    svc = service(HEAPWATCH_DUMP_DIR="", APP_IGNORES="1")
    pid = int(svc.line("READY").split()[1])
    os.kill(pid, signal.SIGUSR2)
    time.sleep(0.5)
    assert svc.proc.poll() is None
    assert svc.stderr() == ""
