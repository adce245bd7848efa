"""The scenario bank (benchmarks/leaks.py) as real processes: each scenario's
sites allocate and free real Python objects, the agent on by environment at a
short window, and the score is the agent's own (``Agent.leak_scores()``
after each of its cycles).  A measurement, never a test.

    python benchmarks/leaks.py --real                       # every scenario
    python benchmarks/leaks.py --real --seeds 6 --scenarios cache,lru,queue
    python benchmarks/leaks.py --real --modes exact --window 20s --interval 0.5

The bank's clock is compressed onto the agent's: a bank window (30 min) is
the agent's ``--window`` (20 s), so every bank second lasts window / 1800
real seconds and every rate is that much faster in bytes a real second; each
site's behaviour (the bank's own step functions) runs once a bank cycle
(10 s: 0.11 s here), and its cohorts are real ``bytes`` objects, allocated at
a line of their own (a file ``<site NAME>``) and dropped when the cohort
dies.  The core samples them for real (``--sample-interval``, 64 KiB by
default as in issue 23, or exact mode).  The bank's 50 churning sites (1
GiB/min) are left out: compressed 90 times they would be 1.5 GiB/s; the
process's own churn is what remains.

Each run is one process per (scenario, mode, seed), ``--jobs`` at a time;
its line of JSON gives the highest score of each non-leak site and when each
leak was first flagged (score >= 0.9), in real seconds after the leak began.

With ``--dumps N`` each process also fetches N dumps of itself from
``/debug/heapwatch/snapshot``, ``--dump-every`` seconds apart and the last
at its end, and notes the agent's scores as it takes the last; ``heapwatch
leaks`` then scores the N dumps, and the first and the last alone: the
offline scorer against the agent, on the same memory.

    python benchmarks/leaks.py --real --window 1m --interval 5 --duration 100 \
        --dumps 7 --dump-every 5 --scenarios lru,leak_10k,cache
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

HERE = Path(__file__).resolve().parent
BANK_WINDOW = 1800.0

# The bank sites' allocation, one code object per site so that each has a
# line of its own in the agent's eyes.
Alloc = Callable[[int, int], List[bytes]]


def _allocator(name: str) -> Alloc:
    code = compile(
        "def alloc(n, size):\n    return [bytes(size) for _ in range(n)]\n",
        f"<site {name}>",
        "exec",
    )
    space: Dict[str, Any] = {}
    exec(code, space)
    alloc: Alloc = space["alloc"]
    return alloc


def _fetch_dump(agent: Any, path: str) -> None:
    """A dump of this process from its own /debug/heapwatch/snapshot."""
    host, port = agent.address
    request = urllib.request.Request(
        f"http://{host}:{port}/debug/heapwatch/snapshot",
        headers={"Authorization": f"Bearer {os.environ['HEAPWATCH_TOKEN']}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response, open(path, "wb") as out:
        out.write(response.read())


def child(
    scenario: str, seed: int, duration: float, bank_hours: float, *, dumps: int, every: float
) -> Dict[str, Any]:
    """Runs one scenario in this process (the agent already running): its
    sites' cohorts as real objects, on a clock compressed to the agent's
    window; returns the highest score of each non-leak and the leaks'
    times to flag (and with ``dumps``, the paths of the dumps it took,
    ``every`` seconds apart to its end, and the agent's scores at the
    last)."""
    # The bank beside this file, and heapwatch (the environment started
    # its agent): imported in the child only.
    import heapwatch
    import leaks as bank

    agent = heapwatch.get_agent()
    if agent is None:
        raise SystemExit("no agent: run with HEAPWATCH_ENABLED=1")
    scale = agent.config.leak_window / BANK_WINDOW  # real seconds a bank second
    sampler = bank.Sampler("exact", random.Random(seed))  # the core samples
    sites = [bank.Site(name, start, step) for name, start, step in bank.SCENARIOS[scenario]]
    allocs = {s.name: _allocator(s.name) for s in sites}
    held: Dict[int, Tuple[bank.Cohort, List[bytes]]] = {}
    by_file = {f"<site {s.name}>": s for s in sites}
    highest: Dict[str, Tuple[float, float]] = {}
    flagged: Dict[str, float] = {}
    began = time.monotonic()
    cycles = agent.readings().cycles
    step = 0
    lag = 0.0
    end = min(duration, bank_hours * 3600.0 * scale)
    dump_at = [end - k * every for k in range(dumps - 1, -1, -1)] if dumps else []
    taken: List[str] = []
    at_last: Dict[str, float] = {}
    directory = tempfile.mkdtemp(prefix="heapwatch-leaks-real-") if dumps else ""
    while True:
        now = time.monotonic() - began
        if dump_at and now >= dump_at[0]:
            dump_at.pop(0)
            taken.append(os.path.join(directory, f"{len(taken)}.hwdump"))
            _fetch_dump(agent, taken[-1])
            if not dump_at:
                scores = agent.leak_scores()
                at_last = {
                    by_file[f].name: s.score for (f, _l), s in scores.items() if f in by_file
                }
        if now >= end and not dump_at:
            break
        while (step + 1) * bank.CYCLE * scale <= now:
            step += 1
            t = step * bank.CYCLE
            for s in sites:
                s.step(s, t, sampler)
                for c in s.cohorts:
                    if id(c) not in held and c.death > t:
                        held[id(c)] = (c, allocs[s.name](c.n, c.size))
                s.cohorts = [c for c in s.cohorts if c.death > t]
            for key in [k for k, (c, _objs) in held.items() if c.death <= t]:
                del held[key]
        # How far the sites ran behind the clock: a run whose sites fell
        # behind (a busy machine) stretched their growth over more cycles
        # than the bank's scenario has, and its scores are of that.
        lag = max(lag, time.monotonic() - began - step * bank.CYCLE * scale)
        readings = agent.readings()
        if readings.cycles != cycles:
            cycles = readings.cycles
            for (file, _line), score in agent.leak_scores().items():
                site = by_file.get(file)
                if site is None:
                    continue
                if site.leak_start is None:
                    if score.score > highest.get(site.name, (0.0, 0.0))[0]:
                        highest[site.name] = (score.score, now)
                elif score.score >= bank.FLAG and site.name not in flagged:
                    flagged[site.name] = now - site.leak_start * scale
        time.sleep(min(0.02, bank.CYCLE * scale / 4))
    return {
        "scenario": scenario,
        "seed": seed,
        "scale": scale,
        "highest": {s.name: highest.get(s.name, (0.0, 0.0)) for s in sites if s.leak_start is None},
        "flagged": {s.name: flagged.get(s.name) for s in sites if s.leak_start is not None},
        "dumps": taken,
        "agent_at_last_dump": at_last,
        "lag": lag,
    }


def _offline(paths: List[str]) -> Dict[str, float]:
    """heapwatch leaks on ``paths``: each bank site's score (0 if not a
    suspect), or the command's error."""
    done = subprocess.run(
        [sys.executable, "-m", "heapwatch", "leaks", "--json", "--limit", "1000", *paths],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip()}  # type: ignore[dict-item]
    report = json.loads(done.stdout)
    return {
        s["filename"][len("<site ") : -1]: s["score"]
        for s in report["suspects"]
        if s["filename"].startswith("<site ")
    }


