"""CPython's own regression tests, untraced and under the agent: the agent
must add no failure and no hang (``make guest``).

Each test file of the interpreter's ``test`` package (the one installed with
``--python``, never a copy) runs three ways, each in a fresh ``python -m
test -v`` of its own, in a scratch directory, watched for a stall:

* ``untraced``: no heapwatch;
* ``exact``: the agent, auto-started from the environment, exact mode, 25
  frames, a cycle every 0.2 s, no exporter;
* ``sample``: the same in sample mode (a sample every 64 KiB on average).

A file's result under the agent is compared with its untraced result, test by
test (regrtest's JUnit XML): a test that fails only under the agent, a file
that hangs only under the agent, or a file whose environment regrtest finds
changed only under the agent is a regression.  A hang is a run that prints
nothing for ``--stall`` seconds (``-v`` prints a line per test), or that is
still running after ``--limit`` seconds: a whole-file timeout alone cannot
tell a hang from a slow run on a loaded machine (``make ci`` runs two of
these suites at once, and every child ``test_subprocess`` starts under the
agent starts an agent of its own).  A file with a
regression runs again, both ways; only a regression seen twice fails the run
(a test that flakes untraced is no news about heapwatch).  Prints a table,
one line per file; exit status 1 on a regression, 2 on bad usage.

Usage: python tests/guest/run.py [--python PY] [--jobs N] [--stall S] [--limit S]
       [--ways untraced,exact,sample] [--markdown FILE] [TEST ...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

__all__ = ["DEFAULT_TESTS", "WAYS", "FileResult", "Watch", "main", "run_file"]

# 50 files: threads, signals, fork, subprocess, gc, weakref, finalization,
# asyncio, ctypes, the C API, pickling, io, and what the agent's own
# machinery touches (servers, logging, tracemalloc).
DEFAULT_TESTS: tuple[str, ...] = (
    # The slowest first (seconds untraced on 3.11 in brackets), so that
    # parallel jobs end together.
    "test_subprocess",  # subprocess [23]
    "test_signal",  # signals [19]
    "test_threading",  # threads, fork from threads [17]
    "test_faulthandler",  # signals, threads [14]
    "test_asyncio.test_subprocess",  # asyncio, subprocess [14]
    "test_selectors",  # io [14]
    "test_logging",  # threads, sockets, what the agent logs through [13]
    "test_queue",  # threads [9]
    "test_pickle",  # pickling [8]
    "test_weakref",  # weakref [6]
    "test_threadsignals",  # threads, signals [5]
    "test_fork1",  # fork [5]
    "test_wait3",  # fork [5]
    "test_wait4",  # fork [5]
    "test_capi",  # the C API [5]
    "test_gc",  # gc [4]
    "test_os",  # fork, io [4]
    "test_posix",  # fork, signals [3]
    "test_ctypes",  # ctypes [3]
    "test_thread",  # threads [2]
    "test_asyncio.test_locks",  # asyncio [2]
    "test_asyncio.test_unix_events",  # asyncio: signal handlers, child watchers [1]
    "test_asyncio.test_runners",  # asyncio: loops started and closed [1]
    "test_asyncio.test_futures",  # asyncio
    "test_select",  # io [2]
    "test_finalization",  # finalization [2]
    "test_tracemalloc",  # the stdlib tracer beside heapwatch's hooks [2]
    "test_exceptions",  # [2]
    "test_threading_local",  # threads [1]
    "test_threadedtempfile",  # threads, io
    "test_popen",  # subprocess [1]
    "test_atexit",  # finalization [1]
    "test_generators",  # finalization [1]
    "test_copyreg",  # pickling [1]
    "test_copy",  # pickling [1]
    "test_shelve",  # pickling, io [1]
    "test_picklebuffer",  # pickling
    "test_fileio",  # io [1]
    "test_bufio",  # io [1]
    "test_sys",  # sys._debugmallocstats, getsizeof [1]
    "test_wsgiref",  # the agent's server [1]
    "test_struct",  # [1]
    "test_call",  # the C API [0]
    "test_weakset",  # weakref [0]
    "test_file",  # io [0]
    "test_memoryio",  # io [0]
    "test_mmap",  # io [0]
    "test_contextlib",  # [0]
    "test_resource",  # [0]
    "test_dict",  # [0]
)

# Where a file went in later versions (3.14 made test_io and test_os packages).
MOVED: dict[str, str] = {
    "test_fileio": "test_io.test_fileio",
    "test_file": "test_io.test_file",
    "test_memoryio": "test_io.test_memoryio",
    "test_bufio": "test_io.test_bufferedio",
    "test_posix": "test_os.test_posix",
}

AGENT = {
    "HEAPWATCH_ENABLED": "1",
    "HEAPWATCH_NFRAME": "25",
    "HEAPWATCH_INTERVAL": "0.2",
    "HEAPWATCH_EXPORTERS": "none",
}
WAYS: dict[str, dict[str, str]] = {
    "untraced": {},
    "exact": {**AGENT, "HEAPWATCH_MODE": "exact"},
    "sample": {**AGENT, "HEAPWATCH_MODE": "sample", "HEAPWATCH_SAMPLE_INTERVAL": "64KiB"},
}
# regrtest's last word: "Result: X" from 3.11, "Tests result: X" before.
_RESULT = re.compile(r"^(?:Tests r|R)esult: (\S+)", re.MULTILINE)


class Known(NamedTuple):
    why: str
    always: bool
    """True: the test fails under the agent every time, and an entry for a
    test that passes is stale (it fails the run, so that the list stays
    true).  False: it fails when the agent's cycle falls at the wrong moment."""


