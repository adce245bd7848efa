"""heapwatch benchmarks: slowdown, memory and agent-cycle cost, measured
against the untraced run and the stdlib tracer in the same run.

A measurement, never a test: the targets are printed next to the numbers and
the exit status only says whether every child process ran.

Every measurement runs in a fresh child interpreter (benchmarks/_child.py), so
no tracer state leaks from one to the next.  Configurations are interleaved:
each round runs every (suite, workload) group once per configuration, in an
order rotated from round to round, and the tables quote medians over rounds.
Ratios are medians of per-round ratios (a configuration against the untraced
run of the same round), which cancels slow drifts of the machine's speed.

    python benchmarks/run.py                 # everything (about 10 minutes)
    python benchmarks/run.py --quick         # smaller sizes, 3 rounds (about 2 minutes)
    python benchmarks/run.py --suites slowdown --workloads churn,json --rounds 9
    python benchmarks/run.py --list          # workloads and configurations
    python benchmarks/run.py --suites instructions   # callgrind counts, immune to noise

benchmarks/README.md describes every suite and how to read the tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHILD = HERE / "_child.py"
RESULTS = HERE / "results"

sys.path.insert(0, str(HERE))

# The runner imports neither tracer: it only needs the names (and the agent's
# configuration module imports no tracer).
import floor  # noqa: E402
from heapwatch.agent.config import DEFAULT_NFRAME  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

SUITES = ("slowdown", "rss", "cycle", "pause", "instructions")
# Run unless --suites says otherwise.
DEFAULT_SUITES = ("slowdown", "rss", "cycle", "pause")
# Deterministic suites run in the first round only.
ONCE = {"instructions"}

# Hooks that only forward, where sample mode's go: the floor under its cost;
# and the same taking bytes off a countdown (floor.py).  Opt-in: they need a
# C compiler.
FLOOR_CONFIG = floor.CONFIG
# Configurations, in table order: (name, label, target ratio to untraced, stdlib peer).
CONFIGS: dict[str, tuple[str, float | None, str | None]] = {
    "untraced": ("untraced", None, None),
    FLOOR_CONFIG: ("hooks only, forwarding", None, None),
    floor.COUNTDOWN_CONFIG: ("hooks only, byte countdown", None, None),
    "stdlib-1": ("stdlib start(1)", None, None),
    "stdlib-25": ("stdlib start(25)", None, None),
    # The agent's exact mode (profile "agent"): the targets are its own.
    "hw-exact-1": ("heapwatch exact n1", 2.0, "stdlib-1"),
    "hw-exact-25": ("heapwatch exact n25", 3.0, "stdlib-25"),
    # The drop-in's (the stdlib's semantics), measured beside the stdlib.
    "hw-dropin-1": ("heapwatch drop-in n1", None, "stdlib-1"),
    "hw-dropin-25": ("heapwatch drop-in n25", None, "stdlib-25"),
    "hw-sample": ("heapwatch sample 512K", 1.05, "stdlib-1"),
    # The agent's default in sample mode (nframe deeper than 1).
    "hw-sample-deep": (f"heapwatch sample 512K n{DEFAULT_NFRAME['sample']}", 1.05, "stdlib-1"),
    # The same inside a request, each sampled allocation labelled with its
    # route (issue 26: at most 1.01x hw-sample-deep, compared by hand).
    "hw-sample-route": (
        f"heapwatch sample 512K n{DEFAULT_NFRAME['sample']} route",
        1.05,
        "stdlib-1",
    ),
}
# Configurations of the slowdown and instructions suites only.
TIMING_ONLY = set(floor.CONFIGS)
# Which configurations each suite can run, and runs by default.
SUITE_CONFIGS: dict[str, tuple[list[str], list[str]]] = {
    "slowdown": (list(CONFIGS), [c for c in CONFIGS if c not in TIMING_ONLY]),
    "rss": ([c for c in CONFIGS if c not in TIMING_ONLY], ["untraced", "stdlib-1", "hw-exact-1"]),
    "cycle": (
        [c for c in CONFIGS if c != "untraced" and c not in TIMING_ONLY],
        ["hw-exact-1", "stdlib-1"],
    ),
    "pause": (
        [c for c in CONFIGS if c != "untraced" and c not in TIMING_ONLY],
        ["hw-exact-1"],
    ),
    "instructions": (
        list(CONFIGS),
        ["untraced", "hw-exact-1", "hw-exact-25", "hw-sample", "hw-sample-deep"],
    ),
}
# The instructions suite runs each workload at these two scales under
# callgrind; the difference is the workload's own count, startup excluded.
INSTRUCTION_SCALES = (0.05, 0.1)

# Exact mode records every allocation: its "recorded" count is the
# workload's number of allocations, whichever of these ran.
EXACT = ("hw-exact-1", "hw-exact-25", "hw-dropin-1", "hw-dropin-25")
# Sample mode traces few blocks: per-block figures mean nothing there.
SAMPLED = {"hw-sample", "hw-sample-deep", "hw-sample-route"}

RSS_TARGET = 48.0  # bytes per live traced block, heapwatch at nframe 1
CYCLE_TARGET_MS = 50.0
CYCLE_SPEEDUP_TARGET = 100.0
PAUSE_TARGET_MS = 20.0

# The environment variables that would start a tracer in the children.
TRACER_ENV = ("HEAPWATCH_ENABLED", "PYTHONTRACEMALLOC")


def label(config: str) -> str:
    return CONFIGS[config][0]


def is_heapwatch(config: str) -> bool:
    return config.startswith("hw-")


def runs_in_blocks_of_two(config: str) -> bool:
    """Whether a slowdown child times two blocks of four runs: the
    configurations whose ratios carry a target or are compared with them."""
    return is_heapwatch(config) or config in floor.CONFIGS


# ---- plan -------------------------------------------------------------------


@dataclass
class Job:
    suite: str
    group: str  # the workload for slowdown, else the suite name
    config: str
    argv: list[str]

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.group}/{self.config}"


@dataclass
class Outcome:
    job: Job
    round: int
    elapsed: float
    result: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class Plan:
    groups: list[list[Job]] = field(default_factory=list)

    def jobs_in_round(self, rnd: int) -> list[Job]:
        """Every group once, its configurations rotated by the round number."""
        out: list[Job] = []
        for jobs in self.groups:
            if rnd > 0 and jobs[0].suite in ONCE:
                continue
            shift = rnd % len(jobs)
            out.extend(jobs[shift:] + jobs[:shift])
        return out


def split_list(text: str | None, allowed: list[str], what: str) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return names


def make_plan(args: argparse.Namespace) -> Plan:
    suites = split_list(args.suites, list(SUITES), "suite") or list(DEFAULT_SUITES)
    workloads = split_list(args.workloads, list(WORKLOADS), "workload") or list(WORKLOADS)
    chosen = split_list(args.configs, list(CONFIGS), "configuration")
    plan = Plan()
    for suite in SUITES:
        if suite not in suites:
            continue
        allowed, default = SUITE_CONFIGS[suite]
        configs = [c for c in CONFIGS if c in (chosen or default) and c in allowed]
        if not configs:
            continue
        if suite in ("slowdown", "instructions"):
            for workload in workloads:
                argv = ["--workload", workload]
                if suite == "slowdown":
                    argv += ["--scale", str(args.scale)]
                plan.groups.append([Job(suite, workload, c, argv) for c in configs])
            continue
        jobs = []
        for config in configs:
            argv = ["--blocks", str(args.blocks)]
            if suite == "cycle":
                cycles = args.cycles if is_heapwatch(config) else max(1, args.cycles // 20)
                argv += ["--cycles", str(cycles)]
            if suite == "pause":
                argv += ["--duration", str(args.duration)]
            jobs.append(Job(suite, suite, config, argv))
        plan.groups.append(jobs)
    return plan


# ---- running ----------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in TRACER_ENV:
        env.pop(name, None)
    env["PYTHONHASHSEED"] = "0"
    if FLOOR_BUILT is not None:
        env[floor.FLOOR_ENV] = str(FLOOR_BUILT)
    return env


# The hooks-only extension, once main() built it for this run.
FLOOR_BUILT: Path | None = None


def callgrind(job: Job, scale: float, timeout: float) -> tuple[int, int | None] | str:
    """(instructions, recorded) of one slowdown child under callgrind, or an error."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        str(CHILD),
        "slowdown",
        job.config,
        *job.argv,
        "--scale",
        str(scale),
        # A traced child otherwise times untraced runs around its traced
        # ones, which callgrind would count as the tracer's.
        "--once",
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), check=False
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        return f"callgrind run failed: {tail}"
    recorded = json.loads(proc.stdout.strip().splitlines()[-1]).get("recorded")
    return int(found.group(1)), recorded