def _run_one(args: Any, scenario: str, mode: str, seed: int, hours: float) -> Dict[str, Any]:
    env = dict(os.environ)
    env.update(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_MODE=mode,
        HEAPWATCH_SAMPLE_INTERVAL=args.sample_interval,
        HEAPWATCH_INTERVAL=str(args.interval),
        HEAPWATCH_LEAK_WINDOW=args.window,
        HEAPWATCH_EXPORTERS="",
        HEAPWATCH_PORT="0",
        HEAPWATCH_TOKEN="leaks-real-" + os.urandom(8).hex(),
    )
    command = [sys.executable, str(Path(__file__).resolve()), "--child", scenario, str(seed)]
    command += [str(args.duration), str(hours), str(args.dumps), str(args.dump_every)]
    done = subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, cwd=str(HERE)
    )
    if done.returncode != 0:
        raise RuntimeError(f"{scenario} {mode} {seed}: exit {done.returncode}: {done.stderr}")
    result: Dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["mode"] = mode
    if result["dumps"]:
        paths = result["dumps"]
        result["offline_all"] = _offline(paths)
        result["offline_two"] = _offline([paths[0], paths[-1]])
        for path in paths:
            os.unlink(path)
        os.rmdir(os.path.dirname(paths[0]))
    return result


