"""The shared top/diff layout: the stdlib documentation's "Pretty top", and JSON."""

from __future__ import annotations

import json
import linecache
import os
from pathlib import Path

from heapwatch import tracemalloc as hw_tm
from heapwatch.formats.report import (
    diff_report,
    format_text,
    source_line,
    to_json,
    top_report,
)
from heapwatch.tracemalloc.raw import raw_diffs, raw_statistics

KIB = 1024


def write_source(tmp_path: Path) -> str:
    path = tmp_path / "app.py"
    path.write_text("import os\nleak = []\nleak.append(bytearray(10))  # LEAK\n")
    return str(path)


def test_top_is_laid_out_like_the_pretty_top_of_the_stdlib_docs(tmp_path: Path) -> None:
    # Given three sites, one of them in a file that exists
    app = write_source(tmp_path)
    stats = [
        (((app, 3),), 40 * KIB, 4),
        ((("lib.py", 7),), 2 * KIB, 1),
        ((("<frozen x>", 1),), 512, 3),
    ]
    # When the top 2 lines are shown
    report = top_report(
        stats,
        (42 * KIB + 512, 8),
        key_type="lineno",
        cumulative=False,
        limit=2,
        mode="exact",
        sample_interval=0,
    )
    text = format_text(report)
    # Then: the title, one line per site with its source line, the rest, the total
    assert text == (
        "Top 2 lines\n"
        f"#1: {app}:3: 40.0 KiB\n"
        "    leak.append(bytearray(10))  # LEAK\n"
        "#2: lib.py:7: 2.0 KiB\n"
        "1 other: 0.5 KiB\n"
        "Total allocated size: 42.5 KiB\n"
    )


def test_sample_mode_says_the_figures_are_estimates() -> None:
    report = top_report(
        [((("a.py", 1),), 100, 1)],
        (100, 1),
        key_type="lineno",
        cumulative=False,
        limit=10,
        mode="sample",
        sample_interval=512 * KIB,
    )
    first, title = format_text(report).splitlines()[:2]
    assert first == (
        "# sample mode: sizes and counts are estimates (one sample per 512.0 KiB allocated "
        "on average)"
    )
    assert title == "Top 10 lines"
    assert to_json(report)["estimates"] is True
    assert to_json(report)["sample_interval"] == 512 * KIB


def test_files_show_no_line_and_tracebacks_show_their_callers(tmp_path: Path) -> None:
    app = write_source(tmp_path)
    by_file = top_report(
        [(((app, 0),), 2048, 2)],
        (2048, 2),
        key_type="filename",
        cumulative=False,
        limit=5,
        mode="exact",
        sample_interval=0,
    )
    assert format_text(by_file).splitlines()[:2] == ["Top 5 files", f"#1: {app}: 2.0 KiB"]
    assert to_json(by_file)["stats"][0]["lineno"] is None

    by_traceback = top_report(
        [(((app, 3), (app, 2)), 2048, 2)],
        (2048, 2),
        key_type="traceback",
        cumulative=False,
        limit=5,
        mode="exact",
        sample_interval=0,
    )
    assert format_text(by_traceback).splitlines()[1:6] == [
        f"#1: {app}:3: 2.0 KiB",
        "    leak.append(bytearray(10))  # LEAK",
        f"    from {app}:2",
        "        leak = []",
        "Total allocated size: 2.0 KiB",
    ]
    assert to_json(by_traceback)["stats"][0]["traceback"] == [[app, 3], [app, 2]]


