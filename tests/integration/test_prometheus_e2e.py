"""The demo service, its heapwatch agents, a real Prometheus server, and every
query of the Grafana dashboard (deploy/grafana/dashboard.json).

Two demos run side by side, one in exact mode and one in sample mode; a
Prometheus server on 127.0.0.1 scrapes both every second and loads the alert
rules.  Once it has data, every target of every panel, with the dashboard's
variables filled in as Grafana would ($job, $instance, $__range,
$__rate_interval), must return data through the HTTP API, the leak-suspect
panel (the agent's leak score, over a window shrunk to seconds) and the
leak-suspect alert's expression must name the demo's leaking line, the
"what made the peak" panel its spike's line, and the alert rules must
evaluate without errors.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _deploy_support import (
    DEPLOY,
    REPO,
    Prometheus,
    autostart_installed,
    free_port,
    source_pythonpath,
    stop_process,
)

from support.external_tools import require_tool
from support.waiting import wait_for

pytestmark = [pytest.mark.tools, pytest.mark.slow]

DEMO = REPO / "examples" / "demo_service.py"
DASHBOARD = DEPLOY / "grafana" / "dashboard.json"
RULES = DEPLOY / "prometheus" / "heapwatch-rules.yml"
LIMITS = DEPLOY / "prometheus" / "heapwatch-limits.yml"
JOB = "heapwatch-demo"  # the job heapwatch-limits.yml gives a 256 MiB limit
SCRAPE_SECONDS = 1
# What Grafana makes of $__rate_interval with a 1 s scrape interval and a 1 s
# step: max($__interval + scrape interval, 4 * scrape interval).
RATE_INTERVAL = "4s"
# The leak score's window (HEAPWATCH_LEAK_WINDOW), shrunk for a run of a minute.
SHORT_WINDOW = 20
# What the demo's /export holds for a moment (DEMO_SPIKE_BYTES).
SPIKE_BYTES = 16 << 20
DEADLINE = 150.0

# Runs the demo as `python demo_service.py` would, with the auto-start hook
# read from the source tree (agent/heapwatch-autostart.pth), for a checkout
# where heapwatch is on PYTHONPATH rather than installed.
_BOOT_FROM_SOURCE = (
    "import runpy, site, sys; site.addsitedir(sys.argv[1]); sys.argv = sys.argv[2:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def marked_line(mark: str) -> int:
    for number, line in enumerate(DEMO.read_text(encoding="utf-8").splitlines(), start=1):
        if f"# {mark}" in line:
            return number
    raise AssertionError(f"{DEMO} marks no line with '# {mark}'")


def leaking_line() -> int:
    return marked_line("the leaking line")


def spike_line() -> int:
    """The line that holds DEMO_SPIKE_BYTES for a moment (its /export)."""
    return marked_line("the spike's line")


@dataclass
class Demo:
    name: str
    proc: subprocess.Popen[bytes]
    output: Path
    instance: str  # host:port of its /metrics, Prometheus's instance label


# The demo labels no request (it imports nothing of heapwatch's): the route
# panels read a service that does, with heapwatch.routes, in sample mode.
ROUTED_SERVICE = """\
import time
from heapwatch import get_agent
from heapwatch.routes import route

agent = get_agent()
while agent is not None and agent.metrics_url is None:
    time.sleep(0.05)
print("heapwatch metrics:", agent.metrics_url if agent else "agent off", flush=True)
orders = []
while True:
    with route("/orders/{id}"):
        orders.append(bytes(4096))  # the routed leak
    with route("/report"):
        rows = [bytes(2048) for _ in range(32)]
        del rows
    time.sleep(0.05)
