"""get_tracemalloc_memory() counts every byte the core holds: checked
against the RSS growth of a process tracing a million live blocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import gc, json, sys
    from heapwatch import _core

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    traced = sys.argv[1] == "traced"
    gc.disable()
    if traced:
        _core.start(1)
    before = rss()
    keep = [object() for _ in range(1_000_000)]
    after = rss()
    print(json.dumps({
        "rss": after - before,
        "tracer": _core.get_tracemalloc_memory() if traced else 0,
        "traces": _core.get_stats()["live_traces"] if traced else 0,
    }))
    """
)


def _measure(kind: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return json.loads(out)  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("HEAPWATCH_SANITIZED") == "1",
    reason="ASan's shadow memory and redzones make RSS meaningless",
)
def test_tracer_memory_accounts_for_the_rss_it_adds() -> None:
    untraced = min((_measure("untraced") for _ in range(2)), key=lambda m: m["rss"])
    traced = min((_measure("traced") for _ in range(2)), key=lambda m: m["rss"])
    assert traced["traces"] >= 1_000_000
    added = traced["rss"] - untraced["rss"]
    # The tables are allocated at their capacity and touched, so RSS follows
    # them closely; allow for allocator rounding and page granularity.
    assert 0.8 * added <= traced["tracer"] <= 1.25 * added + 1_000_000, (added, traced)
    # The budget: at most 48 bytes of RSS per live traced block.
    assert added / traced["traces"] <= 48