def run_instructions(job: Job, rnd: int, timeout: float) -> Outcome:
    """The slowdown workload under callgrind at two scales, both at once:
    instruction counts are deterministic, whatever else the machine runs."""
    t0 = time.perf_counter()
    if shutil.which("valgrind") is None:
        return Outcome(job, rnd, 0.0, error="valgrind is not installed")
    with ThreadPoolExecutor(len(INSTRUCTION_SCALES)) as pool:
        runs = list(pool.map(lambda scale: callgrind(job, scale, timeout), INSTRUCTION_SCALES))
    elapsed = time.perf_counter() - t0
    counted: list[tuple[int, int | None]] = []
    for run in runs:
        if isinstance(run, str):
            return Outcome(job, rnd, elapsed, error=run)
        counted.append(run)
    (small, small_rec), (large, large_rec) = counted
    result = {
        "scales": list(INSTRUCTION_SCALES),
        "instructions": [small, large],
        "delta": large - small,
        "recorded": large_rec - small_rec if large_rec is not None and small_rec else None,
    }
    return Outcome(job, rnd, elapsed, result=result)


def run_job(job: Job, rnd: int, timeout: float) -> Outcome:
    if job.suite == "instructions":
        return run_instructions(job, rnd, timeout)
    cmd = [sys.executable, str(CHILD), job.suite, job.config, *job.argv]
    if job.suite == "slowdown":
        if rnd % 2:
            cmd.append("--traced-first")
        # heapwatch's ratios carry the targets: two blocks of four runs, and
        # so does the floor they are read against; the stdlib's, for
        # comparison, one (its runs take seconds).
        cmd += ["--blocks-of-runs", "2" if runs_in_blocks_of_two(job.config) else "1"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), check=False
        )
    except subprocess.TimeoutExpired:
        return Outcome(job, rnd, time.perf_counter() - t0, error=f"timed out after {timeout:g} s")
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        return Outcome(job, rnd, elapsed, error=f"exit status {proc.returncode}: {tail}")
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return Outcome(job, rnd, elapsed, error=f"no result on stdout: {proc.stdout[-200:]!r}")
    return Outcome(job, rnd, elapsed, result=result)


