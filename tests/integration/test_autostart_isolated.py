"""Auto-start under ``python -E`` / ``-I``: off, as CPython ignores
PYTHONTRACEMALLOC there; and sys._debugmallocstats() while tracing, as the
stdlib tracer has it."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from support.agent_process import clean_env, installed_python, run_script

PROBE = textwrap.dedent(
    """\
    import sys
    agent = sys.modules.get("heapwatch.agent.agent")
    print("agent running:", bool(agent and agent.get_agent()))
    sys.stdout.flush()
    sys._debugmallocstats()
    """
)


def run_installed(flags: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    python = installed_python()
    return subprocess.run(
        [python, *flags, "-c", PROBE],
        env=clean_env(HEAPWATCH_ENABLED="1", HEAPWATCH_EXPORTERS="none", HEAPWATCH_MODE="exact"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.mark.parametrize("flag", ["-E", "-I"])
def test_python_told_to_ignore_its_environment_starts_no_agent(tmp_path: Path, flag: str) -> None:
    # Given HEAPWATCH_ENABLED=1, when Python runs with -E or -I
    done = run_installed([flag], tmp_path)
    # Then the hook starts nothing: the process is the untraced one
    assert "agent running: False" in done.stdout
    assert "Small block threshold" in done.stderr  # pymalloc's own statistics


def test_without_the_flags_the_same_environment_starts_the_agent(tmp_path: Path) -> None:
    done = run_installed([], tmp_path)
    assert "agent running: True" in done.stdout


DEBUGMALLOCSTATS = textwrap.dedent(
    """\
    import sys

    if sys.argv[1] == "stdlib":
        import tracemalloc as tracer
        tracer.start(25)
    elif sys.argv[1] != "untraced":
        from heapwatch import tracemalloc as tracer
        tracer.start(25, mode=sys.argv[1])
    sys._debugmallocstats()
    if sys.argv[1] != "untraced":
        tracer.stop()
        print("--- stopped", file=sys.stderr, flush=True)
        sys._debugmallocstats()
    """
)


def sections(text: str) -> tuple[bool, bool]:
    return "Small block threshold" in text, "free PyDictObjects" in text


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_debugmallocstats_while_tracing_shows_what_it_shows_under_the_stdlib_tracer(
    tmp_path: Path, mode: str
) -> None:
    def run(tracer: str) -> list[tuple[bool, bool]]:
        done = run_script(DEBUGMALLOCSTATS, tracer, cwd=tmp_path)
        return [sections(part) for part in done.stderr.split("--- stopped")]

    untraced = run("untraced")
    stdlib = run("stdlib")
    ours = run(mode)
    # While tracing, allocator hooks hide pymalloc's own statistics from
    # CPython (it checks that pymalloc is the object allocator) for either
    # tracer; the free lists show
    assert ours[0] == stdlib[0] == (False, True)
    # and once tracing stops, everything shows again, as untraced
    assert ours[1] == stdlib[1] == untraced[0] == (True, True)


SUBINTERPRETER = textwrap.dedent(
    """\
    import threading
    import _testcapi

    _testcapi.run_in_subinterp(
        "import sys, threading; "
        "print('sub', 'heapwatch.agent.agent' in sys.modules, len(threading.enumerate()))"
    )
    from heapwatch.runtime.threads import own_threads  # (threading lists none of ours)

    print("main", len(threading.enumerate()), *sorted(t.name for t in own_threads()))
    """
)


def test_a_subinterpreter_starts_no_agent_of_its_own(tmp_path: Path) -> None:
    pytest.importorskip("_testcapi")
    # Given HEAPWATCH_ENABLED=1, when the service runs code in a subinterpreter
    # (which runs site and the .pth hook again)
    done = subprocess.run(
        [installed_python(), "-c", SUBINTERPRETER],
        env=clean_env(HEAPWATCH_ENABLED="1", HEAPWATCH_EXPORTERS="none"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # Then the process's one agent is the main interpreter's, and nothing is said
    assert done.stdout.splitlines() == ["sub False 1", "main 1 heapwatch-agent"], (
        done.stdout + done.stderr
    )
    assert done.stderr == ""


SPAWNING_SERVICE = textwrap.dedent(
    """\
    import json, multiprocessing, os, sys, time

    def work(_):
        return os.getpid()

    if __name__ == "__main__":
        context = multiprocessing.get_context("spawn")
        lock = context.Lock()  # a named semaphore: the resource tracker starts
        with context.Pool(2) as pool:
            workers = set(pool.map(work, range(8)))
            time.sleep(0.5)
            children = {}
            for task in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{task}/children") as listed:
                    for pid in listed.read().split():
                        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                            words = cmdline.read().decode(errors="replace")
                        with open(f"/proc/{pid}/maps") as maps:
                            loaded = "heapwatch/_core" in maps.read()
                        children[pid] = ("resource_tracker" in words, int(pid) in workers, loaded)
            print(json.dumps(children))
    """
)


def test_multiprocessings_resource_tracker_gets_no_agent_its_workers_do(
    tmp_path: Path,
) -> None:
    # Given a service whose spawned workers and resource tracker start with
    # HEAPWATCH_ENABLED=1, as uvicorn --workers starts them
    python = installed_python()
    script = tmp_path / "service.py"
    script.write_text(SPAWNING_SERVICE)
    done = subprocess.run(
        [python, str(script)],
        env=clean_env(HEAPWATCH_ENABLED="1", HEAPWATCH_EXPORTERS="none"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    children = json.loads(done.stdout)
    trackers = [loaded for tracker, _w, loaded in children.values() if tracker]
    workers = [loaded for tracker, _w, loaded in children.values() if not tracker]
    # Then the pool's two workers run an agent, the tracker none
    assert trackers == [False], children
    assert workers == [True, True], children
    assert any(worker for _t, worker, _l in children.values())
