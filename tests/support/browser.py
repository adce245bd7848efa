"""Headless Chromium for the memory page's and the HTML report's tests.

Debian's ``chromium`` and ``chromium-driver`` (``make ci-tools`` installs
them), driven with selenium: a test skips without them, and fails instead
under HEAPWATCH_REQUIRE_TOOLS=1 (make ci).  Nothing is downloaded: the
driver is the Debian one, never selenium's manager.

What a test checks besides the page: the console (every message of level
SEVERE is an error: a CSP violation, a failed request, a script error) and
the requests the page made (Chrome's performance log, the DevTools
protocol's ``Network.requestWillBeSent``).  Screenshots go beside the test's
output (its tmp_path) and to tests/.artifacts/, which git ignores.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.external_tools import require_tool

ARTIFACTS = Path(__file__).resolve().parent.parent / ".artifacts"

# As root in a container: no sandbox, no GPU, nothing Chrome would fetch of
# its own accord (so that every request seen is the page's).
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--window-size=1400,1000",
)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Chromium (its own profile), quit on exit."""
    binary = require_tool("chromium")
    driver_path = require_tool("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        message = "selenium is not installed (requirements-dev.txt)"
        if os.environ.get("HEAPWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(message + "; HEAPWATCH_REQUIRE_TOOLS=1 forbids skipping")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in _FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory(prefix="heapwatch-chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            driver.set_page_load_timeout(30)
            yield driver
        finally:
            driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The console's errors since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def requested_urls(driver: Any) -> list[str]:
    """Every URL the page requested since the last call."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def screenshot(driver: Any, name: str, tmp_path: Path) -> Path:
    """The page as PNG, in tmp_path and in tests/.artifacts/; returns the latter."""
    data = driver.get_screenshot_as_png()
    (tmp_path / name).write_bytes(data)
    ARTIFACTS.mkdir(exist_ok=True)
    stable = ARTIFACTS / name
    stable.write_bytes(data)
    return stable


def wait_in_page(driver: Any, condition: str, timeout: float = 20.0) -> Any:
    """Waits until the JavaScript expression ``condition`` is truthy; returns it."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        lambda d: d.execute_script("return " + condition)
    )