def describe(outcome: Outcome, metric: str) -> str:
    r = outcome.result
    if r is None:
        return f"ERROR {outcome.error}"
    suite = outcome.job.suite
    if suite == "slowdown":
        return f"{r[metric]:.3f} s"
    if suite == "instructions":
        return f"{r['delta'] / 1e6:.1f}M instructions"
    if suite == "rss":
        return f"RSS +{r['rss_growth'] / 2**20:.1f} MiB, {r['live_traces']} live traces"
    if suite == "cycle":
        return f"cycle {statistics.median(r['cycle_seconds']) * 1e3:.2f} ms (median)"
    gaps = ", ".join(f"{k} {v['max_gap'] * 1e3:.1f}" for k, v in r["phases"].items())
    return f"max gaps ms: {gaps}"


def run_plan(plan: Plan, args: argparse.Namespace) -> list[Outcome]:
    outcomes: list[Outcome] = []
    start = time.perf_counter()
    for rnd in range(args.rounds):
        round_start = time.perf_counter()
        jobs = plan.jobs_in_round(rnd)
        for i, job in enumerate(jobs):
            outcome = run_job(job, rnd, args.timeout)
            outcomes.append(outcome)
            if args.verbose or outcome.error:
                print(
                    f"  [{rnd + 1}/{args.rounds} {i + 1}/{len(jobs)}] {job.key}: "
                    f"{describe(outcome, args.metric)}",
                    file=sys.stderr,
                    flush=True,
                )
        done = time.perf_counter() - start
        per_round = done / (rnd + 1)
        left = per_round * (args.rounds - rnd - 1)
        print(
            f"round {rnd + 1}/{args.rounds}: {len(jobs)} runs in "
            f"{time.perf_counter() - round_start:.0f} s (about {left / 60:.1f} min left)",
            file=sys.stderr,
            flush=True,
        )
    return outcomes


# ---- statistics ---------------------------------------------------------------


@dataclass
class Summary:
    median: float
    low: float  # min
    high: float  # max
    q1: float
    q3: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Summary | None:
        if not values:
            return None
        if len(values) > 1:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        else:
            q1 = q3 = values[0]
        return cls(statistics.median(values), min(values), max(values), q1, q3, len(values))

    def as_dict(self) -> dict[str, float]:
        return {
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "q1": self.q1,
            "q3": self.q3,
            "n": self.n,
        }


def by_round(outcomes: list[Outcome], suite: str, group: str, config: str) -> dict[int, Any]:
    return {
        o.round: o.result
        for o in outcomes
        if o.result is not None
        and o.job.suite == suite
        and o.job.group == group
        and o.job.config == config
    }


def paired(
    a: dict[int, Any], b: dict[int, Any], fn: Any
) -> list[float]:  # fn(result_a, result_b) -> float or None
    values = []
    for rnd in sorted(a.keys() & b.keys()):
        value = fn(a[rnd], b[rnd])
        if value is not None:
            values.append(value)
    return values


# ---- tables -------------------------------------------------------------------


def table(headers: list[str], rows: list[list[str]], right: set[int]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def fmt(row: list[str]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(headers), rule, *(fmt(r) for r in rows)])


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("pass" if ok else "FAIL")


def secs(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.2f}"


def ratio(value: float) -> str:
    if value < 2:
        return f"{value:.3f}x"
    return f"{value:.2f}x" if value < 100 else f"{value:.0f}x"


