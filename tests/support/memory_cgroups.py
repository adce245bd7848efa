"""A memory cgroup of the test's own, for a service the kernel may OOM-kill.

Made only under the memory cgroup the test runs in (``/proc/self/cgroup``),
never touching another, and removed afterwards.  cgroup v1 (this project's
machines) and v2 where the test's cgroup delegates the memory controller;
anything else skips, or fails under HEAPWATCH_REQUIRE_TOOLS=1 (make ci).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from heapwatch.runtime.container import find_memory_cgroup


class ChildCgroup(NamedTuple):
    path: Path
    version: int

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def command(self, *args: str) -> list[str]:
        """``args`` run inside this cgroup: a shell joins it, then becomes them."""
        join = 'echo $$ > "$1" && shift && exec "$@"'
        return ["sh", "-c", join, "sh", str(self.procs), *args]

    def oom_kills(self) -> int:
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise AssertionError(f"no oom_kill line in {self.path / name}")


def _unavailable(reason: str) -> None:
    message = f"no memory cgroup to make a child in: {reason}"
    if os.environ.get("HEAPWATCH_REQUIRE_TOOLS") == "1":
        pytest.fail(message + "; HEAPWATCH_REQUIRE_TOOLS=1 forbids skipping")
    pytest.skip(message)


@contextlib.contextmanager
def child_memory_cgroup(limit: int) -> Iterator[ChildCgroup]:
    """A new memory cgroup below this process's own, limited to ``limit``
    bytes without swap; removed at the end, once its processes are gone."""
    own = find_memory_cgroup()
    if own is None:
        _unavailable("this process is in none")
    assert own is not None
    path = Path(own.path) / f"heapwatch-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        _unavailable(f"cannot create {path}: {exc.strerror}")
    child = ChildCgroup(path, own.version)
    try:
        if own.version == 1:
            (path / "memory.limit_in_bytes").write_text(str(limit))
            # No swap: the kernel must kill at the limit, not page out.
            with contextlib.suppress(OSError):
                (path / "memory.swappiness").write_text("0")
        else:
            if not (path / "memory.max").exists():
                _unavailable(f"{own.path} does not delegate the memory controller")
            (path / "memory.max").write_text(str(limit))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
        yield child
    finally:
        _remove(child)


def _remove(child: ChildCgroup) -> None:
    deadline = time.monotonic() + 30
    while True:
        for pid in child.procs.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        try:
            child.path.rmdir()
            return
        except OSError:
            # A killed process leaves its cgroup a moment after its parent
            # has reaped it.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
