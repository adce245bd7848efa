"""The document of the memory page and the report, and the report's HTML."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

from heapwatch.formats.view import (
    MAX_STACKS,
    OTHER_STACKS,
    function_names,
    median_age,
    script_json,
    stacks_of_rows,
    view_data,
)
from heapwatch.server.report_html import standalone_html

HOSTILE = "</script><script>alert('x')</script><!--\u2028\udcff&amp;"


def test_script_json_cannot_end_its_element_and_reads_back() -> None:
    data = {"frames": [[HOSTILE, 1, HOSTILE]]}
    text = script_json(data)
    assert not set("<>&\u2028") & set(text)
    assert json.loads(text) == data


def test_stacks_are_interned_outermost_first_and_bounded() -> None:
    rows = [((("leaf.py", 2), ("main.py", 1)), 100, 1)]
    rows += [((("x.py", n),), 1, 1) for n in range(MAX_STACKS + 10)]
    data = view_data(
        kind="dumps",
        stacks=stacks_of_rows(rows, {("leaf.py", 2): "leak"}),
        mode="exact",
        sample_interval=0,
        total=(10, 1),
    )
    frames = data["frames"]
    ids, size, count = data["stacks"][0]
    assert [frames[i] for i in ids] == [["main.py", 1, ""], ["leaf.py", 2, "leak"]]
    assert (size, count) == (100, 1)
    assert len(data["stacks"]) == MAX_STACKS + 1
    other_ids, other_size, _ = data["stacks"][-1]
    assert frames[other_ids[0]][0] == OTHER_STACKS and other_size == 11


def test_median_age_is_the_bucket_holding_half_the_bytes() -> None:
    assert median_age([0, 0, 0]) is None
    assert median_age([10, 0, 0]) == 0
    assert median_age([1, 0, 0, 9]) == 4  # bucket 3: ages 4 to 7
    assert median_age([5, 5]) == 1


def test_function_names_come_from_the_source(tmp_path: Path) -> None:
    source = tmp_path / "app.py"
    source.write_text("x = 1\nclass A:\n    def f(self):\n        def g():\n            return 1\n")
    rows = [(((str(source), 5), (str(source), 3), (str(source), 1)), 1, 1)]
    names = function_names(rows)
    assert names[(str(source), 5)] == "A.f.<locals>.g"
    assert names[(str(source), 3)] == "A.f"
    assert names[(str(source), 1)] == "<module>"
    assert function_names([((("/no/such/file.py", 1),), 1, 1)]) == {}


def test_the_report_is_one_file_its_csp_naming_each_inline_block() -> None:
    data = view_data(
        kind="dumps",
        stacks=stacks_of_rows([(((HOSTILE, 1),), 10, 1)]),
        mode="exact",
        sample_interval=0,
        total=(10, 1),
    )
    html = standalone_html(data, title=HOSTILE)
    assert "src=" not in html and 'href="static' not in html
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    styles = re.findall(r"<style>(.*?)</style>", html, re.S)
    assert len(scripts) == 2 and len(styles) == 2
    (policy,) = re.findall(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html)
    for block in scripts + styles:
        digest = base64.b64encode(hashlib.sha256(block.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy
    assert "default-src 'none'" in policy
    (document,) = re.findall(
        r'<script type="application/json" id="heapwatch-data">(.*?)</script>', html, re.S
    )
    assert json.loads(document)["frames"][0][0] == HOSTILE
    assert "<title>&lt;/script&gt;" in html