def count(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n:.0f}"


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    targets: list[tuple[str, bool]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def add(self, text: str = "") -> None:
        self.lines.append(text)

    def target(self, what: str, ok: bool) -> None:
        self.targets.append((what, ok))


def own_ratio(result: dict[str, Any], metric: str) -> float | None:
    """A traced child's time over the untraced runs it made around it."""
    base = result.get(f"untraced_{metric}")
    return result[metric] / base if base else None


def untraced_ratio(runs: dict[int, Any], base: dict[int, Any], metric: str) -> list[float]:
    """Per-round ratios to untraced: the child's own (saved runs from before
    children timed their own untraced runs: the untraced child's, same round)."""
    own = [own_ratio(r, metric) for r in runs.values()]
    if own and all(value is not None for value in own):
        return [value for value in own if value is not None]
    return paired(runs, base, lambda a, b: a[metric] / b[metric])


def report_slowdown(outcomes: list[Outcome], plan: Plan, metric: str, rep: Report) -> None:
    groups = [jobs for jobs in plan.groups if jobs[0].suite == "slowdown"]
    if not groups:
        return
    rep.add(f"== Slowdown: one run of each workload per child, {metric} seconds ==")
    rep.add(
        "x untraced: each traced child's time over the untraced runs it made just before and "
        "after, median over rounds, IQR in brackets;\nx stdlib: the same ratios, heapwatch's "
        "over the stdlib's at the same nframe; +ns/alloc: (traced - untraced, median over "
        "rounds) / allocations traced in exact mode"
    )
    headers = [
        "workload",
        "config",
        "median s",
        "min..max s",
        "x untraced",
        "[IQR]",
        "x stdlib",
        "+ns/alloc",
        "target",
        "",
    ]
    rows: list[list[str]] = []
    data: dict[str, Any] = {}
    for jobs in groups:
        workload = jobs[0].group
        results = {j.config: by_round(outcomes, "slowdown", workload, j.config) for j in jobs}
        base = results.get("untraced", {})
        base_summary = Summary.of([r[metric] for r in base.values()])
        exact = next((results[c] for c in EXACT if results.get(c)), {})
        recorded = [r["recorded"] for r in exact.values() if r.get("recorded")]
        allocations = statistics.median(recorded) if recorded else None
        data[workload] = {"allocations": allocations, "configs": {}}
        first = True
        for job in jobs:
            config = job.config
            times = Summary.of([r[metric] for r in results[config].values()])
            if times is None:
                rows.append([workload if first else "", label(config), "no result"])
                first = False
                continue
            cells = [
                workload if first else "",
                label(config),
                secs(times.median),
                f"{secs(times.low)}..{secs(times.high)}",
            ]
            first = False
            entry: dict[str, Any] = {"seconds": times.as_dict()}
            rel = Summary.of(untraced_ratio(results[config], base, metric))
            target, peer = CONFIGS[config][1], CONFIGS[config][2]
            if rel is not None and config != "untraced":
                cells += [ratio(rel.median), f"[{ratio(rel.q1)}-{ratio(rel.q3)}]".replace("x", "")]
                entry["ratio_untraced"] = rel.as_dict()
            else:
                cells += ["", ""]
            peer_results = results.get(peer) if peer else None

            def versus(a: dict[str, Any], b: dict[str, Any]) -> float | None:
                mine, theirs = own_ratio(a, metric), own_ratio(b, metric)
                if mine is None or theirs is None:
                    return float(a[metric] / b[metric])
                return mine / theirs

            vs = Summary.of(paired(results[config], peer_results, versus)) if peer_results else None
            if vs is not None:
                cells.append(f"{vs.median:.3f}x")
                entry["ratio_stdlib"] = vs.as_dict()
            else:
                cells.append("")
            own = [
                r[metric] - r[f"untraced_{metric}"]
                for r in results[config].values()
                if f"untraced_{metric}" in r
            ]
            if allocations and own:
                overhead = statistics.median(own) / allocations * 1e9
                cells.append(f"{overhead:.0f}")
                entry["ns_per_alloc"] = overhead
            elif allocations and base_summary and config != "untraced":
                overhead = (times.median - base_summary.median) / allocations * 1e9
                cells.append(f"{overhead:.0f}")
                entry["ns_per_alloc"] = overhead
            else:
                cells.append("")
            if target is not None and rel is not None:
                ok = rel.median <= target
                cells += [f"<= {target:g}x", verdict(ok)]
                rep.target(f"slowdown {workload} {label(config)} <= {target:g}x", ok)
                entry["target"] = target
                entry["pass"] = ok
            data[workload]["configs"][config] = entry
            rows.append(cells)
        if allocations and len(rows) > 0:
            # Under the workload's name: the allocations it makes (exact mode).
            at = len(rows) - len(jobs) + 1
            if at < len(rows):
                rows[at][0] = f"{count(allocations)} allocs"
            else:
                rows.append([f"{count(allocations)} allocs"])
    rep.add(table(headers, rows, right={2, 3, 4, 5, 6, 7}))
    rep.add()
    rep.data["slowdown"] = data


def report_rss(outcomes: list[Outcome], plan: Plan, rep: Report) -> None:
    groups = [jobs for jobs in plan.groups if jobs[0].suite == "rss"]
    if not groups:
        return
    jobs = groups[0]
    rep.add("== Memory: RSS per live traced block (small objects kept alive) ==")
    rep.add(
        "bytes/block = median over rounds of (RSS growth traced - RSS growth untraced, same "
        "round) / live traced blocks; tracer memory = get_tracemalloc_memory()"
    )
    results = {j.config: by_round(outcomes, "rss", "rss", j.config) for j in jobs}
    base = results.get("untraced", {})
    headers = [
        "config",
        "live blocks",
        "RSS growth MiB",
        "extra MiB",
        "bytes/block",
        "[min-max]",
        "tracer memory MiB",
        "bytes/block",
        "target",
        "",
    ]
    rows = []
    data: dict[str, Any] = {}
    for job in jobs:
        config = job.config
        mine = results[config]
        growth = Summary.of([r["rss_growth"] for r in mine.values()])
        if growth is None:
            rows.append([label(config), "no result"])
            continue
        entry: dict[str, Any] = {"rss_growth": growth.as_dict()}
        live = statistics.median([r["live_traces"] for r in mine.values()])
        cells = [label(config), count(live) if live else "", f"{growth.median / 2**20:.1f}"]
        extra = Summary.of(paired(mine, base, lambda a, b: a["rss_growth"] - b["rss_growth"]))
        per_block = Summary.of(
            paired(
                mine,
                base,
                lambda a, b: (
                    (a["rss_growth"] - b["rss_growth"]) / a["live_traces"]
                    if a["live_traces"]
                    else None
                ),
            )
        )
        if extra is not None and config != "untraced":
            cells.append(f"{extra.median / 2**20:.1f}")
            entry["extra"] = extra.as_dict()
        else:
            cells.append("")
        if per_block is not None and config not in SAMPLED:
            cells += [f"{per_block.median:.1f}", f"[{per_block.low:.1f}-{per_block.high:.1f}]"]
            entry["bytes_per_block"] = per_block.as_dict()
        else:
            cells += ["", ""]
        tmem = statistics.median([r["tracer_memory"] for r in mine.values()])
        if config != "untraced":
            per = f"{tmem / live:.1f}" if live and config not in SAMPLED else ""
            cells += [f"{tmem / 2**20:.1f}", per]
            entry["tracer_memory"] = tmem
        else:
            cells += ["", ""]
        if config == "hw-exact-1" and per_block is not None:
            ok = per_block.median <= RSS_TARGET
            cells += [f"<= {RSS_TARGET:g} B", verdict(ok)]
            rep.target(f"RSS per live block, {label(config)} <= {RSS_TARGET:g} B", ok)
            entry["pass"] = ok
        entry["live_traces"] = live
        data[config] = entry
        rows.append(cells)
    rep.add(table(headers, rows, right={1, 2, 3, 4, 5, 6, 7}))
    rep.add()
    rep.data["rss"] = data


def report_cycle(outcomes: list[Outcome], plan: Plan, rep: Report) -> None:
    groups = [jobs for jobs in plan.groups if jobs[0].suite == "cycle"]
    if not groups:
        return
    jobs = groups[0]
    rep.add("== Agent cycle at the live heap below, exact mode, nframe 1 ==")
    rep.add(
        "heapwatch: Agent.run_cycle() (snapshot resetting the peak, group by line, top 20 "
        "with growth, tracer memory, drain).  stdlib: take_snapshot(), "
        "statistics('lineno'), compare_to(prev, 'lineno'), reset_peak().  Median per child, "
        "then median over rounds."
    )
    results = {j.config: by_round(outcomes, "cycle", "cycle", j.config) for j in jobs}
    per_child = {
        config: {rnd: statistics.median(r["cycle_seconds"]) for rnd, r in res.items()}
        for config, res in results.items()
    }
    headers = ["config", "live blocks", "cycles", "median ms", "min..max ms", "mean ms per step"]
    rows = []
    data: dict[str, Any] = {}
    for job in jobs:
        config = job.config
        res = results[config]
        times = Summary.of(list(per_child[config].values()))
        if times is None:
            rows.append([label(config), "no result"])
            continue
        live = statistics.median([r["live_traces"] for r in res.values()])
        ncycles = sum(len(r["cycle_seconds"]) for r in res.values())
        steps: dict[str, list[float]] = {}
        for r in res.values():
            for step, seconds in r["phases"].items():
                steps.setdefault(step, []).append(seconds)
        step_text = ", ".join(
            f"{step} {statistics.median(v) * 1e3:.2f}" for step, v in steps.items()
        )
        rows.append(
            [
                label(config),
                count(live),
                str(ncycles),
                f"{times.median * 1e3:.2f}",
                f"{times.low * 1e3:.2f}..{times.high * 1e3:.2f}",
                step_text,
            ]
        )
        data[config] = {
            "cycle_seconds": times.as_dict(),
            "live_traces": live,
            "steps": {k: statistics.median(v) for k, v in steps.items()},
        }
    rep.add(table(headers, rows, right={1, 2, 3, 4}))
    hw = next((c for c in per_child if is_heapwatch(c)), None)
    std = next((c for c in per_child if c.startswith("stdlib")), None)
    if hw is not None and per_child[hw]:
        med = statistics.median(per_child[hw].values()) * 1e3
        ok = med <= CYCLE_TARGET_MS
        rep.add(
            f"{label(hw)} cycle: {med:.2f} ms median (target <= {CYCLE_TARGET_MS:g} ms) "
            f"{verdict(ok)}"
        )
        rep.target(f"agent cycle, {label(hw)} <= {CYCLE_TARGET_MS:g} ms", ok)
    if hw is not None and std is not None:
        speedup = Summary.of(paired(per_child[std], per_child[hw], lambda a, b: a / b))
        if speedup is not None:
            ok = speedup.median >= CYCLE_SPEEDUP_TARGET
            rep.add(
                f"{label(std)} / {label(hw)}: {ratio(speedup.median)} faster "
                f"[{ratio(speedup.low)}-{ratio(speedup.high)}] "
                f"(target >= {CYCLE_SPEEDUP_TARGET:g}x) {verdict(ok)}"
            )
            rep.target(f"agent cycle, stdlib / heapwatch >= {CYCLE_SPEEDUP_TARGET:g}x", ok)
            data["speedup"] = speedup.as_dict()
    rep.add()
    rep.data["cycle"] = data


def report_instructions(outcomes: list[Outcome], plan: Plan, rep: Report) -> None:
    groups = [jobs for jobs in plan.groups if jobs[0].suite == "instructions"]
    if not groups:
        return
    small, large = INSTRUCTION_SCALES
    rep.add(
        f"== Instructions (callgrind): the slowdown workloads at scale {large:g} minus "
        f"scale {small:g} =="
    )
    rep.add(
        "deterministic, but blind to cache and TLB misses (it understates memory-bound "
        "costs: dict_1m);\nthe targets are the slowdown targets, shown for orientation and "
        "not counted; +Ir/alloc per allocation (and its free)"
    )
    headers = ["workload", "config", "instructions", "x untraced", "+Ir/alloc", "target", ""]
    rows: list[list[str]] = []
    data: dict[str, Any] = {}
    for jobs in groups:
        workload = jobs[0].group
        results = {
            j.config: next(
                iter(by_round(outcomes, "instructions", workload, j.config).values()), None
            )
            for j in jobs
        }
        base = results.get("untraced")
        exact = next((results[c] for c in EXACT if results.get(c)), None)
        allocations = exact["recorded"] if exact else None
        data[workload] = {}
        for i, job in enumerate(jobs):
            r = results[job.config]
            name = workload if i == 0 else ""
            if i == 1 and allocations:
                name = f"{count(allocations)} allocs"
            if r is None:
                rows.append([name, label(job.config), "no result"])
                continue
            cells = [name, label(job.config), f"{r['delta'] / 1e6:.1f}M"]
            entry: dict[str, Any] = {"instructions": r["delta"]}
            target = CONFIGS[job.config][1]
            if base is not None and job.config != "untraced":
                rel = r["delta"] / base["delta"]
                cells.append(ratio(rel))
                entry["ratio_untraced"] = rel
                per = (r["delta"] - base["delta"]) / allocations if allocations else None
                cells.append(f"{per:.0f}" if per is not None else "")
                if target is not None:
                    cells += [f"<= {target:g}x", "within" if rel <= target else "over"]
            data[workload][job.config] = entry
            rows.append(cells)
    rep.add(table(headers, rows, right={2, 3, 4}))
    rep.add()
    rep.data["instructions"] = data


PAUSE_LABELS = {
    "idle": "baseline: main sleeps",
    "busy": "baseline: main runs Python",
    "cycle": "main runs agent cycles",
}


def report_pause(outcomes: list[Outcome], plan: Plan, rep: Report) -> None:
    groups = [jobs for jobs in plan.groups if jobs[0].suite == "pause"]
    if not groups:
        return
    rep.add("== Pause: the longest gap seen by a thread allocating in a loop ==")
    rep.add(
        "per phase (about --duration s each): median over rounds of the child's longest gap, "
        "the worst over all rounds,\nand the number of gaps > 5 ms / > 20 ms summed over rounds"
    )
    headers = [
        "config",
        "phase",
        "median max gap ms",
        "worst ms",
        "> 5 ms",
        "> 20 ms",
        "target",
        "",
    ]
    rows = []
    notes = []
    data: dict[str, Any] = {}
    for job in groups[0]:
        config = job.config
        res = by_round(outcomes, "pause", "pause", config)
        if not res:
            rows.append([label(config), "no result"])
            continue
        first = True
        data[config] = {}
        for phase, text in PAUSE_LABELS.items():
            gaps = [r["phases"][phase]["max_gap"] * 1e3 for r in res.values()]
            over5 = sum(r["phases"][phase]["over_5ms"] for r in res.values())
            over20 = sum(r["phases"][phase]["over_20ms"] for r in res.values())
            cells = [
                label(config) if first else "",
                text,
                f"{statistics.median(gaps):.2f}",
                f"{max(gaps):.2f}",
                str(over5),
                str(over20),
            ]
            first = False
            if phase == "cycle" and is_heapwatch(config):
                ok = statistics.median(gaps) <= PAUSE_TARGET_MS
                cells += [f"<= {PAUSE_TARGET_MS:g} ms", verdict(ok)]
                rep.target(f"pause during a cycle, {label(config)} <= {PAUSE_TARGET_MS:g} ms", ok)
            data[config][phase] = {"max_gap_ms": Summary.of(gaps).as_dict()}  # type: ignore[union-attr]
            rows.append(cells)
        ncycles = statistics.median([r["cycles"] for r in res.values()])
        longest = max(r["longest_cycle"] for r in res.values()) * 1e3
        live = statistics.median([r["live_traces"] for r in res.values()])
        notes.append(
            f"{label(config)}: {ncycles:.0f} cycles per child over {count(live)} live blocks, "
            f"the longest took {longest:.2f} ms"
        )
    rep.add(table(headers, rows, right={2, 3, 4, 5}))
    for note in notes:
        rep.add(note)
    switch = next(iter(by_round(outcomes, "pause", "pause", groups[0][0].config).values()), None)
    if switch is not None:
        rep.add(f"(sys.getswitchinterval() = {switch['switch_interval'] * 1e3:g} ms)")
    rep.add()
    rep.data["pause"] = data


def noise_note(outcomes: list[Outcome], metric: str) -> str | None:
    """How much of a CPU the single-threaded slowdown runs got."""
    shares = [
        o.result["cpu"] / o.result["wall"]
        for o in outcomes
        if o.result is not None
        and o.job.suite == "slowdown"
        and o.job.group != "threads"
        and o.result["wall"] > 0
    ]
    if not shares:
        return None
    share = statistics.median(shares)
    worst = min(shares)
    text = f"single-threaded runs got {share:.0%} of a CPU (median; worst {worst:.0%})"
    if share < 0.95 or worst < 0.8:
        text += ": the machine was busy"
        if metric == "wall":
            text += ", wall times are inflated; compare with --metric cpu"
    return text


# ---- main ---------------------------------------------------------------------


def git_state() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty else "")


