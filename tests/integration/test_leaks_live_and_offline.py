"""One real process's memory scored live and from its dumps: the agent's
``/debug/heapwatch/leaks`` and ``heapwatch leaks`` on dumps fetched from
its ``/debug/heapwatch/snapshot`` give the same verdict (issue 23): a leak
is a suspect both ways, an LRU cache that evicts neither."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from support.agent_process import clean_env, free_ports, installed_python, running
from support.waiting import wait_for

TOKEN = "test-token-0123456789abcdef"
WINDOW = 10.0

SERVICE = """\
import collections, time

def leak_more(leaked, n):
    leaked.extend([bytes(4096) for _ in range(n)])

def cache_put(cache, key):
    cache[key] = bytes(65536)

leaked, cache, key = [], collections.OrderedDict(), 0
began = last = time.monotonic()
owed_leak = owed_cache = 0.0
print("ready", flush=True)
while True:
    now = time.monotonic()
    owed_leak += (now - last) * 256  # 1 MiB/s of 4 KiB blocks
    owed_cache += (now - last) * 32  # 2 MiB/s of 64 KiB entries
    last = now
    leak_more(leaked, int(owed_leak))
    owed_leak -= int(owed_leak)
    while owed_cache >= 1:
        owed_cache -= 1
        key += 1
        cache_put(cache, key)
        if len(cache) > 192:  # 12 MiB: full after 6 s, then evicting its oldest
            cache.popitem(last=False)
    time.sleep(0.01)
"""
LEAK_LINE, CACHE_LINE = 4, 7


def _get(port: int, path: str) -> bytes:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body: bytes = response.read()
        return body


def _verdicts(report: dict[str, object], script: Path) -> set[int]:
    suspects = report["suspects"]
    assert isinstance(suspects, list)
    return {s["lineno"] for s in suspects if s["filename"] == str(script)}


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_the_agent_and_its_dumps_give_the_same_verdict(mode: str, tmp_path: Path) -> None:
    python = installed_python()
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    assert script.read_text().splitlines()[LEAK_LINE - 1].strip().startswith("leaked.extend")
    assert script.read_text().splitlines()[CACHE_LINE - 1].strip().startswith("cache[key]")
    port = free_ports()
    env = clean_env(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_MODE=mode,
        HEAPWATCH_SAMPLE_INTERVAL="64KiB",
        HEAPWATCH_INTERVAL="0.5",
        HEAPWATCH_LEAK_WINDOW=f"{WINDOW:g}s",
        HEAPWATCH_PORT=str(port),
        HEAPWATCH_TOKEN=TOKEN,
        HEAPWATCH_EXPORTERS="",
    )
    # Given a service leaking at one line and turning an LRU cache over
    # at another, under the agent at a 10 s window
    with running([python, str(script)], env, cwd=tmp_path) as service:
        wait_for(lambda: "ready" in service.output()[0], what="the service")  # type: ignore[attr-defined]
        time.sleep(WINDOW)
        # When three dumps are fetched 2 s apart, and at the last the
        # agent's own suspects
        paths = []
        for index in range(3):
            if index:
                time.sleep(2.0)
            path = tmp_path / f"s{index}.hwdump"
            path.write_bytes(_get(port, "/debug/heapwatch/snapshot"))
            paths.append(str(path))
        live = json.loads(_get(port, "/debug/heapwatch/leaks?format=json"))
        assert service.poll() is None, service.output()  # type: ignore[attr-defined]
    done = subprocess.run(
        [python, "-m", "heapwatch", "leaks", "--json", *paths],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    offline = json.loads(done.stdout)
    # Then both see the leak and not the cache, over the agent's window
    assert _verdicts(live, script) == {LEAK_LINE}, live
    assert _verdicts(offline, script) == {LEAK_LINE}, offline
    assert live["window"] == offline["window"] == WINDOW