# What the agent changes that a test sees, test by test (file -> Class.test).
# The agent cycles every 0.2 s here; at its default 10 s the timing ones are
# 50 times rarer.
_COUNTS_THE_AGENT = (
    "counts every block of the process between two reads, and the agent's cycle (Python "
    "objects made and freed) may fall between them"
)
KNOWN_DIFFERENCES: dict[str, dict[str, Known]] = {
    "test_sys": {
        "SysModuleTest.test_getallocatedblocks": Known(
            f"sys.getallocatedblocks() {_COUNTS_THE_AGENT}", always=False
        ),
    },
    "test_gc": {
        "GCTests.test_get_count": Known(
            "gc.get_count() after gc.collect() counts the container objects every thread made "
            "since, and the agent's cycle (tuples, lists, dicts) may fall between the two calls; "
            "any thread of the service's own would do the same",
            always=False,
        ),
        # (3.11, exact: failed once in f0dd0b2's run, and twice, so on the
        # retry too, in aebc2eb's, at a load average of 10 on 2 CPUs)
        "GCTests.test_get_objects_arguments": Known(
            "compares the lengths of two gc.get_objects() calls, each a list of every container "
            "object of the process; the agent's cycle (tuples, lists, dicts) may fall between "
            "them, as any thread of the service's own would",
            always=False,
        ),
    },
    "test_tracemalloc": {
        "TestTracemallocEnabled.test_get_traced_memory": Known(
            f"the stdlib tracer's get_traced_memory() {_COUNTS_THE_AGENT}", always=False
        ),
        # (seen once on 3.15, exact: "flaky once, not again")
        "TestTracemallocEnabled.test_reset_peak": Known(
            f"the stdlib tracer's peak after reset_peak() {_COUNTS_THE_AGENT}", always=False
        ),
    },
}


_OWN_GIL_OVER_MAIN_OBMALLOC = (
    "runs subinterpreters with a GIL of their own over the main interpreter's obmalloc (a "
    "config test_interp_init calls questionable), which corrupts pymalloc whenever another "
    "thread allocates meanwhile: with a plain Python thread and no heapwatch, test_interp_init "
    "crashed 3.15 three times in three"
)

# Tests not run at all (in any way, so that the ways stay comparable): what
# they do breaks with any other thread in the process, the agent's or the
# service's own (file -> test method -> why).
NOT_RUN: dict[str, dict[str, str]] = {
    "test_capi": {
        # test_interp_init (3.12+) crashed 3.15 in every try; on 3.14 test_capi
        # crashed once in sample mode, in the agent's allocation meanwhile.
        "test_interp_init": _OWN_GIL_OVER_MAIN_OBMALLOC,
        "test_configured_settings": _OWN_GIL_OVER_MAIN_OBMALLOC,
    },
    "test_call": {
        "test_super_deep": (
            "allocates at every level of a recursion 90,000 to 100,000 frames deep, and a tracer "
            "walks the whole stack at each allocation to count total_nframe: the stdlib's "
            "(-X tracemalloc=25) did not finish it in 10 minutes on 3.15 (1.4 s untraced)"
        ),
    },
}


