"""The black box's summary in Kubernetes' termination message: its size
bound, what it names, whose summary stays, and where it goes by default."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from heapwatch.server import termination_log
from heapwatch.server.termination_log import (
    FRESH_SECONDS,
    MAX_MESSAGE_BYTES,
    Summary,
    crossing,
    format_summary,
    termination_log_path,
    write_summary,
)

MIB = 1 << 20
SUMMARY = Summary(
    threshold="97%",
    working_set=194 * MIB,
    limit=200 * MIB,
    usage=196 * MIB,
    timestamp=1_800_000_000.0,
    pid=1,
    mode="sample",
    traced=150 * MIB,
    untraced=30 * MIB,
    tracer=MIB // 2,
    sites=[("/srv/app/cache.py", 42, 120 * MIB), ("/srv/app/views.py", 7, 20 * MIB)],
    dump="/var/lib/heapwatch/heapwatch-20270115T080000.000000Z-1-2-blackbox.hwdump",
)


def test_the_summary_names_the_crossing_the_sites_and_the_dump() -> None:
    text = format_summary(SUMMARY).decode()
    lines = text.splitlines()
    assert lines[0] == (
        "heapwatch: working set 194.0 MiB, usage 196.0 MiB crossed 97% of the memory limit "
        "(200.0 MiB) at 2027-01-15T08:00:00Z in pid 1"
    )
    assert lines[1] == (
        "traced 150.0 MiB, untraced 30.0 MiB, heapwatch 0.5 MiB (estimates: sample mode)"
    )
    assert lines[3:5] == [
        "     120.0 MiB  /srv/app/cache.py:42",
        "      20.0 MiB  /srv/app/views.py:7",
    ]
    assert f"dump: {SUMMARY.dump}" in lines


def test_the_summary_keeps_within_what_the_kubelet_keeps() -> None:
    # Hundreds of sites with long paths, and a dump path of kilobytes
    sites = [("/srv/" + "deep/" * 60 + f"m{n}.py", n, (500 - n) * MIB) for n in range(400)]
    long = SUMMARY._replace(sites=sites)
    data = format_summary(long)
    assert len(data) <= MAX_MESSAGE_BYTES
    text = data.decode()
    # The biggest sites first, each line's path cut at its start
    assert "m0.py:0" in text and "m399.py" not in text
    assert "...deep/" in text
    assert text.endswith(f"traced={150 * MIB} at=1800000000.000)\n")
    huge_dump = SUMMARY._replace(dump="/d/" + "x" * 5000)
    data = format_summary(huge_dump)
    assert len(data) <= MAX_MESSAGE_BYTES
    assert data.decode().splitlines()[0].startswith("heapwatch: working set")


def test_a_size_threshold_is_said_as_a_size() -> None:
    assert crossing("1073741824B", 2 << 30) == "1024.0 MiB (the memory limit is 2048.0 MiB)"
    assert crossing("90%", 100 * MIB) == "90% of the memory limit (100.0 MiB)"


def test_the_process_that_traced_the_most_keeps_the_message(tmp_path: Path) -> None:
    path = str(tmp_path / "termination-log")
    big = SUMMARY._replace(pid=10, traced=150 * MIB)
    small = SUMMARY._replace(pid=11, traced=5 * MIB, timestamp=SUMMARY.timestamp + 1)
    assert write_summary(path, big)
    # A worker that traced less, a second later: the bigger one's stays
    assert not write_summary(path, small)
    assert "pid 10" in Path(path).read_text()
    # Once the other's is stale, or from the same process, it is replaced
    later = small._replace(timestamp=SUMMARY.timestamp + FRESH_SECONDS + 1)
    assert write_summary(path, later)
    assert "pid 11" in Path(path).read_text()
    assert write_summary(path, later._replace(traced=1))
    # A file heapwatch did not write is replaced
    Path(path).write_text("something else\n")
    assert write_summary(path, small)


def test_auto_is_the_kubernetes_file_only_when_it_is_there_to_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = tmp_path / "termination-log"
    monkeypatch.setattr(termination_log, "TERMINATION_LOG_DEFAULT", str(default))
    assert termination_log_path("auto") is None
    default.write_text("")
    assert termination_log_path("auto") == str(default)
    assert termination_log_path(None) is None
    assert termination_log_path("/elsewhere") == "/elsewhere"
    os.chmod(default, 0o444)
    if os.access(default, os.W_OK):  # root: read-only is no obstacle
        return
    assert termination_log_path("auto") is None