def core_location() -> str:
    code = "import heapwatch._core as c; print(c.__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"cannot import heapwatch._core:\n{proc.stderr}")
    return proc.stdout.strip()


def command_line() -> str:
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in ("PYTHONPATH",) if k in os.environ]
    return " ".join([*env, shlex.join([sys.executable, *sys.argv])])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes and 3 rounds")
    parser.add_argument("--rounds", type=int, help="rounds (default 5, quick 3)")
    parser.add_argument("--suites", help=f"comma-separated, from {','.join(SUITES)}")
    parser.add_argument("--workloads", help=f"comma-separated, from {','.join(WORKLOADS)}")
    parser.add_argument("--configs", help=f"comma-separated, from {','.join(CONFIGS)}")
    parser.add_argument("--scale", type=float, help="workload size factor (default 1, quick 0.25)")
    parser.add_argument(
        "--blocks", type=int, help="live blocks for rss, cycle, pause (default 1M, quick 250k)"
    )
    parser.add_argument(
        "--cycles",
        type=int,
        help="timed cycles per heapwatch child (default 20, quick 10; the stdlib runs 1/20th)",
    )
    parser.add_argument(
        "--duration", type=float, help="seconds per pause phase (default 1, quick 0.5)"
    )
    parser.add_argument(
        "--metric",
        choices=("wall", "cpu"),
        default="wall",
        help="slowdown time: wall clock (default) or process CPU time",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per child")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<time>.json")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument("--list", action="store_true", help="list workloads and configurations")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="print the tables of a saved run again (with --metric) instead of running",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print every child's result")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "rounds": 3 if quick else 5,
        "scale": 0.25 if quick else 1.0,
        "blocks": 250_000 if quick else 1_000_000,
        "cycles": 10 if quick else 20,
        "duration": 0.5 if quick else 1.0,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def list_all() -> None:
    from workloads import load

    print("workloads (slowdown suite):")
    for name in WORKLOADS:
        print(f"  {name:<11} {load(name).DESCRIPTION}")
    print("configurations:")
    for name, (text, target, _) in CONFIGS.items():
        goal = f"  target <= {target:g}x untraced" if target else ""
        print(f"  {name:<14} {text}{goal}")
    print("suites and their default configurations:")
    for suite, (_, default) in SUITE_CONFIGS.items():
        print(f"  {suite:<11} {', '.join(default)}")


