"""Four threads allocating at once (the churn workload, split four ways)."""

from __future__ import annotations

import threading
from typing import Callable

from workloads.churn import ITERATIONS, churn

DESCRIPTION = (
    "4 threads each run a quarter of the churn workload concurrently (GIL "
    "hand-offs, contention on the tracer's lock); timed from start to join"
)

THREADS = 4


def run_threads(per_thread: int) -> int:
    workers = [
        threading.Thread(target=churn, args=(per_thread,), name=f"alloc-{k}")
        for k in range(THREADS)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return per_thread * THREADS


def prepare(scale: float) -> Callable[[], object]:
    per_thread = max(1, int(ITERATIONS * scale) // THREADS)
    return lambda: run_threads(per_thread)
