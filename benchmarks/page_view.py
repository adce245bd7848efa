"""What one refresh of the memory page costs the service: the time of a
``/debug/heapwatch/view`` request on a large live heap, and the longest
the service's own thread waited for the GIL meanwhile.

Run it as ``.venv/bin/python benchmarks/page_view.py [--mode exact|sample]
[--traces N] [--stacks S] [--nframe F] [--requests R]``.  The process is the service: it
starts the real agent with its HTTP endpoint, holds N live blocks spread
over S distinct call stacks, and runs a thread that wakes every
millisecond and records how late it woke (a wait for the GIL: the view is
built under it).  The requests come from ``curl``, another process, so the
client takes no GIL of ours.  It prints one JSON line: per request the
wall time, and the longest and summed lateness of the ticker (medians over
the requests, the first, which builds the cycle's view, apart), the
cycle's own time for comparison, with and without taking a baseline, and
the bytes of the agent's ring of baselines filled with this heap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

TOKEN = "bench-page-view-token"
TICK = 0.001


def _hold(n: int, stacks: int) -> list[object]:
    """n live blocks under ``stacks`` distinct tracebacks (recursion depth
    and the calling line vary), each a small bytearray."""
    kept: list[object] = []
    per = max(1, n // stacks)

    def down(depth: int, branch: int) -> None:
        if depth > 0:
            if branch % 2:
                down(depth - 1, branch // 2)
            else:
                down(depth - 1, branch // 2)
            return
        kept.extend(bytearray(48) for _ in range(per))

    for index in range(stacks):
        down(4 + index % 16, index)
    return kept


def _deep_size(root: object) -> int:
    """Bytes of the objects reachable from ``root`` through containers,
    each once; strings too, though the core shares them with the code."""
    seen: set[int] = set()
    todo = [root]
    total = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, (tuple, list)):
            todo.extend(obj)
    return total


class _Ticker(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.late: list[float] = []
        self.running = True
        self.recording = False

    def run(self) -> None:
        while self.running:
            t0 = time.perf_counter()
            time.sleep(TICK)
            if self.recording:
                self.late.append(time.perf_counter() - t0 - TICK)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("exact", "sample"), default="exact")
    parser.add_argument("--traces", type=int, default=1_000_000)
    parser.add_argument("--stacks", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=7)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--nframe", type=int, default=None, help="default: the mode's")
    options = parser.parse_args()

    import heapwatch

    agent = heapwatch.start_agent(
        mode=options.mode,
        nframe=options.nframe,
        interval=options.interval,
        token=TOKEN,
        host="127.0.0.1",
        port=0,
        exporters="none",
    )
    assert agent is not None and agent.address is not None
    kept = _hold(options.traces, options.stacks)
    plain = []
    for _ in range(5):
        t0 = time.perf_counter()
        agent.run_cycle()
        plain.append(time.perf_counter() - t0)
    # A cycle that also takes the page's baseline (every STACK_POINT_SECONDS),
    # then the ring filled with readings of this heap.
    from heapwatch.agent import agent as agent_module

    due, agent_module.STACK_POINT_SECONDS = agent_module.STACK_POINT_SECONDS, 0.0
    folding = []
    for _ in range(agent_module.STACK_POINTS):
        t0 = time.perf_counter()
        agent.run_cycle()
        folding.append(time.perf_counter() - t0)
    agent_module.STACK_POINT_SECONDS = due
    ring = _deep_size(agent.stack_points())
    host, port = agent.address
    url = f"http://{host}:{port}/debug/heapwatch/view"
    ticker = _Ticker()
    ticker.start()
    walls, worst, summed, sizes = [], [], [], []
    for _ in range(options.requests):
        ticker.late.clear()
        ticker.recording = True
        t0 = time.perf_counter()
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{size_download} %{http_code}",
                "-H",
                f"Authorization: Bearer {TOKEN}",
                url,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        walls.append(time.perf_counter() - t0)
        ticker.recording = False
        assert out[1] == "200", out
        sizes.append(int(out[0]))
        worst.append(max(ticker.late, default=0.0))
        summed.append(sum(ticker.late))
    ticker.running = False
    print(
        json.dumps(
            {
                "mode": options.mode,
                "live_blocks": len(kept),
                "stacks": options.stacks,
                "nframe": agent.config.effective_nframe,
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "cycle_s_median": round(statistics.median(plain), 4),
                "cycle_with_stack_point_s_median": round(statistics.median(folding), 4),
                "stack_points": len(agent.stack_points()),
                "stack_points_bytes": ring,
                "first_request_s": round(walls[0], 4),
                "first_gil_wait_max_s": round(worst[0], 4),
                "request_s_median": round(statistics.median(walls), 4),
                "request_s": [round(w, 4) for w in walls],
                "gil_wait_max_s_median": round(statistics.median(worst), 4),
                "gil_wait_sum_s_median": round(statistics.median(summed), 4),
                "body_bytes": sizes[-1],
            }
        )
    )
    heapwatch.stop_agent()
    return 0


if __name__ == "__main__":
    sys.exit(main())