def render(outcomes: list[Outcome], plan: Plan, metric: str) -> Report:
    rep = Report()
    report_slowdown(outcomes, plan, metric, rep)
    report_rss(outcomes, plan, rep)
    report_cycle(outcomes, plan, rep)
    report_pause(outcomes, plan, rep)
    report_instructions(outcomes, plan, rep)
    if rep.targets:
        rep.add(
            f"targets met: {sum(ok for _, ok in rep.targets)} of {len(rep.targets)}"
            + "".join(f"\n  missed: {what}" for what, ok in rep.targets if not ok)
        )
    noise = noise_note(outcomes, metric)
    if noise:
        rep.add(noise)
    for o in outcomes:
        if o.error:
            rep.add(f"FAILED round {o.round + 1} {o.job.key}: {o.error}")
    return rep


def load_saved(path: Path) -> tuple[list[str], Plan, list[Outcome]]:
    """The header, plan and outcomes of a run saved with --save or --json."""
    document = json.loads(path.read_text(encoding="utf-8"))
    groups: dict[tuple[str, str], dict[str, Job]] = {}
    outcomes = []
    for run in document["runs"]:
        group = groups.setdefault((run["suite"], run["group"]), {})
        job = group.setdefault(
            run["config"], Job(run["suite"], run["group"], run["config"], run["argv"])
        )
        outcomes.append(Outcome(job, run["round"], run["elapsed"], run["result"], run["error"]))
    plan = Plan()
    for jobs in groups.values():
        plan.groups.append(sorted(jobs.values(), key=lambda j: list(CONFIGS).index(j.config)))
    return list(document["header"]), plan, outcomes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        list_all()
        return 0
    if args.report is not None:
        header, plan, outcomes = load_saved(args.report)
        print("\n".join([*header, f"(re-read from {args.report}, metric {args.metric})", ""]))
        print("\n".join(render(outcomes, plan, args.metric).lines))
        return 0
    plan = make_plan(args)
    if not plan.groups:
        raise SystemExit("nothing to run")
    if any(job.config in floor.CONFIGS for group in plan.groups for job in group):
        global FLOOR_BUILT
        try:
            FLOOR_BUILT = floor.build(RESULTS / "floor" / sys.implementation.cache_tag)
        except RuntimeError as err:
            raise SystemExit(str(err)) from None
    nruns = sum(len(g) for g in plan.groups)
    header = [
        "heapwatch benchmarks (a measurement: targets are printed, never enforced)",
        f"command:   {command_line()}",
        f"python:    {sys.version.splitlines()[0]} [{platform.python_implementation()}]",
        f"core:      {core_location()}",
        f"git:       {git_state()}",
        f"machine:   {platform.system()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"plan:      {args.rounds} rounds x {nruns} children; scale {args.scale:g}, "
        f"{count(args.blocks)} live blocks, metric {args.metric}",
    ]
    for name in ("PYTHONMALLOC", "PYTHONDEVMODE", *TRACER_ENV):
        if name in os.environ:
            removed = " (removed for the children)" if name in TRACER_ENV else ""
            header.append(f"env:       {name}={os.environ[name]}{removed}")
    print("\n".join(header), flush=True)
    print(flush=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()
    outcomes = run_plan(plan, args)
    elapsed = time.perf_counter() - t0

    rep = render(outcomes, plan, args.metric)
    rep.add(
        f"{len(outcomes)} children in {elapsed / 60:.1f} min; load average now "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print()
    print("\n".join(rep.lines))

    path = args.json
    if args.save and path is None:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"bench-{started:%Y%m%d-%H%M%S}.json"
    if path is not None:
        document = {
            "header": header,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "started": started.isoformat(),
            "elapsed": elapsed,
            "summary": rep.data,
            "targets": [{"target": what, "pass": ok} for what, ok in rep.targets],
            "runs": [
                {
                    "round": o.round,
                    "suite": o.job.suite,
                    "group": o.job.group,
                    "config": o.job.config,
                    "argv": o.job.argv,
                    "elapsed": o.elapsed,
                    "result": o.result,
                    "error": o.error,
                }
                for o in outcomes
            ],
        }
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        print(f"results written to {path}")
    return 1 if any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
