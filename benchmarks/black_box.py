"""The black box's race (issue 22): from the crossing of a memory threshold
to a finished dump, and the memory that dump takes, at 10k, 100k and 1M live
traces in exact and sample mode; and what the watcher's poll costs when
nothing crosses, ten times a second for the life of the service.  A
measurement, never a test: nothing here passes or fails.

    .venv/bin/python benchmarks/black_box.py                   # the tables, under a minute
    .venv/bin/python benchmarks/black_box.py --sizes 10000,100000 --modes exact
    .venv/bin/python benchmarks/black_box.py --profile exact:1000000   # cProfile of one crossing
    .venv/bin/python benchmarks/black_box.py --batch 65536     # another TRACE_BATCH

What runs is the real watcher: ``BlackBoxWatcher.poll()`` of
``heapwatch.server.black_box`` on a ``DumpService``, over a fixture cgroup v1
directory (``memory.usage_in_bytes``, ``memory.stat``,
``memory.limit_in_bytes``) whose usage is set above 90% of its limit, so the
poll reads the usage, then the working set, crosses ``dump_at=90%`` and
writes the termination-log summary and the dump (snapshot with traces,
grouping by line, streaming write, fsync, rename, retention) before it
returns the dump's path.  It runs as the watcher's thread runs it: its own
allocations untraced (``own_work``).

Each configuration runs in a fresh interpreter: tracing started with
``_core.start`` (exact: nframe 1; sample: nframe 64, the agent's default,
and a 1-byte interval, so that every block is sampled and the live traces
are the blocks asked for), then N blocks of 41 to 289 bytes kept alive from
200 lines of generated code, called 20 frames deep, over 60 epochs (the
dump's ages vary as a running service's do).  Then several crossings, each
into a fresh dump directory and termination log, deleted after.

Memory: before each crossing the process's high-water mark is reset
(``5`` to ``/proc/self/clear_refs``), its RSS read; after, ``VmHWM`` less
that RSS is the crossing's peak extra resident memory.  Where the kernel
does not reset it, each crossing runs in a process of its own and
``ru_maxrss`` stands in (an upper bound then: it includes any higher peak
before the crossing).  The first crossing of a process is the one to read:
what a crossing frees stays with the allocator (glibc raises its mmap
threshold once a large block is freed, and keeps the heap's top), so the
later ones in the same process reuse it and add next to nothing.  The
core's snapshot memory is
``get_stats()["snapshot_memory"]`` read just after the snapshot is taken.
The phases are timed by wrapping, from outside, the dump service's source
(``snapshot``), ``write_summary``, ``write_dump_file``, ``os.fsync`` and
``prune_dumps``; "other" is the rest (the grouping by line for the summary,
the header, the process's memory read for it).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

# The children's environment as benchmarks/run.py makes it (no tracer
# switched on from outside, a fixed hash seed).
from run import child_env

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

MIB = 1 << 20
LINES = 200
DEPTH = 20
EPOCHS = 60
CHUNK = 1000  # blocks per call of a site
# 8 to 256 bytes of payload (41 to 289-byte blocks): small ints, never
# allocated.  Drawn at random, and more of them than zlib's 32 KiB window
# holds records for, so that the dump compresses as a real heap's would,
# not as a repeated pattern does.
_DRAW = random.Random(22)
SIZES = [_DRAW.randint(8, 256) for _ in range(1 << 16)]
LIMIT = 1 << 30  # the fixture cgroup's limit; only the ratio matters
CROSSING_USAGE = int(LIMIT * 0.95)
IDLE_USAGE = int(LIMIT * 0.5)
SAMPLE_NFRAME = 64
SAMPLE_INTERVAL = 1
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
# Repetitions per size: the 1M case takes seconds per crossing.
REPS = {10_000: 9, 100_000: 7, 1_000_000: 5}
IDLE_POLLS = 2000
IDLE_ROUNDS = 15
# The environment variables that would start a tracer in the children.


# ---- the child: one configuration --------------------------------------------


def _status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    out: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def _peak_reset_works() -> bool:
    """Whether writing 5 to clear_refs brings VmHWM down to VmRSS here."""
    block = bytearray(64 * MIB)
    block[::4096] = b"x" * len(range(0, len(block), 4096))
    del block
    if not _reset_peak_rss():
        return False
    status = _status()
    return status["VmHWM"] - status["VmRSS"] < 8 * MIB


def _v1_cgroup(root: Path, usage: int, inactive: int = 0) -> Any:
    from heapwatch.runtime.container import MemoryCgroup

    root.mkdir(exist_ok=True)
    (root / "memory.limit_in_bytes").write_text(f"{LIMIT}\n")
    (root / "memory.stat").write_text(
        f"cache {inactive}\nrss {usage - inactive}\ninactive_file {inactive}\n"
        f"total_inactive_file {inactive}\nhierarchical_memory_limit {LIMIT}\n"
    )
    (root / "memory.usage_in_bytes").write_text(f"{usage}\n")
    return MemoryCgroup(1, str(root), (str(root),), None)


def _sites() -> list[Callable[..., Any]]:
    """LINES functions, one allocating line each, in a file of their own."""
    source = "\n".join(
        f"def site_{i}(sizes): return [bytes(s) for s in sizes]" for i in range(LINES)
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "/srv/app/generated_sites.py", "exec"), namespace)
    return [namespace[f"site_{i}"] for i in range(LINES)]


def _descend(depth: int, site: Callable[..., Any], sizes: list[int]) -> Any:
    if depth:
        return _descend(depth - 1, site, sizes)
    return site(sizes)


def _live_heap(blocks: int, sites: list[Callable[..., Any]]) -> list[Any]:
    """``blocks`` bytes objects kept alive, spread over the sites and epochs
    (tracing on; ``sites`` made before)."""
    from heapwatch import _core

    kept: list[Any] = []
    calls = -(-blocks // CHUNK)
    for call in range(calls):
        epoch = call * EPOCHS // calls
        if epoch > _core.get_epoch():
            _core.set_epoch(epoch)
        start = call * CHUNK % (len(SIZES) - CHUNK)
        chunk = SIZES[start : start + min(CHUNK, blocks - call * CHUNK)]
        kept.append(_descend(DEPTH, sites[(call * 7) % LINES], chunk))
    return kept


class _Phases:
    """Wall time of the crossing's phases, taken by wrapping from outside."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.snapshot_memory = 0

    @contextlib.contextmanager
    def timing(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.timing(name):
                return function(*args, **kwargs)

        return timed


class _TimedSource:
    """The core as the dump service's source, with the snapshot timed and
    the core's snapshot memory read just after it is taken."""

    def __init__(self, phases: _Phases) -> None:
        from heapwatch.runtime.source import CoreSource

        self._inner = CoreSource()
        self._phases = phases

    def snapshot(self, traces: bool) -> Any:
        from heapwatch import _core

        with self._phases.timing("snapshot"):
            snap = self._inner.snapshot(traces)
        self._phases.snapshot_memory = _core.get_stats()["snapshot_memory"]
        return snap


def _instrument(phases: _Phases) -> None:
    from heapwatch.server import black_box, dumps

    # The names the watcher and the dump service call at each crossing.
    for module, name, phase in (
        (black_box, "write_summary", "summary"),
        (dumps, "write_dump_file", "write"),
        (dumps, "prune_dumps", "retention"),
        (os, "fsync", "fsync"),
    ):
        setattr(module, name, phases.wrap(phase, getattr(module, name)))


def _crossing(base: str, rss_method: str, phases: _Phases) -> dict[str, Any]:
    """One crossing into a fresh directory: its figures.  All of it runs
    as heapwatch's own work, as the watcher's thread does: the fixture's
    objects are not part of the heap measured, nor the dump's."""
    from heapwatch.runtime.threads import own_work

    with own_work():
        return _untraced_crossing(base, rss_method, phases)


def _untraced_crossing(base: str, rss_method: str, phases: _Phases) -> dict[str, Any]:
    from heapwatch.agent.config import AgentConfig
    from heapwatch.server.black_box import BlackBoxWatcher
    from heapwatch.server.dumps import DumpService

    work = tempfile.mkdtemp(prefix="hw-black-box-", dir=base)
    try:
        cgroup = _v1_cgroup(Path(work) / "cgroup", CROSSING_USAGE)
        config = AgentConfig().replace(dump_dir=os.path.join(work, "dumps"), dump_at="90%")
        service = DumpService(config, source=_TimedSource(phases))
        watcher = BlackBoxWatcher(
            service,
            cgroup,
            config.dump_at,
            LIMIT,
            termination_log=os.path.join(work, "termination-log"),
            agent=None,
        )
        phases.seconds.clear()
        gc.collect()
        if rss_method == "hwm":
            _reset_peak_rss()
        before = _status()["VmRSS"]
        cpu = time.process_time()
        started = time.perf_counter()
        path = watcher.poll()
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
        if rss_method == "hwm":
            peak = _status()["VmHWM"]
        else:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if path is None:
            raise SystemExit("the poll wrote no black box (see the log above)")
        return {
            "wall": wall,
            "cpu": cpu,
            "extra_rss": peak - before,
            "rss_before": before,
            "snapshot_memory": phases.snapshot_memory,
            "dump_bytes": os.path.getsize(path),
            "phases": dict(phases.seconds),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _import_all() -> None:
    """What the crossings use, imported before tracing starts: the modules'
    own blocks are not the heap measured."""
    import resource  # noqa: F401

    import heapwatch.agent.config
    import heapwatch.formats.dump
    import heapwatch.runtime.threads
    import heapwatch.server.black_box
    import heapwatch.server.dumps  # noqa: F401


def _traced_heap(mode: str, blocks: int) -> list[Any]:
    """Starts tracing in ``mode`` and makes ``blocks`` live blocks over the
    benchmark's sites; returns what keeps them alive."""
    from heapwatch import _core

    sites = _sites()
    if mode == "exact":
        _core.start(1, "exact")
    else:
        _core.start(SAMPLE_NFRAME, "sample", SAMPLE_INTERVAL)
    kept = _live_heap(blocks, sites)
    gc.collect()
    return kept


def child_crossings(mode: str, blocks: int, reps: int, base: str, rss_method: str) -> None:
    import logging

    from heapwatch import _core
    from heapwatch.server import black_box

    _import_all()

    # The watcher logs each box at WARNING; errors still show.
    logging.basicConfig(level=logging.ERROR)
    if rss_method == "hwm" and not _peak_reset_works():
        print(json.dumps({"hwm_reset": False}))
        return
    phases = _Phases()
    _instrument(phases)
    kept = _traced_heap(mode, blocks)
    stats = _core.get_stats()
    runs = [_crossing(base, rss_method, phases) for _ in range(reps)]
    result = {
        "hwm_reset": rss_method == "hwm",
        "mode": mode,
        "blocks": blocks,
        "live_traces": stats["live_traces"],
        "tracebacks": stats["tracebacks"],
        "traced": stats["traced"],
        "tracer_memory": _core.get_tracemalloc_memory(),
        "batch": black_box.TRACE_BATCH,
        "runs": runs,
    }
    del kept
    _core.stop()
    print(json.dumps(result))


def _per_call(function: Callable[[], object]) -> list[float]:
    """Seconds per call of ``function``, one figure per round."""
    out = []
    for _ in range(IDLE_ROUNDS):
        started = time.perf_counter()
        for _ in range(IDLE_POLLS):
            function()
        out.append((time.perf_counter() - started) / IDLE_POLLS)
    return out


def child_idle(base: str) -> None:
    """The poll's cost when nothing crosses, as the watcher's thread pays it."""
    from heapwatch import _core
    from heapwatch.agent.config import AgentConfig
    from heapwatch.runtime.container import find_memory_cgroup, read_usage
    from heapwatch.runtime.threads import own_work
    from heapwatch.server.black_box import POLL_SECONDS, BlackBoxWatcher
    from heapwatch.server.dumps import DumpService

    _core.start(1, "exact")
    work = tempfile.mkdtemp(prefix="hw-black-box-idle-", dir=base)
    results: dict[str, Any] = {}
    try:
        config = AgentConfig().replace(dump_dir=os.path.join(work, "dumps"))

        def watcher(cgroup: Any) -> Any:
            # A clock that moves one poll interval per look, so the limit is
            # read again every 10 s of it, as in a running service.
            clock = [0.0]

            def timer() -> float:
                clock[0] += POLL_SECONDS
                return clock[0]

            return BlackBoxWatcher(
                DumpService(config),
                cgroup,
                config.dump_at,
                LIMIT,
                termination_log=None,
                agent=None,
                timer=timer,
            )

        low = _v1_cgroup(Path(work) / "low", IDLE_USAGE)
        # Usage past 90% but most of it inactive page cache: the working set
        # is read at every look, and stays below every threshold.
        cached = _v1_cgroup(Path(work) / "cached", CROSSING_USAGE, inactive=LIMIT // 4)
        with own_work():
            results["read_usage"] = _per_call(lambda: read_usage(low))
            below = watcher(low)
            results["poll_below"] = _per_call(below.poll)
            over = watcher(cached)
            results["poll_cached"] = _per_call(over.poll)
            if below.written or over.written:
                raise SystemExit("an idle poll wrote a black box")
            own = find_memory_cgroup()
            if own is not None and read_usage(own) is not None:
                results["own_cgroup"] = f"v{own.version}"
                results["read_usage_own"] = _per_call(lambda: read_usage(own))
        results["dump_at"] = ",".join(str(t) for t in config.dump_at)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _core.stop()
    print(json.dumps(results))


def child_profile(mode: str, blocks: int, base: str, top: int) -> None:
    """One crossing under cProfile, after one unprofiled (warm-up)."""
    import cProfile
    import io
    import logging
    import pstats

    from heapwatch import _core

    _import_all()
    logging.basicConfig(level=logging.ERROR)
    kept = _traced_heap(mode, blocks)
    phases = _Phases()
    warm = _crossing(base, "hwm", phases)
    profile = cProfile.Profile()
    profile.enable()
    _crossing(base, "hwm", phases)
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out).strip_dirs()
    print(f"{mode}, {blocks} blocks: unprofiled crossing {warm['wall'] * 1e3:.0f} ms")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    print(out.getvalue())
    del kept
    _core.stop()


# ---- the parent: plan, children, tables --------------------------------------


def run_child(argv: list[str], timeout: float) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", *argv]
    done = subprocess.run(
        command, capture_output=True, text=True, env=child_env(), timeout=timeout, check=False
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"child failed ({done.returncode}): {shlex.join(command)}")
    if done.stderr.strip():
        sys.stderr.write(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def crossings(
    mode: str, blocks: int, reps: int, base: str, *, batch: int | None, timeout: float
) -> dict[str, Any]:
    extra = [] if batch is None else ["--batch", str(batch)]
    argv = ["crossings", mode, str(blocks), str(reps), base, "hwm", *extra]
    result = run_child(argv, timeout)
    if result["hwm_reset"]:
        return result
    # No resettable high-water mark: a process per crossing, ru_maxrss.
    runs = []
    for _ in range(reps):
        argv = ["crossings", mode, str(blocks), "1", base, "ru", *extra]
        one = run_child(argv, timeout)
        runs.extend(one["runs"])
    one["runs"] = runs
    return one


def _mounted_on(path: str) -> str:
    """The file system type ``path`` is on, from /proc/self/mounts."""
    best, kind = "", "?"
    with contextlib.suppress(OSError), open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2:
                point = fields[1]
                prefix = point.rstrip("/") + "/"
                if (path == point or path.startswith(prefix)) and len(point) > len(best):
                    best, kind = point, fields[2]
    return kind


def _git() -> str:
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return f"{commit}{' with uncommitted changes' if dirty else ''}"


def header(args: argparse.Namespace, base: str) -> None:
    from heapwatch import _core

    command = shlex.join([os.path.relpath(sys.executable), *sys.argv])
    print(f"$ {command}")
    print(
        f"Python {platform.python_version()}, heapwatch._core {_core.__file__}, "
        f"tree {_git()}; Linux {platform.release()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    print(
        f"dumps into {base} ({_mounted_on(os.path.realpath(base))}; fsync is real there "
        f"unless tmpfs); TRACE_BATCH {args.batch or 'as shipped'}"
    )
    print()


def _ms(values: list[float]) -> str:
    ms = [v * 1e3 for v in values]
    return f"{statistics.median(ms):.1f} ({min(ms):.1f}..{max(ms):.1f})"


def crossing_tables(results: list[dict[str, Any]]) -> None:
    print(
        "Crossing -> finished dump: BlackBoxWatcher.poll() with the working set past 90%, "
        "until it returns the dump's path, median (min..max) over the repetitions. Peak "
        "extra RSS: VmHWM during the poll less VmRSS just before it, for the process's "
        "first crossing (nothing freed before to reuse: the figure to plan headroom by) "
        "and the median (max) of the later ones."
    )
    print()
    print(
        "| mode | live traces | reps | crossing→dump ms | peak extra RSS MiB, first "
        "| later | snapshot memory MiB | dump size MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        runs = result["runs"]
        later = [r["extra_rss"] / MIB for r in runs[1:]] or [0.0]
        print(
            f"| {result['mode']} | {result['live_traces']:,} | {len(runs)} "
            f"| {_ms([r['wall'] for r in runs])} "
            f"| {runs[0]['extra_rss'] / MIB:.1f} "
            f"| {statistics.median(later):.1f} ({max(later):.1f}) "
            f"| {statistics.median(r['snapshot_memory'] for r in runs) / MIB:.1f} "
            f"| {statistics.median(r['dump_bytes'] for r in runs) / MIB:.2f} |"
        )
    print()
    print(
        "Where the time goes (median ms; write: the traces turned into tuples a batch "
        "at a time, encoded, compressed, synced), and the heap each ran over:"
    )
    print()
    print(
        "| mode | live traces | wall | CPU | snapshot | summary | write (of which fsync) "
        "| retention | other | traced heap MiB | tracer MiB | bytes/trace in the dump |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        runs = result["runs"]

        def med(name: str, runs: list[dict[str, Any]] = runs) -> float:
            return float(statistics.median(r["phases"].get(name, 0.0) for r in runs)) * 1e3

        other = statistics.median(
            r["wall"]
            - sum(r["phases"].get(n, 0.0) for n in ("snapshot", "summary", "write", "retention"))
            for r in runs
        )
        print(
            f"| {result['mode']} | {result['live_traces']:,} "
            f"| {statistics.median(r['wall'] for r in runs) * 1e3:.1f} "
            f"| {statistics.median(r['cpu'] for r in runs) * 1e3:.1f} "
            f"| {med('snapshot'):.1f} | {med('summary'):.2f} "
            f"| {med('write'):.1f} ({med('fsync'):.1f}) | {med('retention'):.2f} "
            f"| {other * 1e3:.1f} | {result['traced'] / MIB:.0f} "
            f"| {result['tracer_memory'] / MIB:.1f} "
            f"| {statistics.median(r['dump_bytes'] for r in runs) / result['live_traces']:.2f} |"
        )
    print()


def idle_table(idle: dict[str, Any]) -> None:
    rows = [
        ("read_usage (fixture file)", "read_usage"),
        (f"poll(), usage below every threshold ({idle['dump_at']})", "poll_below"),
        ("poll(), usage past 90% but the working set below (memory.stat read too)", "poll_cached"),
    ]
    if "read_usage_own" in idle:
        rows.append(
            (f"read_usage (this process's own cgroup, {idle['own_cgroup']})", "read_usage_own")
        )
    print(
        f"Idle: a look when nothing crosses, µs per call, median (min..max) over "
        f"{IDLE_ROUNDS} rounds of {IDLE_POLLS}; the share of a core at 10 looks a second:"
    )
    print()
    print("| what | µs per call | share of a core at 10/s |")
    print("|---|---:|---:|")
    for text, key in rows:
        us = [v * 1e6 for v in idle[key]]
        median = statistics.median(us)
        print(
            f"| {text} | {median:.1f} ({min(us):.1f}..{max(us):.1f}) "
            f"| {median * 10 / 1e6 * 100:.4f} % |"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    parser.add_argument("--modes", default="exact,sample")
    parser.add_argument("--reps", type=int, help="repetitions for every size (default 9/7/5)")
    parser.add_argument("--batch", type=int, help="TRACE_BATCH for the crossings")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the dumps go")
    parser.add_argument("--profile", metavar="MODE:N", help="cProfile one crossing instead")
    parser.add_argument("--top", type=int, default=25, help="rows of the profile")
    parser.add_argument("--timeout", type=float, default=600.0, help="per child, seconds")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_as_child(args.child)
        return
    base = os.path.abspath(args.dir)
    if args.profile:
        mode, _, blocks = args.profile.partition(":")
        extra = [] if args.batch is None else ["--batch", str(args.batch)]
        command = [sys.executable, str(Path(__file__).resolve()), "--child", "profile"]
        command += [mode, blocks or "1000000", base, str(args.top), *extra]
        raise SystemExit(subprocess.run(command, env=child_env(), check=False).returncode)
    header(args, base)
    started = time.perf_counter()
    cpu_started = os.times()
    idle = run_child(["idle", base], args.timeout)
    results = []
    for mode in args.modes.split(","):
        for blocks in (int(s) for s in args.sizes.split(",")):
            reps = args.reps or REPS.get(blocks, 3)
            results.append(
                crossings(mode, blocks, reps, base, batch=args.batch, timeout=args.timeout)
            )
    crossing_tables(results)
    idle_table(idle)
    took = time.perf_counter() - started
    cpu_done = os.times()
    children_cpu = (cpu_done.children_user + cpu_done.children_system) - (
        cpu_started.children_user + cpu_started.children_system
    )
    how = "VmHWM reset by clear_refs" if results and results[0]["hwm_reset"] else "ru_maxrss"
    print(
        f"Conditions: exact mode nframe 1; sample mode nframe {SAMPLE_NFRAME} at a "
        f"{SAMPLE_INTERVAL}-byte interval, so every block is sampled and a trace; "
        f"{LINES} lines, {DEPTH} frames deep, {EPOCHS} epochs; peak RSS from {how}; "
        f"one child per configuration, run one after another; {took:.0f} s in all, "
        f"the children using {children_cpu / took:.0%} of a CPU; load average "
        f"{os.getloadavg()[0]:.2f} at the end, on {os.cpu_count()} CPUs shared with other work."
    )


def run_as_child(argv: list[str]) -> None:
    batch = None
    if "--batch" in argv:
        at = argv.index("--batch")
        batch = int(argv[at + 1])
        del argv[at : at + 2]
    if batch is not None:
        from heapwatch.server import black_box

        # Read by BlackBoxWatcher.write at each crossing.
        black_box.TRACE_BATCH = batch
    what, rest = argv[0], argv[1:]
    if what == "crossings":
        mode, blocks, reps, base, rss_method = rest
        child_crossings(mode, int(blocks), int(reps), base, rss_method)
    elif what == "idle":
        child_idle(rest[0])
    elif what == "profile":
        mode, blocks, base, top = rest
        child_profile(mode, int(blocks), base, int(top))
    else:
        raise SystemExit(f"unknown child {what!r}")


if __name__ == "__main__":
    main()
