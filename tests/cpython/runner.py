"""Runs the interpreter's own ``test/test_tracemalloc.py`` against
``heapwatch.tracemalloc``.

The file is the one installed with the running interpreter (pyenv's
``lib/pythonX.Y/test``; Debian's ``libpythonX.Y-testsuite`` package), never a
copy: ``heapwatch.tracemalloc`` takes the place of ``tracemalloc`` in
``sys.modules`` before the test module imports it, so every test calls
heapwatch.  Tests that cannot concern heapwatch are skipped here, each with
its reason; nothing else is.

Usage: python runner.py [--json]  (run from a scratch directory: the tests
write files into the current one).  Exit status 0 when nothing failed.
"""

from __future__ import annotations

import json
import sys
import unittest
from typing import Any

# Whole classes and single tests (Class.test_name) that are skipped, and why.
SKIPS: dict[str, str] = {
    "TestCommandLine": (
        "starts child interpreters with -X tracemalloc or PYTHONTRACEMALLOC and has them "
        "import the stdlib module: it tests the built-in tracer's start-up options, which "
        "heapwatch does not read (it starts from HEAPWATCH_* variables)"
    ),
    "TestCAPI": (
        "PyTraceMalloc_Track reaches heapwatch only through its interposition of that "
        "function, and these tests read the trace back through the built-in tracer's "
        "private table (_PyTraceMalloc_GetTraceback)"
    ),
}

# Expected failures: the test must fail, or the run fails (an unexpected
# success is a failure), so the reason is kept true.
EXPECTED_FAILURES: dict[str, str] = {}
if sys.version_info < (3, 13):
    EXPECTED_FAILURES["TestTracemallocEnabled.test_new_reference"] = (
        "an object reused from a free list is created without an allocation; from 3.13 "
        "heapwatch re-stamps it through the reference tracer (PyRefTracer_SetTracer), which "
        "older interpreters do not have"
    )


def _install_heapwatch() -> Any:
    from heapwatch import tracemalloc as heapwatch_tracemalloc

    sys.modules["tracemalloc"] = heapwatch_tracemalloc
    from test import test_tracemalloc

    if test_tracemalloc.tracemalloc is not heapwatch_tracemalloc:
        raise SystemExit("test_tracemalloc imported another tracemalloc than heapwatch's")
    return test_tracemalloc


def _mark(module: Any) -> None:
    for name, reason in SKIPS.items():
        cls_name, _, test_name = name.partition(".")
        cls = getattr(module, cls_name, None)
        if cls is None:
            continue  # not in this version's file
        if test_name:
            if hasattr(cls, test_name):
                setattr(cls, test_name, unittest.skip(reason)(getattr(cls, test_name)))
        else:
            unittest.skip(reason)(cls)
    for name, _reason in EXPECTED_FAILURES.items():
        cls_name, _, test_name = name.partition(".")
        cls = getattr(module, cls_name)
        setattr(cls, test_name, unittest.expectedFailure(getattr(cls, test_name)))


class _Result(unittest.TextTestResult):
    """Also keeps the id of every test that passed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.passed: list[str] = []

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.passed.append(test.id())


def _short(test_id: str) -> str:
    return test_id.split("test_tracemalloc.", 1)[-1]


def main() -> int:
    module = _install_heapwatch()
    _mark(module)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=_Result)
    result = runner.run(suite)
    assert isinstance(result, _Result)
    summary = {
        "python": ".".join(map(str, sys.version_info[:3])),
        "file": module.__file__,
        "run": result.testsRun,
        "passed": sorted(_short(t) for t in result.passed),
        "failed": sorted(_short(t.id()) for t, _ in result.failures),
        "errors": sorted(_short(t.id()) for t, _ in result.errors),
        "skipped": {_short(t.id()): reason for t, reason in result.skipped},
        "expected_failures": sorted(_short(t.id()) for t, _ in result.expectedFailures),
        "unexpected_successes": sorted(_short(t.id()) for t in result.unexpectedSuccesses),
    }
    if "--json" in sys.argv[1:]:
        print(json.dumps(summary))
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
