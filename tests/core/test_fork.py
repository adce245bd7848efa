"""fork(): the child keeps tracing with a consistent state."""

from __future__ import annotations

import os
import threading
from types import ModuleType

import pytest


def _in_child(body: str, namespace: dict[str, object]) -> int:
    """Runs body in a forked child; returns its exit status (0 = assertions held)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            exec(body, {**globals(), **namespace})
            code = 0
        except BaseException:  # report any failure through the status
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_child_keeps_tracing_with_the_parents_traces(core: ModuleType) -> None:
    core.start(3)
    inherited = [bytearray(2222) for _ in range(10)]
    stop = threading.Event()
    # A thread allocating at fork time: the child must not inherit a held lock.
    worker = threading.Thread(target=lambda: [bytearray(64) for _ in iter(stop.is_set, True)])
    worker.start()
    try:
        status = _in_child(
            "from heapwatch import _core\n"
            "assert _core.is_tracing()\n"
            "_core._check_invariants()\n"
            "assert _core.get_object_traceback(inherited[0]) is not None\n"
            "fresh = [bytearray(3333) for _ in range(5)]\n"
            "assert _core.get_object_traceback(fresh[0]) is not None\n"
            "del inherited[:]\n"
            "_core._check_invariants()\n",
            {"inherited": inherited},
        )
    finally:
        stop.set()
        worker.join()
    assert status == 0
    assert core.get_object_traceback(inherited[0]) is not None
    core._check_invariants()


def _sampled_indexes(core: ModuleType, blocks: list[bytearray]) -> list[int]:
    # Block i has a buffer of 4001 + i bytes: its sampled trace names it.
    sizes = {t[1] for t in core.take_snapshot().traces()}
    return [i for i in range(len(blocks)) if 4001 + i in sizes]


def test_child_samples_with_a_fresh_random_stream(core: ModuleType, tmp_path: object) -> None:
    core.start(1, "sample", 65536)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            blocks = [bytearray(4000 + i) for i in range(3000)]
            os.write(write_fd, repr(_sampled_indexes(core, blocks)).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    blocks = [bytearray(4000 + i) for i in range(3000)]
    mine = _sampled_indexes(core, blocks)
    with os.fdopen(read_fd) as pipe:
        child = eval(pipe.read())  # our own child's repr of a list of ints
    os.waitpid(pid, 0)
    # ~180 samples expected each; identical choices would mean a shared stream.
    assert 50 < len(mine) < 500 and 50 < len(child) < 500
    assert mine != child
