"""deploy/kubernetes/prometheus-scrape.yml's relabelling, run by a real
Prometheus server: Kubernetes pod discovery is replaced by a file listing the
targets it would produce (the same __meta_kubernetes_* labels), since no
cluster is at hand and Debian's build lacks Kubernetes discovery anyway."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from _deploy_support import DEPLOY, Prometheus

from support.external_tools import require_tool

pytestmark = [pytest.mark.tools, pytest.mark.deploy_files]

K8S_SCRAPE = DEPLOY / "kubernetes" / "prometheus-scrape.yml"


def pod_port(
    pod: str,
    port_name: str,
    port: int,
    *,
    annotated: bool = True,
    phase: str = "Running",
    path: str | None = None,
) -> dict[str, Any]:
    """One target of Kubernetes pod discovery: a declared container port."""
    labels = {
        "__meta_kubernetes_namespace": "shop",
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_phase": phase,
        "__meta_kubernetes_pod_container_name": "app",
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_container_port_number": str(port),
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "example-api",
    }
    if annotated:
        labels["__meta_kubernetes_pod_annotation_heapwatch_io_scrape"] = "true"
    if path is not None:
        labels["__meta_kubernetes_pod_annotation_heapwatch_io_path"] = path
    # An address nobody listens on: the targets are down, which is fine here.
    return {"targets": [f"127.0.0.1:{port}"], "labels": labels}


def test_pod_discovery_relabelling(tmp_path: Path) -> None:
    binary = require_tool("prometheus")
    pods = [
        pod_port("api-1", "http", 18000),
        pod_port("api-1", "heapwatch-0", 19438, path="/metrics"),
        pod_port("api-1", "heapwatch-1", 19439, path="/metrics"),
        pod_port("api-2", "heapwatch-0", 19440, path="/heapwatch/metrics"),
        pod_port("other-1", "heapwatch-0", 19441, annotated=False),
        pod_port("api-3", "heapwatch-0", 19442, phase="Pending"),
        pod_port("api-4", "metrics", 19443),
    ]
    (tmp_path / "pods.json").write_text(json.dumps(pods), encoding="utf-8")
    config = yaml.safe_load(K8S_SCRAPE.read_text(encoding="utf-8"))
    config["rule_files"] = []
    (job,) = config["scrape_configs"]
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
    job["file_sd_configs"] = [{"files": [str(tmp_path / "pods.json")], "refresh_interval": "1s"}]
    job["scrape_interval"] = "1h"  # discovery and relabelling are what is tested

    with Prometheus(binary, yaml.safe_dump(config), tmp_path / "prometheus") as prom:
        deadline = time.monotonic() + 30
        while True:
            targets = prom.targets()
            if len(targets["activeTargets"]) + len(targets["droppedTargets"]) == len(pods):
                break
            assert time.monotonic() < deadline, targets
            time.sleep(0.5)

    active = {
        t["labels"]["instance"]: (t["labels"], t["scrapeUrl"]) for t in targets["activeTargets"]
    }
    assert set(active) == {"api-1:19438", "api-1:19439", "api-2:19440"}
    for instance, (labels, url) in active.items():
        pod, port = instance.split(":")
        assert labels == {
            "job": "shop/example-api",
            "instance": instance,
            "namespace": "shop",
            "pod": pod,
            "container": "app",
        }
        path = "/heapwatch/metrics" if pod == "api-2" else "/metrics"
        assert url == f"http://127.0.0.1:{port}{path}"
    dropped = {
        (
            t["discoveredLabels"]["__meta_kubernetes_pod_name"],
            t["discoveredLabels"]["__meta_kubernetes_pod_container_port_name"],
        )
        for t in targets["droppedTargets"]
    }
    assert dropped == {
        ("api-1", "http"),
        ("other-1", "heapwatch-0"),
        ("api-3", "heapwatch-0"),
        ("api-4", "metrics"),
    }
