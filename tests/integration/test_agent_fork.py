"""After fork() the agent restarts in the child; gunicorn workers each get an endpoint."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.runtime.threads import own_threads
from heapwatch_exporters.prometheus import PrometheusExporter
from support.agent_model import ModelSource
from support.agent_process import (
    clean_env,
    fetch,
    free_ports,
    installed_python,
    parse,
    running,
    site_values,
)
from support.waiting import wait_for


class RecordingExporter:
    name = "recording"

    def __init__(self) -> None:
        self.events: list[str] = []

    def start(self, agent: Agent) -> None:
        self.events.append("start")

    def shutdown(self, timeout: float) -> None:
        self.events.append("shutdown")

    def after_fork_in_child(self) -> None:
        self.events.append("after_fork_in_child")


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_in_the_child_the_same_agent_restarts_from_scratch() -> None:
    # Given a running agent that has cycled and serves /metrics
    source = ModelSource()
    source.allocate("app.py", 1, 1000)
    exporter = RecordingExporter()
    agent = Agent(
        AgentConfig(port=free_ports(4), port_range=4, interval=0.05),
        source=source,
        exporters=[exporter, PrometheusExporter()],
    )
    assert agent.start()
    try:
        wait_for(lambda: agent.readings().cycles >= 3)
        parent_address = agent.address
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running pytest's teardown
            try:
                fresh = agent.readings()
                report = {
                    "cycles_at_fork": fresh.cycles,
                    "result_at_fork": fresh.result is not None,
                    "events_at_fork": list(exporter.events),
                    "threads_at_fork": sorted(
                        t.name for t in [*threading.enumerate(), *own_threads()]
                    ),
                    "wake_after": source.wakeup[0] if source.wakeup else None,
                }
                source.wake()  # the child's first cycle is due: what the allocator does
                # (the restart runs in a thread of its own: the pending call
                # may come while the main thread holds any lock)
                deadline = time.monotonic() + 10
                while len(exporter.events) < 3 and time.monotonic() < deadline:
                    time.sleep(0.01)
                while agent.address is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                report["events"] = list(exporter.events)
                report["address"] = list(agent.address or ())
                deadline = time.monotonic() + 10
                while agent.readings().cycles < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
                report["threads"] = sorted(t.name for t in [*threading.enumerate(), *own_threads()])
                url = agent.metrics_url
                report["served"] = url is not None and b"heapwatch_traced_bytes 1000.0" in (
                    urllib.request.urlopen(url, timeout=5).read()
                )
                report["stopped"] = agent.stop(5)
                os.write(write, json.dumps(report).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            report = json.loads(pipe.read())
        os.waitpid(pid, 0)
        # Then the child restarted the agent in place, from scratch, on its own port
        assert report["cycles_at_fork"] == 0  # counters dropped
        assert report["result_at_fork"] is False
        # nothing of it running until its first cycle is due, an interval on
        assert report["events_at_fork"] == ["start", "after_fork_in_child"]
        assert report["threads_at_fork"] == ["MainThread"]
        assert report["wake_after"] == 0.05
        assert report["events"] == ["start", "after_fork_in_child", "start"]
        assert tuple(report["address"]) != parent_address
        assert "heapwatch-agent" in report["threads"]
        assert report["served"] is True
        assert report["stopped"] is True
        # while the parent's agent carries on, its endpoint untouched
        assert agent.running
        assert agent.address == parent_address
        cycles = agent.readings().cycles
        wait_for(lambda: agent.readings().cycles > cycles)
        assert fetch(f"http://127.0.0.1:{parent_address[1]}/metrics") is not None
    finally:
        agent.stop()


FORKING = """\
import os, sys, time
parent = []
parent.append(bytearray(2_000_000))  # PARENT
time.sleep(float(sys.argv[1]))
pid = os.fork()
if pid == 0:
    child = []
    child.append(bytearray(3_000_000))  # CHILD
    print("forked", time.time(), flush=True)
    # Alive, running Python that allocates: the agent restarts at its first
    # allocation past its first cycle's deadline (one that sleeps in C for
    # good, or whose objects all come from free lists, never restarts it:
    # docs/design/agent.md, "Fork").
    for _ in range(12000):
        time.sleep(0.01)
        str(time.time())
    os._exit(0)
