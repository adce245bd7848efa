"""A real OOM kill: the black box, the summary Kubernetes would show, and a
restarted service that knows.

The service runs in a memory cgroup of its own below the test's (200 MiB, no
swap), with the agent on as deploy/kubernetes runs it (sample mode, cycles
every 10 s, a dump directory), churns for a moment and then keeps about
10 MiB/s at one line until the kernel kills it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from support.agent_process import clean_env, fetch, free_ports, installed_python, parse, running
from support.memory_cgroups import child_memory_cgroup
from support.waiting import wait_for

LIMIT = 200 << 20
TOKEN = "black-box-test-token-0123456789"

SERVICE = """\
import os, sys, time

if sys.argv[1] == "restart":
    print("READY", flush=True)
    time.sleep(600)

# Churn first: memory that comes and goes must not be what the box blames.
deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    junk = [bytearray(4096) for _ in range(256)]
    del junk
HOLD = []
while True:
    HOLD.append(bytearray(256 * 1024))  # the leak
    time.sleep(0.025)
"""


def _leak_line(script: Path) -> int:
    lines = script.read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.endswith("# the leak"))


def test_an_oom_kill_leaves_a_black_box_a_summary_and_a_restart_that_knows(
    tmp_path: Path,
) -> None:
    python = installed_python()
    script = tmp_path / "leaky.py"
    script.write_text(SERVICE)
    line = _leak_line(script)
    dumps = tmp_path / "dumps"
    summary = tmp_path / "termination-log"
    settings = {
        "HEAPWATCH_ENABLED": "1",
        "HEAPWATCH_MODE": "sample",
        "HEAPWATCH_INTERVAL": "10s",
        "HEAPWATCH_DUMP_DIR": str(dumps),
        "HEAPWATCH_TERMINATION_LOG": str(summary),
    }
    with child_memory_cgroup(LIMIT) as cgroup:
        args = cgroup.command(python, str(script), "leak")
        env = clean_env(HEAPWATCH_EXPORTERS="none", **settings)
        with running(args, env, cwd=tmp_path) as proc:
            status = proc.wait(timeout=180)
            died = time.time()
            out, err = proc.output()
        assert status == -signal.SIGKILL, f"status {status}\n{out}\n{err}"
        assert cgroup.oom_kills() >= 1

    boxes = sorted(dumps.glob("*-blackbox.hwdump"))
    assert boxes, f"no black box in {sorted(p.name for p in dumps.iterdir())}\n{err}"
    newest = boxes[-1]
    shown = subprocess.run(
        [python, "-m", "heapwatch", "top", str(newest), "--json", "--limit", "3"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(shown.stdout)
    first = report["stats"][0]
    assert (Path(first["filename"]).name, first["lineno"]) == ("leaky.py", line)
    assert report["meta"]["trigger"] == "memory-threshold"
    assert int(report["meta"]["limit"]) == LIMIT
    text = subprocess.run(
        [python, "-m", "heapwatch", "top", str(newest)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "# black box: written as the container's working set" in text
    message = summary.read_text()
    assert f"leaky.py:{line}" in message
    assert newest.name in message or any(box.name in message for box in boxes)
    assert len(message.encode()) <= 4096
    for box in boxes:  # for the record (pytest -s): how long before the kill each landed
        print(f"\n{box.name}: landed {died - os.stat(box).st_mtime:.2f}s before the kill was seen")

    port = free_ports()
    env = clean_env(HEAPWATCH_PORT=str(port), HEAPWATCH_TOKEN=TOKEN, **settings)
    with running([python, str(script), "restart"], env, cwd=tmp_path) as proc:
        wait_for(lambda: "READY" in proc.output()[0], timeout=60, what="the restart's READY")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        index = wait_for(
            lambda: fetch(f"http://127.0.0.1:{port}/debug/heapwatch/?format=json", headers=auth),
            what="/debug/heapwatch/",
        )
        previous = json.loads(index)["previous_black_box"]
        assert (Path(previous["site"][0]).name, previous["site"][1]) == ("leaky.py", line)
        assert Path(previous["path"]).name in {box.name for box in boxes}
        metrics = wait_for(lambda: fetch(f"http://127.0.0.1:{port}/metrics"), what="/metrics")
        found = {
            labels: value
            for (name, labels), value in parse(metrics).items()
            if name == "heapwatch_previous_black_box_timestamp_seconds"
        }
        assert len(found) == 1
        labels = dict(next(iter(found)))
        assert labels["code_line_number"] == str(line)
        assert labels["dump"] == Path(previous["path"]).name
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        _out, err = proc.output()
    said = [text for text in err.splitlines() if "found the black box" in text]
    assert len(said) == 1 and f"leaky.py:{line}" in said[0], err
