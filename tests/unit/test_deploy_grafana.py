"""deploy/grafana: the committed dashboard matches its generator, validates
against Grafana 11.6's JSON Schemas (dashboard, each panel kind, the
Prometheus query model), and queries what the agent exports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from support.repo_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
RULES = REPO / "deploy" / "prometheus" / "heapwatch-rules.yml"
DASHBOARD = GRAFANA / "dashboard.json"
GENERATOR = GRAFANA / "generate.py"
# Grafana's schemas are data kept beside the repository (see its README):
# HEAPWATCH_GRAFANA_SCHEMAS points elsewhere.
SCHEMAS = Path(os.environ.get("HEAPWATCH_GRAFANA_SCHEMAS", REPO.parent / "shared" / "grafana"))
PANEL_KINDS = ("timeseries", "bargauge", "table", "stat")

# The agent's metric catalogue (exporters/heapwatch_exporters): what a query
# may select, besides prometheus-client's process_* metrics.
CATALOGUE = {
    "heapwatch_traced_bytes",
    "heapwatch_traced_peak_bytes",
    "heapwatch_traced_blocks",
    "heapwatch_lineno_size_bytes",
    "heapwatch_lineno_blocks",
    "heapwatch_lineno_growth_bytes",
    "heapwatch_lineno_peak_bytes",
    "heapwatch_lineno_leak_score",
    "heapwatch_lineno_leak_rate_bytes_per_second",
    "heapwatch_tracer_memory_bytes",
    "heapwatch_cycle_duration_seconds",
    "heapwatch_info",
    "heapwatch_sample_interval_bytes",
    "heapwatch_last_cycle_timestamp_seconds",
    "heapwatch_dropped_traces_total",
    "heapwatch_cycles_total",
    "heapwatch_cycle_errors_total",
    "heapwatch_process_resident_bytes",
    "heapwatch_untraced_bytes",
    "heapwatch_native_heap_bytes",
    "heapwatch_container_memory_limit_bytes",
    "heapwatch_container_memory_high_bytes",
    "heapwatch_container_memory_usage_bytes",
    "heapwatch_container_memory_working_set_bytes",
    "heapwatch_container_oom_kills_total",
    "heapwatch_container_memory_pressure_seconds_total",
    "heapwatch_black_box_dumps_total",
    "heapwatch_previous_black_box_timestamp_seconds",
    "heapwatch_route_size_bytes",
    "heapwatch_route_growth_bytes",
    "heapwatch_route_leak_score",
    "heapwatch_route_leak_rate_bytes_per_second",
    "heapwatch_route_lineno_size_bytes",
    "heapwatch_routes_folded_total",
    "process_resident_memory_bytes",
}
METRIC = re.compile(r"\b((?:heapwatch|process)_[a-z_]+)\b")


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def schema(name: str) -> dict[str, Any]:
    path = SCHEMAS / f"{name}.jsonschema.json"
    if not path.exists():
        message = f"{path} is missing (set HEAPWATCH_GRAFANA_SCHEMAS to Grafana's schemas)"
        if os.environ.get("HEAPWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    loaded: dict[str, Any] = load_json(path)
    return loaded


def definition(name: str, ref: str) -> dict[str, Any]:
    """One definition of a panel schema, as a schema of its own."""
    full = schema(name)
    return {"$ref": f"#/definitions/{ref}", "definitions": full["definitions"]}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = load_json(DASHBOARD)
    return loaded


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = dashboard["panels"]
    return found


def targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in panels(dashboard) for t in p.get("targets", [])]


def load_generator() -> ModuleType:
    pytest.importorskip(
        "grafana_foundation_sdk", reason="grafana-foundation-sdk (requirements-deploy.txt)"
    )
    return load_script(GENERATOR, "heapwatch_dashboard_generator")


def test_committed_json_is_what_the_generator_writes() -> None:
    generator = load_generator()
    assert DASHBOARD.read_text(encoding="utf-8") == generator.render(), (
        "deploy/grafana/dashboard.json is stale: run python deploy/grafana/generate.py"
    )


def test_generator_check_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generator = load_generator()
    stale = tmp_path / "dashboard.json"
    stale.write_text("{}\n", encoding="utf-8")
    assert generator.main(["--check", "--output", str(stale)]) == 1
    assert generator.main(["--output", str(stale)]) == 0
    assert generator.main(["--check", "--output", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == DASHBOARD.read_text(encoding="utf-8")
    capsys.readouterr()


def test_requirements_pin_the_sdk_release_for_grafana_11_6() -> None:
    text = (REPO / "requirements-deploy.txt").read_text(encoding="utf-8")
    assert "grafana-foundation-sdk==1769699379!11.6.0" in text


def test_dashboard_validates_against_grafana_schema(dashboard: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(schema("dashboard")).validate(dashboard)


@pytest.mark.parametrize("kind", PANEL_KINDS)
def test_panels_validate_against_their_kind(dashboard: dict[str, Any], kind: str) -> None:
    of_kind = [p for p in panels(dashboard) if p["type"] == kind]
    assert of_kind, f"the dashboard has no {kind} panel"
    options = jsonschema.Draft7Validator(definition(kind, "Options"))
    has_field_config = "FieldConfig" in schema(kind)["definitions"]
    for panel in of_kind:
        assert "options" in panel, panel["title"]
        options.validate(panel["options"])
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is not None:
            assert has_field_config, panel["title"]
            jsonschema.Draft7Validator(definition(kind, "FieldConfig")).validate(custom)


def test_every_panel_is_of_a_validated_kind(dashboard: dict[str, Any]) -> None:
    assert {p["type"] for p in panels(dashboard)} <= set(PANEL_KINDS)


def test_targets_validate_against_prometheus_query_schema(dashboard: dict[str, Any]) -> None:
    validator = jsonschema.Draft7Validator(schema("prometheus"))
    for _title, target in targets(dashboard):
        validator.validate(target)


def test_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "instance"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["query"] == "label_values(heapwatch_info, job)"
    assert variables["instance"]["query"] == 'label_values(heapwatch_info{job=~"$job"}, instance)'
    assert variables["instance"]["multi"] and variables["instance"]["includeAll"]
    for name in ("job", "instance"):
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_every_query_uses_the_datasource_and_the_selection(dashboard: dict[str, Any]) -> None:
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels(dashboard):
        assert panel["datasource"] == ref, panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]
    for title, target in targets(dashboard):
        assert target["datasource"] == ref, title
        expr = target["expr"]
        # Every selector of every metric filters on $job and $instance.
        selectors = re.findall(METRIC.pattern + r"\{([^}]*)\}", expr)
        assert selectors, (title, expr)
        assert len(selectors) == len(METRIC.findall(expr)), (title, expr)
        for _metric, matchers in selectors:
            assert 'job=~"$job"' in matchers and 'instance=~"$instance"' in matchers, (title, expr)


def test_queries_select_only_catalogued_metrics(dashboard: dict[str, Any]) -> None:
    used = {m for _title, t in targets(dashboard) for m in METRIC.findall(t["expr"])}
    assert used <= CATALOGUE, used - CATALOGUE


def test_required_panels(dashboard: dict[str, Any]) -> None:
    exprs: dict[str, str] = {
        p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels(dashboard)
    }
    kinds = {p["title"]: p["type"] for p in panels(dashboard)}

    def panel_with(*needles: str) -> str:
        found = [title for title, expr in exprs.items() if all(n in expr for n in needles)]
        assert found, needles
        return found[0]

    memory = panel_with(
        "heapwatch_traced_bytes", "heapwatch_traced_peak_bytes", "process_resident_memory_bytes"
    )
    assert kinds[memory] == "timeseries"
    unseen = panel_with(
        "heapwatch_process_resident_bytes",
        "heapwatch_untraced_bytes",
        "heapwatch_native_heap_bytes",
        "heapwatch_traced_bytes",
    )
    assert (unseen, kinds[unseen]) == ("Memory heapwatch can't see", "timeseries")
    assert kinds[panel_with("topk(10", "heapwatch_lineno_size_bytes")] == "bargauge"
    assert kinds[panel_with("deriv(heapwatch_lineno_size_bytes")] == "bargauge"
    leak = panel_with("heapwatch_lineno_leak_score", "heapwatch_lineno_leak_rate_bytes_per_second")
    assert (leak, kinds[leak]) == ("Leak suspects", "table")
    peak = panel_with("heapwatch_lineno_peak_bytes")
    assert (peak, kinds[peak]) == ("What made the peak", "timeseries")
    panel_with("heapwatch_tracer_memory_bytes")
    panel_with("heapwatch_cycle_duration_seconds")
    assert kinds[panel_with("heapwatch_info")] == "stat"
    assert kinds[panel_with("heapwatch_sample_interval_bytes{")] == "stat"
    container = panel_with(
        "heapwatch_container_memory_working_set_bytes",
        "heapwatch_container_memory_usage_bytes",
        "heapwatch_container_memory_limit_bytes",
    )
    assert (container, kinds[container]) == ("Container memory against its limit", "timeseries")
    events = panel_with(
        "heapwatch_container_oom_kills_total",
        "heapwatch_black_box_dumps_total",
        "heapwatch_previous_black_box_timestamp_seconds",
    )
    assert (events, kinds[events]) == ("OOM kills and black boxes", "stat")
    routes = panel_with("heapwatch_route_size_bytes")
    assert (routes, kinds[routes]) == ("Memory by route", "timeseries")


def panel_titled(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    (panel,) = [p for p in panels(dashboard) if p["title"] == title]
    return panel


def rules_container_labels() -> set[str]:
    """The labels the container alerts of heapwatch-rules.yml group by."""
    grouped = re.findall(r"max by \(([^)]*\bhost\b[^)]*)\)", RULES.read_text(encoding="utf-8"))
    assert grouped
    sets = {frozenset(label.strip() for label in group.split(",")) for group in grouped}
    # The black-box alert adds the dump's own labels to the container's.
    container = min(sets, key=len)
    assert all(container <= labels for labels in sets), sets
    return set(container)


def test_container_memory_panel_has_one_line_per_container_and_figure(
    dashboard: dict[str, Any],
) -> None:
    """Working set, usage and limit, as the container alerts see them: one
    series per container (its processes report the same figures), by the
    labels the alerts group by, and a figure label naming each."""
    panel = panel_titled(dashboard, "Container memory against its limit")
    (target,) = panel["targets"]
    expr = target["expr"]
    labels = rules_container_labels()
    grouped = re.match(r"max by \(([^)]*)\) \(", expr)
    assert grouped, expr
    assert {label.strip() for label in grouped.group(1).split(",")} == labels | {"figure"}
    assert '"host", "$1", "instance", "(.*):[0-9]+"' in expr
    figures = dict(
        re.findall(r'(heapwatch_container_memory_\w+)\{[^}]*\}, "figure", "([^"]+)"', expr)
    )
    assert figures == {
        "heapwatch_container_memory_working_set_bytes": "working set",
        "heapwatch_container_memory_usage_bytes": "usage",
        "heapwatch_container_memory_limit_bytes": "limit",
    }
    assert "{{figure}}" in target["legendFormat"]
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["unit"] == "bytes"
    # Lines, not areas: the limit is a line above the other two.
    assert defaults["custom"]["fillOpacity"] == 0


def test_oom_kills_and_black_boxes_stat(dashboard: dict[str, Any]) -> None:
    panel = panel_titled(dashboard, "OOM kills and black boxes")
    by_legend = {t["legendFormat"]: t["expr"] for t in panel["targets"]}
    assert set(by_legend) == {"OOM kills", "black boxes written", "black boxes found"}
    kills = by_legend["OOM kills"]
    # Counted once per container, not once per process that saw the kill.
    container = ", ".join(sorted(rules_container_labels()))
    grouped = re.search(r"sum\(max by \(([^)]*)\)", kills)
    assert grouped, kills
    assert ", ".join(sorted(label.strip() for label in grouped.group(1).split(","))) == container
    assert "increase(heapwatch_container_oom_kills_total{" in kills and "[$__range]" in kills
    assert by_legend["black boxes written"].startswith(
        "sum(increase(heapwatch_black_box_dumps_total{"
    )
    found = by_legend["black boxes found"]
    assert "count by (job, dump)" in found and found.endswith(" or vector(0)")
    assert panel["fieldConfig"]["defaults"]["decimals"] == 0


def test_leak_suspects_table_joins_score_rate_and_route(dashboard: dict[str, Any]) -> None:
    """The queries' rows merge into one row per site of a process: the same
    labels on every side (the route's query adds http_route), and no metric
    name (it would differ)."""
    (panel,) = [p for p in panels(dashboard) if p["title"] == "Leak suspects"]
    by_ref = {t["refId"]: t["expr"] for t in panel["targets"]}
    assert "heapwatch_lineno_leak_score" in by_ref["A"]
    assert "heapwatch_lineno_leak_rate_bytes_per_second" in by_ref["B"]
    for ref in "AB":
        expr = by_ref[ref]
        assert expr.startswith("max by (job, instance, code_file_path, code_line_number) ("), expr
    # The route holding the most of each suspect line, one per line.
    route = by_ref["C"]
    assert route.startswith(
        "max by (job, instance, code_file_path, code_line_number, http_route) ("
    ), route
    assert "topk by (job, instance, code_file_path, code_line_number) (1, " in route
    assert "heapwatch_route_lineno_size_bytes{" in route
    assert "heapwatch_lineno_leak_score{" in route
    assert [t["format"] for t in panel["targets"]] == ["table", "table", "table"]
    transformations = [t["id"] for t in panel["transformations"]]
    assert transformations == ["merge", "organize"]
    renamed = panel["transformations"][1]["options"]["renameByName"]
    assert (renamed["Value #A"], renamed["Value #B"]) == ("score", "rate (B/s)")
    assert (renamed["http_route"], renamed["Value #C"]) == ("route", "route's bytes")


def test_memory_by_route_has_one_line_per_route(dashboard: dict[str, Any]) -> None:
    (target,) = panel_titled(dashboard, "Memory by route")["targets"]
    assert target["expr"].startswith("sum by (job, http_route) (heapwatch_route_size_bytes{")
    assert target["legendFormat"] == "{{http_route}}"


def test_peak_panel_stacks_the_sites(dashboard: dict[str, Any]) -> None:
    (panel,) = [p for p in panels(dashboard) if p["title"] == "What made the peak"]
    assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    (target,) = panel["targets"]
    # The sites are chosen over the whole range, not at its end only.
    assert "max_over_time(heapwatch_lineno_peak_bytes" in target["expr"]
    assert "[$__range] @ end()" in target["expr"]


def test_sites_panels_leave_out_the_other_bucket(dashboard: dict[str, Any]) -> None:
    for title, target in targets(dashboard):
        if "heapwatch_lineno_" in target["expr"]:
            for matchers in re.findall(r"heapwatch_lineno_\w+\{([^}]*)\}", target["expr"]):
                assert 'code_file_path!="<other>"' in matchers, title


def test_instant_and_range_queries(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        for target in panel["targets"]:
            if panel["type"] == "timeseries":
                assert target["range"] and not target["instant"], panel["title"]
            else:
                assert target["instant"] and not target["range"], panel["title"]


def test_grid_layout(dashboard: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
    ids = [p["id"] for p in panels(dashboard)]
    assert len(set(ids)) == len(ids)


def test_uid_and_title(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "heapwatch"
    assert dashboard["title"] == "heapwatch"


def test_generator_runs_as_a_script(tmp_path: Path) -> None:
    load_generator()
    out = tmp_path / "dashboard.json"
    subprocess.run(
        [sys.executable, str(GENERATOR), "--output", str(out)], check=True, capture_output=True
    )
    assert out.read_text(encoding="utf-8") == DASHBOARD.read_text(encoding="utf-8")
