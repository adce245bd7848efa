"""Sample mode leaves pymalloc's frees alone (agent/csrc/hooks.c, install_set).

Above plain pymalloc, a sampled MEM or OBJ block of 1 to 512 bytes is
allocated past pymalloc's threshold: pymalloc serves it from the raw
allocator and frees it through PyMem_RawFree, that is through heapwatch's RAW
hook, which forgets its trace.  Every other free goes to pymalloc untouched.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from types import ModuleType

import pytest


def _live(core: ModuleType) -> int:
    return int(core.get_stats()["live_traces"])


def _small_objects() -> list[tuple[int, str]]:
    return [(i, str(i)) for i in range(20_000)]  # ALLOC


ALLOC_LINE = _small_objects.__code__.co_firstlineno + 1


def test_sampled_small_blocks_are_forgotten_when_freed(core: ModuleType) -> None:
    core.start(1, "sample", 16)  # nearly every block is sampled
    keep = _small_objects()
    assert _live(core) > 20_000
    traced_with = core.get_traced_memory()[0]
    del keep
    gc.collect()
    assert _live(core) < 200
    assert core.get_traced_memory()[0] < traced_with / 50


def test_a_sampled_small_object_has_its_traceback(core: ModuleType) -> None:
    core.start(1, "sample", 1)
    keep = _small_objects()
    frames = core.get_object_traceback(keep[-1])
    assert frames == ((__file__, ALLOC_LINE),)
    del keep


def _grow_and_shrink(count: int) -> list[bytearray]:
    kept = []
    for i in range(count):
        buffer = bytearray()
        for _ in range(1 + i % 300):
            buffer += b"x"  # realloc, within pymalloc's sizes and past them
        del buffer[i % 7 :]  # and shrinking
        kept.append(buffer)
    return kept


def test_sampled_reallocs_are_forgotten_when_freed(core: ModuleType) -> None:
    core.start(1, "sample", 64)
    kept = _grow_and_shrink(3000)
    assert _live(core) > 100
    assert [len(b) for b in kept[:8]] == [min(1 + i % 300, i % 7) for i in range(8)]
    del kept
    gc.collect()
    assert _live(core) < 200


PYMALLOC_COUNT = textwrap.dedent(
    """
    import gc, sys
    from heapwatch import _core

    def work():
        keep = [(i, str(i), bytearray(i % 600)) for i in range(30000)]
        for b in keep[::3]:
            b[2].extend(b"y" * 40)
        del keep

    def session(mode):
        _core.start(1, mode, 64) if mode == "sample" else _core.start(1, "exact")
        work()
        gc.collect()
        _core.stop()
        gc.collect()

    work(); session("sample"); session("exact"); gc.collect()   # warm up
    before = sys.getallocatedblocks()
    for _ in range(3):
        session("sample")
    sampled = sys.getallocatedblocks() - before
    before = sys.getallocatedblocks()
    for _ in range(3):
        session("exact")
    exact = sys.getallocatedblocks() - before
    print(sampled, exact)
    """
)


def _run_fresh(code: str, allocator: str) -> subprocess.CompletedProcess[str]:
    """The allocator chain is process state: a fresh interpreter per case."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONMALLOC": allocator},
    )


def test_pymalloc_keeps_counting_its_blocks_right() -> None:
    """Raw-backed blocks go in and out through pymalloc's own fallback, so
    sys.getallocatedblocks() stays as it is under exact tracing."""
    result = _run_fresh(PYMALLOC_COUNT, "pymalloc")
    assert result.returncode == 0, result.stderr
    sampled, exact = (int(n) for n in result.stdout.split())
    assert abs(sampled - exact) <= 8, (sampled, exact)


OTHER_ALLOCATOR = textwrap.dedent(
    """
    import gc
    from heapwatch import _core

    _core.start(1, "sample", 16)
    keep = [(i, str(i)) for i in range(20000)]
    live = _core.get_stats()["live_traces"]
    assert live > 20000, live
    del keep
    gc.collect()
    after = _core.get_stats()["live_traces"]
    assert after < 200, after
    _core.stop()
    print("ok")
    """
)


@pytest.mark.parametrize("allocator", ["malloc", "pymalloc_debug", "malloc_debug"])
def test_sampling_over_other_allocators_hooks_every_free(allocator: str) -> None:
    """Without plain pymalloc below, every free goes through heapwatch."""
    result = _run_fresh(OTHER_ALLOCATOR, allocator)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