@dataclass
class Run:
    """One file run one way."""

    status: str
    """SUCCESS, FAILURE, ENV_CHANGED, ... (regrtest's), TIMEOUT or CRASH."""
    seconds: float
    failed: frozenset[str] = frozenset()
    """The tests that failed or erred."""
    tests: int = 0
    names: frozenset[str] = frozenset()
    """Every test run (Class.test_name)."""
    tail: str = ""
    """The end of the output, for a report."""


@dataclass
class FileResult:
    name: str
    runs: dict[str, Run]
    regressions: dict[str, str] = field(default_factory=dict)
    """Way -> what the agent added (seen twice)."""
    flaky: dict[str, str] = field(default_factory=dict)
    """Way -> what the agent seemed to add once only."""
    known: dict[str, list[str]] = field(default_factory=dict)
    """Way -> the known differences (KNOWN_DIFFERENCES) it showed."""


def _environment(way: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HEAPWATCH_", "PYTHON", "OTEL_"))
    }
    env.update(WAYS[way])
    return env


def _failed_tests(xml_path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """(the tests that failed or erred, every test run) of regrtest's JUnit XML."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return frozenset(), frozenset()
    failed: set[str] = set()
    names: set[str] = set()
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        names.add(name)
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(name)
    return frozenset(failed), frozenset(names)


class Watch(NamedTuple):
    """When a run counts as hung."""

    stall: float
    """Seconds it may print nothing."""
    limit: float
    """Seconds it may take in all."""


def run_file(python: str, name: str, way: str, watch: Watch) -> Run:
    """Runs one test file one way, in a scratch directory of its own; a run
    that ``watch`` finds hung is killed (status TIMEOUT)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"guest-{way}-{name}-"))
    xml_path = scratch / "junit.xml"
    started = time.monotonic()
    try:
        with (scratch / "output.txt").open("w+") as output:
            proc = subprocess.Popen(
                [
                    python,
                    "-m",
                    "test",
                    "-v",
                    "--junit-xml",
                    str(xml_path),
                    *(arg for test in NOT_RUN.get(name, {}) for arg in ("-i", test)),
                    name,
                ],
                cwd=scratch,
                env=_environment(way),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a hang's kill reaches its children too
            )
            status = "" if _wait_while_printing(proc, output, watch) else "TIMEOUT"
            if status:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            output.seek(0)
            text = output.read()
        seconds = time.monotonic() - started
        if not status:
            found = _RESULT.findall(text)
            status = found[-1] if found else f"CRASH({proc.returncode})"
        failed, names = _failed_tests(xml_path)
        short = frozenset(_short(name) for name in names)
        return Run(status, seconds, failed, len(names), short, text[-3000:])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _wait_while_printing(proc: subprocess.Popen[bytes], output: IO[str], watch: Watch) -> bool:
    """Waits for ``proc`` while its output grows; False once it has printed
    nothing for ``watch.stall`` seconds or run for ``watch.limit`` seconds."""
    stall, limit = watch
    started = last_change = time.monotonic()
    size = -1
    while True:
        try:
            proc.wait(min(1.0, stall))
            return True
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        grown = os.fstat(output.fileno()).st_size
        if grown != size:
            size, last_change = grown, now
        if now - last_change >= stall or now - started >= limit:
            return False


def _short(test: str) -> str:
    """``Class.test_name`` of a JUnit test name."""
    return ".".join(test.rsplit(".", 2)[-2:])


