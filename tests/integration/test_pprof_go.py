"""The pprof exporter's output, read by the real ``go tool pprof``.

Runs offline: ``go tool pprof`` only reads local files here, and the
environment points every Go and pprof directory at a temporary one, forbids the
module proxy and toolchain downloads, and ignores the user's Go settings.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from heapwatch.formats.pprof import HeapSample, encode_heap_profile
from support.external_tools import require_tool

pytestmark = pytest.mark.tools

MIB = 1024 * 1024
INTERVAL = 512 * 1024

# One site, leaky.py:42 in grow(), holds 96 MiB of the ~97.5 MiB live.
SAMPLES = [
    HeapSample(
        [
            ("/srv/leaky.py", 42, "grow"),
            ("/srv/app.py", 10, "handle"),
            ("/srv/app.py", 3, "<module>"),
        ],
        count=3000,
        size=96 * MIB,
    ),
    HeapSample(
        [
            ("/srv/cache.py", 7, "Cache.fill"),
            ("/srv/app.py", 11, "handle"),
            ("/srv/app.py", 3, "<module>"),
        ],
        count=400,
        size=1 * MIB,
        domain=389_047,
    ),
    HeapSample(
        [("/srv/café/модуль.py", 5, "<lambda>"), ("/srv/app.py", 3, "<module>")],
        count=20,
        size=512 * 1024,
    ),
]
TOTAL = 96 * MIB + 1 * MIB + 512 * 1024

# A -top row: flat flat% sum% cum cum% name.
TOP_ROW = re.compile(r"^\s*(\S+)\s+(\S+)%\s+(\S+)%\s+(\S+)\s+(\S+)%\s+(.+?)\s*$")


@pytest.fixture(scope="module")
def go(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str], Path]:
    """The go binary, an offline environment for it, and a scratch directory."""
    path = require_tool("go")
    home = tmp_path_factory.mktemp("gohome")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GOPATH": str(home / "gopath"),
        "GOCACHE": str(home / "gocache"),
        "GOENV": "off",  # no $HOME/.config/go/env
        "GOFLAGS": "-mod=mod",  # override any ambient flags
        "GOTOOLCHAIN": "local",  # Go >= 1.21: never download a toolchain
        "GOPROXY": "off",
        "GOSUMDB": "off",
        "GOTELEMETRY": "off",
        "PPROF_TMPDIR": str(home / "pprof"),
        "PPROF_BINARY_PATH": str(home / "binaries"),
        "TZ": "UTC",
        "LC_ALL": "C",
    }
    return path, env, home


def run_pprof(go: tuple[str, dict[str, str], Path], *args: str) -> str:
    path, env, home = go
    result = subprocess.run(
        [path, "tool", "pprof", *args],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # pprof must not have tried to symbolize (no binary exists anywhere).
    assert "symbolization" not in result.stderr.lower(), result.stderr
    assert "binary" not in result.stderr.lower(), result.stderr
    return result.stdout


def write_profile(directory: Path, name: str, samples: list[HeapSample], **kwargs: object) -> str:
    data = encode_heap_profile(
        samples,
        mode="sample",
        sample_interval=INTERVAL,
        time_nanos=1_700_000_000_000_000_000,
        **kwargs,  # type: ignore[arg-type]
    )
    path = directory / name
    path.write_bytes(data)
    return str(path)


def top_rows(output: str) -> list[tuple[str, str, str]]:
    """(flat, cum, name) of every -top row, in pprof's order."""
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["flat", "flat%"])
    rows = []
    for line in lines[header + 1 :]:
        match = TOP_ROW.match(line)
        assert match, line
        rows.append((match.group(1), match.group(4), match.group(6)))
    return rows


def test_top_names_the_leaking_site(go: tuple[str, dict[str, str], Path], tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "heap.pb.gz", SAMPLES)
    output = run_pprof(
        go, "-top", "-sample_index=inuse_space", "-unit=B", "-nodefraction=0", profile
    )
    print(output)
    assert "Type: inuse_space" in output
    assert f"Showing nodes accounting for {TOTAL}B, 100% of {TOTAL}B total" in output
    rows = top_rows(output)
    assert rows[0] == (f"{96 * MIB}B", f"{96 * MIB}B", "grow")
    by_name = {name: (flat, cum) for flat, cum, name in rows}
    assert by_name["Cache.fill"] == (f"{MIB}B", f"{MIB}B")
    assert by_name["<lambda>"] == (f"{512 * 1024}B", f"{512 * 1024}B")
    assert by_name["handle"] == ("0", f"{97 * MIB}B")
    # "<module>" keeps its name: pprof's C++ demangling heuristics are not applied.
    assert by_name["<module>"] == ("0", f"{TOTAL}B")

    # The default sample type is inuse_space too.
    assert run_pprof(go, "-top", "-unit=B", "-nodefraction=0", profile) == output