"""


def start_demo(tmp_path: Path, name: str, env_extra: dict[str, str], script: Path = DEMO) -> Demo:
    env = dict(os.environ)
    env.update(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_HOST="127.0.0.1",
        HEAPWATCH_PORT=str(free_port()),
        HEAPWATCH_INTERVAL=str(SCRAPE_SECONDS),
        HEAPWATCH_LEAK_WINDOW=f"{SHORT_WINDOW}s",
        DEMO_HOST="127.0.0.1",
        DEMO_PORT="0",
        DEMO_SPIKE_BYTES=str(SPIKE_BYTES),
        **env_extra,
    )
    source_pythonpath(env)
    if autostart_installed():
        command = [sys.executable, str(script)]
    else:
        command = [sys.executable, "-c", _BOOT_FROM_SOURCE, str(REPO / "agent"), str(script)]
    output = tmp_path / f"{name}.out"
    with open(output, "wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = output.read_text(encoding="utf-8", errors="replace")
        match = re.search(r"^heapwatch metrics: http://([^/\s]+)/metrics$", text, re.M)
        if match:
            return Demo(name, proc, output, match.group(1))
        if "heapwatch metrics:" in text or proc.poll() is not None:
            break
        time.sleep(0.1)
    stop_process(proc)
    raise AssertionError(
        f"demo {name} did not report its metrics URL:\n{output.read_text(errors='replace')}"
    )


def prometheus_config(demos: dict[str, Demo]) -> str:
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_SECONDS}s",
            "evaluation_interval": f"{SCRAPE_SECONDS}s",
        },
        "rule_files": [str(RULES), str(LIMITS)],
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [{"targets": [d.instance for d in demos.values()]}],
            }
        ],
    }
    return json.dumps(config, indent=2)  # JSON is YAML


@dataclass
class Target:
    panel: str
    ref_id: str
    expr: str
    instant: bool


def dashboard_targets() -> list[Target]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    targets = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            targets.append(
                Target(
                    panel=panel["title"],
                    ref_id=target["refId"],
                    expr=target["expr"],
                    instant=bool(target.get("instant")) and not target.get("range"),
                )
            )
    return targets


def fill_in(expr: str, instance: str, range_seconds: int) -> str:
    """The query Grafana sends for one chosen job and instance."""
    values = {
        "$__rate_interval": RATE_INTERVAL,
        "$__interval": f"{SCRAPE_SECONDS}s",
        "$__range": f"{range_seconds}s",
        "$job": JOB,
        "$instance": instance,
    }
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(name, values[name])
    # ($1 and the like are label_replace's references, not Grafana variables)
    assert not re.search(r"\$(?!\d)", expr), f"a variable is left in {expr!r}"
    return expr


def panel_expr(panel: str, ref_id: str = "A") -> str:
    (target,) = [t for t in dashboard_targets() if (t.panel, t.ref_id) == (panel, ref_id)]
    return target.expr


def site_of(series: dict[str, Any]) -> tuple[str, str]:
    metric = series["metric"]
    return Path(metric.get("code_file_path", "")).name, metric.get("code_line_number", "")


@dataclass
class Stack:
    prom: Prometheus
    demos: dict[str, Demo]
    started: float  # when Prometheus started scraping
    named_at: float = 0.0
    """The instant the leak-suspect panel last named the leak (wait_for_leak)."""

    def elapsed(self, at: float | None = None) -> int:
        return int((time.time() if at is None else at) - self.started)

    def suspects(
        self, demo: Demo, at: float | None = None, ref_id: str = "A"
    ) -> list[dict[str, Any]]:
        """The leak-suspect panel's rows (A: their scores, B: their rates),
        largest first."""
        expr = fill_in(panel_expr("Leak suspects", ref_id), demo.instance, max(1, self.elapsed(at)))
        result = self.prom.query(expr, at=at)
        return sorted(result, key=lambda s: float(s["value"][1]), reverse=True)

    def peak_sites(self, demo: Demo, end: float) -> dict[tuple[str, str], float]:
        """The "what made the peak" panel: each site's largest share of a peak."""
        expr = fill_in(panel_expr("What made the peak"), demo.instance, max(1, self.elapsed(end)))
        result = self.prom.query_range(expr, self.started, end, SCRAPE_SECONDS)
        return {site_of(s): max(float(v) for _t, v in s["values"]) for s in result if s["values"]}

    def wait_for_leak(self, demo: Demo, timeout: float) -> list[dict[str, Any]]:
        """Waits until the leak-suspect panel names the leaking line for
        demo (its score reached the agent's suspect threshold)."""
        leak = ("demo_service.py", str(leaking_line()))
        rows: list[dict[str, Any]] = []

        def named() -> list[dict[str, Any]]:
            at = time.time()
            rows[:] = self.suspects(demo, at=at)
            if leak in [site_of(r) for r in rows]:
                self.named_at = at
                return rows
            return []

        def why() -> str:
            return (
                f"{demo.name}: no leak suspect at {leak} after {self.elapsed()}s: "
                f"{[site_of(r) for r in rows]}\ntargets: {self.prom.targets()}\n"
                f"demo output: {demo.output.read_text(errors='replace')}\n{self.prom.log()}"
            )

        return wait_for(named, timeout, 2.0, what=why)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = require_tool("prometheus")
    if not DEMO.exists():
        pytest.fail(f"{DEMO} is missing")
    tmp_path = tmp_path_factory.mktemp("e2e")
    demos: dict[str, Demo] = {}
    try:
        demos["exact"] = start_demo(tmp_path, "exact", {"HEAPWATCH_MODE": "exact"})
        demos["sample"] = start_demo(
            tmp_path,
            "sample",
            {"HEAPWATCH_MODE": "sample", "HEAPWATCH_SAMPLE_INTERVAL": "16KiB"},
        )
        routed = tmp_path / "routed_service.py"
        routed.write_text(ROUTED_SERVICE, encoding="utf-8")
        demos["routed"] = start_demo(
            tmp_path,
            "routed",
            {"HEAPWATCH_MODE": "sample", "HEAPWATCH_SAMPLE_INTERVAL": "16KiB"},
            script=routed,
        )
        with Prometheus(binary, prometheus_config(demos), tmp_path / "prometheus") as prom:
            yield Stack(prom, demos, time.time())
    finally:
        for demo in demos.values():
            stop_process(demo.proc)


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    """Exact mode: the agent sees every allocation, so the leaking line grows
    in every cycle and every panel has something to show."""
    demo = stack.demos["exact"]
    prom = stack.prom
    stack.wait_for_leak(demo, DEADLINE)

    # Every target of every panel, at the instant the leak was named (a
    # busy machine may make a cycle late and the score dip a moment later).
    end = stack.named_at
    elapsed = int(end - stack.started)
    empty = []
    route_targets = []
    for target in dashboard_targets():
        if "route" in target.expr:
            route_targets.append(target)  # a sample-mode feature: below
            continue
        expr = fill_in(target.expr, demo.instance, elapsed)
        if target.instant:
            result = prom.query(expr, at=end)
        else:
            result = prom.query_range(expr, stack.started, end, SCRAPE_SECONDS)
            result = [s for s in result if s["values"]]
        if not result:
            empty.append(f"{target.panel} [{target.ref_id}]: {expr}")
    assert not empty, "queries that returned no data:\n" + "\n".join(empty)
    check_leak_and_peak_panels(stack, demo, end)
    check_route_panels(stack, route_targets)


