"""CHANGELOG.md follows the version: its newest entry is heapwatch's version."""

from __future__ import annotations

import re
from pathlib import Path

import heapwatch

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"


def test_the_newest_entry_is_the_version_being_made() -> None:
    headings = re.findall(r"^## (\S+)", CHANGELOG.read_text(encoding="utf-8"), re.MULTILINE)
    assert headings, f"{CHANGELOG} has no version heading (## X.Y.Z)"
    assert headings[0] == heapwatch.__version__, (
        f"{CHANGELOG.name}'s newest entry is {headings[0]}, the version is "
        f"{heapwatch.__version__} (agent/heapwatch/_version.py): add its entry"
    )
