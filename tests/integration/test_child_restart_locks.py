"""A forked child's agent restarts from a pending call in the main thread,
at whatever bytecode the service is running, holding whatever locks it
holds.  The restart takes locks (heapwatch's, the stdlib's, OpenTelemetry's),
so it must not run in that thread: a gunicorn gthread worker hung about half
the time, its pending call run inside ThreadPoolExecutor.submit (which holds
concurrent.futures' _global_shutdown_lock) while the restart built
OpenTelemetry's Resource, which submits to a ThreadPoolExecutor too."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.agent_process import free_ports, installed_python, run_script

pytest.importorskip("opentelemetry.sdk.resources")

HOLDS_THE_LOCK = """\
import concurrent.futures.thread as pool_thread
import os, time

pid = os.fork()
if pid == 0:
    # The child's first cycle falls due while its main thread holds the lock
    # ThreadPoolExecutor.submit holds (the restart's OpenTelemetry Resource
    # submits its detectors to a pool).
    deadline = time.monotonic() + 1.5
    with pool_thread._global_shutdown_lock:
        junk = []
        while time.monotonic() < deadline:
            junk.append(bytearray(4096))
            if len(junk) > 256:
                junk.clear()
    time.sleep(1.0)  # the restart, free to take the lock now
    from heapwatch import get_agent
    agent = get_agent()
    print("child restarted", agent is not None and agent.running, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child status", status, flush=True)
"""


class _Accept(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    """An OTLP/HTTP endpoint on 127.0.0.1 that accepts everything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_child_restart_waits_for_no_lock_the_main_thread_holds(
    tmp_path: Path, mode: str, receiver: str
) -> None:
    installed_python()
    done = run_script(
        HOLDS_THE_LOCK,
        cwd=tmp_path,
        timeout=30.0,
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_MODE=mode,
        HEAPWATCH_INTERVAL="0.2",
        HEAPWATCH_EXPORTERS="prometheus,otlp",
        HEAPWATCH_PORT=str(free_ports(2)),
        HEAPWATCH_PORT_RANGE="2",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver,
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    assert done.stdout.splitlines() == ["child restarted True", "child status 0"], done
    assert done.stderr == "", done.stderr