def check_route_panels(stack: Stack, targets: list[Target]) -> None:
    """Routes label sampled allocations: the route panels' queries, on the
    service whose work runs under heapwatch.routes.route() (one route leaks,
    one churns), in sample mode."""
    assert targets, "the dashboard has no route panel"
    demo = stack.demos["routed"]
    empty: list[str] = []

    def answered() -> bool:
        end = time.time()
        empty.clear()
        for target in targets:
            expr = fill_in(target.expr, demo.instance, max(1, stack.elapsed(end)))
            if target.instant:
                result = stack.prom.query(expr, at=end)
            else:
                result = stack.prom.query_range(expr, stack.started, end, SCRAPE_SECONDS)
                result = [s for s in result if s["values"]]
            if not result:
                empty.append(f"{target.panel} [{target.ref_id}]: {expr}")
        return not empty

    wait_for(
        answered, DEADLINE, 2.0, what=lambda: "route queries with no data:\n" + "\n".join(empty)
    )


def check_leak_and_peak_panels(stack: Stack, demo: Demo, end: float) -> None:
    """At end, an instant the leak-suspect panel named the leak: the leak is
    its first row with a positive rate, the alert's expression names it, and
    the peak panel shows the spike's line at its size."""
    leak = ("demo_service.py", str(leaking_line()))
    rows = stack.suspects(demo, at=end)
    assert rows and site_of(rows[0]) == leak, [(site_of(r), r["value"]) for r in rows]
    rates = {site_of(r): float(r["value"][1]) for r in stack.suspects(demo, at=end, ref_id="B")}
    assert rates.get(leak, 0.0) > 0, rates

    # The leak-suspect alert's expression, as Prometheus loaded it, names the
    # leak once its score reaches the alert's threshold (the alert itself
    # waits for it to hold 10 minutes).
    rules = [rule for group in stack.prom.api("rules")["groups"] for rule in group["rules"]]
    (alert,) = [r for r in rules if r["name"] == "HeapwatchLeakSuspect"]
    found: list[tuple[tuple[str, str], str]] = []

    def alert_names_the_leak() -> bool:
        found[:] = [(site_of(s), s["metric"]["instance"]) for s in stack.prom.query(alert["query"])]
        return (leak, demo.instance) in found

    wait_for(alert_names_the_leak, 60, 1.0, what=lambda: f"{alert['query']}: {found}")

    # The spike held 16 MiB for a moment: its share of a peak shows it.
    spike = ("demo_service.py", str(spike_line()))
    peaks = stack.peak_sites(demo, end)
    assert peaks.get(spike, 0.0) >= SPIKE_BYTES // 2, peaks


