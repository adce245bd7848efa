"""deploy/gunicorn/gunicorn.conf.py with a real gunicorn: the master and each
worker serve their own /metrics on consecutive ports of the range, and a
worker gunicorn replaces takes the port its predecessor freed."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _deploy_support import DEPLOY, free_port, get_text, source_pythonpath, stop_process

from support.external_tools import require_tool
from support.waiting import wait_for

pytestmark = [pytest.mark.tools, pytest.mark.slow]

CONFIG = DEPLOY / "gunicorn" / "gunicorn.conf.py"
RANGE = 8
WORKERS = 2
SERVES = re.compile(r"heapwatch: (master|worker) (\d+) serves http://127\.0\.0\.1:(\d+)/metrics")

APP = """
def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\\n"]
"""


def free_port_range(count: int) -> int:
    """A first port such that it and the count - 1 above it are free."""
    for _ in range(50):
        base = free_port()
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError(f"no {count} consecutive free ports")


def announced(
    log: Path, predicate: Callable[[list[tuple[str, int, int]]], bool]
) -> list[tuple[str, int, int]]:
    """The (role, pid, port) announcements in the log, once predicate(them)."""

    def found() -> list[tuple[str, int, int]]:
        text = log.read_text(encoding="utf-8", errors="replace")
        seen = [(r, int(pid), int(port)) for r, pid, port in SERVES.findall(text)]
        return seen if predicate(seen) else []

    return wait_for(
        found, 30.0, 0.2, what=lambda: f"gunicorn log:\n{log.read_text(errors='replace')}"
    )


def test_master_and_workers_serve_their_own_metrics(tmp_path: Path) -> None:
    if importlib.util.find_spec("gunicorn") is None:
        require_tool("gunicorn")
    (tmp_path / "wsgi_app.py").write_text(APP, encoding="utf-8")
    base = free_port_range(RANGE)
    app_port = free_port()
    env = dict(os.environ)
    source_pythonpath(env, str(tmp_path))
    env.update(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_HOST="127.0.0.1",
        HEAPWATCH_PORT=str(base),
        HEAPWATCH_PORT_RANGE=str(RANGE),
        HEAPWATCH_INTERVAL="1",
        GUNICORN_BIND=f"127.0.0.1:{app_port}",
        GUNICORN_WORKERS=str(WORKERS),
        XDG_RUNTIME_DIR=str(tmp_path),  # gunicorn 23+'s control socket
    )
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(CONFIG), "wsgi_app:application"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    try:
        found = announced(log, lambda f: len(f) == WORKERS + 1)
        roles = {port: (role, pid) for role, pid, port in found}
        # The master takes the first port, the workers the next ones.
        assert sorted(roles) == list(range(base, base + WORKERS + 1)), found
        assert roles[base][0] == "master"
        assert roles[base][1] == proc.pid
        assert len({pid for _role, pid, _port in found}) == WORKERS + 1
        for port in roles:
            metrics = get_text(f"http://127.0.0.1:{port}/metrics")
            assert "heapwatch_info{" in metrics, port
            assert "heapwatch_traced_bytes " in metrics, port
        assert get_text(f"http://127.0.0.1:{app_port}/") == "ok\n"

        # A worker dies; its replacement serves on the port it freed.
        (victim_port, (_, victim)) = max(roles.items())
        os.kill(victim, signal.SIGKILL)
        found = announced(log, lambda f: len(f) == WORKERS + 2)
        role, pid, port = found[-1]
        assert role == "worker" and pid != victim and port == victim_port, found
        assert "heapwatch_info{" in get_text(f"http://127.0.0.1:{port}/metrics")
    finally:
        stop_process(proc, timeout=30)
    assert proc.returncode == 0, log.read_text(encoding="utf-8", errors="replace")
