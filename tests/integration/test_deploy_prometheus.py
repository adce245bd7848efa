"""deploy/prometheus (and the Prometheus files of deploy/compose and
deploy/kubernetes) against the real promtool: configurations and rules
check, and the rule unit tests pass and have teeth."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from _deploy_support import DEPLOY

from support.external_tools import require_tool

pytestmark = [pytest.mark.tools, pytest.mark.deploy_files]

PROMETHEUS = DEPLOY / "prometheus"
RULES = PROMETHEUS / "heapwatch-rules.yml"
LIMITS = PROMETHEUS / "heapwatch-limits.yml"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.test.yml"))
K8S_SCRAPE = DEPLOY / "kubernetes" / "prometheus-scrape.yml"
ALERTS = {
    "HeapwatchLeakSuspect",
    "HeapwatchTracedMemoryNearLimit",
    "HeapwatchTracerMemoryHigh",
    "HeapwatchAgentDown",
    "HeapwatchAgentStalled",
    "HeapwatchNearMemoryLimit",
    "HeapwatchMemoryLimitWithinHour",
    "HeapwatchOOMKill",
    "HeapwatchPreviousBlackBox",
}
# The container alerts: one per container, whatever its number of processes.
CONTAINER_LABELS = "job, service, namespace, pod, container, host"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"{result.args}:\n{result.stdout}\n{result.stderr}"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


@pytest.mark.parametrize(
    "config",
    [PROMETHEUS / "prometheus.yml", DEPLOY / "compose" / "prometheus.yml"],
    ids=["hosts", "compose"],
)
def test_check_config(config: Path) -> None:
    result = promtool("check", "config", config.name, cwd=config.parent)
    assert_ok(result)
    # Both load the rules and the limits.
    assert "SUCCESS: 2 rule files found" in result.stdout + result.stderr


def test_check_kubernetes_config(tmp_path: Path) -> None:
    result = promtool("check", "config", "--syntax-only", str(K8S_SCRAPE))
    if "kubernetes_sd_configs not found" in result.stdout + result.stderr:
        # Debian's prometheus is built without Kubernetes discovery: check
        # everything else, with the discovery swapped for a file.
        config = load_yaml(K8S_SCRAPE)
        for job in config["scrape_configs"]:
            assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
            job["file_sd_configs"] = [{"files": [str(tmp_path / "pods.json")]}]
        swapped = tmp_path / "prometheus.yml"
        swapped.write_text(yaml.safe_dump(config), encoding="utf-8")
        result = promtool("check", "config", "--syntax-only", str(swapped))
    assert_ok(result)


def test_check_rules() -> None:
    result = promtool("check", "rules", str(RULES), str(LIMITS))
    assert_ok(result)
    # The traced limit, the containers' working set and limit, nine alerts.
    assert "SUCCESS: 12 rules found" in result.stdout
    assert "SUCCESS: 1 rules found" in result.stdout


def test_alerts_are_the_documented_ones() -> None:
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    assert alerts == ALERTS
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for alert in ALERTS:
        assert alert in readme, f"{alert} is not described in deploy/README.md"
    for rule in rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_rule_unit_tests_pass() -> None:
    assert RULE_TESTS, "no promtool tests under deploy/prometheus/tests"
    result = promtool("test", "rules", *(p.name for p in RULE_TESTS), cwd=RULE_TESTS[0].parent)
    assert_ok(result)
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    """Each alert has a test where it fires on one series while a flat one
    in the same input stays quiet (promtool compares the alerts exactly, so a
    listed alert means no other series fired)."""
    firing: dict[str, int] = {}
    for path in RULE_TESTS:
        for case in load_yaml(path)["tests"]:
            for check in case.get("alert_rule_test", []):
                if check["exp_alerts"]:
                    firing[check["alertname"]] = firing.get(check["alertname"], 0) + 1
                    series = [s["series"] for s in case["input_series"]]
                    assert len(series) > 1, f"{case['name']}: nothing to stay quiet"
    assert set(firing) == ALERTS, ALERTS - set(firing)


# Each rewrite weakens one clause of a rule; the promtool tests must catch it.
MUTATIONS = {
    "leak threshold lowered": (r">= 0\.9\b", ">= 0.5"),
    "leak threshold raised": (r">= 0\.9\b", ">= 0.99"),
    "leak score not held": (r"for: 10m", "for: 1m"),
    "leak score held too long": (r"for: 10m", "for: 30m"),
    "<other> counted as a site": (r'code_file_path!="<other>"', 'code_file_path!="-"'),
    "no per-job limit": (
        r"max by \(job\) \(heapwatch:traced_limit_bytes:override\)",
        "vector(0) == 1",
    ),
    "no container limit for traced memory": (
        r"max by \(job, instance\) \(heapwatch_container_memory_limit_bytes\)",
        "vector(0) == 1",
    ),
    "container near-limit threshold lowered": (
        r"0\.9 \* heapwatch:container_memory_limit_bytes:max",
        "0.85 * heapwatch:container_memory_limit_bytes:max",
    ),
    "container near limit not held": (
        r"(0\.9 \* heapwatch:container_memory_limit_bytes:max\n\s+for:) 5m",
        r"\1 1m",
    ),
    "every process a container": (
        rf"max by \({CONTAINER_LABELS}\)",
        f"max by ({CONTAINER_LABELS}, instance)",
    ),
    "prediction further ahead": (r":max\[15m\], 3600\)", ":max[15m], 7200)"),
    "prediction over a longer range": (r":max\[15m\]", ":max[1h]"),
    "prediction not held": (
        r"(\n\s+heapwatch:container_memory_limit_bytes:max\n\s+for:) 20m",
        r"\1 5m",
    ),
    "OOM kills counted, not their increase": (
        r"increase\((heapwatch_container_oom_kills_total)\[10m\]\)",
        r"\1",
    ),
    "OOM kill remembered longer": (r"oom_kills_total\[10m\]", "oom_kills_total[1h]"),
    "black box kept firing": (
        r"black_box_timestamp_seconds offset 1h",
        "black_box_timestamp_seconds offset 10h",
    ),
    "black box per process": (r"host,\n(\s+)dump,", r"host, instance,\n\1dump,"),
    "tracer floor gone": (r"> 67108864", "> 0"),
    "down without history": (r"max_over_time\(heapwatch_info\[1h\]\)", "up"),
    "stall threshold": (r"> 300", "> 1000"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_rule_unit_tests_catch_a_weakened_rule(name: str, tmp_path: Path) -> None:
    pattern, replacement = MUTATIONS[name]
    text = RULES.read_text(encoding="utf-8")
    mutated, count = re.subn(pattern, replacement, text)
    assert count, f"{name}: {pattern!r} no longer matches heapwatch-rules.yml"
    (tmp_path / "tests").mkdir()
    (tmp_path / RULES.name).write_text(mutated, encoding="utf-8")
    shutil.copy(LIMITS, tmp_path / LIMITS.name)
    for path in RULE_TESTS:
        shutil.copy(path, tmp_path / "tests" / path.name)
    assert_ok(promtool("check", "rules", str(tmp_path / RULES.name)))
    result = promtool("test", "rules", *(p.name for p in RULE_TESTS), cwd=tmp_path / "tests")
    assert result.returncode != 0, f"the promtool tests missed the mutation {name!r}"
