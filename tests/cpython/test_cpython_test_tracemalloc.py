"""CPython's own test_tracemalloc, the interpreter's installed file, passes
against heapwatch.tracemalloc (see runner.py for the substitution and the
skips, each with its reason)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.agent_process import clean_env

RUNNER = Path(__file__).with_name("runner.py")


def _require_cpython_tests() -> None:
    if importlib.util.find_spec("test.test_tracemalloc") is not None:
        return
    message = (
        f"this interpreter ({sys.executable}) has no test.test_tracemalloc "
        "(Debian: libpython3.X-testsuite)"
    )
    if os.environ.get("HEAPWATCH_REQUIRE_TOOLS") == "1":
        pytest.fail(message + "; HEAPWATCH_REQUIRE_TOOLS=1 forbids skipping")
    pytest.skip(message)


def test_cpython_test_tracemalloc_passes_against_heapwatch(tmp_path: Path) -> None:
    _require_cpython_tests()
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(tmp_path / "summary.json")],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    summary_path = tmp_path / "summary.json"
    assert summary_path.exists(), done.stdout[-5000:] + done.stderr[-5000:]
    summary = json.loads(summary_path.read_text())
    problems = summary["failed"] + summary["errors"] + summary["unexpected_successes"]
    assert not problems, done.stdout[-20000:] + done.stderr[-5000:]
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    # The public API is exercised: most tests ran rather than being skipped.
    assert len(summary["passed"]) >= 30, summary
    print(
        f"CPython {summary['python']} test_tracemalloc: {len(summary['passed'])} passed, "
        f"{len(summary['skipped'])} skipped, {len(summary['expected_failures'])} expected "
        "failures"
    )
