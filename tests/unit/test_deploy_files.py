"""deploy/: every YAML file parses, and the files agree with each other and
with the agent (its HEAPWATCH_* settings, its port rule, the port range
Prometheus scrapes).  Docker is not available here: compose.yaml is checked as
YAML and against the files it names."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml"))
BASE_PORT = 9438
PORT_RANGE = 8  # the ports scraped per host or pod: a master and seven workers
SCRAPED_PORTS = list(range(BASE_PORT, BASE_PORT + PORT_RANGE))


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def agent_settings() -> set[str]:
    config = pytest.importorskip("heapwatch.agent.config")
    return {f"HEAPWATCH_{name.upper()}" for name in config.AgentConfig._fields}


@pytest.mark.parametrize("path", YAML_FILES, ids=[str(p.relative_to(DEPLOY)) for p in YAML_FILES])
def test_yaml_parses(path: Path) -> None:
    assert load_all(path), f"{path} is empty"


def test_expected_files_exist() -> None:
    for name in (
        "README.md",
        "compose.yaml",
        "compose/demo.Dockerfile",
        "compose/prometheus.yml",
        "grafana/generate.py",
        "grafana/dashboard.json",
        "grafana/provisioning/dashboards/heapwatch.yaml",
        "grafana/provisioning/datasources/prometheus.yaml",
        "prometheus/prometheus.yml",
        "prometheus/heapwatch-rules.yml",
        "prometheus/heapwatch-limits.yml",
        "kubernetes/deployment.yaml",
        "kubernetes/servicemonitor.yaml",
        "kubernetes/prometheus-scrape.yml",
        "gunicorn/gunicorn.conf.py",
    ):
        assert (DEPLOY / name).is_file(), name
    assert list((DEPLOY / "prometheus" / "tests").glob("*.test.yml"))


def test_heapwatch_variables_are_agent_settings() -> None:
    # Besides the agent's settings, the README names the test suite's own.
    known = agent_settings() | {"HEAPWATCH_GRAFANA_SCHEMAS", "HEAPWATCH_REQUIRE_TOOLS"}
    for path in [*YAML_FILES, DEPLOY / "gunicorn" / "gunicorn.conf.py", DEPLOY / "README.md"]:
        used = set(re.findall(r"\bHEAPWATCH_[A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8")))
        assert used <= known, f"{path.name}: {sorted(used - known)}"


def test_agent_defaults_match_the_documented_ones() -> None:
    config = pytest.importorskip("heapwatch.agent.config")
    assert config.DEFAULTS.port == BASE_PORT
    assert config.DEFAULTS.port_range >= PORT_RANGE


# ---- Prometheus on hosts ------------------------------------------------------


def test_host_scrape_config_covers_the_port_range() -> None:
    config = load(DEPLOY / "prometheus" / "prometheus.yml")
    assert set(config["rule_files"]) == {"heapwatch-rules.yml", "heapwatch-limits.yml"}
    (job,) = config["scrape_configs"]
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    hosts: dict[str, list[int]] = {}
    for target in targets:
        host, port = target.rsplit(":", 1)
        hosts.setdefault(host, []).append(int(port))
    assert hosts
    for ports in hosts.values():
        assert sorted(ports) == SCRAPED_PORTS


# ---- Kubernetes -----------------------------------------------------------------


def deployment() -> dict[str, Any]:
    docs = load_all(DEPLOY / "kubernetes" / "deployment.yaml")
    found: list[dict[str, Any]] = [d for d in docs if d["kind"] == "Deployment"]
    assert len(found) == 1
    return found[0]


def test_deployment_env_and_ports() -> None:
    spec = deployment()["spec"]["template"]
    (container,) = spec["spec"]["containers"]
    env = env_of(container)
    assert env["HEAPWATCH_ENABLED"] == "1"
    assert env["HEAPWATCH_HOST"] == "0.0.0.0"
    assert int(env["HEAPWATCH_PORT"]) == BASE_PORT
    assert int(env["HEAPWATCH_PORT_RANGE"]) == PORT_RANGE
    # The agent's range needs room for the master and every worker.
    assert int(env["GUNICORN_WORKERS"]) + 1 <= PORT_RANGE
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    heapwatch_ports = {name: port for name, port in ports.items() if name.startswith("heapwatch")}
    assert heapwatch_ports == {f"heapwatch-{i}": port for i, port in enumerate(SCRAPED_PORTS)}
    for name in ports:
        assert len(name) <= 15, f"Kubernetes port names are at most 15 characters: {name}"
    assert spec["metadata"]["annotations"]["heapwatch.io/scrape"] == "true"


def kubernetes_quantity(text: str) -> int:
    """Bytes from a Kubernetes quantity with a binary suffix (1Gi, 512Mi)."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)", text)
    assert match, text
    return int(match[1]) * units[match[2]]


