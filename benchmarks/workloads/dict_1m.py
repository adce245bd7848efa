"""A dict of one million live objects: built, then dropped."""

from __future__ import annotations

import gc
from typing import Callable

DESCRIPTION = (
    "build a dict of 1M entries int -> 1-tuple (1M live tuples: the trace table at "
    "its largest), then drop it and collect; the keys exist before the tracer starts"
)

ENTRIES = 1_000_000


def build_and_drop(keys: list[int]) -> int:
    table = {}
    for key in keys:
        table[key] = (key,)
    size = len(table)
    del table
    gc.collect()
    return size


def prepare(scale: float) -> Callable[[], object]:
    keys = list(range(1000, 1000 + max(1, int(ENTRIES * scale))))
    return lambda: build_and_drop(keys)
