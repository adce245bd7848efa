"""A soak run of the agent in a busy service (``make soak``, ``make soak-short``).

The service (tests/soak/service.py) runs with heapwatch auto-started from the
environment: a cycle every 0.1 s, 25 frames, Prometheus and an OTLP exporter
whose collector does not exist, the ``/debug/`` routes, a dump directory; 8
threads allocate and free, one forks a worker every second (half of them end
with ``os._exit``, half by returning from the forking thread).  Meanwhile
this driver scrapes ``/metrics`` and asks for ``/top``, ``/diff``, the pprof
profile and whole snapshots in a loop, sends the dump signal now and then,
and fills the dump directory (a small tmpfs when it may mount one, else a
directory it makes read-only) and empties it again.

At the end it asserts: the service neither crashed nor hung (it answers and
exits 0, every forked worker ended on its own), the sum of the traces equals
the traced total and the core's invariants hold, dropped traces are
published as the core counts them, the tracer's own memory stayed flat, and
the service's stderr holds only heapwatch's one-line reports, each distinct
problem at most once per minute, and heapwatch's own memory is not the
service's: the sites of heapwatch's modules hold almost nothing at the end,
and the tracer's memory ends near its steady state.  Prints the figures;
exit status 1 if a check failed.

Usage: python tests/soak/soak.py [--seconds 300] [--mode exact|sample]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Figures", "main", "soak"]

SERVICE = Path(__file__).with_name("service.py")
TOKEN = "soak-" + "t" * 32
# Each client asks for /metrics, then one of these (a whole snapshot now and
# then: it holds the dump lock longest).
ROUTES = (
    ("/debug/heapwatch/top?limit=20", 5),
    ("/debug/heapwatch/top?key_type=traceback&limit=5&format=json", 3),
    ("/debug/heapwatch/diff?limit=20", 5),
    ("/debug/heapwatch/diff?key_type=filename&cumulative=1&format=json", 2),
    ("/debug/pprof/heap", 4),
    ("/debug/heapwatch/snapshot", 1),
)
DUMP_FS_BYTES = 640 << 10  # a dump or so: the directory fills up
# heapwatch's own memory is not the service's: at the end, the live sites in
# heapwatch's modules (what the service's threads allocated through
# heapwatch's code: the agent's start, the fork hooks) hold at most this.
# A dump in progress traced as the service's held 33 MB there.
OWNED_BYTES_MAX = 256 << 10
# The tracer's memory at the end, after the threads stopped, against its
# steady state (_steady): at most this factor (a dump's objects traced made
# it 4.3).
TRACER_GROWTH_MAX = 1.5
_METRIC = re.compile(r"^(heapwatch_[a-z_]+)(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


@dataclass
class Figures:
    """What the run did and saw."""

    seconds: float = 0.0
    requests: Counter[str] = field(default_factory=Counter)
    """route -> requests answered 200."""
    seconds_served: list[float] = field(default_factory=list)
    busy: int = 0
    """Requests answered 429 (one dump at a time)."""
    failed: list[str] = field(default_factory=list)
    """Requests answered otherwise, or not at all."""
    signals: int = 0
    dumps: dict[str, int] = field(default_factory=dict)
    """Name -> size of each dump seen."""
    fills: int = 0
    tracer_memory: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since start, heapwatch_tracer_memory_bytes) per scrape."""
    last_metrics: dict[str, float] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)
    exit_status: int | None = None
    stderr: str = ""
    child_stderr: list[str] = field(default_factory=list)
    """Each forked worker's own stderr."""
    problems: list[str] = field(default_factory=list)


