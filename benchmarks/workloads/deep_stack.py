"""Allocations at stack depth 30 to 50, through varied call paths."""

from __future__ import annotations

import random
import sys
from typing import Callable

DESCRIPTION = (
    "descend 30 to 50 frames through 4 alternating functions (64 call paths), "
    "allocate and free 100 tuples and strs at the bottom; repeated"
)

DESCENTS = 5_000
LEAF_ALLOCATIONS = 100
PATHS = 64
MIN_DEPTH = 30
MAX_DEPTH = 50

Path = tuple[int, ...]


def _leaf(n: int) -> int:
    live: list[tuple[int, str]] = []
    for i in range(n):
        live.append((i + 1000, str(i)))
        if len(live) > 16:
            live.clear()
    return len(live)


def _a(depth: int, path: Path, n: int) -> int:
    if depth:
        return _STEPS[path[depth]](depth - 1, path, n)
    return _leaf(n)


def _b(depth: int, path: Path, n: int) -> int:
    if depth:
        return _STEPS[path[depth]](depth - 1, path, n)
    return _leaf(n)


def _c(depth: int, path: Path, n: int) -> int:
    if depth:
        return _STEPS[path[depth]](depth - 1, path, n)
    return _leaf(n)


def _d(depth: int, path: Path, n: int) -> int:
    if depth:
        return _STEPS[path[depth]](depth - 1, path, n)
    return _leaf(n)


_STEPS: tuple[Callable[[int, Path, int], int], ...] = (_a, _b, _c, _d)


def stack_depth() -> int:
    """Frames on the calling thread's stack, the caller's included."""
    depth = 0
    frame = sys._getframe(1)
    while frame is not None:
        depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    return depth


def descend_many(descents: int, paths: list[Path]) -> int:
    # Descending `depth` levels adds depth + 1 step frames and _leaf, so the
    # allocating frame (_leaf) sits MIN_DEPTH to MAX_DEPTH frames deep.
    base = stack_depth()
    span = MAX_DEPTH - MIN_DEPTH + 1
    total = 0
    for j in range(descents):
        depth = max(0, MIN_DEPTH + (j * 11) % span - base - 2)
        path = paths[j % len(paths)]
        total += _STEPS[path[0]](depth, path, LEAF_ALLOCATIONS)
    return total


def prepare(scale: float) -> Callable[[], object]:
    rng = random.Random(1234)
    paths = [tuple(rng.randrange(4) for _ in range(MAX_DEPTH + 1)) for _ in range(PATHS)]
    descents = max(1, int(DESCENTS * scale))
    return lambda: descend_many(descents, paths)