def test_deployment_keeps_the_evidence_of_an_oom_kill() -> None:
    """The termination message where heapwatch writes its summary, a memory
    limit, and the black boxes on an emptyDir that outlives the container."""
    pod = deployment()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert kubernetes_quantity(container["resources"]["limits"]["memory"]) > 0
    # Left to their defaults: the thresholds, and the termination log, which
    # is terminationMessagePath.
    assert "HEAPWATCH_DUMP_AT" not in env
    assert "HEAPWATCH_TERMINATION_LOG" not in env
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [
        m
        for m in container["volumeMounts"]
        if Path(env["HEAPWATCH_DUMP_DIR"]).is_relative_to(m["mountPath"])
    ]
    assert not mount.get("readOnly")
    dumps = volumes[mount["name"]]["emptyDir"]
    # A tmpfs would count against the memory limit the dumps are about.
    assert dumps.get("medium", "") != "Memory"
    # The kubelet evicts a pod whose emptyDir outgrows sizeLimit: the dumps
    # kept, and one being written, stay within it.
    config = pytest.importorskip("heapwatch.agent.config")
    kept = config.AgentConfig.from_env(env).dump_max_bytes
    assert 0 < 2 * kept <= kubernetes_quantity(dumps["sizeLimit"])


def test_deployment_comments_show_the_default_thresholds() -> None:
    """The commented HEAPWATCH_DUMP_AT is the agent's default, and parses."""
    config = pytest.importorskip("heapwatch.agent.config")
    text = (DEPLOY / "kubernetes" / "deployment.yaml").read_text(encoding="utf-8")
    (example,) = re.findall(r"#\s+- name: HEAPWATCH_DUMP_AT\n\s+#\s+value: (\S+)", text)
    assert config.parse_dump_at(example) == config.parse_dump_at(",".join(config.DEFAULT_DUMP_AT))
    assert config.DEFAULTS.termination_log == config.TERMINATION_LOG_AUTO
    assert config.TERMINATION_LOG_DEFAULT == "/dev/termination-log"


