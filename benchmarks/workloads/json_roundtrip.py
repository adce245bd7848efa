"""json.dumps and json.loads of a document of nested records."""

from __future__ import annotations

import json
from typing import Callable

DESCRIPTION = (
    "json.dumps then json.loads of a 400-record document (nested dicts, lists, "
    "strs, floats), repeated"
)

RECORDS = 400
REPEATS = 45


def document(records: int) -> list[dict[str, object]]:
    return [
        {
            "id": i,
            "name": f"user-{i:06d}",
            "email": f"user{i}@example.com",
            "active": i % 3 != 0,
            "scores": [i * 0.5, i * 1.25, i / 7.0],
            "tags": ["alpha", "beta", f"t{i % 17}"],
            "address": {"street": f"{i} Main St", "city": "Springfield", "zip": f"{i % 99999:05d}"},
        }
        for i in range(records)
    ]


def roundtrip(doc: object, repeats: int) -> int:
    total = 0
    for _ in range(repeats):
        text = json.dumps(doc)
        total += len(json.loads(text))
    return total


def prepare(scale: float) -> Callable[[], object]:
    doc = document(RECORDS)
    repeats = max(1, int(REPEATS * scale))
    return lambda: roundtrip(doc, repeats)
