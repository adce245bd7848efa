"""The test's window into the server: what the core holds, by route name.

Read straight from the core (not through an exporter), so these tests check
the labels themselves; the JSON also says how many blocks the keeping route
kept, the truth the estimate is compared with."""

from __future__ import annotations

import sys
from typing import Any

from heapwatch import _core
from heapwatch.runtime import span_routes
from heapwatch.runtime.routes import route_name

BLOCK = 64 * 1024
KEPT: list[bytes] = []


def keep_one() -> None:
    KEPT.append(bytes(BLOCK))


def new_block() -> bytes:
    """The churning routes' only block allocation: any live trace whose
    innermost frame is here is a churned block not freed."""
    return bytes(BLOCK)


def churn_one() -> int:
    block = new_block()
    return len(block)


def by_route() -> dict[str, Any]:
    snapshot = _core.take_snapshot()
    sums: dict[str, int] = {}
    churned_live = 0
    for rid, row in zip(snapshot.routes(), snapshot.tracebacks(names=True)):
        name = route_name(rid)
        sums[name] = sums.get(name, 0) + row[3]
        frames = row[1]
        if frames and frames[0][2] == new_block.__name__:
            churned_live += row[3]
    return {
        "routes": sums,
        "kept": len(KEPT),
        "churned_live": churned_live,
        "block": sys.getsizeof(bytes(BLOCK)),
        "mode": snapshot.mode,
        "interval": snapshot.sample_interval,
        "otel_hooked": span_routes._bridge.provider is not None,
    }
