"""heapwatch never keeps a process alive: a child forked from a thread other
than the main one ends when its threads end (test_threading's
test_main_thread_after_fork_from_nonmain_thread hung for ever before)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from agent_process import run_script

FORK_FROM_A_THREAD = textwrap.dedent(
    """\
    import os, sys, threading, time

    import heapwatch

    heapwatch.start_agent(
        exporters=sys.argv[1].split(","), port=0, interval=0.05, token="t" * 32,
        dump_dir=sys.argv[2],
    )
    status = []


    def work():
        pid = os.fork()
        if pid == 0:
            if sys.argv[3] == "helper":
                # a thread of the child's own outlives the forking one
                threading.Thread(target=time.sleep, args=(0.5,)).start()
            os.write(1, b"child ran\\n")
            return  # the child ends when its last thread does
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status.append(os.waitstatus_to_exitcode(code))
                return
            time.sleep(0.02)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status.append("still alive after 20s")


    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    print("child exit:", status[0])
    """
)


@pytest.mark.parametrize("exporters", ["none", "prometheus"])
@pytest.mark.parametrize("helper", ["alone", "helper"])
def test_a_child_forked_from_a_thread_ends_when_its_threads_do(
    tmp_path: Path, exporters: str, helper: str
) -> None:
    # Given a service with the agent (cycling, serving, dump signal armed),
    # a thread of which forks a child that returns from that thread
    done = run_script(
        FORK_FROM_A_THREAD,
        exporters,
        str(tmp_path / "dumps"),
        helper,
        cwd=tmp_path,
        # 3.12+ warns of any fork with threads running, heapwatch's or not
        python_args=("-W", "ignore::DeprecationWarning"),
    )
    # Then the child ends, as it does without heapwatch, and says nothing on stderr
    assert done.stdout.count("child ran") == 1, done.stdout + done.stderr
    assert "child exit: 0" in done.stdout, done.stdout + done.stderr
    assert done.stderr == ""