time.sleep(120)
"""


def line_of(source: str, marker: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), 1) if marker in text)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = fetch(f"http://127.0.0.1:{port}/metrics")
    return parse(text) if text is not None else {}


def test_a_forked_child_restarts_the_agent_with_its_own_endpoint_and_state(
    tmp_path: Path,
) -> None:
    # Given a process whose agent has run for a while, then forks
    script = tmp_path / "forking.py"
    script.write_text(FORKING)
    base = free_ports(3)
    env = clean_env(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_MODE="exact",
        HEAPWATCH_PORT=str(base),
        HEAPWATCH_PORT_RANGE="3",
        HEAPWATCH_INTERVAL="0.1",
    )
    args = [installed_python(), str(script), "1.5"]
    with running(args, env, cwd=tmp_path, start_new_session=True) as proc:
        try:
            child = wait_for(
                lambda: (
                    (s := scrape(base + 1))
                    and site_values(s, "heapwatch_lineno_size_bytes", "forking.py").get(
                        line_of(FORKING, "# CHILD")
                    )
                    and s
                )
            )
            parent = scrape(base)
            forked_at = float(proc.output()[0].split()[1])  # type: ignore[attr-defined]
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
    parent_line, child_line = line_of(FORKING, "# PARENT"), line_of(FORKING, "# CHILD")
    # Then the child serves on the next port, and sees its memory, inherited included
    child_sites = site_values(child, "heapwatch_lineno_size_bytes", "forking.py")
    assert child_sites[child_line] >= 3_000_000
    assert child_sites[parent_line] >= 2_000_000
    # while the parent's endpoint still serves the parent only
    parent_sites = site_values(parent, "heapwatch_lineno_size_bytes", "forking.py")
    assert parent_sites[parent_line] >= 2_000_000
    assert child_line not in parent_sites
    # and the child started from scratch: its own counters, a fresh baseline
    assert child["heapwatch_cycles_total", ()] < parent["heapwatch_cycles_total", ()]
    assert child["heapwatch_last_cycle_timestamp_seconds", ()] >= forked_at - 1
    child_growth = site_values(child, "heapwatch_lineno_growth_bytes", "forking.py")
    assert child_growth.get(parent_line, 0) == 0


APP = """\
import os, time

leak = []


def app(environ, start_response):
    leak.append(bytearray(100_000))  # LEAK
    time.sleep(0.02)
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"""


@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.parametrize("preload", [False, True], ids=["no-preload", "preload"])
def test_every_gunicorn_worker_is_scraped_on_its_own_port(tmp_path: Path, preload: bool) -> None:
    pytest.importorskip("gunicorn")
    gunicorn = Path(sys.executable).parent / "gunicorn"
    if not gunicorn.exists():
        pytest.skip("gunicorn is not installed next to " + sys.executable)
    installed_python()
    # Given gunicorn with two workers, the agent switched on by the environment
    (tmp_path / "app.py").write_text(APP)
    app_port = free_ports()
    base = free_ports(4)
    env = clean_env(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_MODE="exact",
        HEAPWATCH_PORT=str(base),
        HEAPWATCH_PORT_RANGE="4",
        HEAPWATCH_INTERVAL="0.2",
    )
    args = [str(gunicorn), "-w", "2", "-b", f"127.0.0.1:{app_port}", "--chdir", str(tmp_path)]
    args += ["--preload", "app:app"] if preload else ["app:app"]
    with running(args, env, cwd=tmp_path) as proc:
        # When requests reach both workers
        served: Counter[int] = Counter()
        lock = threading.Lock()

        def request() -> bool:
            try:
                url = f"http://127.0.0.1:{app_port}/"
                with urllib.request.urlopen(url, timeout=10) as response:
                    pid = int(response.read())
            except urllib.error.HTTPError as exc:
                exc.close()  # its body is a temporary file: 3.14 warns if it is left open
                return False
            except OSError:
                return False
            with lock:
                served[pid] += 1
            return True

        def client() -> None:
            for _ in range(40):
                request()

        wait_for(request, timeout=60)  # the workers are up
        for _ in range(10):
            threads = [threading.Thread(target=client) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if len(served) >= 2:
                break
        assert len(served) == 2, f"requests reached {dict(served)}"
        leak_line = line_of(APP, "# LEAK")

        # Then each process has its endpoint in the documented range, and the
        # leak each worker holds is the requests it served
        def leaks() -> list[float] | None:
            found = []
            for port in range(base, base + 4):
                samples = scrape(port)
                if samples:
                    sites = site_values(samples, "heapwatch_lineno_size_bytes", "app.py")
                    found.append(sites.get(leak_line, 0.0))
            expected = sorted([0.0] + [n * 100_000 for n in served.values()])
            ok = len(found) == 3 and all(
                abs(a - b) <= 0.01 * b for a, b in zip(sorted(found), expected)
            )
            return found if ok else None

        try:
            wait_for(leaks, timeout=30)
        except AssertionError:
            seen = [
                site_values(scrape(port), "heapwatch_lineno_size_bytes", "app.py")
                for port in range(base, base + 4)
            ]
            raise AssertionError(f"served {dict(served)}; endpoints saw {seen}") from None
        # and gunicorn stops cleanly, every agent with it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        _, stderr = proc.output()  # type: ignore[attr-defined]
    assert "Traceback" not in stderr, stderr
    assert "heapwatch" not in stderr, stderr
