"""Interpreters with a GIL of their own allocate through the same
process-wide hooks: their blocks are traced without frames, and the core
never references nor releases their code objects (it did, and the process
died: free(): invalid size)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    from concurrent.futures import InterpreterPoolExecutor
    from heapwatch import _core

    _core.start(5, sys.argv[1])
    for _ in range(3):
        with InterpreterPoolExecutor(max_workers=4) as executor:
            code = "import struct; kept = [bytearray(100) for _ in range(2000)]"
            assert list(executor.map(exec, [code] * 8)) == [None] * 8
        _core.drain()
    _core._check_invariants()
    _core.take_snapshot().traces()
    _core.stop()
    print("ok")
    """
)


@pytest.mark.skipif(sys.version_info < (3, 14), reason="InterpreterPoolExecutor is new in 3.14")
@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_interpreters_with_their_own_gil_do_not_crash_the_process(mode: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
