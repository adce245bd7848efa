"""``go tool pprof`` reads the agent's /debug/pprof/heap and /allocs: the
leaking line tops inuse_space, the churning one alloc_space."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest
from test_pprof_go import go, run_pprof, top_rows

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.cli import main

pytestmark = pytest.mark.tools

__all__ = ["go"]  # the fixture, shared with test_pprof_go

TOKEN = "pprof-test-token-0123456789"
HERE = os.path.basename(__file__)
LEAK_LINE = next(
    i
    for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
    if text.endswith("# LEAK")
)

hoard: list[bytearray] = []


def hoard_memory() -> None:
    for _ in range(200):
        hoard.append(bytearray(100_000))  # LEAK


def churn_memory() -> None:
    """Allocates and frees 100 MB, five times what hoard_memory keeps."""
    for _ in range(1_000):
        block = bytearray(100_000)
        del block


def fetch_profile(tmp_path: Path, mode: str, route: str = "/debug/pprof/heap") -> Path:
    agent = Agent(
        AgentConfig(port=0, interval=3600, mode=mode, sample_interval=64 * 1024, token=TOKEN)
    )
    assert agent.start()
    try:
        hoard_memory()
        churn_memory()
        base = agent.serve()
        assert base is not None
        request = urllib.request.Request(base + route, headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            path = tmp_path / f"{mode}.pb.gz"
            path.write_bytes(response.read())
        # the same memory, dumped and converted offline
        request = urllib.request.Request(
            base + "/debug/heapwatch/snapshot", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            (tmp_path / f"{mode}.hwdump").write_bytes(response.read())
    finally:
        agent.stop()
        hoard.clear()
    return path


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_go_tool_pprof_top_shows_the_leaking_function_and_line(
    go: tuple[str, dict[str, str], Path], tmp_path: Path, mode: str
) -> None:
    # Given the profile of a process that holds 20 MB from one line
    profile = fetch_profile(tmp_path, mode)
    # When go tool pprof ranks it by function, then by line
    by_function = top_rows(run_pprof(go, "-top", "-sample_index=inuse_space", str(profile)))
    by_line = top_rows(run_pprof(go, "-top", "-lines", "-sample_index=inuse_space", str(profile)))
    # Then the leak comes first
    assert by_function[0][2] == "hoard_memory"
    name = by_line[0][2]
    assert name.startswith("hoard_memory ")
    assert name.endswith(f"{HERE}:{LEAK_LINE}")
    raw = run_pprof(go, "-raw", str(profile))
    assert (
        "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes[dflt]" in raw
    )
    if mode == "sample":
        assert "Period: 65536" in raw
    # And the churning function, which holds nothing, is not in the live view
    assert all(row[2] != "churn_memory" for row in by_function)


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_go_tool_pprof_allocs_shows_the_churning_function(
    go: tuple[str, dict[str, str], Path], tmp_path: Path, mode: str
) -> None:
    # Given /debug/pprof/allocs of a process that allocated and freed 100 MB
    # from one function and holds 20 MB from another
    profile = fetch_profile(tmp_path, mode, "/debug/pprof/allocs")
    # When go tool pprof ranks it by its default sample type
    raw = run_pprof(go, "-raw", str(profile))
    rows = top_rows(run_pprof(go, "-top", str(profile)))
    # Then that type is alloc_space and the churn comes first, the leak after
    assert "alloc_space/bytes[dflt]" in raw
    names = [row[2] for row in rows]
    assert names[0] == "churn_memory"
    assert "hoard_memory" in names
    # And by objects too (1,000 blocks against 200), in exact mode: sampling
    # weighs a sampled small block as interval/size blocks (about 1,170 for a
    # bytearray's 56-byte header at 64 KiB), so one such hit at either
    # function, or anywhere, reorders the object counts at random.
    if mode == "exact":
        by_objects = top_rows(run_pprof(go, "-top", "-sample_index=alloc_objects", str(profile)))
        assert by_objects[0][2] == "churn_memory"


def test_go_tool_pprof_reads_a_converted_dump(
    go: tuple[str, dict[str, str], Path], tmp_path: Path
) -> None:
    fetch_profile(tmp_path, "exact")
    converted = tmp_path / "converted.pb.gz"
    dump = str(tmp_path / "exact.hwdump")
    assert main(["convert", dump, "--to", "pprof", "-o", str(converted)]) == 0
    rows = top_rows(run_pprof(go, "-top", "-sample_index=inuse_space", str(converted)))
    # a dump keeps no function names: its frames are named after their lines
    assert rows[0][2].endswith(f"{HERE}:{LEAK_LINE}")
