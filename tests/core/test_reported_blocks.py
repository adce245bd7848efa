"""Blocks extensions report through PyTraceMalloc_Track() / _Untrack().

numpy reports its array data that way (domain 389047): up to numpy 2.4 a
block from libc's malloc, from 2.5 a PyMem_RawMalloc block moved from domain
0 to numpy's.  _hwtest does both, through the PLT (built as usual) and
through the GOT (built with -fno-plt), from a module loaded before tracing
started and from one loaded after.  The stdlib tracer gets the calls too.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from test_sampling import _tolerance

NUMPY_DOMAIN = 389047
BIG = 10_000_000


def _load_copy(path: Path, directory: Path) -> ModuleType:
    """A fresh copy of the extension at path, loaded now: a new file is a new
    object for the dynamic linker, so importing it calls dlopen()."""
    directory.mkdir(exist_ok=True)
    copy = directory / path.name
    shutil.copy(path, copy)
    spec = importlib.util.spec_from_file_location("_hwtest", copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _traces_at(core: ModuleType, domain: int) -> list[tuple[int, int]]:
    """(size, line of the innermost frame) of every trace in domain."""
    return [
        (size, frames[0][1])
        for dom, size, frames, _total in core.take_snapshot().traces()
        if dom == domain
    ]


def _line_of(marker: str) -> int:
    source = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(source, 1) if text.rstrip().endswith(marker))


@pytest.fixture(params=["loaded before", "loaded after start, no PLT"])
def reporting(
    request: pytest.FixtureRequest, core: ModuleType, tmp_path: Path, hwtest_no_plt: Path
) -> ModuleType:
    """Tracing in exact mode, and the extension: loaded before tracing
    started (hwtest: PLT entries) or a copy of the -fno-plt build loaded
    after (GOT entries)."""
    if request.param == "loaded before":
        module: ModuleType = request.getfixturevalue("hwtest")
        core.start(1)
        return module
    core.start(1)
    return _load_copy(hwtest_no_plt, tmp_path / "late")


@pytest.fixture
def exact(core: ModuleType, hwtest: ModuleType) -> Iterator[ModuleType]:
    core.start(1)
    yield core


def _domain_estimate(core: ModuleType, domain: int) -> int:
    return sum(row[3] for row in core.take_snapshot().tracebacks() if row[0] == domain)


def test_a_reported_block_is_traced_in_its_domain_at_the_callers_line(
    core: ModuleType, reporting: ModuleType
) -> None:
    # given tracing, and the extension loaded before or after it started
    base = core.get_traced_memory()[0]
    # when it allocates with malloc and reports the block
    ptr = reporting.tracked_malloc(NUMPY_DOMAIN, BIG)  # reported here
    # then the block is traced in numpy's domain, at this line, once
    assert _traces_at(core, NUMPY_DOMAIN) == [(BIG, _line_of("# reported here"))]
    assert BIG <= core.get_traced_memory()[0] - base < BIG + 65536
    # and untracking it (as numpy does before freeing) forgets it
    reporting.untracked_free(NUMPY_DOMAIN, ptr)
    assert _traces_at(core, NUMPY_DOMAIN) == []
    assert core.get_traced_memory()[0] - base < 65536


def test_a_block_reported_without_the_gil_is_traced_at_the_callers_line(
    exact: ModuleType, hwtest: ModuleType
) -> None:
    ptr = hwtest.tracked_malloc_nogil(NUMPY_DOMAIN, BIG)  # reported without the GIL
    assert _traces_at(exact, NUMPY_DOMAIN) == [(BIG, _line_of("# reported without the GIL"))]
    hwtest.untracked_free(NUMPY_DOMAIN, ptr)
    assert _traces_at(exact, NUMPY_DOMAIN) == []


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_raw_block_moved_to_another_domain_is_counted_once(
    core: ModuleType, hwtest: ModuleType, mode: str
) -> None:
    # given tracing (a 10 MB block is sampled with probability 1 - e**-19)
    core.start(1, mode)
    # when a block from PyMem_RawMalloc (traced in domain 0 by the hooks) is
    # untracked there and tracked in numpy's domain, as numpy 2.5 does
    ptr = hwtest.raw_retracked(NUMPY_DOMAIN, BIG)  # moved here
    # then it is traced once, in numpy's domain, weighing its size
    assert _traces_at(core, NUMPY_DOMAIN) == [(BIG, _line_of("# moved here"))]
    assert BIG not in [size for size, _line in _traces_at(core, 0)]
    assert BIG <= _domain_estimate(core, NUMPY_DOMAIN) <= BIG + 1
    # and numpy's free (untrack, PyMem_RawFree) leaves nothing behind
    hwtest.raw_untracked_free(NUMPY_DOMAIN, ptr)
    assert _traces_at(core, NUMPY_DOMAIN) == []
    assert BIG not in [size for size, _line in _traces_at(core, 0)]


def test_in_exact_mode_the_moved_block_adds_its_size_once(
    exact: ModuleType, hwtest: ModuleType
) -> None:
    base = exact.get_traced_memory()[0]
    ptr = hwtest.raw_retracked(NUMPY_DOMAIN, BIG)
    assert BIG <= exact.get_traced_memory()[0] - base < BIG + 65536
    hwtest.raw_untracked_free(NUMPY_DOMAIN, ptr)
    assert exact.get_traced_memory()[0] - base < 65536


def test_reported_blocks_are_sampled_like_any_other(core: ModuleType, hwtest: ModuleType) -> None:
    # given sample mode, one block in 64 KiB of reported bytes on average
    interval = 64 * 1024
    core.start(1, "sample", interval)
    sizes = [1000] * 20_000
    # when 20 MB are reported in 1000-byte blocks
    blocks = [hwtest.tracked_malloc(NUMPY_DOMAIN, size) for size in sizes]
    try:
        traces = _traces_at(core, NUMPY_DOMAIN)
        estimate = _domain_estimate(core, NUMPY_DOMAIN)
    finally:
        for ptr in blocks:
            hwtest.untracked_free(NUMPY_DOMAIN, ptr)
    # then a few hundred of them are traced, weighing what all of them weigh
    assert 0 < len(traces) < len(sizes) // 10
    assert abs(estimate - sum(sizes)) <= _tolerance(sizes, interval), estimate
    assert _traces_at(core, NUMPY_DOMAIN) == []


def test_got_entries_are_patched_while_tracing_and_put_back_on_stop(
    core: ModuleType, hwtest: ModuleType, hwtest_no_plt: Path, tmp_path: Path
) -> None:
    # given the extension's two entries, and the interpreter's dlopen
    assert core._interposed() == 0
    core.start(1)
    patched = core._interposed()
    assert patched >= 2
    # when a module loaded after the start adds its own two
    late = _load_copy(hwtest_no_plt, tmp_path / "late")
    assert core._interposed() == patched + 2
    # then stopping puts every one back, and a block reported then is ignored
    core.stop()
    assert core._interposed() == 0
    ptr = late.tracked_malloc(NUMPY_DOMAIN, 4096)
    late.untracked_free(NUMPY_DOMAIN, ptr)
    # and the next start patches them all again
    core.start(1, "sample")
    assert core._interposed() == patched + 2


def test_stopping_with_reported_blocks_alive_is_clean(core: ModuleType, hwtest: ModuleType) -> None:
    # given a reported block alive when tracing stops
    core.start(1)
    ptr = hwtest.tracked_malloc(NUMPY_DOMAIN, BIG)
    core.stop()
    # when tracing starts again and the block is untracked and freed
    core.start(1)
    hwtest.untracked_free(NUMPY_DOMAIN, ptr)
    # then nothing was traced for it in the new session
    assert _traces_at(core, NUMPY_DOMAIN) == []
    core._check_invariants()


def test_clear_traces_forgets_reported_blocks(exact: ModuleType, hwtest: ModuleType) -> None:
    ptr = hwtest.tracked_malloc(NUMPY_DOMAIN, BIG)
    exact.clear_traces()
    assert _traces_at(exact, NUMPY_DOMAIN) == []
    hwtest.untracked_free(NUMPY_DOMAIN, ptr)
    exact._check_invariants()


def test_the_stdlib_tracer_beside_heapwatch_sees_reported_blocks(hwtest_no_plt: Path) -> None:
    # heapwatch first, the stdlib on top (the order that works), in a fresh
    # interpreter: the allocator chain is process state.
    script = textwrap.dedent(
        f"""
        import importlib.util, tracemalloc as S
        from heapwatch import _core as H

        def load():
            spec = importlib.util.spec_from_file_location("_hwtest", {str(hwtest_no_plt)!r})
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module

        def std_sizes():
            return [t.size for t in S.take_snapshot().traces if t.domain == {NUMPY_DOMAIN}]

        def hw_sizes():
            return [t[1] for t in H.take_snapshot().traces() if t[0] == {NUMPY_DOMAIN}]

        for stop_first in ("stdlib", "heapwatch"):
            H.start(); S.start()
            ext = load() if stop_first == "stdlib" else ext
            for report, free in ((ext.tracked_malloc, ext.untracked_free),
                                 (ext.raw_retracked, ext.raw_untracked_free)):
                ptr = report({NUMPY_DOMAIN}, 1 << 20)
                assert std_sizes() == hw_sizes() == [1 << 20], (std_sizes(), hw_sizes())
                free({NUMPY_DOMAIN}, ptr)
                assert std_sizes() == hw_sizes() == []
            ptr = ext.tracked_malloc({NUMPY_DOMAIN}, 1 << 20)
            if stop_first == "stdlib":
                S.stop(); assert hw_sizes() == [1 << 20]
                H.stop()
            else:
                H.stop(); assert H._interposed() == 0 and std_sizes() == [1 << 20]
                S.stop()
            ext.untracked_free({NUMPY_DOMAIN}, ptr)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert done.stderr == ""
