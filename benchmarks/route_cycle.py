"""What the routes add to the agent's cycle (issue 26): the same live heap,
its allocations labelled with routes, cycled by an agent that exports
routes (HEAPWATCH_TOP_ROUTES=10) and one that does not (0), interleaved.

    .venv/bin/python benchmarks/route_cycle.py --mode exact --blocks 200000 --routes 20

Prints the median cycle time of each and their ratio.  A measurement, not a
test: on a shared machine quote medians and say so.
"""

from __future__ import annotations

import argparse
import contextvars
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_cycle import LiveHeap
from heapwatch import Agent, AgentConfig, _core
from heapwatch.runtime.routes import current_route, route_id


def populate(heap: LiveHeap, routes: int) -> None:
    """Each site's blocks allocated under one of ``routes`` routes (site k
    under route k mod routes), every one in a context of its own."""
    for k, site in enumerate(heap.sites):

        def request(k: int = k, site: object = site) -> None:
            current_route.set(route_id(f"/bench/{k % routes}/{{id}}"))
            heap.held[k] = site(heap.counts[k])  # type: ignore[operator]

        contextvars.copy_context().run(request)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("exact", "sample"), default="exact")
    parser.add_argument("--blocks", type=int, default=200_000)
    parser.add_argument("--sites", type=int, default=1000)
    parser.add_argument("--routes", type=int, default=20)
    parser.add_argument("--cycles", type=int, default=15)
    args = parser.parse_args()
    _core.set_route_var(current_route)
    _core.start(1 if args.mode == "exact" else 64, args.mode, 64 * 1024, profile="agent")
    heap = LiveHeap(args.blocks, args.sites)
    populate(heap, args.routes)
    with_routes = Agent(AgentConfig(exporters=(), top=20, top_routes=10), exporters=())
    without = Agent(AgentConfig(exporters=(), top=20, top_routes=0), exporters=())
    times: dict[str, list[float]] = {"routes": [], "none": []}
    for cycle in range(args.cycles):
        order = [("routes", with_routes), ("none", without)]
        for name, agent in order if cycle % 2 else order[::-1]:
            start = time.perf_counter()
            result = agent.run_cycle()
            times[name].append(time.perf_counter() - start)
        assert result is not None
    last = with_routes.run_cycle()
    print(
        f"mode={args.mode} blocks={args.blocks} sites={args.sites} routes={args.routes} "
        f"traces={_core.take_snapshot().ntraces} route series={len(last.routes)} "
        f"route sites={len(last.route_sites)}"
    )
    routes, none = statistics.median(times["routes"]), statistics.median(times["none"])
    print(
        f"median cycle: with routes {routes * 1e3:.1f} ms, without {none * 1e3:.1f} ms, "
        f"ratio {routes / none:.2f}x ({args.cycles} cycles each, interleaved)"
    )
    _core.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