def test_top_lines_and_objects(go: tuple[str, dict[str, str], Path], tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "heap.pb.gz", SAMPLES)
    lines = top_rows(
        run_pprof(go, "-top", "-lines", "-sample_index=inuse_space", "-unit=B", profile)
    )
    assert lines[0] == (f"{96 * MIB}B", f"{96 * MIB}B", "grow /srv/leaky.py:42")

    objects = run_pprof(go, "-top", "-sample_index=inuse_objects", "-nodefraction=0", profile)
    assert "Type: inuse_objects" in objects
    assert "Showing nodes accounting for 3420, 100% of 3420 total" in objects
    assert top_rows(objects)[0] == ("3000", "3000", "grow")


def test_traces_are_leaf_first_with_labels(
    go: tuple[str, dict[str, str], Path], tmp_path: Path
) -> None:
    profile = write_profile(tmp_path, "heap.pb.gz", SAMPLES, comments=["heapwatch test"])
    output = run_pprof(go, "-traces", profile)
    # Traces are separated by "-----------+-----...": values, then frames.
    traces = [block.split() for block in re.split(r"^-+\+-+$", output, flags=re.M)[1:]]
    assert traces[0][:4] == ["96MB", "grow", "handle", "<module>"]
    assert traces[1][:5] == ["domain:", "389047", "1MB", "Cache.fill", "handle"]
    assert "/srv/café/модуль.py" in run_pprof(go, "-raw", profile)
    assert "heapwatch test" in run_pprof(go, "-comments", profile)


def test_raw_period_and_mapping(go: tuple[str, dict[str, str], Path], tmp_path: Path) -> None:
    raw = run_pprof(go, "-raw", write_profile(tmp_path, "heap.pb.gz", SAMPLES))
    assert "PeriodType: space bytes" in raw
    assert f"Period: {INTERVAL}" in raw
    assert "inuse_objects/count inuse_space/bytes[dflt]" in raw
    assert "1: 0x0/0x0/0x0 [python]  [FN][FL][LN]" in raw


def test_empty_profile(go: tuple[str, dict[str, str], Path], tmp_path: Path) -> None:
    output = run_pprof(go, "-top", write_profile(tmp_path, "empty.pb.gz", []))
    assert "Showing nodes accounting for 0, 0% of 0 total" in output
    assert top_rows(output) == []


def test_routes_are_string_labels_that_tagfocus_selects(
    go: tuple[str, dict[str, str], Path], tmp_path: Path
) -> None:
    # Given the same line reached from two routes, and memory of no request
    frames = [("/srv/shared.py", 9, "serialize"), ("/srv/app.py", 3, "<module>")]
    samples = [
        HeapSample(frames, count=30, size=6 * MIB, route="/items/{id}"),
        HeapSample(frames, count=10, size=2 * MIB, route="/users/<int:uid>"),
        HeapSample(frames, count=5, size=1 * MIB),
    ]
    profile = write_profile(tmp_path, "routes.pb.gz", samples)
    # When pprof lists the tags, every route is there with its bytes
    tags = run_pprof(go, "-tags", "-sample_index=inuse_space", profile)
    print(tags)
    # (Go's releases print "8.0MB" or "8MB", and the shares of the labelled
    # bytes or of all: the bytes are what the profile says)
    number = r"(\d+(?:\.\d+)?)MB"
    total = re.search(rf"http\.route: Total {number}", tags)
    items = re.search(rf"{number} \([\d.]+%\): /items/\{{id\}}", tags)
    users = re.search(rf"{number} \([\d.]+%\): /users/<int:uid>", tags)
    assert total and items and users, tags
    assert [float(m.group(1)) for m in (total, items, users)] == [8.0, 6.0, 2.0], tags
    # and -tagfocus keeps one route's memory only
    focused = run_pprof(
        go, "-top", "-unit=B", "-tagfocus=http.route=/items/", "-sample_index=inuse_space", profile
    )
    assert f"Showing nodes accounting for {6 * MIB}B" in focused, focused
    assert top_rows(focused)[0] == (f"{6 * MIB}B", f"{6 * MIB}B", "serialize")
