"""The core's descriptor calls (descriptors.h): files read and connections
accepted with the GIL held, never left at a number the service closed."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest


def test_read_small_file_reads_up_to_its_limit(core: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"x" * 5000)
    assert core.read_small_file(str(path)) == b"x" * 4096
    assert core.read_small_file(path, 10) == b"x" * 10
    assert core.read_small_file(os.fsencode(path), core.SMALL_FILE_MAX) == b"x" * 5000
    assert core.read_small_file("/proc/self/statm").split()[1].isdigit()


def test_read_small_file_refuses_what_it_cannot_read_at_once(
    core: ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        core.read_small_file(str(tmp_path / "missing"))
    assert missing.value.filename == str(tmp_path / "missing")
    # A FIFO with no writer would block the GIL's holder: refused at once
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as not_regular:
        core.read_small_file(str(fifo))
    assert not_regular.value.errno == errno.EINVAL
    too_big = core.SMALL_FILE_MAX + 1
    with pytest.raises(ValueError, match=rf"limit must be from 0 to {too_big - 1}, got {too_big}"):
        core.read_small_file(str(fifo), too_big)


def test_count_dir_entries_counts_all_but_dot_and_dot_dot(core: ModuleType, tmp_path: Path) -> None:
    for name in ("a", "b", ".hidden"):
        (tmp_path / name).write_text("")
    assert core.count_dir_entries(str(tmp_path)) == 3
    with pytest.raises(NotADirectoryError):
        core.count_dir_entries(str(tmp_path / "a"))


def test_accept_wants_a_non_blocking_socket_and_never_waits(core: ModuleType) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        with pytest.raises(ValueError, match="must be non-blocking"):
            core.accept(server.fileno())
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            core.accept(server)
        with socket.create_connection(server.getsockname()) as client:
            fd = core.accept(server)
            with socket.socket(fileno=fd) as conn:
                assert conn.getpeername() == client.getsockname()
                assert not os.get_inheritable(fd)


def test_open_file_opens_close_on_exec_and_blocking_as_asked(
    core: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "out"
    fd = core.open_file(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        assert fd >= 3
        assert not os.get_inheritable(fd)
        # O_NONBLOCK is only for the open itself (a FIFO must not block it)
        assert os.get_blocking(fd)
        os.write(fd, b"abc")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abc"
    assert path.stat().st_mode & 0o777 == 0o640 & ~_umask()
    with pytest.raises(FileExistsError) as exists:
        core.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert exists.value.filename == path
    with pytest.raises(TypeError):
        core.open_file(str(path), "w")


def test_open_file_does_not_block_on_a_fifo_without_a_reader(
    core: ModuleType, tmp_path: Path
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A plain open() for writing would wait for a reader, the GIL held
    with pytest.raises(OSError) as no_reader:
        core.open_file(str(fifo), os.O_WRONLY)
    assert no_reader.value.errno == errno.ENXIO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# With stdin and stdout closed, as a service has them for a moment, the
# lowest free numbers are 0 and 1: the connection must not take them.
CLOSED_STANDARD = textwrap.dedent(
    """\
    import json, os, socket
    from heapwatch import _core

    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    client = socket.create_connection(server.getsockname())
    os.close(0)
    os.close(1)
    fd = _core.accept(server)
    free = []
    for low in (0, 1):
        try:
            os.fstat(low)
        except OSError:
            free.append(low)
    data = _core.read_small_file("/proc/self/statm")
    opened = _core.open_file("/dev/null", os.O_WRONLY)
    os.write(2, json.dumps([fd, opened, free, len(data) > 0]).encode())
    """
)


def test_accept_and_read_leave_the_closed_standard_numbers_free(core: ModuleType) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CLOSED_STANDARD],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    fd, opened, free, read = json.loads(done.stderr)
    assert fd >= 3
    assert opened >= 3
    assert (free, read) == ([0, 1], True)