def _metrics(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for name, value in _METRIC.findall(text):
        if name not in values:  # the first series of a family is enough here
            values[name] = float(value)
    return values


@contextlib.contextmanager
def _dump_directory() -> Iterator[tuple[Path, str]]:
    """A directory that fills up: a small tmpfs if this process may mount
    one, else a directory the driver makes read-only to stand for a full
    disk (as root, permissions would not stop the service)."""
    path = Path(tempfile.mkdtemp(prefix="heapwatch-soak-dumps-"))
    # (not the sanitizer runtime the service may be preloaded with)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    mounted = False
    if os.geteuid() == 0 and shutil.which("mount"):
        size = f"size={DUMP_FS_BYTES},mode=0700"
        mount = ["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(path)]
        done = subprocess.run(mount, env=env, capture_output=True, check=False)
        mounted = done.returncode == 0
    try:
        yield path, ("tmpfs" if mounted else "read-only")
    finally:
        if mounted:
            subprocess.run(["umount", "-l", path], env=env, capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)


class Driver:
    def __init__(self, base: str, pid: int, dump_dir: Path, fill: str, figures: Figures) -> None:
        self.base = base
        self.pid = pid
        self.dump_dir = dump_dir
        self.fill = fill
        self.figures = figures
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.started = time.monotonic()

    def get(self, route: str) -> int:
        request = urllib.request.Request(
            self.base + route, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                body = response.read()
                status = int(response.status)
        except urllib.error.HTTPError as exc:
            body, status = b"", exc.code
        except (OSError, urllib.error.URLError) as exc:
            with self.lock:
                self.figures.failed.append(f"{route}: {exc}")
            return 0
        with self.lock:
            if status == 200:
                self.figures.requests[route.split("?", maxsplit=1)[0]] += 1
                self.figures.seconds_served.append(time.monotonic() - started)
            elif status == 429:
                self.figures.busy += 1
            elif status == 503 and "/diff" in route:
                self.figures.requests["diff: 503 before the first cycle"] += 1
            else:
                self.figures.failed.append(f"{route}: HTTP {status}")
        if route == "/metrics" and status == 200:
            values = _metrics(body.decode())
            with self.lock:
                self.figures.last_metrics = values
                if "heapwatch_tracer_memory_bytes" in values:
                    self.figures.tracer_memory.append(
                        (time.monotonic() - self.started, values["heapwatch_tracer_memory_bytes"])
                    )
        return status

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        routes = [route for route, _ in ROUTES]
        weights = [weight for _, weight in ROUTES]
        while not self.stop.is_set():
            self.get("/metrics")
            if self.get(rng.choices(routes, weights)[0]) == 429:
                time.sleep(rng.uniform(0.2, 0.6))  # as a client honouring Retry-After would
            else:
                time.sleep(rng.uniform(0.0, 0.05))

    def watch_dumps(self) -> None:
        while not self.stop.wait(0.1):
            self.note_dumps()

    def note_dumps(self) -> None:
        with contextlib.suppress(OSError):
            for name in os.listdir(self.dump_dir):
                if name.startswith("heapwatch-") and name.endswith(".hwdump"):
                    size = (self.dump_dir / name).stat().st_size
                    with self.lock:
                        self.figures.dumps[name] = size

    def signal_and_fill(self) -> None:
        """The dump signal every 8-16 s (a dump takes seconds, holding the
        lock the routes need); every 25 s the directory is emptied (a full
        tmpfs fills again) or, read-only, made writable for 5 s."""
        rng = random.Random(7)
        next_signal = time.monotonic() + rng.uniform(2.0, 6.0)
        next_fill = time.monotonic() + (25.0 if self.fill == "tmpfs" else 5.0)
        writable = True
        while not self.stop.wait(0.25):
            now = time.monotonic()
            if now >= next_signal:
                next_signal = now + rng.uniform(8.0, 16.0)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGUSR2)
                    with self.lock:
                        self.figures.signals += 1
            if now < next_fill:
                continue
            if self.fill == "tmpfs":
                next_fill = now + 25.0
                self.note_dumps()
                for name in os.listdir(self.dump_dir):
                    if name.startswith("heapwatch-"):  # never a dump being written
                        with contextlib.suppress(OSError):
                            os.unlink(self.dump_dir / name)
                with self.lock:
                    self.figures.fills += 1
            else:
                next_fill = now + 5.0
                writable = not writable
                os.chmod(self.dump_dir, 0o700 if writable else 0o500)
                if not writable:
                    with self.lock:
                        self.figures.fills += 1


def _check(figures: Figures) -> list[str]:
    problems: list[str] = []
    result = figures.result
    if figures.exit_status != 0:
        problems.append(f"the service exited with {figures.exit_status}")
    if not result:
        problems.append("the service gave no result")
        return problems
    if figures.failed:
        problems.append(f"{len(figures.failed)} requests failed, first: {figures.failed[:3]}")
    if result["children_bad"]:
        problems.append(f"forked workers: {result['children_bad']}")
    if result["forks"] == 0:
        problems.append("no worker was forked")
    if result["cycle_errors"]:
        problems.append(f"{result['cycle_errors']} cycles failed")
    if result["invariants"] != "ok":
        problems.append(f"the core's invariants: {result['invariants']}")
    if result["sum_of_traces"] != result["traced"]:
        problems.append(
            f"the sum of the traces {result['sum_of_traces']} != traced {result['traced']}"
        )
    published = figures.last_metrics.get("heapwatch_dropped_traces_total")
    if published is None or published > result["dropped"]:
        problems.append(f"dropped traces published {published}, counted {result['dropped']}")
    if not figures.dumps:
        problems.append("no dump was written")
    problems.extend(_flat(figures.tracer_memory))
    problems.extend(_heapwatch_memory(result, figures.tracer_memory))
    problems.extend(_one_line_each(figures.stderr, figures.seconds))
    for index, stderr in enumerate(figures.child_stderr):
        problems.extend(f"worker {index}: {p}" for p in _one_line_each(stderr, 1.0))
    return problems


def _steady(samples: list[tuple[float, float]]) -> float | None:
    """The tracer's own memory at its lowest in the second quarter of the
    run: its steady state.  Not the first scrape: that one may come before
    the threads have filled their pools (0.05 MiB in a CI run, 0.32 MiB in
    others, 0.58 MiB at most in both).  The lowest, because a dump in
    progress traces its own objects for a while (heapwatch's, freed with the
    dump), and a leak raises the floor."""
    end = samples[-1][0] if samples else 0.0
    second = [v for t, v in samples if end / 4 <= t < end / 2]
    return min(second) if second else None


def _flat(samples: list[tuple[float, float]]) -> list[str]:
    """The tracer's own memory at its lowest in the last quarter of the run
    against its steady state: at most 10% more."""
    if len(samples) < 8:
        return [f"only {len(samples)} scrapes of the tracer's memory"]
    end = samples[-1][0]
    last = [v for t, v in samples if t >= end * 3 / 4]
    before = _steady(samples)
    if before is None or not last:
        return []
    after = min(last)
    if after > before * 1.10:
        return [f"the tracer's memory grew from {before:.0f} to {after:.0f} bytes (lowest)"]
    return []


def _heapwatch_memory(result: dict[str, Any], samples: list[tuple[float, float]]) -> list[str]:
    """heapwatch's own memory at the end: none of it shown as the
    service's, and the tracer's own back near its steady state."""
    problems: list[str] = []
    owned = result["heapwatch_bytes"]
    if owned > OWNED_BYTES_MAX:
        problems.append(
            f"heapwatch's own sites hold {owned} bytes of the service's memory at the end "
            f"(at most {OWNED_BYTES_MAX}): {result['heapwatch_top']}"
        )
    steady, end = _steady(samples), result["tracer_memory"]
    if steady is not None and end > steady * TRACER_GROWTH_MAX:
        problems.append(
            f"the tracer's memory went from {steady:.0f} bytes in its steady state to {end} "
            f"at the end (at most {TRACER_GROWTH_MAX} times)"
        )
    return problems


def _shape(line: str) -> str:
    """A log line without its numbers: one problem whatever the figures."""
    return re.sub(r"\d+(\.\d+)?", "N", line)


def _one_line_each(stderr: str, seconds: float) -> list[str]:
    problems: list[str] = []
    if "Traceback" in stderr:
        problems.append("a traceback on stderr")
    lines = [line for line in stderr.splitlines() if line.strip()]
    strangers = [line for line in lines if not line.startswith("heapwatch")]
    if strangers:
        problems.append(f"stderr lines not from heapwatch: {strangers[:3]}")
    shapes = Counter(_shape(line) for line in lines)
    allowed = int(seconds // 60) + 1
    for shape, count in shapes.items():
        if count > allowed:
            problems.append(f"{count} times in {seconds:.0f}s (at most {allowed}): {shape}")
    return problems


def soak(python: str, seconds: float, mode: str) -> Figures:
    figures = Figures()
    # Not parenthesised: that needs Python 3.10.
    with _dump_directory() as (dump_dir, fill), tempfile.TemporaryDirectory() as scratch:
        stderr_path = Path(scratch) / "stderr.txt"
        child_logs = Path(scratch) / "children"
        child_logs.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HEAPWATCH_", "OTEL_"))}
        env.update(
            HEAPWATCH_ENABLED="1",
            HEAPWATCH_MODE=mode,
            HEAPWATCH_SAMPLE_INTERVAL="16KiB",
            HEAPWATCH_NFRAME="25",
            HEAPWATCH_INTERVAL="0.1",
            HEAPWATCH_EXPORTERS="prometheus,otlp",
            HEAPWATCH_PORT="0",
            HEAPWATCH_TOKEN=TOKEN,
            HEAPWATCH_DUMP_DIR=str(dump_dir),
            HEAPWATCH_DUMP_KEEP="0",
            OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",  # nothing listens on discard
            OTEL_METRIC_EXPORT_INTERVAL="1000",
            OTEL_METRIC_EXPORT_TIMEOUT="2000",
            SOAK_CHILD_LOGS=str(child_logs),
        )
        started = time.monotonic()
        with stderr_path.open("w") as stderr:
            proc = subprocess.Popen(
                [python, str(SERVICE)],
                env=env,
                cwd=scratch,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            ready = proc.stdout.readline().split()
            if ready[:1] != ["READY"]:
                figures.stderr = stderr_path.read_text()
                figures.problems.append(f"the service did not start: {ready}")
                return figures
            driver = Driver(ready[1], proc.pid, dump_dir, fill, figures)
            workers = [threading.Thread(target=driver.client, args=(n,)) for n in range(3)]
            workers += [
                threading.Thread(target=driver.signal_and_fill),
                threading.Thread(target=driver.watch_dumps),
            ]
            for worker in workers:
                worker.start()
            time.sleep(seconds)
            driver.stop.set()
            for worker in workers:
                worker.join()
            with contextlib.suppress(OSError):
                os.chmod(dump_dir, 0o700)
            proc.stdin.write("stop\n")
            proc.stdin.flush()
            try:
                out, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                figures.problems.append("the service did not stop within 60s of being asked")
                os.kill(proc.pid, signal.SIGABRT)  # faulthandler shows where it hangs
                out, _ = proc.communicate()
            for line in out.splitlines():
                if line.startswith("RESULT "):
                    figures.result = json.loads(line[len("RESULT ") :])
            figures.exit_status = proc.returncode
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        figures.seconds = time.monotonic() - started
        figures.stderr = stderr_path.read_text()
        figures.child_stderr = [path.read_text() for path in sorted(child_logs.iterdir())]
        figures.problems += _check(figures)
        figures.result["dump_directory"] = fill
    return figures


def report(figures: Figures) -> str:
    result = figures.result
    memory = figures.tracer_memory
    lines = [
        f"soak: {figures.seconds:.0f}s, mode {result.get('mode')}, "
        f"dump directory: {result.get('dump_directory')}",
        f"requests served: {sum(figures.requests.values())} "
        + "("
        + ", ".join(f"{route} {n}" for route, n in sorted(figures.requests.items()))
        + f"), {figures.busy} answered 429 (a dump in progress), {len(figures.failed)} failed",
        f"request time: median {statistics.median(figures.seconds_served or [0]):.2f}s, "
        f"at most {max(figures.seconds_served or [0]):.2f}s",
        f"agent cycles: {result.get('cycles')} ({result.get('cycle_errors')} failed)",
        f"dump signals: {figures.signals}, dumps written: {len(figures.dumps)} "
        f"({max(figures.dumps.values(), default=0) / 2**10:.0f} KiB at most), "
        f"directory emptied (tmpfs) or made read-only: {figures.fills} times",
        f"forked workers: {result.get('forks')} ({result.get('children_ok')} ended by "
        "themselves with status 0)",
        f"allocations by the 8 threads: {result.get('allocations')}",
        f"traced: {result.get('traced')} bytes in {result.get('ntraces')} traces, sum of the "
        f"traces {result.get('sum_of_traces')}, invariants {result.get('invariants')}",
        f"live at the end (after the threads stopped): {result.get('top')}",
        f"heapwatch-owned live bytes at the end: {result.get('heapwatch_bytes')} "
        f"(largest sites: {result.get('heapwatch_top')})",
        f"dropped traces: {result.get('dropped')} (published "
        f"{figures.last_metrics.get('heapwatch_dropped_traces_total')})",
    ]
    if memory:
        lines.append(
            f"tracer memory: {memory[0][1] / 2**20:.2f} MiB at {memory[0][0]:.0f}s, "
            f"{(_steady(memory) or 0) / 2**20:.2f} MiB steady (second quarter's lowest), "
            f"{max(v for _, v in memory) / 2**20:.2f} MiB at most, "
            f"{memory[-1][1] / 2**20:.2f} MiB at {memory[-1][0]:.0f}s, "
            f"{result.get('tracer_memory', 0) / 2**20:.2f} MiB at the end"
        )
    distinct = sorted({_shape(line) for line in figures.stderr.splitlines()})
    lines.append(f"stderr: {len(figures.stderr.splitlines())} lines, {len(distinct)} distinct:")
    lines += [f"    {line[:160]}" for line in distinct]
    workers = [len(text.splitlines()) for text in figures.child_stderr]
    lines.append(f"forked workers' stderr: {sum(workers)} lines in {len(workers)} workers:")
    shapes = {_shape(line) for text in figures.child_stderr for line in text.splitlines()}
    lines += [f"    {line[:160]}" for line in sorted(shapes)]
    lines.append("FAILED:\n  " + "\n  ".join(figures.problems) if figures.problems else "OK")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="how long (default 300)")
    parser.add_argument("--mode", choices=("exact", "sample"), default="exact")
    parser.add_argument("--python", default=sys.executable, help="the service's interpreter")
    options = parser.parse_args(argv)
    figures = soak(options.python, options.seconds, options.mode)
    print(report(figures))
    return 1 if figures.problems else 0


if __name__ == "__main__":
    sys.exit(main())
