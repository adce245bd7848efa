"""Runs the interpreter's own ``test/test_tracemalloc.py`` against
``heapwatch.tracemalloc``.

The file is the one installed with the running interpreter (pyenv's
``lib/pythonX.Y/test``; Debian's ``libpythonX.Y-testsuite`` package), never a
copy: ``heapwatch.tracemalloc`` takes the place of ``tracemalloc`` in
``sys.modules`` before the test module imports it, so every test calls
heapwatch.  Tests that cannot concern heapwatch are skipped here, each with
its reason; nothing else is.

Usage: python runner.py SUMMARY.json  (from a scratch directory: the tests
write files into the current one).  Writes a JSON summary of every test's
outcome; the exit status is 0 when nothing failed.
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
        "checks PyTraceMalloc_Track as the built-in tracer answers it: the return value says "
        "whether the stdlib tracer is tracing (-2 when it is not, heapwatch's interposition "
        "passes it on), and the trace is read back from the built-in tracer's private table "
        "(_PyTraceMalloc_GetTraceback); heapwatch's view of those calls is tested in "
        "tests/core/test_reported_blocks.py"
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


# What each test did, filled by the wrappers _record() puts on unittest's
# TestResult: whichever result class regrtest uses, it derives from it.
OUTCOMES: dict[str, dict[str, str]] = {
    key: {}
    for key in (
        "passed",
        "failed",
        "errors",
        "skipped",
        "expected_failures",
        "unexpected_successes",
    )
}


def _short(test: Any) -> str:
    return str(test.id()).split("test_tracemalloc.", 1)[-1]


def _record() -> None:
    result = unittest.TestResult
    originals = {
        "passed": result.addSuccess,
        "failed": result.addFailure,
        "errors": result.addError,
        "skipped": result.addSkip,
        "expected_failures": result.addExpectedFailure,
        "unexpected_successes": result.addUnexpectedSuccess,
    }
    names = {
        "passed": "addSuccess",
        "failed": "addFailure",
        "errors": "addError",
        "skipped": "addSkip",
        "expected_failures": "addExpectedFailure",
        "unexpected_successes": "addUnexpectedSuccess",
    }

    def wrap(key: str, original: Any) -> Any:
        def add(self: Any, test: Any, *details: Any) -> Any:
            detail = details[0] if key == "skipped" else ""
            OUTCOMES[key][_short(test)] = str(detail)
            return original(self, test, *details)

        return add

    for key, original in originals.items():
        setattr(result, names[key], wrap(key, original))


def _mark_when_loaded() -> None:
    """Marks the test module as regrtest loads it: regrtest imports it
    afresh, so marks made on an earlier import would be lost."""
    load = unittest.TestLoader.loadTestsFromModule

    def load_marked(self: unittest.TestLoader, module: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(module, "__name__", "") == "test.test_tracemalloc":
            if module.tracemalloc is not sys.modules["tracemalloc"]:
                raise SystemExit("test_tracemalloc imported another tracemalloc than heapwatch's")
            _mark(module)
        return load(self, module, *args, **kwargs)

    unittest.TestLoader.loadTestsFromModule = load_marked  # type: ignore[method-assign]


def main() -> int:
    """Runs the file through the interpreter's own test runner (regrtest),
    in this process: its tests depend on being run from there (test_snapshot
    expects a traceback deeper than a plain unittest run has, and fails
    under one with the stdlib too).  argv[1]: where to write the summary."""
    out = sys.argv[1]
    module = _install_heapwatch()
    _mark_when_loaded()
    _record()
    from test.libregrtest.main import main as regrtest

    sys.argv = [sys.argv[0], "-v", "test_tracemalloc"]
    code: object = 0
    try:
        regrtest()
    except SystemExit as exit_:
        code = exit_.code
    summary = {
        "python": ".".join(map(str, sys.version_info[:3])),
        "file": module.__file__,
        "regrtest_exit": code,
        **{key: sorted(tests) for key, tests in OUTCOMES.items() if key != "skipped"},
        "skipped": OUTCOMES["skipped"],
    }
    with open(out, "w", encoding="utf-8") as fp:
        json.dump(summary, fp)
    failed = any(OUTCOMES[k] for k in ("failed", "errors", "unexpected_successes"))
    return 1 if failed or code not in (0, None) else 0


if __name__ == "__main__":
    sys.exit(main())
