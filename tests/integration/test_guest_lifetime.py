"""heapwatch never keeps a process alive: a child forked from a thread other
than the main one ends when its threads end (test_threading's
test_main_thread_after_fork_from_nonmain_thread hung for ever before)."""

from __future__ import annotations

import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from support.agent_process import run_script

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


FORK_WITH_OTLP = textwrap.dedent(
    """\
    import os, sys, time

    import heapwatch

    heapwatch.start_agent(exporters="otlp", port=0, interval=0.05)
    # The OpenTelemetry SDK, imported by the agent after it registered its
    # at-fork hook, runs resource detection in a ThreadPoolExecutor, whose
    # module holds a lock across fork() until its own at-fork hook, later.
    pid = os.fork()
    if pid == 0:
        time.sleep(0.3)
        os._exit(0 if heapwatch.get_agent() is not None else 7)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("child exit:", os.waitstatus_to_exitcode(status))
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        print("child hung")
    """
)


def test_the_agent_restarts_in_a_child_after_every_at_fork_hook(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    done = run_script(
        FORK_WITH_OTLP,
        cwd=tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    assert done.stdout.strip() == "child exit: 0", done.stdout + done.stderr


def test_a_server_stopped_with_no_time_left_still_ends_its_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a server whose thread is out of select(), accepting a connection
    from heapwatch.server import http as _server
    from heapwatch.server.router import Router

    accepting = threading.Event()
    accept = _server._HTTPServer.process_request

    def slow_accept(self: Any, request: Any, client_address: Any) -> None:
        accepting.set()
        time.sleep(0.5)
        accept(self, request, client_address)

    monkeypatch.setattr(_server._HTTPServer, "process_request", slow_accept)
    router = Router()
    router.add("/metrics", lambda environ, start_response: [b""])
    server = _server.Server(router, "127.0.0.1", 0)
    assert server.start() and server.address is not None
    thread = server._thread
    assert thread is not None

    def request() -> None:
        try:
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as error:
            error.close()  # its body is a temporary file: 3.14 warns if it is left open
        except OSError:
            pass  # stop() may abort it: no answer

    client = threading.Thread(target=request)
    client.start()
    assert accepting.wait(10)
    # When it is stopped with no time to wait (an exporter used the deadline up)
    server.stop(0.0)
    client.join(10)
    # Then its thread still ends, not stranded on an empty selector
    thread.join(5)
    assert not thread.is_alive()