def _seconds(values: List[float | None]) -> str:
    got = sorted(v for v in values if v is not None)
    missed = len(values) - len(got)
    if not got:
        return "not flagged"
    text = f"{got[0]:.1f} to {got[-1]:.1f} s" if len(got) > 1 else f"{got[0]:.1f} s"
    return text + (f", {missed} of {len(values)} not flagged" if missed else "")


def main(args: Any, hours: Dict[str, float]) -> int:
    """The real-process table (``benchmarks/leaks.py --real``); hours: the
    bank's hours of each scenario."""
    scenarios = args.scenarios.split(",")
    modes = args.modes.split(",")
    jobs = [
        (scenario, mode, seed, hours[scenario])
        for scenario in scenarios
        for mode in modes
        for seed in range(1, args.seeds + 1)
    ]

    def run(job: Tuple[str, str, int, float]) -> Dict[str, Any]:
        # Each run's line as it ends: a long table cut short keeps its runs.
        r = _run_one(args, *job)
        print(f"# {json.dumps(r)}", file=sys.stderr, flush=True)
        return r

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run, jobs))
    print(
        f"real processes: window {args.window}, cycles {args.interval} s, sample interval "
        f"{args.sample_interval} in sample mode; {args.seeds} runs (seeds) per row, "
        f"up to {args.duration:g} s each; flagged: score >= 0.9 (the bank's minutes in brackets)"
    )
    print()
    print(
        "| scenario | site | mode | highest score (each run) | highest | time to flag "
        "| sites' worst lag (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for scenario in scenarios:
        for mode in modes:
            rows = [r for r in results if r["scenario"] == scenario and r["mode"] == mode]
            scale = rows[0]["scale"]
            lags = f"{max(r['lag'] for r in rows):.2f}"
            for name in rows[0]["highest"]:
                each = [r["highest"][name][0] for r in rows]
                shown = ", ".join(f"{v:.2f}" for v in each)
                print(f"| {scenario} | {name} | {mode} | {shown} | {max(each):.2f} | | {lags} |")
            for name in rows[0]["flagged"]:
                times = [r["flagged"][name] for r in rows]
                bank_min = [t / scale / 60 for t in times if t is not None]
                bracket = f" ({min(bank_min):.1f} to {max(bank_min):.1f} min)" if bank_min else ""
                print(f"| {scenario} | {name} | {mode} | | | {_seconds(times)}{bracket} | {lags} |")
    if args.dumps:
        _print_offline(args, scenarios, modes, results)
    return 0


def _print_offline(
    args: Any, scenarios: List[str], modes: List[str], results: List[Dict[str, Any]]
) -> None:
    print()
    print(
        f"the agent against heapwatch leaks on {args.dumps} dumps {args.dump_every:g} s apart "
        f"(the last at the run's end), and on the first and last alone; a score under 0.5 "
        "is no suspect (shown 0)"
    )
    print()
    print("| scenario | site | mode | seed | agent | all dumps | two dumps |")
    print("|---|---|---|---|---|---|---|")
    for scenario in scenarios:
        for mode in modes:
            for r in (r for r in results if r["scenario"] == scenario and r["mode"] == mode):
                names = list(r["highest"]) + list(r["flagged"])
                for name in names:
                    agent = r["agent_at_last_dump"].get(name, 0.0)
                    cells = []
                    for key in ("offline_all", "offline_two"):
                        got = r[key]
                        cells.append(
                            got["error"] if "error" in got else f"{got.get(name, 0.0):.2f}"
                        )
                    print(
                        f"| {scenario} | {name} | {mode} | {r['seed']} | {agent:.2f} | "
                        f"{cells[0]} | {cells[1]} |"
                    )


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--child":
    sys.path.insert(0, str(HERE))
    numbers = [float(value) for value in sys.argv[4:8]]
    out = child(
        sys.argv[2], int(sys.argv[3]), *numbers[:2], dumps=int(numbers[2]), every=numbers[3]
    )
    print(json.dumps(out), flush=True)