def test_a_diff_shows_each_change_and_the_change_of_the_total() -> None:
    diffs = [
        ((("a.py", 1),), 30 * KIB, 20 * KIB, 3, 2),
        ((("b.py", 2),), 0, -KIB, 0, -1),
        ((("c.py", 3),), KIB, 512, 1, 1),
    ]
    report = diff_report(
        diffs,
        (31 * KIB, 4),
        (11 * KIB + 512, 2),
        key_type="lineno",
        cumulative=True,
        limit=2,
        mode="exact",
        sample_interval=0,
        notes=["since the agent's last cycle, 10.0s ago"],
    )
    assert format_text(report) == (
        "# since the agent's last cycle, 10.0s ago\n"
        "Top 2 differences (lines) (cumulative)\n"
        "#1: a.py:1: 30.0 KiB (+20.0 KiB)\n"
        "#2: b.py:2: 0.0 KiB (-1.0 KiB)\n"
        "1 other: 1.0 KiB (+0.5 KiB)\n"
        "Total allocated size: 31.0 KiB (+19.5 KiB)\n"
    )
    data = json.loads(json.dumps(to_json(report)))
    assert data["kind"] == "diff"
    assert data["stats"][0] == {
        "rank": 1,
        "filename": "a.py",
        "lineno": 1,
        "size": 30 * KIB,
        "count": 3,
        "size_diff": 20 * KIB,
        "count_diff": 2,
        "traceback": [["a.py", 1]],
        "source": None,
    }
    assert data["other"] == {
        "groups": 1,
        "size": KIB,
        "count": 1,
        "size_diff": 512,
        "count_diff": 1,
    }
    assert data["total"] == {
        "size": 31 * KIB,
        "count": 4,
        "size_diff": 19 * KIB + 512,
        "count_diff": 2,
    }


def test_statistics_objects_convert_to_the_same_rows() -> None:
    traces = [(0, 10, (("a.py", 2), ("b.py", 4)), 2), (0, 30, (("c.py", 1),), 1)]
    snapshot = hw_tm.Snapshot(traces, 2)
    assert raw_statistics(snapshot.statistics("traceback")) == [
        ((("c.py", 1),), 30, 1),
        ((("a.py", 2), ("b.py", 4)), 10, 1),
    ]
    empty = hw_tm.Snapshot([], 2)
    assert raw_diffs(snapshot.compare_to(empty, "lineno"))[0] == ((("c.py", 1),), 30, 30, 1, 1)


def test_source_lines_come_only_from_regular_files(tmp_path: Path) -> None:
    app = write_source(tmp_path)
    assert source_line(app, 2) == "leak = []"
    # A name in a hostile dump must not make linecache read a device or a FIFO.
    assert source_line("/dev/zero", 1) == ""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert source_line(str(fifo), 1) == ""
    assert source_line(str(tmp_path), 1) == ""
    assert source_line("<frozen importlib._bootstrap>", 1) == ""
    assert source_line("a\0b", 1) == ""
    assert source_line(app, 99) == ""


def test_unencodable_filenames_survive_text_and_json() -> None:
    report = top_report(
        [((("/srv/\udcff.py", 1),), 10, 1)],
        (10, 1),
        key_type="lineno",
        cumulative=False,
        limit=1,
        mode="exact",
        sample_interval=0,
    )
    assert "\\udcff" in format_text(report).encode("utf-8", "backslashreplace").decode()
    assert json.loads(json.dumps(to_json(report)))["stats"][0]["filename"] == "/srv/\udcff.py"


def test_reports_leave_no_source_file_in_linecache(tmp_path: Path) -> None:
    # Given sites in files the service never had linecache read
    app = write_source(tmp_path)
    other = tmp_path / "other.py"
    other.write_text("# coding: latin-1\nx = 'caf\xe9'\n", encoding="latin-1")
    stats = [(((app, 3),), 40, 1), (((str(other), 2), (app, 2)), 20, 1)]
    report = top_report(
        stats,
        (60, 2),
        key_type="traceback",
        cumulative=False,
        limit=2,
        mode="exact",
        sample_interval=0,
    )
    # When a report shows their source lines
    text = format_text(report)
    data = to_json(report)
    # Then the lines are there (the file's own encoding honoured)
    assert "leak.append(bytearray(10))  # LEAK" in text
    assert "x = 'caf\xe9'" in text
    assert data["stats"][0]["source"] == "leak.append(bytearray(10))  # LEAK"
    # and linecache keeps none of the files: heapwatch's reading is not the
    # service's memory
    assert app not in linecache.cache
    assert str(other) not in linecache.cache


def test_a_file_the_service_cached_is_read_from_its_cache(tmp_path: Path) -> None:
    app = write_source(tmp_path)
    linecache.getline(app, 1)
    cached = linecache.cache[app]
    try:
        os.unlink(app)  # only the cache knows it now
        assert source_line(app, 2) == ""  # not a regular file on disk: nothing read
        write_source(tmp_path)
        assert source_line(app, 2) == "leak = []"
        assert linecache.cache[app] is cached  # left as the service had it
    finally:
        linecache.cache.pop(app, None)
