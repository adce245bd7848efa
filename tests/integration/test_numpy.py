"""numpy's arrays, traced through heapwatch.tracemalloc on every Python.

numpy reports its array data to tracemalloc in domain 389047: up to 2.4 (the
last release for Python 3.10 and 3.11; 2.0 for 3.9) a block from libc's
malloc reported through PyTraceMalloc_Track(), from 2.5 (3.12+) a
PyMem_RawMalloc block moved from domain 0 to numpy's.  Either way an 80 MB
array allocated here is traced at its line, in numpy's domain, once.
numpy comes from the package index (requirements-dev.txt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc as stdlib_tm
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from heapwatch import _core
from heapwatch import tracemalloc as hw_tm


def _import_numpy() -> ModuleType:
    try:
        import numpy
    except ImportError as exc:
        message = f"numpy is not installed ({exc}): pip install -r requirements-dev.txt"
        if os.environ.get("HEAPWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(message + "; HEAPWATCH_REQUIRE_TOOLS=1 forbids skipping", pytrace=False)
        pytest.skip(message, allow_module_level=True)
    return numpy


np = _import_numpy()

NUMPY_DOMAIN = 389047
ELEMENTS = 10_000_000
ARRAY_BYTES = ELEMENTS * 8  # 80 MB of float64
SLACK = 1 << 20  # what else a statement may allocate beside the array


def allocate() -> Any:
    array = np.empty(ELEMENTS)  # the array's line
    array.fill(1.0)  # resident, not only reserved
    return array


ARRAY_LINE = next(
    number
    for number, text in enumerate(Path(__file__).read_text().splitlines(), 1)
    if text.rstrip().endswith("# the array's line")
)


@pytest.fixture(autouse=True)
def _nothing_traces() -> Iterator[None]:
    for module in (stdlib_tm, hw_tm):
        module.stop()
    yield
    for module in (stdlib_tm, hw_tm):
        module.stop()


def test_numpy_reports_in_the_domain_the_tests_expect() -> None:
    assert np.lib.tracemalloc_domain == NUMPY_DOMAIN


def _at_array_line(snapshot: Any) -> int:
    return sum(
        stat.size
        for stat in snapshot.statistics("lineno")
        if stat.traceback[0].filename == __file__ and stat.traceback[0].lineno == ARRAY_LINE
    )


def _in_numpys_domain(snapshot: Any, module: Any = hw_tm) -> int:
    kept = snapshot.filter_traces([module.DomainFilter(True, NUMPY_DOMAIN)])
    return sum(stat.size for stat in kept.statistics("filename"))


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_an_80mb_array_is_traced_at_its_line_once_and_freed(mode: str) -> None:
    # given heapwatch tracing (an 80 MB block is sampled with certainty)
    hw_tm.start(1, mode=mode)
    before = hw_tm.get_traced_memory()[0]
    # when a traced function allocates an 80 MB array
    array = allocate()
    # then heapwatch sees it at its line, in numpy's domain, counted once
    grown = hw_tm.get_traced_memory()[0] - before
    snapshot = hw_tm.take_snapshot()
    numpy_only = snapshot.filter_traces([hw_tm.DomainFilter(True, NUMPY_DOMAIN)])
    top = numpy_only.statistics("lineno")[0]
    assert (top.traceback[0].filename, top.traceback[0].lineno) == (__file__, ARRAY_LINE)
    assert ARRAY_BYTES <= top.size < ARRAY_BYTES + SLACK
    assert ARRAY_BYTES <= _at_array_line(snapshot) < ARRAY_BYTES + SLACK
    assert snapshot.statistics("lineno")[0].traceback == top.traceback  # the biggest line
    if mode == "exact":  # sampled small blocks may weigh 512 KiB each
        assert ARRAY_BYTES <= grown < ARRAY_BYTES + SLACK
    # and once freed, nothing of it is left
    del array
    after = hw_tm.take_snapshot()
    assert _at_array_line(after) < SLACK
    assert _in_numpys_domain(after) < SLACK
    if mode == "exact":
        assert hw_tm.get_traced_memory()[0] - before < SLACK


def test_stopping_with_arrays_alive_is_clean() -> None:
    # given arrays alive when tracing stops
    hw_tm.start(5)
    arrays = [allocate(), np.ones(1000), np.zeros(ELEMENTS)]
    hw_tm.stop()
    # then every entry is put back, and freeing them then is harmless
    assert _core._interposed() == 0
    del arrays[0]
    # and a new session traces new arrays and forgets old ones freed
    hw_tm.start(1, mode="sample")
    fresh = allocate()
    arrays.clear()
    assert ARRAY_BYTES <= _at_array_line(hw_tm.take_snapshot()) < ARRAY_BYTES + SLACK
    _core._check_invariants()
    del fresh
    assert _at_array_line(hw_tm.take_snapshot()) < SLACK


@pytest.mark.parametrize("stop_first", ["stdlib", "heapwatch"])
def test_the_stdlib_tracer_beside_heapwatch_sees_the_array_too(stop_first: str) -> None:
    # given heapwatch tracing, then the stdlib on top (the order that works)
    hw_tm.start(1)
    stdlib_tm.start(1)
    # when a traced function allocates an 80 MB array
    array = allocate()
    # then both see it at its line, in numpy's domain
    for module in (stdlib_tm, hw_tm):
        snapshot = module.take_snapshot()
        numpy_only = snapshot.filter_traces([module.DomainFilter(True, NUMPY_DOMAIN)])
        top = numpy_only.statistics("lineno")[0]
        assert top.traceback[0].lineno == ARRAY_LINE, module
        assert ARRAY_BYTES <= top.size < ARRAY_BYTES + SLACK, module
    # and the one left running still does once the other stops
    if stop_first == "stdlib":
        stdlib_tm.stop()
        left: Any = hw_tm
    else:
        hw_tm.stop()
        left = stdlib_tm
    assert ARRAY_BYTES <= _at_array_line(left.take_snapshot()) < ARRAY_BYTES + SLACK
    del array
    assert _at_array_line(left.take_snapshot()) < SLACK
    assert _in_numpys_domain(left.take_snapshot(), left) < SLACK


def test_numpy_imported_after_tracing_started_is_covered() -> None:
    # numpy is imported in this process already: a fresh one imports it late.
    script = textwrap.dedent(
        f"""
        import json
        from heapwatch import tracemalloc as tm
        tm.start(1)
        import numpy as np
        before = tm.get_traced_memory()[0]
        array = np.empty({ELEMENTS})  # the late line
        grown = tm.get_traced_memory()[0] - before
        snapshot = tm.take_snapshot().filter_traces([tm.DomainFilter(True, {NUMPY_DOMAIN})])
        top = snapshot.statistics("lineno")[0]
        print(json.dumps([grown, top.size, top.traceback[0].lineno]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    grown, size, line = json.loads(done.stdout)
    late_line = next(
        n for n, text in enumerate(script.splitlines(), 1) if text.endswith("# the late line")
    )
    assert line == late_line
    assert ARRAY_BYTES <= size < ARRAY_BYTES + SLACK
    assert ARRAY_BYTES <= grown < ARRAY_BYTES + SLACK
