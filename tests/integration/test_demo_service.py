"""make demo's service: started with HEAPWATCH_* only, its leak shows on /metrics."""

from __future__ import annotations

import ast
import re
import signal
from pathlib import Path

from support.agent_process import (
    clean_env,
    fetch,
    free_ports,
    installed_python,
    parse,
    running,
    site_values,
    with_default_sigint,
)
from support.waiting import wait_for

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo_service.py"


def test_the_demo_leaks_visibly_and_stops_on_ctrl_c() -> None:
    source = DEMO.read_text()
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert not imported & {"heapwatch", "heapwatch_exporters"}
    leak_line = next(
        i for i, text in enumerate(source.splitlines(), 1) if "# the leaking line" in text
    )
    # Given the demo started the way make demo starts it, on free ports
    port = free_ports()
    env = clean_env(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_INTERVAL="0.5",
        HEAPWATCH_SAMPLE_INTERVAL="64KiB",
        HEAPWATCH_PORT=str(port),
        DEMO_PORT="0",
        DEMO_RATE="50",
    )
    # (with Ctrl-C's default action, even when this test runs in a background job)
    with running(with_default_sigint([installed_python(), str(DEMO)]), env) as proc:
        # When it has printed its URLs (whole lines: a busy machine may hand
        # the output over in pieces)
        whole = re.compile(r"heapwatch metrics: \S+\n")
        stdout = wait_for(
            lambda: (out := proc.output()[0]) and whole.search(out) and out  # type: ignore[attr-defined]
        )
        demo_url = re.search(r"demo service: (\S+)", stdout)
        metrics_url = re.search(r"heapwatch metrics: (\S+)", stdout)
        assert demo_url and metrics_url
        assert metrics_url.group(1) == f"http://127.0.0.1:{port}/metrics"
        assert "orders remembered" in (fetch(demo_url.group(1)) or "")

        # Then its own traffic makes the leaking line grow on /metrics
        def leak() -> float:
            text = fetch(metrics_url.group(1))
            sites = site_values(parse(text), "heapwatch_lineno_size_bytes", "demo_service.py")
            return sites.get(leak_line, 0.0) if text else 0.0

        first = wait_for(leak, timeout=60)
        wait_for(lambda: leak() > first + 500_000, timeout=60)
        # and Ctrl-C stops it cleanly
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        stdout, stderr = proc.output()  # type: ignore[attr-defined]
    assert "demo service stopped" in stdout
    assert "Traceback" not in stderr, stderr
