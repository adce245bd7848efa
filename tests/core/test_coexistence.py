"""heapwatch and the stdlib tracer, started and stopped in every order.

Each scenario runs in a fresh interpreter: the allocator chain is process
state.  Orders that can be made safe work; those that cannot raise a clear
RuntimeError: heapwatch installing under a running stdlib tracer (which would
remove heapwatch's hooks on stop), and exact tracing asked of heapwatch's
sampling hooks while they are buried (they leave pymalloc's frees alone).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from support.sizes import BYTEARRAY_OVERHEAD

PRELUDE = textwrap.dedent(
    """
    import tracemalloc as S
    from heapwatch import _core as H

    def hw_sees(size=123457):
        # SMALL, a block pymalloc serves itself, is sampled through the fast
        # path of the hooks on top, through the slow path of buried exact ones.
        x = bytearray(size)
        return any(t[1] == size + OVERHEAD for t in H.take_snapshot().traces())
    SMALL = 300

    def std_sees():
        x = bytearray(123457)
        return any(t.size == 123457 + OVERHEAD for t in S.take_snapshot().traces)

    def allocator():
        import ctypes
        name = ctypes.pythonapi._PyMem_GetCurrentAllocatorName
        name.restype = ctypes.c_char_p
        return name()
    PLAIN_PYMALLOC = allocator() == b"pymalloc"   # as found before any hook
    """
)

SCENARIOS = {
    "hw, stdlib on top, stdlib stops, hw stops": """
        H.start(); S.start()
        assert hw_sees() and std_sees()
        S.stop(); assert hw_sees()
        H.stop(); assert not H.hooks_installed()
    """,
    "hw, stdlib on top, hw stops first, stdlib stops": """
        H.start(); S.start()
        H.stop()
        assert H.hooks_installed()   # buried under the stdlib's hooks: stays, passing through
        assert std_sees()
        S.stop()
        H.start(); assert hw_sees()  # restarting reuses the hooks already in the chain
        H.stop(); assert not H.hooks_installed()
    """,
    "hw stops under stdlib and restarts under it": """
        H.start(); S.start(); H.stop()
        H.start(); assert hw_sees() and std_sees()
        S.stop(); assert hw_sees()
        H.stop(); assert not H.hooks_installed()
    """,
    "stdlib first, then hw: refused": """
        S.start()
        try:
            H.start()
        except RuntimeError as exc:
            assert "tracemalloc.stop() first" in str(exc), exc
        else:
            raise AssertionError("H.start() under a running stdlib tracer must raise")
        assert not H.is_tracing() and std_sees()
        S.stop()
        H.start(); assert hw_sees(); H.stop()
    """,
    "stdlib before and after hw": """
        S.start(); assert std_sees(); S.stop()
        H.start(); assert hw_sees(); H.stop()
        S.start(); assert std_sees(); S.stop()
        assert not H.hooks_installed()
    """,
    "hw sampling, stdlib on top, stdlib stops, hw stops": """
        H.start(1, "sample", 1); assert hw_sees(SMALL); S.start()
        assert hw_sees() and hw_sees(SMALL) and std_sees()
        S.stop(); assert hw_sees() and hw_sees(SMALL)
        H.stop(); assert not H.hooks_installed()
    """,
    "hw sampling, buried under stdlib, restarts exact: refused above pymalloc": """
        H.start(1, "sample", 1); S.start(); H.stop()
        try:
            H.start(1, "exact")
        except RuntimeError as exc:
            assert PLAIN_PYMALLOC, exc   # only the sampling set leaves frees alone
            assert "stop that tracer first" in str(exc), exc
        else:
            assert not PLAIN_PYMALLOC, "exact tracing under buried sampling hooks must raise"
            assert hw_sees() and std_sees()
            H.stop()
        H.start(1, "sample", 1); assert hw_sees() and std_sees()
        S.stop(); H.stop()
        H.start(1, "exact"); assert hw_sees(); H.stop()
        assert not H.hooks_installed()
    """,
    "hw exact, stdlib on top, hw restarts sampling under it": """
        H.start(); S.start(); H.stop()
        H.start(1, "sample", 1); assert hw_sees() and hw_sees(SMALL) and std_sees()
        S.stop(); H.stop(); assert not H.hooks_installed()
    """,
    "interleaved many times": """
        for i in range(20):
            H.start(); S.start(); assert hw_sees() and std_sees()
            if i % 2: S.stop(); H.stop()
            else: H.stop(); S.stop()
        H.start(); assert hw_sees(); H.stop()
        assert not H.hooks_installed()
    """,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_coexistence_order(name: str) -> None:
    code = (
        f"OVERHEAD = {BYTEARRAY_OVERHEAD}\n"
        + PRELUDE
        + textwrap.dedent(SCENARIOS[name])
        + "\nprint('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
