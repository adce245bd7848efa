"""On-demand dumps of a script that never imports heapwatch, with the installed
package: auto-start, the endpoint, the signal, and the ``heapwatch`` command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from heapwatch.server.dumps import list_dumps
from support.agent_process import (
    clean_env,
    fetch,
    free_ports,
    installed_python,
    installed_script,
    running,
)
from support.waiting import wait_for

TOKEN = "installed-token-0123456789"
LEAKY = """\
import time

leak = []


def grow():
    leak.append(bytearray(100_000))  # LEAK


for _ in range(30):
    grow()
print("READY", flush=True)
time.sleep(120)
"""
LEAK_LINE = next(i for i, text in enumerate(LEAKY.splitlines(), 1) if "# LEAK" in text)


def test_a_service_that_never_imports_heapwatch_dumps_on_request(tmp_path: Path) -> None:
    # Given a leaking script started with the agent, a token and a dump directory
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY)
    port = free_ports()
    dumps = tmp_path / "dumps"
    env = clean_env(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_PORT=str(port),
        HEAPWATCH_MODE="exact",
        HEAPWATCH_TOKEN=TOKEN,
        HEAPWATCH_DUMP_DIR=str(dumps),
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    top_url = f"http://127.0.0.1:{port}/debug/heapwatch/top?format=json&limit=1"
    with running([installed_python(), str(script)], env, cwd=tmp_path) as proc:
        wait_for(lambda: "READY" in proc.output()[0])  # type: ignore[attr-defined]
        # When its top is asked for over HTTP
        body = wait_for(lambda: fetch(top_url, headers=auth))
        first = json.loads(body)["stats"][0]
        # Then the leaking line is first
        assert (os.path.basename(first["filename"]), first["lineno"]) == ("leaky.py", LEAK_LINE)
        assert fetch(top_url) is None  # 401 without the token
        # When it gets SIGUSR2, a dump appears, that the heapwatch command reads
        os.kill(proc.pid, signal.SIGUSR2)
        wait_for(lambda: dumps.is_dir() and list_dumps(str(dumps)))
        assert proc.poll() is None
    ((name, _size),) = list_dumps(str(dumps))
    done = subprocess.run(
        [installed_script("heapwatch"), "top", str(dumps / name), "--limit", "1"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "Top 1 lines"
    assert lines[1].startswith(f"#1: {script}:{LEAK_LINE}: ")
    assert lines[2] == "    leak.append(bytearray(100_000))  # LEAK"


def test_the_heapwatch_command_reports_a_damaged_dump_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hwdump"
    bad.write_bytes(b"\x89HEAPWATCH\r\n\x1a\n\x01\x00\x01\x00" + b"\x00" * 40)
    started = time.monotonic()
    done = subprocess.run(
        [installed_script("heapwatch"), "top", str(bad)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert time.monotonic() - started < 30
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"heapwatch top: '{bad}'")
