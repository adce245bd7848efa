"""One measurement in a fresh interpreter; run.py spawns it.

    python benchmarks/_child.py SUITE TRACER [options]

prints one line of JSON on stdout: the measurement.  Suites:

  slowdown  time one run of a workload (--workload, --scale) under TRACER
  rss       RSS growth while --blocks small objects are kept alive
  cycle     time agent cycles (--cycles) over --blocks live blocks
  pause     the longest gaps a spinning thread sees while agent cycles run
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Every import happens before any tracer starts, whatever the configuration.
import agent_cycle
import tracers
import workloads

Result = dict[str, Any]


def proc_status() -> dict[str, int]:
    """VmRSS, VmHWM and RssAnon of this process, in bytes."""
    wanted = {"VmRSS", "VmHWM", "RssAnon"}
    out: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in wanted:
                out[key] = int(value.split()[0]) * 1024
    return out


def _timed_run(timed: Callable[[], object], tracer: tracers.Tracer | None) -> Result:
    """One run of the workload, under tracer (None: untraced)."""
    gc.collect()
    if tracer is not None:
        tracer.start()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    timed()
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    result: Result = {"wall": seconds, "cpu": cpu}
    if tracer is not None:
        result["traced_peak"] = tracer.traced_memory()[1]
        result["recorded"] = tracer.recorded()
        tracer.stop()
    return result


def suite_slowdown(tracer: tracers.Tracer, args: argparse.Namespace) -> Result:
    workload = workloads.load(args.workload)
    timed = workload.prepare(args.scale)
    # An untraced warm-up run, untimed: lazy imports, specialisation, and
    # pymalloc's arenas grown to the workload's size, so that every timed run
    # starts from the same state.
    timed()
    if tracer.family == "untraced":
        return _timed_run(timed, None)
    if args.once:
        # One traced run and nothing else, as the untraced child runs: what
        # the instructions suite counts (callgrind counts the whole process).
        return _timed_run(timed, tracer)
    # The traced runs, and untraced runs of the same workload in the same
    # process around them: a shared machine's speed drifts (on the 2-CPU VM
    # these numbers come from, by 2x within minutes) and hiccups (a run now
    # and then takes 1.5x as long), while runs a few hundred milliseconds
    # apart see the same speed.  Each side keeps its fastest run, since
    # hiccups only ever slow a run down.  In blocks of untraced, traced,
    # traced, untraced (or the reverse, by turns: --traced-first), so that
    # neither side always runs first.
    block = [True, False, False, True] if args.traced_first else [False, True, True, False]
    order = block * args.blocks_of_runs
    runs = [_timed_run(timed, tracer if traced else None) for traced in order]
    traced_runs = [r for r, traced in zip(runs, order) if traced]
    untraced_runs = [r for r, traced in zip(runs, order) if not traced]
    return {
        "wall": min(r["wall"] for r in traced_runs),
        "cpu": min(r["cpu"] for r in traced_runs),
        "untraced_wall": min(r["wall"] for r in untraced_runs),
        "untraced_cpu": min(r["cpu"] for r in untraced_runs),
        "runs": len(traced_runs),
        "traced_peak": max(r["traced_peak"] for r in traced_runs),
        "recorded": traced_runs[0]["recorded"],
    }


def suite_rss(tracer: tracers.Tracer, args: argparse.Namespace) -> Result:
    gc.collect()
    before = proc_status()
    tracer.start()
    kept = [object() for _ in range(args.blocks)]
    gc.collect()
    after = proc_status()
    tracer_memory = tracer.tracer_memory()
    traced = tracer.traced_memory()[0]
    live = tracer.live_traces()  # after the RSS reading: the stdlib copies its traces
    tracer.stop()
    del kept
    return {
        "objects": args.blocks,
        "rss_growth": after["VmRSS"] - before["VmRSS"],
        "anon_growth": after.get("RssAnon", 0) - before.get("RssAnon", 0),
        "hwm_growth": after["VmHWM"] - before["VmHWM"],
        "tracer_memory": tracer_memory,
        "traced": traced,
        "live_traces": live,
    }


def make_cycle(tracer: tracers.Tracer, phases: agent_cycle.Phases) -> agent_cycle.Cycle:
    if tracer.family == "heapwatch":
        return agent_cycle.make_heapwatch_cycle(phases)
    if tracer.family == "stdlib":
        return agent_cycle.make_stdlib_cycle(phases)
    raise SystemExit(f"the {tracer.name} configuration has no agent cycle")


def live_heap(tracer: tracers.Tracer, args: argparse.Namespace) -> agent_cycle.LiveHeap:
    heap = agent_cycle.LiveHeap(args.blocks, args.sites)
    tracer.start()
    heap.populate()
    gc.collect()
    return heap


def suite_cycle(tracer: tracers.Tracer, args: argparse.Namespace) -> Result:
    heap = live_heap(tracer, args)
    live = tracer.live_traces()
    phases: agent_cycle.Phases = {}
    cycle = make_cycle(tracer, phases)
    cycle()  # the first cycle has no previous one to compare with
    phases.clear()
    times: list[float] = []
    for _ in range(args.cycles):
        heap.mutate()
        t0 = time.perf_counter()
        cycle()
        times.append(time.perf_counter() - t0)
    memory = tracer.tracer_memory()
    tracer.stop()
    return {
        "cycle_seconds": times,
        "phases": {step: total / len(times) for step, total in phases.items()},
        "live_traces": live,
        "tracer_memory": memory,
    }


class Spinner(threading.Thread):
    """Allocates tiny objects in a loop and records, per phase, the longest
    gap between two iterations.  A gap counts for the phase that was current
    when it began."""

    def __init__(self, nphases: int) -> None:
        super().__init__(name="spinner", daemon=True)
        self.phase = -1
        self.stopping = False
        self.max_gap = [0.0] * nphases
        self.over_5ms = [0] * nphases
        self.over_20ms = [0] * nphases
        self.iterations = [0] * nphases

    def run(self) -> None:
        perf = time.perf_counter
        last = perf()
        while not self.stopping:
            phase = self.phase
            scratch = (object(), [phase])
            now = perf()
            if phase >= 0:
                gap = now - last
                self.iterations[phase] += 1
                if gap > 0.005:
                    self.over_5ms[phase] += 1
                    if gap > 0.020:
                        self.over_20ms[phase] += 1
                self.max_gap[phase] = max(self.max_gap[phase], gap)
            last = now
            del scratch


PAUSE_PHASES = ("idle", "busy", "cycle")


def suite_pause(tracer: tracers.Tracer, args: argparse.Namespace) -> Result:
    heap = live_heap(tracer, args)
    live = tracer.live_traces()
    cycle = make_cycle(tracer, {})
    cycle()
    cycle_times: list[float] = []

    def idle(end: float) -> None:
        while time.perf_counter() < end:
            time.sleep(0.01)

    def busy(end: float) -> None:
        while time.perf_counter() < end:
            sum(range(100))

    def cycles(end: float) -> None:
        while True:
            t0 = time.perf_counter()
            cycle()
            cycle_times.append(time.perf_counter() - t0)
            if time.perf_counter() >= end:
                break
            time.sleep(0.01)

    activities: dict[str, Callable[[float], None]] = {"idle": idle, "busy": busy, "cycle": cycles}
    spinner = Spinner(len(PAUSE_PHASES))
    spinner.start()
    for index, name in enumerate(PAUSE_PHASES):
        time.sleep(0.05)  # settle: the spinner runs freely and closes its gap
        spinner.phase = index
        activities[name](time.perf_counter() + args.duration)
        spinner.phase = -1
    time.sleep(0.05)
    spinner.stopping = True
    spinner.join()
    tracer.stop()
    del heap
    return {
        "phases": {
            name: {
                "max_gap": spinner.max_gap[i],
                "over_5ms": spinner.over_5ms[i],
                "over_20ms": spinner.over_20ms[i],
                "iterations": spinner.iterations[i],
            }
            for i, name in enumerate(PAUSE_PHASES)
        },
        "cycles": len(cycle_times),
        "longest_cycle": max(cycle_times),
        "switch_interval": sys.getswitchinterval(),
        "live_traces": live,
    }


SUITES: dict[str, Callable[[tracers.Tracer, argparse.Namespace], Result]] = {
    "slowdown": suite_slowdown,
    "rss": suite_rss,
    "cycle": suite_cycle,
    "pause": suite_pause,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("tracer", choices=sorted(tracers.TRACERS))
    parser.add_argument("--workload", choices=sorted(workloads.WORKLOADS), default="churn")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--sites", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--duration", type=float, default=1.0)
    parser.add_argument("--traced-first", action="store_true")
    parser.add_argument("--blocks-of-runs", type=int, default=1)
    parser.add_argument("--once", action="store_true", help="one traced run only")
    args = parser.parse_args()
    result = SUITES[args.suite](tracers.TRACERS[args.tracer], args)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
