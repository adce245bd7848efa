"""promtool check metrics passes on what the agent serves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch_exporters.prometheus import PrometheusExporter
from support.agent_model import FakeClock, ModelSource, TickingTimer
from support.agent_process import clean_env, fetch, free_ports, installed_python, running
from support.external_tools import require_tool
from support.waiting import wait_for

pytestmark = pytest.mark.tools


def promtool_check(text: str) -> None:
    promtool = require_tool("promtool")
    done = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout + done.stderr == ""  # no lint remark either


def test_promtool_accepts_the_exporters_output_with_awkward_file_names() -> None:
    # Given sites whose file names need escaping, and more sites than the top
    source = ModelSource()
    source.allocate('/srv/a "quoted"\\path.py', 3, 4096, 2)
    source.allocate("/srv/ünïcode.py", 7, 2048)
    source.allocate("<frozen importlib._bootstrap>", 241, 512)
    source.allocate("small.py", 1, 10)
    exporter = PrometheusExporter()
    agent = Agent(
        AgentConfig(exporters=(), top=3),
        source=source,
        exporters=[exporter],
        clock=FakeClock(),
        timer=TickingTimer(0.001),
    )
    exporter.start(agent)
    agent.run_cycle()
    source.allocate("small.py", 1, 10)
    agent.run_cycle()
    assert exporter.registry is not None
    # Then promtool finds nothing to say
    promtool_check(generate_latest(exporter.registry).decode())


def test_promtool_accepts_a_live_agents_metrics(tmp_path: Path) -> None:
    require_tool("promtool")
    script = tmp_path / "service.py"
    script.write_text(
        "import time\nkept = [bytearray(10_000) for _ in range(100)]\ntime.sleep(60)\n"
    )
    port = free_ports()
    env = clean_env(HEAPWATCH_ENABLED="1", HEAPWATCH_PORT=str(port), HEAPWATCH_INTERVAL="0.2")
    url = f"http://127.0.0.1:{port}/metrics"
    with running([installed_python(), str(script)], env, cwd=tmp_path):
        text = wait_for(lambda: (t := fetch(url)) and "heapwatch_lineno_size_bytes{" in t and t)
    assert isinstance(text, str)
    promtool_check(text)
