"""A service that forks sees no thread of heapwatch's across the fork.

In the parent, the agent's threads end before ``fork()`` and start again
after it (3.12+ warns, or raises under ``-W error``, when a process with
other threads forks); in the child, nothing of ours runs until its first
cycle is due (docs/design/agent.md, "Fork").
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.agent_process import free_ports, installed_python, run_script

MODES = ["exact", "sample"]

# A single-threaded service that forks, reports what the child sees at once
# and after its first cycle is due (it keeps running Python meanwhile), then
# what the parent serves.
CHILD_THREADS = """\
import json, os, sys, threading, time, urllib.request

from heapwatch.runtime.threads import own_threads

def seen():
    return {
        "active": threading.active_count(),
        "frames": len(sys._current_frames()),
        "names": sorted(t.name for t in threading.enumerate()),
        "ours": sorted(t.name for t in own_threads()),
    }

time.sleep(0.3)  # the parent's agent has cycled and serves
before = seen()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    report = {"at_fork": seen()}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "heapwatch-agent" not in seen()["ours"]:
        time.sleep(0.01)  # and allocates, as a live process does
    report["later"] = seen()
    from heapwatch import get_agent
    agent = get_agent()
    report["url"] = agent.metrics_url if agent else None
    if report["url"]:
        report["served"] = b"heapwatch_cycles_total" in urllib.request.urlopen(
            report["url"], timeout=5).read()
    os.write(write, json.dumps(report).encode())
    os._exit(0)
os.close(write)
with os.fdopen(read) as pipe:
    report = json.loads(pipe.read())
os.waitpid(pid, 0)
report["parent_before"] = before
report["parent_after"] = seen()
print(json.dumps(report))
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_forked_child_has_no_thread_of_ours_until_its_first_cycle(
    tmp_path: Path, mode: str
) -> None:
    installed_python()
    # Given a single-threaded service, the agent on by environment, that forks
    done = run_script(
        CHILD_THREADS,
        cwd=tmp_path,
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_MODE=mode,
        HEAPWATCH_INTERVAL="0.2",
        HEAPWATCH_PORT=str(free_ports(2)),
        HEAPWATCH_PORT_RANGE="2",
    )
    report = json.loads(done.stdout)
    # Then right after fork() the child sees its one thread, as without heapwatch
    one = {"active": 1, "names": ["MainThread"]}
    assert report["at_fork"] == {**one, "frames": 1, "ours": []}
    # and once its first cycle is due the agent runs there, serving on its own
    # port, where threading lists none of its threads, nor in the parent
    assert "heapwatch-agent" in report["later"]["ours"]
    assert report["served"] is True
    for seen in ("later", "parent_before", "parent_after"):
        assert {k: report[seen][k] for k in one} == one, (seen, report[seen])
    # while the parent kept its agent's threads across the fork
    assert report["parent_after"]["ours"] == report["parent_before"]["ours"]
    assert "heapwatch-agent" in report["parent_after"]["ours"]
    assert done.stderr == ""


# A pre-fork server: forks workers in quick succession from __main__, where
# Python's default filters show a DeprecationWarning on stderr; each worker
# exits at once; then the parent serves.
PRE_FORK = """\
import os, sys, time, urllib.request
from heapwatch import get_agent

time.sleep(0.3)
for _ in range(int(sys.argv[1])):
    pid = os.fork()  # 3.12+ warns here if a thread of ours ran
    if pid == 0:
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
print(b"heapwatch_cycles_total" in urllib.request.urlopen(get_agent().metrics_url).read())
"""


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    """A loopback HTTP server that takes every POST (the push exporters')."""

    class Accept(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Accept)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# Every exporter that runs a thread of its own, beside the agent's and the
# HTTP server's.
EVERY_THREAD = "prometheus,otlp,pyroscope,otlp-profiles"


@pytest.mark.skipif(sys.version_info < (3, 12), reason="3.12+ warns of fork() with threads")
@pytest.mark.parametrize("exporters", ["prometheus", EVERY_THREAD])
@pytest.mark.parametrize("warnings", ["default", "error::DeprecationWarning"])
@pytest.mark.parametrize("mode", MODES)
def test_forking_warns_of_no_thread_in_a_single_threaded_service(
    tmp_path: Path, mode: str, warnings: str, exporters: str, receiver: str
) -> None:
    installed_python()
    # Given a single-threaded service, the agent on by environment (its HTTP
    # server and agent threads run), with Python's default warning filters
    # or -W error (CPython clears the exception the warning then becomes,
    # 3.12 to 3.14: either way nothing may be shown nor raised)
    done = run_script(
        PRE_FORK,
        "20",
        cwd=tmp_path,
        check=False,
        python_args=("-W", warnings),
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_MODE=mode,
        HEAPWATCH_INTERVAL="0.05",
        HEAPWATCH_PORT=str(free_ports()),
        HEAPWATCH_PORT_RANGE="1",
        HEAPWATCH_EXPORTERS=exporters,
        HEAPWATCH_PYROSCOPE_URL=receiver,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver,
    )
    # Then forking 20 workers in a row shows no warning (the workers, which
    # exit at once, start no agent), and the parent still serves its metrics
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "True", "")


MULTIPROCESSING_FORK = """\
import multiprocessing, os, sys

def square(n):
    return n * n

if __name__ == "__main__":
    context = multiprocessing.get_context("fork")
    process = context.Process(target=square, args=(3,))
    process.start()
    process.join()
    print(process.exitcode)
    with context.Pool(2) as pool:
        print(sum(pool.map(square, range(100))))
"""


@pytest.mark.parametrize("mode", MODES)
def test_multiprocessing_fork_start_method_works_and_warns_nothing(
    tmp_path: Path, mode: str
) -> None:
    installed_python()
    # Given multiprocessing's fork start method, in a service run with every
    # DeprecationWarning shown and the agent on by environment
    done = run_script(
        MULTIPROCESSING_FORK,
        cwd=tmp_path,
        check=False,
        python_args=("-W", "always::DeprecationWarning"),
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_MODE=mode,
        HEAPWATCH_INTERVAL="0.05",
        HEAPWATCH_PORT=str(free_ports(8)),
        HEAPWATCH_PORT_RANGE="8",
    )
    # Then the process and the pool's workers run as without heapwatch (the
    # pool forks its workers before it starts threads of its own)
    assert (done.returncode, done.stdout.split(), done.stderr) == (0, ["0", "328350"], "")
