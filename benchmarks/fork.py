"""What heapwatch costs a process that forks: microseconds per ``os.fork()``.

With the agent on, every fork ends the agent's threads first (the agent's,
the HTTP server's) and starts them again after it, in the parent
(docs/design/agent.md, "Fork"); the tracer alone (no thread) shows what
copying its tables' mappings costs the fork itself.  Each round starts one process per
configuration, in rotating order, that forks ``--forks`` children (each
exits at once) and times each ``os.fork()`` call in the parent; the table
quotes the median over rounds of each process's median.  A measurement, not
a test: nothing is enforced.

    python benchmarks/fork.py --rounds 7 --forks 200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """\
import json, os, sys, time
forks = int(sys.argv[1])
if len(sys.argv) > 2:  # the tracer without the agent: the cost of its tables alone
    from heapwatch import _core
    _core.start(1 if sys.argv[2] == "exact" else 64, sys.argv[2], 512 * 1024)
time.sleep(0.5)  # the agent has started its threads and cycled
samples = []
for _ in range(forks):
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    samples.append(time.perf_counter() - start)
    os.waitpid(pid, 0)
samples.sort()
print(json.dumps({"median_us": samples[len(samples) // 2] * 1e6}))
"""

# name -> (environment, the tracer to start without the agent, if any)
CONFIGS: dict[str, tuple[dict[str, str], str | None]] = {
    "off": ({}, None),
    "tracer-sample": ({}, "sample"),
    "tracer-exact": ({}, "exact"),
    "agent-sample": ({"HEAPWATCH_ENABLED": "1", "HEAPWATCH_MODE": "sample"}, None),
    "agent-exact": ({"HEAPWATCH_ENABLED": "1", "HEAPWATCH_MODE": "exact"}, None),
}


def measure(config: str, forks: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPWATCH_")}
    variables, tracer = CONFIGS[config]
    env.update(variables, HEAPWATCH_PORT="0")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(forks), *([tracer] if tracer else [])],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(done.stdout)["median_us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--forks", type=int, default=200)
    args = parser.parse_args()
    results: dict[str, list[float]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(measure(name, args.forks))
    print(
        f"{sys.version.split()[0]}: µs per os.fork() in the parent, median of "
        f"{args.rounds} rounds x {args.forks} forks"
    )
    for name, values in results.items():
        print(
            f"  {name:13} {statistics.median(values):8.1f}"
            f"  (min {min(values):.1f}, max {max(values):.1f})"
        )


if __name__ == "__main__":
    main()
