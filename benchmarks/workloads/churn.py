"""Object churn: short-lived objects of the usual kinds, freed at once."""

from __future__ import annotations

from typing import Callable

DESCRIPTION = (
    "short-lived ints, tuples, lists, dicts, strs and slotted instances "
    "(about 9 blocks allocated and freed per iteration)"
)

ITERATIONS = 200_000


class Point:
    __slots__ = ("x", "y")

    def __init__(self, x: object, y: str) -> None:
        self.x = x
        self.y = y


def churn(iterations: int) -> int:
    """Allocates and frees about 9 blocks per iteration; keeps nothing."""
    total = 0
    for i in range(iterations):
        pair = (i + 1000, i + 2000)
        items = [pair, i]
        mapping = {"a": items, "b": i}
        text = str(i)
        point = Point(mapping, text)
        total += len(point.y)
    return total


def prepare(scale: float) -> Callable[[], object]:
    iterations = max(1, int(ITERATIONS * scale))
    return lambda: churn(iterations)