def test_kubernetes_scrape_job_keeps_the_declared_ports() -> None:
    config = load(DEPLOY / "kubernetes" / "prometheus-scrape.yml")
    (job,) = config["scrape_configs"]
    keep = {
        tuple(r["source_labels"]): r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    port_regex = keep[("__meta_kubernetes_pod_container_port_name",)]
    (container,) = deployment()["spec"]["template"]["spec"]["containers"]
    for port in container["ports"]:
        matches = re.fullmatch(port_regex, port["name"]) is not None
        assert matches == port["name"].startswith("heapwatch-"), port["name"]
    assert keep[("__meta_kubernetes_pod_annotation_heapwatch_io_scrape",)] == "true"


def test_servicemonitor_scrapes_every_port_of_the_range() -> None:
    docs = load_all(DEPLOY / "kubernetes" / "servicemonitor.yaml")
    (service,) = [d for d in docs if d["kind"] == "Service"]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service_ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert service_ports == {f"heapwatch-{i}": port for i, port in enumerate(SCRAPED_PORTS)}
    assert sorted(e["port"] for e in monitor["spec"]["endpoints"]) == sorted(service_ports)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    pod_labels = deployment()["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


# ---- The container rules ---------------------------------------------------------


def container_labels() -> list[set[str]]:
    """The label sets heapwatch-rules.yml aggregates the processes of a
    container by (those with the host it derives from the instance)."""
    text = (DEPLOY / "prometheus" / "heapwatch-rules.yml").read_text(encoding="utf-8")
    grouped = re.findall(r"max by \(([^)]*)\)", text)
    sets = [{label.strip() for label in group.split(",")} for group in grouped]
    with_host = [labels for labels in sets if "host" in labels]
    assert with_host
    # Every one of them derives host the same way.
    derived = text.count('"host", "$1", "instance", "(.*):[0-9]+"')
    assert derived == text.count('"host", "$1", "instance"') >= len(with_host)
    return with_host


def test_container_rules_group_by_what_tells_containers_apart() -> None:
    """Each label a scrape configuration here gives every port of a container
    alike is kept (the alerts name the container, and route by them); none
    that differs between its ports is (gunicorn's processes would alert
    once each)."""
    sets = container_labels()
    container = min(sets, key=len)
    assert all(container <= labels for labels in sets)
    # Kubernetes pod discovery: every target label but the instance.
    (job,) = load(DEPLOY / "kubernetes" / "prometheus-scrape.yml")["scrape_configs"]
    set_by_k8s = {r["target_label"] for r in job["relabel_configs"] if "target_label" in r}
    set_by_k8s = {label for label in set_by_k8s if not label.startswith("__")}
    assert set_by_k8s - {"instance"} <= container
    # Hosts: the static labels.
    (job,) = load(DEPLOY / "prometheus" / "prometheus.yml")["scrape_configs"]
    static = {label for group in job["static_configs"] for label in group.get("labels", {})}
    assert static and static <= container
    # The Prometheus Operator sets namespace, service, pod, container (and
    # endpoint, the port's name, which differs between the processes).
    assert {"namespace", "service", "pod", "container"} <= container
    assert not container & {"instance", "endpoint"}


# ---- Compose ---------------------------------------------------------------------


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = load(DEPLOY / "compose.yaml")
    return loaded


def test_compose_services() -> None:
    services = compose()["services"]
    assert set(services) == {"demo", "prometheus", "grafana"}
    demo_env = services["demo"]["environment"]
    assert demo_env["HEAPWATCH_ENABLED"] == "1"
    assert demo_env["HEAPWATCH_HOST"] == "0.0.0.0"
    assert demo_env["DEMO_HOST"] == "0.0.0.0"
    assert f"{demo_env['HEAPWATCH_PORT']}:{demo_env['HEAPWATCH_PORT']}" in services["demo"]["ports"]
    assert services["grafana"]["image"].startswith("grafana/grafana:11.6.")
    assert services["prometheus"]["image"].startswith("prom/prometheus:v2.")


def test_compose_names_existing_files() -> None:
    services = compose()["services"]
    build = services["demo"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == REPO
    dockerfile = context / build["dockerfile"]
    assert dockerfile.is_file()
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                # dist/: the wheels make wheels builds (see the test of images below).
                assert source.startswith("dist/") or (context / source).exists(), source
    mounts: dict[str, str] = {}
    for service in services.values():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            assert (DEPLOY / source).exists(), source
            mounts[target] = source
    # Prometheus reads the compose config, with the rules where it says.
    command = services["prometheus"]["command"]
    (config_flag,) = [c for c in command if c.startswith("--config.file=")]
    config_path = config_flag.split("=", 1)[1]
    config_dir, config_name = config_path.rsplit("/", 1)
    config = load(DEPLOY / mounts[config_dir] / config_name)
    for rule_file in config["rule_files"]:
        in_container = f"{config_dir}/{rule_file}"
        parts: list[str] = []
        for part in in_container.split("/"):
            if part == "..":
                parts.pop()
            else:
                parts.append(part)
        resolved = "/".join(parts)
        (mount,) = [t for t in mounts if resolved.startswith(t + "/")]
        assert (DEPLOY / mounts[mount] / resolved[len(mount) + 1 :]).is_file(), rule_file


def test_compose_job_has_the_demo_limit() -> None:
    config = load(DEPLOY / "compose" / "prometheus.yml")
    (job,) = config["scrape_configs"]
    limits = load(DEPLOY / "prometheus" / "heapwatch-limits.yml")
    jobs = {r["labels"]["job"] for g in limits["groups"] for r in g["rules"]}
    assert job["job_name"] in jobs
    port = compose()["services"]["demo"]["environment"]["HEAPWATCH_PORT"]
    assert job["static_configs"][0]["targets"] == [f"demo:{port}"]


# ---- Grafana provisioning ------------------------------------------------------------


def test_grafana_provisioning() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    (provider,) = load(provisioning / "dashboards" / "heapwatch.yaml")["providers"]
    assert provider["type"] == "file"
    (datasource,) = load(provisioning / "datasources" / "prometheus.yaml")["datasources"]
    assert datasource["type"] == "prometheus"
    # Compose mounts the dashboard where the provider looks, and the
    # datasource points at the compose Prometheus.
    grafana = compose()["services"]["grafana"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    dashboard_target = next(t for t, s in mounted.items() if s.endswith("dashboard.json"))
    assert dashboard_target.rsplit("/", 1)[0] == provider["options"]["path"]
    assert datasource["url"] == "http://prometheus:9090"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == dashboard_target


# ---- gunicorn ----------------------------------------------------------------------------


def test_gunicorn_config_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("GUNICORN_")]:
        monkeypatch.delenv(name)
    namespace: dict[str, Any] = {"__name__": "gunicorn_conf", "__file__": "gunicorn.conf.py"}
    path = DEPLOY / "gunicorn" / "gunicorn.conf.py"
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    assert callable(namespace["on_starting"]) and callable(namespace["post_fork"])
    assert namespace["workers"] + 1 <= PORT_RANGE
    assert namespace["bind"] == "0.0.0.0:8000"


# ---- metric names ------------------------------------------------------------------------


def test_metrics_used_are_the_agents() -> None:
    """The dashboard and the rules select only metrics the exporter publishes
    (and prometheus-client's process_* and Prometheus's up)."""
    catalogue = pytest.importorskip("heapwatch_exporters._catalogue")
    # heapwatch_info is an info metric, published beside the catalogue.
    exported = {metric.prometheus_name for metric in catalogue.CATALOGUE} | {"heapwatch_info"}
    for path in (
        DEPLOY / "grafana" / "dashboard.json",
        DEPLOY / "prometheus" / "heapwatch-rules.yml",
    ):
        used = set(re.findall(r"\b(heapwatch_[a-z_]+)\b", path.read_text(encoding="utf-8")))
        assert used, path
        assert used <= exported, f"{path.name}: {sorted(used - exported)}"


# ---- images ------------------------------------------------------------------------------


def test_the_demo_image_installs_the_wheel_and_no_compiler() -> None:
    """Images need no compiler: the demo's installs heapwatch's wheel, refusing
    to build anything (make demo-image runs its steps in a chroot)."""
    text = (DEPLOY / "compose" / "demo.Dockerfile").read_text(encoding="utf-8")
    steps = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"\b(gcc|clang|build-essential|libc6-dev|python3?-dev)\b", steps), steps
    assert re.search(r"pip install [^\n]*--only-binary=:all: [^\n]*heapwatch-\*\.whl", steps), steps
    assert re.search(r"^COPY dist/heapwatch-\*-cp\d+-cp\d+-manylinux_\*\.whl ", steps, re.M), steps