def test_rules_evaluate_on_real_series(stack: Stack) -> None:
    """The alert and recording rules run without errors on the agents' real
    series, and the demo's job gets its limit from heapwatch-limits.yml."""
    deadline = time.monotonic() + 30
    while True:
        rules = [r for g in stack.prom.api("rules")["groups"] for r in g["rules"]]
        # A rule's health is "unknown" until its first evaluation.
        if len(rules) >= 7 and all(r.get("health") != "unknown" for r in rules):
            break
        assert time.monotonic() < deadline, rules
        time.sleep(1)
    broken = [(r["name"], r.get("lastError")) for r in rules if r.get("health") != "ok"]
    assert not broken, broken
    # One limit per process: no container limit here, so the job's override
    limit = stack.prom.query(f'heapwatch:traced_limit_bytes{{job="{JOB}"}}')
    assert [float(s["value"][1]) for s in limit] == [256 * 1024 * 1024] * len(stack.demos)
    assert {s["metric"]["source"] for s in limit} == {"override"}


def test_variables_list_the_job_and_instances(stack: Stack) -> None:
    """The Job and Instance variables: Grafana's label_values() are these
    label-values queries."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    variables = {v["name"]: v["query"] for v in dashboard["templating"]["list"]}
    match = re.fullmatch(r"label_values\((.*), (\w+)\)", variables["job"])
    assert match and match.group(2) == "job"
    jobs = stack.prom.api("label/job/values", **{"match[]": match.group(1)})
    assert JOB in jobs
    match = re.fullmatch(r"label_values\((.*), (\w+)\)", variables["instance"])
    assert match and match.group(2) == "instance"
    selector = match.group(1).replace("$job", JOB)
    instances = stack.prom.api("label/instance/values", **{"match[]": selector})
    assert sorted(instances) == sorted(d.instance for d in stack.demos.values())


def test_sample_mode_leak_is_a_suspect(stack: Stack) -> None:
    """Sample mode: the leaking line's estimate moves by samples, now and then
    down (a sampled array of _ORDERS resized into an unsampled block); the
    agent's score weighs that noise."""
    demo = stack.demos["sample"]
    stack.wait_for_leak(demo, DEADLINE)
    check_leak_and_peak_panels(stack, demo, stack.named_at)


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_line_that_churns_shows_in_the_rate_of_bytes_allocated(stack: Stack, mode: str) -> None:
    """The report's rows are built and dropped with each /report: the line
    holds nothing at a cycle's end, so it is never among the top sites by
    size, yet it allocates a megabyte a second.  The counter of bytes
    allocated must carry it, so that rate() shows it (issue 25)."""
    demo = stack.demos[mode]
    line = marked_line("churn")
    where = (
        f'instance="{demo.instance}", code_file_path=~".*demo_service.py", '
        f'code_line_number="{line}"'
    )
    rate = f"rate(heapwatch_lineno_allocated_bytes_total{{{where}}}[{RATE_INTERVAL}])"
    rates: list[float] = []

    def churns() -> bool:
        rates[:] = [float(s["value"][1]) for s in stack.prom.query(rate)]
        return bool(rates) and max(rates) > 100_000

    wait_for(churns, 60, 1.0, what=lambda: f"{rate}: {rates}")
    # and it holds (next to) nothing: no live view would have shown it.
    held = stack.prom.query(f"max_over_time(heapwatch_lineno_size_bytes{{{where}}}[1m])")
    biggest = stack.prom.query(
        f'max(heapwatch_lineno_size_bytes{{instance="{demo.instance}", code_file_path!="<other>"}})'
    )
    assert float(held[0]["value"][1]) < float(biggest[0]["value"][1]) / 4, (held, biggest)
