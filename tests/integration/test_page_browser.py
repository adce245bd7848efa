"""The memory page and the HTML report in a real browser (headless Chromium).

A service leaks in ``leak_slowly`` and, from a file whose path holds
``<script>`` and quotes, in a function renamed to markup; the page must show
both as text, zoom on a click, highlight a search, colour the growing stack
against a baseline, log no console error and request nothing from another
origin.  The report gets the same checks from two dumps opened from disk.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from support.agent_process import clean_env, free_ports, python_path, running
from support.browser import chromium, console_errors, requested_urls, screenshot, wait_in_page
from support.waiting import wait_for

TOKEN = "page-token-0123456789abcdef"
MARKUP = "<img src=x onerror=window.pwned=1>\"'"

SERVICE = textwrap.dedent(
    """
    import importlib.util, os, sys, time, types
    keep = []

    def leak_slowly():
        keep.append(bytearray(200_000))  # LEAK

    spec = importlib.util.spec_from_file_location("hostile", sys.argv[1])
    hostile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hostile)
    code = hostile.hold.__code__
    names = {"co_name": sys.argv[2]}
    if sys.version_info >= (3, 11):
        names["co_qualname"] = sys.argv[2]
    renamed = types.FunctionType(code.replace(**names), hostile.__dict__)
    renamed()
    print("ready", flush=True)
    while True:
        leak_slowly()
        time.sleep(0.3)
    """
)

HOSTILE = "held = []\ndef hold():\n    held.append(bytearray(300_000))  # HELD\n"


def hostile_file(root: Path) -> Path:
    """A source file whose path reads ``.../<script>window.pwned=1</script>"q'.py``."""
    folder = root / "<script>window.pwned=1<"
    folder.mkdir()
    path = folder / "script>\"q'.py"
    path.write_text(HOSTILE)
    return path


def line_of(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.endswith(marker))


def frame_texts(driver: Any) -> list[str]:
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll('#flame .frame'), e => e.textContent)"
        )
    )


def check_clean(driver: Any, allowed: tuple[str, ...]) -> None:
    errors = console_errors(driver)
    assert errors == [], errors
    foreign = [u for u in requested_urls(driver) if not u.startswith(allowed)]
    assert foreign == [], foreign
    assert driver.execute_script("return window.pwned") is None


def check_zoom_and_search(driver: Any, function: str) -> None:
    # Clicking the frame zooms on it: it fills the width, the trail names it.
    target = driver.execute_script(
        "return Array.from(document.querySelectorAll('#flame .frame'))"
        ".find(e => e.textContent.startsWith(arguments[0] + ' '))",
        function,
    )
    assert target is not None, frame_texts(driver)
    target.click()
    crumbs = driver.execute_script(
        "return Array.from(document.querySelectorAll('#crumbs .crumb'), e => e.textContent)"
    )
    assert crumbs[-1].startswith(function + " "), crumbs
    first = driver.execute_script("return document.querySelector('#flame .frame')")
    assert first.text.startswith(function + " ")
    assert first.value_of_css_property("width") == driver.execute_script(
        "return getComputedStyle(document.getElementById('flame')).width"
    )
    driver.find_element("id", "reset").click()
    # A search highlights the frames it matches, and only those.
    box = driver.find_element("id", "search")
    box.clear()
    box.send_keys(function)
    matched = driver.execute_script(
        "return Array.from(document.querySelectorAll('#flame .frame.match'), e => e.textContent)"
    )
    assert matched and all(function in text for text in matched), matched
    assert "matches:" in driver.find_element("id", "matched").text
    box.clear()
    box.send_keys("no-such-frame-anywhere")
    assert driver.find_elements("css selector", "#flame .frame.match") == []
    box.clear()
    driver.execute_script("document.getElementById('search').dispatchEvent(new Event('input'))")


def grown(driver: Any) -> list[str]:
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll('#flame .frame.grew'), "
            "e => e.textContent + ' ' + getComputedStyle(e).backgroundColor)"
        )
    )


