"""A small pure-Python reference for the C aggregation.

It follows the stdlib's grouping rules (Lib/tracemalloc.py) and the core's
weights, and nothing of the C code, so the two can disagree only by a bug.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

Frames = tuple[tuple[str, int], ...]
COUNT_ONE = 1 << 20


def llround(x: float) -> int:
    """C's llround() for x >= 0: half away from zero, computed exactly."""
    whole = math.floor(x)
    return whole + (1 if x - whole >= 0.5 else 0)


def weigh(size: int, mode: str, interval: int) -> tuple[int, int]:
    if mode == "exact":
        return size, COUNT_ONE
    p = -math.expm1(-size / interval)
    if not p > 0.0:
        p = 1.0 / interval
    return llround(size * (1.0 / p)), llround((1.0 / p) * COUNT_ONE)


def group(
    traces: Iterable[tuple[int, int, Frames, int]],
    key_type: str,
    cumulative: bool,
    mode: str = "exact",
    interval: int = 1,
) -> dict[Frames, tuple[int, int]]:
    sums: dict[Frames, list[int]] = {}
    for _domain, size, frames, _total in traces:
        est, est_blocks = weigh(size, mode, interval)
        if cumulative:
            keys = [((f[0], 0),) if key_type == "filename" else (f,) for f in frames]
        elif key_type == "traceback":
            keys = [frames]
        elif key_type == "lineno":
            keys = [frames[:1]]
        else:
            keys = [((frames[0][0], 0),)]
        for key in keys:
            entry = sums.setdefault(key, [0, 0])
            entry[0] += est
            entry[1] += est_blocks
    return {k: (v[0], (v[1] + COUNT_ONE // 2) >> 20) for k, v in sums.items()}


def _oldest_first(frames: Frames) -> Frames:
    return tuple(reversed(frames))


def statistics(grouped: dict[Frames, tuple[int, int]]) -> list[tuple[Frames, int, int]]:
    rows = [(k, size, count) for k, (size, count) in grouped.items()]
    rows.sort(key=lambda r: (r[1], r[2], _oldest_first(r[0])), reverse=True)
    return rows


def compare(
    new: dict[Frames, tuple[int, int]], old: dict[Frames, tuple[int, int]]
) -> list[tuple[Frames, int, int, int, int]]:
    rows: list[tuple[Frames, int, int, int, int]] = []
    for key, (size, count) in new.items():
        old_size, old_count = old.get(key, (0, 0))
        rows.append((key, size, size - old_size, count, count - old_count))
    for key, (size, count) in old.items():
        if key not in new:
            rows.append((key, 0, -size, 0, -count))

    def sort_key(r: tuple[Frames, int, int, int, int]) -> Any:
        return (abs(r[2]), r[1], abs(r[4]), r[3], _oldest_first(r[0]))

    rows.sort(key=sort_key, reverse=True)
    return rows