def _added(name: str, untraced: Run, traced: Run) -> tuple[str, list[str]]:
    """(what the traced run has that the untraced one has not, or "";
    the known differences it showed)."""
    known = KNOWN_DIFFERENCES.get(name, {})
    shown = sorted(test for test in known if any(_short(f) == test for f in traced.failed))
    if traced.status == "TIMEOUT" and untraced.status != "TIMEOUT":
        return f"hang (killed after {traced.seconds:.0f}s)", shown
    if traced.status.startswith("CRASH") and not untraced.status.startswith("CRASH"):
        return traced.status.lower(), shown
    new = sorted(_short(t) for t in traced.failed - untraced.failed if _short(t) not in known)
    if new:
        return "failed: " + ", ".join(new), shown
    if (
        traced.status == "FAILURE"
        and untraced.status != "FAILURE"
        and not traced.failed - untraced.failed
    ):
        return "failure (regrtest's result; no test named)", shown
    if traced.status == "ENV_CHANGED" and untraced.status != "ENV_CHANGED":
        return "environment changed", shown
    return "", shown


def _schedule(
    python: str, jobs: int, watch: Watch, tasks: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], Run]:
    """Runs every (file, way) with ``jobs`` at a time, printing each as it ends."""
    runs: dict[tuple[str, str], Run] = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {
            pool.submit(run_file, python, name, way, watch): (name, way) for name, way in tasks
        }
        for future in concurrent.futures.as_completed(futures):
            name, way = futures[future]
            run = runs[name, way] = future.result()
            print(f"  {name:32} {way:9} {run.status.lower()} {run.seconds:.0f}s", flush=True)
    return runs


def check_files(
    python: str, names: Sequence[str], ways: Sequence[str], jobs: int, watch: Watch
) -> list[FileResult]:
    """Runs each file every way; a regression is confirmed by running both
    ways of that file again."""
    # Every way of the slowest files first (the list is ordered by time), so
    # that the jobs end together.
    tasks = [(name, way) for name in names for way in ways]
    runs = _schedule(python, jobs, watch, tasks)
    results = [FileResult(name, {way: runs[name, way] for way in ways}) for name in names]
    if "untraced" not in ways:
        return results
    suspects: list[tuple[FileResult, str, str]] = []
    for result in results:
        for way in ways:
            if way == "untraced":
                continue
            added, shown = _added(result.name, result.runs["untraced"], result.runs[way])
            result.known[way] = shown
            if added:
                suspects.append((result, way, added))
    if suspects:
        print(f"running {len(suspects)} suspect(s) again, both ways", flush=True)
        again_tasks = sorted(
            {(r.name, w) for r, w, _ in suspects} | {(r.name, "untraced") for r, _, _ in suspects}
        )
        # At most two at a time: a confirmation wants a machine less busy
        # than the first pass had it, or timing tests confirm the load.
        again = _schedule(python, min(jobs, 2), watch, again_tasks)
        for result, way, added in suspects:
            confirmed, _ = _added(
                result.name, again[result.name, "untraced"], again[result.name, way]
            )
            if confirmed:
                result.regressions[way] = confirmed
            else:
                result.flaky[way] = added
    return results


def stale_differences(results: Iterable[FileResult], ways: Sequence[str]) -> list[str]:
    """Known differences that a traced way ran without showing."""
    stale: list[str] = []
    for result in results:
        for test, known in KNOWN_DIFFERENCES.get(result.name, {}).items():
            if not known.always:
                continue
            for way in ways:
                run = result.runs.get(way)
                if way == "untraced" or run is None or run.status == "TIMEOUT":
                    continue
                if test in run.names and test not in result.known.get(way, []):
                    stale.append(f"{result.name} {test} ({way})")
    return stale


def _cell(result: FileResult, way: str) -> str:
    run = result.runs.get(way)
    if run is None:
        return "-"
    text = f"{run.status.lower()} {run.seconds:.0f}s"
    if way in result.regressions:
        text += " REGRESSION"
    elif way in result.flaky:
        text += " (flaky once)"
    elif result.known.get(way):
        text += f" ({len(result.known[way])} known)"
    return text