def check_red(driver: Any) -> None:
    red = [g for g in grown(driver) if g.startswith("leak_slowly ")]
    assert red, grown(driver)
    rgb = re.findall(r"[\d.]+", red[0].rsplit(" rgb", 1)[1])
    assert float(rgb[0]) > 150 and float(rgb[1]) < 100, red[0]


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_live_page_in_chromium(tmp_path: Path, mode: str) -> None:
    service = tmp_path / "service.py"
    service.write_text(SERVICE)
    leak_line = line_of(SERVICE, "# LEAK")
    hostile = hostile_file(tmp_path)
    port = free_ports()
    env = clean_env(
        PYTHONPATH=python_path(),
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_PORT=str(port),
        HEAPWATCH_TOKEN=TOKEN,
        HEAPWATCH_INTERVAL="0.5",
        HEAPWATCH_MODE=mode,
        HEAPWATCH_SAMPLE_INTERVAL="4096",
        HEAPWATCH_NFRAME="32",
    )
    origin = f"http://127.0.0.1:{port}"
    args = [sys.executable, str(service), str(hostile), MARKUP]
    with running(args, env, cwd=tmp_path) as proc, chromium() as driver:
        wait_for(lambda: "ready" in proc.output()[0], what=lambda: str(proc.output()))
        driver.get("about:blank")
        requested_urls(driver)
        console_errors(driver)

        # The leak grows past the reading the agent's first cycle kept.
        time.sleep(1.0)
        opened = time.time()
        # Without the cookie a browser is sent to the form; the token goes in
        # a POST body, never in a URL, and buys an HttpOnly cookie.
        driver.get(origin + "/debug/heapwatch/")
        assert driver.current_url == origin + "/debug/heapwatch/login"
        driver.find_element("name", "token").send_keys(TOKEN)
        driver.find_element("css selector", "button[type=submit]").click()
        wait_in_page(driver, "document.body.getAttribute('data-ready') >= 1")
        assert driver.current_url == origin + "/debug/heapwatch/"
        (cookie,) = driver.get_cookies()
        assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (
            True,
            "Strict",
            "/debug/",
        )
        assert TOKEN not in cookie["value"]
        assert driver.execute_script("return document.cookie") == ""

        # The leaking function is in the graph, its FILE:LINE in the table.
        site = f"{service}:{leak_line}"
        wait_in_page(
            driver, f"document.querySelector('#sites tbody').textContent.includes({site!r})"
        )
        assert any(t.startswith(f"leak_slowly {site}") for t in frame_texts(driver))
        # Freshly opened, the page colours against the agent's reading from
        # before it opened.
        chosen = driver.execute_script("return document.getElementById('baseline').value")
        assert chosen.startswith("a") and float(chosen[1:]) < opened, chosen
        check_red(driver)
        # Markup in a file and a function name is text, never elements.
        texts = frame_texts(driver)
        assert any(MARKUP in t and str(hostile) in t for t in texts), texts
        assert driver.find_elements("css selector", "#flame img, #sites img, #flame script") == []
        check_zoom_and_search(driver, "leak_slowly")

        # The timeline draws the agent's cycles.
        wait_in_page(driver, "document.querySelector('#timeline canvas') !== null")

        # Against the reading the page opened on, the leaking stack grew.
        wait_in_page(driver, "document.body.getAttribute('data-ready') >= 2", timeout=30)
        from selenium.webdriver.support.ui import Select

        Select(driver.find_element("id", "baseline")).select_by_value("first")
        check_red(driver)
        # A site of the table leads into the graph.
        driver.find_element("link text", site).click()
        assert driver.find_element("id", "search").get_attribute("value") == site
        assert driver.find_elements("css selector", "#flame .frame.match")

        screenshot(driver, f"page-live-{mode}.png", tmp_path)
        check_clean(driver, (origin + "/",))
        assert proc.poll() is None, proc.output()
        _, stderr = proc.output()
        assert stderr == "", stderr


def test_report_in_chromium(tmp_path: Path) -> None:
    hostile = hostile_file(tmp_path)
    source = tmp_path / "app.py"
    source.write_text(
        textwrap.dedent(
            f"""
            import importlib.util, sys
            import heapwatch.tracemalloc as tm
            keep = []

            def leak_slowly(n):
                for _ in range(n):
                    keep.append(bytearray(100_000))  # LEAK

            spec = importlib.util.spec_from_file_location("hostile", {str(hostile)!r})
            hostile = importlib.util.module_from_spec(spec)
            tm.start(32)
            spec.loader.exec_module(hostile)
            hostile.hold()
            leak_slowly(5)
            tm.take_snapshot().dump(sys.argv[1])
            leak_slowly(20)
            tm.take_snapshot().dump(sys.argv[2])
            """
        )
    )
    leak_line = line_of(source.read_text(), "# LEAK")
    old, new, report = tmp_path / "old.hwdump", tmp_path / "new.hwdump", tmp_path / "report.html"
    env = clean_env(PYTHONPATH=python_path())
    subprocess.run(
        [sys.executable, str(source), str(old), str(new)], env=env, check=True, timeout=60
    )
    done = subprocess.run(
        [sys.executable, "-m", "heapwatch", "report", str(new), str(old), "-o", str(report)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    html = report.read_text()
    # The path's </script> stays inside the data block, escaped.
    assert "window.pwned=1</script>" not in html
    with chromium() as driver:
        driver.get("about:blank")
        requested_urls(driver)
        console_errors(driver)
        driver.get(report.as_uri())
        wait_in_page(driver, "document.body.getAttribute('data-ready') >= 1")
        site = f"{source}:{leak_line}"
        assert site in driver.find_element("id", "sites").text
        assert any(t.startswith(f"leak_slowly {site}") for t in frame_texts(driver))
        assert any(str(hostile) in t for t in frame_texts(driver))
        check_zoom_and_search(driver, "leak_slowly")
        # Two dumps: the report opens on their difference.
        assert driver.execute_script("return document.getElementById('baseline').value") == "data"
        assert any(g.startswith("leak_slowly ") for g in grown(driver)), grown(driver)
        screenshot(driver, "report.png", tmp_path)
        check_clean(driver, (report.as_uri(), "data:"))
