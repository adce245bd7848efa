"""Deterministic allocation workloads, traced once by the stdlib and once by
heapwatch in the differential tests.

Every workload returns what it allocated, so that the blocks are still alive
when the snapshot is taken; the tests look only at traces whose most recent
frame is in this file.
"""

from __future__ import annotations

from typing import Any, Callable


def bytearrays(n: int = 300, size: int = 1000) -> list[bytearray]:
    kept = []
    for _ in range(n):
        kept.append(bytearray(size))
    return kept


def _leaf(size: int) -> bytes:
    return b"x" * size


def _middle(depth: int, size: int) -> bytes:
    if depth == 0:
        return _leaf(size)
    return _middle(depth - 1, size)


def nested(n: int = 50, depth: int = 6) -> list[bytes]:
    """Allocations 8 to 9 frames deep in this file, at two distinct sizes."""
    return [_middle(depth, 4000 + (i % 2) * 1000) for i in range(n)]


def dicts(n: int = 200) -> list[dict[str, Any]]:
    return [{"index": i, "name": f"item-{i}", "tags": [i, i + 1]} for i in range(n)]


def growing_list(n: int = 5000) -> list[int]:
    items: list[int] = []
    for i in range(n):
        items.append(i * 1000)  # big ints: one block each, the list grows by realloc
    return items


def strings(n: int = 400) -> list[str]:
    return [f"{i}-{'y' * (i % 50)}" for i in range(n)]


# Each workload allocates at its own lines only.  An object taken back from
# a free list at one line after another line freed it is where the two
# tracers differ (see freelist_reuse), so workloads are traced one at a time.
WORKLOADS: dict[str, Callable[[], object]] = {
    "bytearrays": bytearrays,
    "nested": nested,
    "dicts": dicts,
    "growing_list": growing_list,
    "strings": strings,
}


def _dropped_pair(x: int) -> None:
    pair = (x, x)  # malloc'd here, then parked in the tuple free list
    del pair


def freelist_reuse(x: int = 7) -> tuple[int, int]:
    """A 2-tuple freed at one line and taken back from the free list at another."""
    _dropped_pair(x)
    return (x, x + 1)  # the parked block, re-initialised here


def hand_built_twin(snapshot: Any) -> Any:
    """A hand-built snapshot of a snapshot's traces, weighed the same way."""
    return type(snapshot)(
        list(snapshot.traces._traces),
        snapshot.traceback_limit,
        mode=snapshot.mode,
        sample_interval=snapshot.sample_interval,
    )
