"""The soak's service: heapwatch auto-started from the environment, 8 threads
allocating and freeing, a thread that forks a worker now and then.

Prints ``READY <base URL>`` once the agent serves, and, when a line arrives
on stdin (or stdin closes), stops its threads and prints ``RESULT <json>``:
the agent's counters, the forks and how their children ended, and the
tracer's own checks (the sum of the traces against the traced total, the
core's invariants).  Run by tests/soak/soak.py; not a test by itself.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import warnings
from typing import Any

import heapwatch
import heapwatch_exporters
from heapwatch import _core

ALLOCATORS = 8
POOL = 1000  # objects each allocator keeps: some 10,000 live traces in all
FORK_EVERY = 1.0  # seconds
CHILD_LIFE = 0.3  # seconds a forked worker lives (long enough for its agent to cycle)
PACKAGES = tuple(
    os.path.dirname(module.__file__ or "") + os.sep for module in (heapwatch, heapwatch_exporters)
)


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.allocations = 0
        self.forks = 0
        self.children_ok = 0
        self.children_bad: list[str] = []


def allocate(stop: threading.Event, counters: Counters, seed: int) -> None:
    """Keeps a bounded pool of objects of many shapes, replacing them at random:
    steady state, so the tracer's memory must stay flat."""
    rng = random.Random(seed)
    pool: list[Any] = [None] * POOL
    made = 0
    while not stop.is_set():
        for _ in range(100):
            kind = rng.random()
            if kind < 0.4:
                obj: Any = bytes(rng.randrange(1, 600))
            elif kind < 0.7:
                obj = list(range(rng.randrange(1, 200)))  # small ints: one block
            elif kind < 0.9:
                obj = {i: None for i in range(rng.randrange(1, 20))}
            else:
                obj = bytearray(rng.randrange(1_000, 200_000))  # past pymalloc: raw domain
            pool[rng.randrange(len(pool))] = obj
            made += 1
        time.sleep(0.002)
    with counters.lock:
        counters.allocations += made


def child_work(seed: int) -> None:
    rng = random.Random(seed)
    keep = [bytes(rng.randrange(1, 5000)) for _ in range(2000)]
    deadline = time.monotonic() + CHILD_LIFE
    while time.monotonic() < deadline:
        keep[rng.randrange(len(keep))] = bytes(rng.randrange(1, 5000))
        time.sleep(0.001)


def fork_now(counters: Counters, number: int) -> bool:
    """Forks a worker from this (non-main) thread; False in the child."""
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        # Each process's log apart: a child has the parent's problems too,
        # and says each once in its own log.
        logs = os.environ.get("SOAK_CHILD_LOGS")
        if logs:
            fd = os.open(os.path.join(logs, f"child-{number}.txt"), os.O_WRONLY | os.O_CREAT, 0o600)
            os.dup2(fd, 2)
            os.close(fd)
        child_work(number)
        if number % 2:
            os._exit(0)
        return False  # the other half ends by returning from the thread
    deadline = started + 15.0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            with counters.lock:
                counters.forks += 1
                if code == 0:
                    counters.children_ok += 1
                else:
                    counters.children_bad.append(f"child {number} exited {code}")
            return True
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            with counters.lock:
                counters.forks += 1
                counters.children_bad.append(
                    f"child {number} ({'exit' if number % 2 else 'return'}) still alive after 15s"
                )
            return True
        time.sleep(0.01)


def fork_repeatedly(stop: threading.Event, counters: Counters) -> None:
    number = 0
    while not stop.wait(FORK_EVERY):
        number += 1
        if not fork_now(counters, number):
            return  # a child: its last thread ends here


def heapwatch_sites(snap: _core.Snapshot) -> list[tuple[str, int, int]]:
    """(file:line, bytes, blocks) of the live sites in heapwatch's own
    modules (heapwatch's and its exporters' packages), largest first."""
    sites = snap.group("lineno").statistics()
    owned = [
        (f"{frames[0][0]}:{frames[0][1]}", size, count)
        for frames, size, count in sites
        if frames[0][0].startswith(PACKAGES)
    ]
    return sorted(owned, key=lambda site: site[1], reverse=True)


def tracer_checks() -> dict[str, Any]:
    snap = _core.take_snapshot(traces=True)
    config = _core.get_config()
    stats = _core.get_stats()
    top = snap.group("lineno").statistics(5)
    owned = heapwatch_sites(snap)
    checks: dict[str, Any] = {
        "top": [f"{frames[0][0]}:{frames[0][1]} {size} B in {n}" for frames, size, n in top],
        "heapwatch_bytes": sum(size for _site, size, _count in owned),
        "heapwatch_top": [f"{site} {size} B in {count}" for site, size, count in owned[:5]],
        "mode": config["mode"],
        "traced": snap.traced,
        "ntraces": snap.ntraces,
        "dropped": stats["dropped"],
        "tracer_memory": _core.get_tracemalloc_memory(),
    }
    if config["mode"] == "exact":
        checks["sum_of_traces"] = sum(trace[1] for trace in snap.traces())
    else:  # sizes of samples are real sizes; the totals are the estimates
        checks["sum_of_traces"] = sum(row[3] for row in snap.tracebacks())
    try:
        _core._check_invariants()
        checks["invariants"] = "ok"
    except AssertionError as exc:
        checks["invariants"] = str(exc)
    return checks


def main() -> None:
    # 3.12+ warns at every fork of a process with threads: this service's own
    # eight allocators make it one, heapwatch or not, and it forks on purpose.
    warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
    agent = heapwatch.get_agent()
    if agent is None or agent.metrics_url is None:
        print("NOAGENT", flush=True)
        sys.exit(3)
    stop = threading.Event()
    counters = Counters()
    threads = [
        threading.Thread(target=allocate, args=(stop, counters, seed), name=f"alloc-{seed}")
        for seed in range(ALLOCATORS)
    ]
    threads.append(threading.Thread(target=fork_repeatedly, args=(stop, counters), name="forker"))
    for thread in threads:
        thread.start()
    print("READY", agent.metrics_url.rsplit("/", 1)[0], flush=True)
    sys.stdin.readline()
    stop.set()
    for thread in threads:
        thread.join()
    readings = agent.readings()
    result = {
        "pid": os.getpid(),
        "allocations": counters.allocations,
        "forks": counters.forks,
        "children_ok": counters.children_ok,
        "children_bad": counters.children_bad,
        "cycles": readings.cycles,
        "cycle_errors": readings.errors,
        "published_dropped": readings.result.dropped if readings.result else None,
        **tracer_checks(),
    }
    print("RESULT", json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
