"""``heapwatch report``: the ages of the top sites from one dump, and with
an older dump of the same process their leak scores and the suspects,
scored as ``heapwatch leaks`` scores them."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_cli_leaks import CACHE, LEAK, _leak_and_cache, run

from heapwatch.formats.dump import iter_dump, write_dump
from support.cli_runner import run_cli


def report_data(capsys: pytest.CaptureFixture[str], out: Path, *dumps: str) -> dict[str, Any]:
    status, _out, err = run_cli(capsys, "report", *dumps, "-o", str(out))
    assert (status, err) == (0, "")
    html = out.read_text()
    found = re.search(r'<script type="application/json" id="heapwatch-data">(.*?)</script>', html)
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def site_row(data: dict[str, Any], where: tuple[str, int]) -> dict[str, Any]:
    (row,) = [s for s in data["sites"] if (s["file"], s["line"]) == where]
    return row


def test_two_dumps_score_the_sites_as_heapwatch_leaks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given two dumps 10 s apart of a process leaking at one line and
    # turning a cache over at another
    old, new = _leak_and_cache(tmp_path, (90, 100))
    # When the report compares them
    data = report_data(capsys, tmp_path / "report.html", new, old)
    # Then the leak has the score heapwatch leaks gives it, and leads the suspects
    _status, leaks, _err = run(capsys, "leaks", "--json", old, new)
    (expected,) = leaks["suspects"]
    leak = site_row(data, LEAK)
    assert leak["leak_score"] == expected["score"] >= 0.9
    assert [(s["file"], s["line"], s["score"]) for s in data["suspects"]] == [
        (*LEAK, expected["score"])
    ]
    assert data["suspects"][0]["rate"] == expected["rate"]
    # and the cache is no suspect
    assert site_row(data, CACHE)["leak_score"] in (None, 0.0)
    # Ages: half the leak's 100 entries are at least 50 epochs (of 1 s) old;
    # the cache keeps its last 40
    assert leak["age"] >= 31 and site_row(data, CACHE)["age"] < leak["age"]
    assert any(note.startswith("leak scores: 2 dumps of pid 4242") for note in data["notes"])


def test_one_dump_gives_ages_and_says_what_scores_need(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (only,) = _leak_and_cache(tmp_path, (100,))
    data = report_data(capsys, tmp_path / "report.html", only)
    leak = site_row(data, LEAK)
    assert leak["age"] >= 31 and leak["leak_score"] is None
    assert data["suspects"] == []
    assert "leak scores need a series: give an older dump of the same process" in data["notes"]


def test_dumps_of_two_processes_give_ages_and_no_scores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = _leak_and_cache(tmp_path, (90, 100))
    # The older dump, as another process's
    header, pairs = iter_dump(old, ages=True)
    other = str(tmp_path / "other.hwdump")
    write_dump(other, dataclasses.replace(header, pid=11), list(pairs))
    data = report_data(capsys, tmp_path / "report.html", new, other)
    leak = site_row(data, LEAK)
    assert leak["age"] >= 31 and leak["leak_score"] is None
    assert data["suspects"] == []
    assert any(
        note.startswith(f"no leak scores: {new} is a dump of pid 4242")
        and f"{other} of pid 11" in note
        for note in data["notes"]
    ), data["notes"]