def table(results: Iterable[FileResult], ways: Sequence[str], python: str) -> str:
    """A Markdown table: one row per file, one column per way."""
    rows = list(results)
    lines = [
        f"Python: `{python}`",
        "",
        "| file | tests | " + " | ".join(ways) + " |",
        "|---|---:|" + "---|" * len(ways),
    ]
    for result in rows:
        tests = max((run.tests for run in result.runs.values()), default=0)
        cells = " | ".join(_cell(result, way) for way in ways)
        lines.append(f"| {result.name} | {tests} | {cells} |")
    totals = " | ".join(f"{sum(r.runs[w].seconds for r in rows if w in r.runs):.0f}s" for w in ways)
    lines.append(f"| **{len(rows)} files** | | {totals} |")
    for result in rows:
        for way, known in sorted(result.known.items()):
            for test in known:
                why = KNOWN_DIFFERENCES[result.name][test].why
                lines.append(f"\nknown difference: {result.name} {test} ({way}): {why}")
    for result in rows:
        for test, why in NOT_RUN.get(result.name, {}).items():
            lines.append(f"\nnot run: {result.name} {test}: {why}")
    # Last, where a log cut short (CI keeps the end) still shows them.
    for result in rows:
        for way, what in sorted(result.flaky.items()):
            lines.append(f"\nflaky once, not again: {result.name} ({way}): {what}")
            # (the first run's end: what a rare failure looked like)
            lines.append("```\n" + result.runs[way].tail[-1500:] + "\n```")
        for way, what in sorted(result.regressions.items()):
            lines.append(f"\nREGRESSION {result.name} ({way}): {what}")
            lines.append("```\n" + result.runs[way].tail[-1500:] + "\n```")
    return "\n".join(lines) + "\n"


def resolve(python: str, names: Sequence[str]) -> list[str]:
    """``names`` as ``python``'s test package has them (MOVED)."""
    probe = (
        "import importlib.util, sys\n"
        "for name in sys.argv[1:]:\n"
        "    print(name, importlib.util.find_spec('test.' + name) is not None)\n"
    )
    done = subprocess.run(
        [python, "-c", probe, *names],
        env=_environment("untraced"),
        capture_output=True,
        text=True,
        check=False,
    )
    found = dict(line.split() for line in done.stdout.splitlines())
    return [MOVED.get(name, name) if found.get(name) == "False" else name for name in names]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "tests", nargs="*", metavar="TEST", help=f"test files (default: {len(DEFAULT_TESTS)})"
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter to test")
    # Most files spend their time waiting (sleeps, timeouts): more jobs than cores.
    parser.add_argument("--jobs", type=int, default=4, help="runs at once (default 4)")
    parser.add_argument(
        "--stall",
        type=float,
        default=240.0,
        help="seconds a file may print nothing before it counts as hung (default 240)",
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=1800.0,
        help="seconds a file may take in all before it counts as hung (default 1800)",
    )
    parser.add_argument(
        "--ways", default=",".join(WAYS), help="comma-separated: " + ", ".join(WAYS)
    )
    parser.add_argument("--markdown", metavar="FILE", help="also write the table there")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    ways = [way.strip() for way in options.ways.split(",") if way.strip()]
    unknown = [way for way in ways if way not in WAYS]
    if unknown or not ways:
        parser.error(f"--ways={options.ways!r}: each is one of {', '.join(WAYS)}")
    if options.jobs < 1:
        parser.error(f"--jobs={options.jobs}: at least 1")
    for flag in ("stall", "limit"):
        if not getattr(options, flag) > 0:
            parser.error(f"--{flag}={getattr(options, flag)}: a number of seconds above 0")
    tests = options.tests or list(DEFAULT_TESTS)
    # Absolute, not resolved: a virtual environment's python is a symbolic link.
    python = os.path.abspath(options.python) if os.sep in options.python else options.python
    python = shutil.which(python) or python
    check = subprocess.run(
        [python, "-c", "import heapwatch._core, test.libregrtest"],
        env=_environment("untraced"),
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        print(f"{python} cannot run the guest check:\n{check.stderr}", file=sys.stderr)
        return 2
    tests = resolve(python, tests)
    started = time.monotonic()
    watch = Watch(options.stall, options.limit)
    results = check_files(python, tests, ways, options.jobs, watch)
    report = table(results, ways, python)
    stale = stale_differences(results, ways)
    for line in stale:
        report += f"\nSTALE known difference (it no longer fails under the agent): {line}"
    report += f"\nwall time {time.monotonic() - started:.0f}s, {options.jobs} jobs\n"
    print("\n" + report)
    if options.markdown:
        Path(options.markdown).write_text(report)
    return 1 if stale or any(result.regressions for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
